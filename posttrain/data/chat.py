"""Rendering prompts and conversations to text, and encoding them with a loss mask.

Two modes, chosen by ``use_chat_template``:

- **chat template**: the tokenizer's own template (ChatML for the embedded tiny tokenizer). A
  string prompt becomes one user message; the rendered prompt ends with the generation prompt
  (``<|im_start|>assistant\\n``), exactly what the model sees at RL / eval time.
- **plain text**: prompt, then `PLAIN_SEPARATOR` (a newline), then the completion, then EOS.
  The separator keeps ``Solve: 17 × 13`` and ``Answer: 221`` on separate lines, and
  `render_prompt` ends with it so generation starts where training started.

Loss mask. The text is encoded once, with character offsets, and a token is a target when it
overlaps an assistant reply's characters (a token straddling the boundary counts, as predicting
it is the model's job). The special token that closes a reply (``<|im_end|>`` in ChatML, EOS in
plain mode) is a target too, so the model learns to stop. Encoding the whole text at once, rather
than prompt and reply separately, keeps token boundaries identical to what a tokenizer produces
for the full string. This needs a fast tokenizer (offset mapping).

Special tokens: the text is encoded with ``add_special_tokens=False`` — a chat template writes
its own BOS if it wants one; in plain mode a BOS is prepended when the tokenizer has one.
"""

from __future__ import annotations

PLAIN_SEPARATOR = "\n"


def as_messages(prompt: str | list[dict]) -> list[dict]:
    return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)


def _apply(tokenizer, messages: list[dict], add_generation_prompt: bool, thinking: bool | None = None) -> str:
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError("use_chat_template is set but the tokenizer has no chat template")
    # enable_thinking only when asked: templates without the switch render as they always did
    switch = {} if thinking is None else {"enable_thinking": thinking}
    return tokenizer.apply_chat_template(messages, tokenize=False,
                                         add_generation_prompt=add_generation_prompt, **switch)


def render_prompt(tokenizer, prompt: str | list[dict], use_chat_template: bool, thinking: bool | None = None) -> str:
    """The text a model continues to answer ``prompt`` (the generation prompt included); ``thinking``
    is the chat template's ``enable_thinking`` (None: the template's default)."""
    if use_chat_template:
        return _apply(tokenizer, as_messages(prompt), add_generation_prompt=True, thinking=thinking)
    if not isinstance(prompt, str):
        raise ValueError("a prompt given as chat messages needs use_chat_template=True")
    return prompt + PLAIN_SEPARATOR


def _bos(tokenizer, use_chat_template: bool) -> list[int]:
    bos = getattr(tokenizer, "bos_token_id", None)
    return [bos] if (bos is not None and not use_chat_template) else []


def encode_prompt(tokenizer, prompt: str | list[dict], use_chat_template: bool,
                  thinking: bool | None = None) -> list[int]:
    """Token ids of `render_prompt`, encoded the same way training encodes them."""
    text = render_prompt(tokenizer, prompt, use_chat_template, thinking)
    return _bos(tokenizer, use_chat_template) + tokenizer(text, add_special_tokens=False)["input_ids"]


END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>", "</s>")
"""The tokens that close a turn in the chat templates of ChatML/Qwen, Llama 3, Gemma and Phi-3."""


def stop_token_ids(tokenizer, use_chat_template: bool) -> list[int]:
    """Tokens that end a reply: EOS, plus each `END_OF_TURN` token the vocabulary has as a special
    token (with a chat template)."""
    ids = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    if use_chat_template:
        specials = set(tokenizer.all_special_tokens)
        for marker in END_OF_TURN:
            token = tokenizer.convert_tokens_to_ids(marker) if marker in specials else None
            if isinstance(token, int) and token != tokenizer.unk_token_id and token not in ids:
                ids.append(token)
    return ids


def render_with_spans(tokenizer, *, prompt: str | list[dict] | None = None, completion: str | None = None,
                      messages: list[dict] | None = None,
                      use_chat_template: bool) -> tuple[str, list[tuple[int, int]]]:
    """Full text and the character spans ``[start, end)`` of the replies to train on."""
    if messages is not None:
        if not use_chat_template:
            raise ValueError("a 'messages' conversation needs use_chat_template=True")
        return _render_conversation(tokenizer, messages)
    if prompt is None or completion is None:
        raise ValueError("give prompt and completion, or messages")
    if not use_chat_template:
        head = render_prompt(tokenizer, prompt, False)
        return head + completion, [(len(head), len(head) + len(completion))]
    return _render_conversation(tokenizer, as_messages(prompt) + [{"role": "assistant", "content": completion}])


def _render_conversation(tokenizer, messages: list[dict]) -> tuple[str, list[tuple[int, int]]]:
    pieces = conversation_pieces(tokenizer, messages)
    if len(pieces) > 1:
        raise ValueError("the chat template renders a conversation's prefix differently from the "
                         "conversation itself (it re-renders earlier turns); use conversation_pieces")
    return pieces[0]


def conversation_pieces(tokenizer, messages: list[dict]) -> list[tuple[str, list[tuple[int, int]]]]:
    """A conversation as the texts the model saw, each with the character spans of its replies.

    Usually one text. A template that re-renders earlier turns (Qwen3's drops the ``<think>``
    blocks of replies before the last user message) shows the model a history that is not a
    prefix of the whole conversation's rendering; each reply whose prompt breaks the prefix starts
    a new text: the conversation up to that reply, rendered as it was when the model wrote it. The
    same split as the RL episode runner's segments at a prefix break.

    A reply with ``"weight": 0`` (OpenAI's fine-tuning format) is context, not a target: it has no
    span, and a text left with no span to train on is left out."""
    pieces, text, spans = [], None, []  # spans: (start, end, trained)
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        head = _apply(tokenizer, messages[:i], add_generation_prompt=True)
        through = _apply(tokenizer, messages[: i + 1], add_generation_prompt=False)
        if not through.startswith(head):
            raise ValueError("the chat template renders a conversation's prefix differently from the "
                             "conversation itself; cannot locate the assistant reply for the loss mask")
        # the history so far, through the end of the last reply (a template may close a finished
        # conversation with more, as Phi-3's eos, which the next prompt does not have)
        if text is not None and not head.startswith(text[:spans[-1][1]] if spans else text):
            pieces.append((text, spans))
            spans = []
        start = through.find(m["content"], len(head))
        if start < 0:
            raise ValueError("the chat template does not reproduce the assistant reply verbatim")
        text = through
        spans.append((start, start + len(m["content"]), m.get("weight", 1) != 0))
    if text is None:
        return [(_apply(tokenizer, messages, add_generation_prompt=False), [])]
    return [(t, [(a, b) for a, b, trained in s if trained]) for t, s in pieces + [(text, spans)]
            if any(trained for *_, trained in s)]


def encode_with_mask(tokenizer, text: str, spans: list[tuple[int, int]], *,
                     use_chat_template: bool) -> tuple[list[int], list[int]]:
    """``(input_ids, loss_mask)`` for ``text``; 1 marks reply tokens and the token that closes each reply.

    In plain mode the EOS token is appended after the (single) reply.
    """
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = list(enc["input_ids"]), enc["offset_mapping"]
    mask = [0] * len(ids)
    stops = set(stop_token_ids(tokenizer, use_chat_template)) | set(tokenizer.all_special_ids)
    for start, end in spans:
        last = None
        for t, (a, b) in enumerate(offsets):
            if b > start and a < end:
                mask[t] = 1
                last = t
        if last is not None and last + 1 < len(ids) and ids[last + 1] in stops and offsets[last + 1][0] >= end:
            mask[last + 1] = 1
    if not use_chat_template:
        if tokenizer.eos_token_id is None:
            raise ValueError("plain-text SFT needs a tokenizer with an EOS token to end the completion")
        ids.append(tokenizer.eos_token_id)
        mask.append(1)
    bos = _bos(tokenizer, use_chat_template)
    return bos + ids, [0] * len(bos) + mask
