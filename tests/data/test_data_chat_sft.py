"""Chat rendering, loss-mask boundaries, SFT tokenization and raw-text chunks on the nano tokenizer."""

from __future__ import annotations

import logging

import pytest

from posttrain.data.chat import encode_prompt, render_prompt, stop_token_ids
from posttrain.data.records import SFTExample
from posttrain.data.sft import tokenize_raw_text, tokenize_sft, tokenize_sft_report

COMPLETION = "17 × 10 = 170\n17 × 3 = 51\n170 + 51 = 221\nAnswer: 221"


def masked_text(tok, ex):
    return tok.decode([i for i, m in zip(ex.input_ids, ex.loss_mask) if m])


def unmasked_text(tok, ex):
    return tok.decode([i for i, m in zip(ex.input_ids, ex.loss_mask) if not m])


def test_render_prompt(nano_tokenizer):
    tok = nano_tokenizer
    assert render_prompt(tok, "Solve: 17 × 13", True) == \
        "<|im_start|>user\nSolve: 17 × 13<|im_end|>\n<|im_start|>assistant\n"
    assert render_prompt(tok, "Solve: 17 × 13", False) == "Solve: 17 × 13\n"
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert render_prompt(tok, msgs, True).startswith("<|im_start|>system\nBe brief.<|im_end|>")
    with pytest.raises(ValueError, match="use_chat_template"):
        render_prompt(tok, msgs, False)
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert stop_token_ids(tok, True) == [tok.eos_token_id, im_end]
    assert stop_token_ids(tok, False) == [tok.eos_token_id]


@pytest.mark.parametrize("chat", [True, False])
def test_loss_mask_covers_the_completion_and_its_stop_token(nano_tokenizer, chat):
    tok = nano_tokenizer
    [ex] = tokenize_sft([SFTExample(prompt="Solve: 17 × 13", completion=COMPLETION)], tok,
                        max_len=512, use_chat_template=chat)
    stop = "<|im_end|>" if chat else "<|endoftext|>"
    assert masked_text(tok, ex) == COMPLETION + stop
    # The masked tokens are one contiguous block ending at the stop token.
    first = ex.loss_mask.index(1)
    last = len(ex.loss_mask) - 1 - ex.loss_mask[::-1].index(1)
    assert all(ex.loss_mask[first:last + 1])
    assert tok.convert_ids_to_tokens(ex.input_ids[last]) == stop
    # What the model sees at generation time is exactly the unmasked prefix.
    prompt_ids = encode_prompt(tok, "Solve: 17 × 13", chat)
    assert ex.input_ids[:first] == prompt_ids
    if chat:  # the newline after <|im_end|> is template markup, not a target
        assert unmasked_text(tok, ex).endswith("<|im_start|>assistant\n\n")


def test_messages_train_every_assistant_turn(nano_tokenizer):
    tok = nano_tokenizer
    msgs = [{"role": "user", "content": "Solve: 2 × 3"}, {"role": "assistant", "content": "Answer: 6"},
            {"role": "user", "content": "Solve: 4 × 5"}, {"role": "assistant", "content": "Answer: 20"}]
    [ex] = tokenize_sft([SFTExample(messages=msgs)], tok, max_len=512, use_chat_template=True)
    assert masked_text(tok, ex) == "Answer: 6<|im_end|>Answer: 20<|im_end|>"
    assert "Solve: 4 × 5" in unmasked_text(tok, ex)


def test_a_reply_of_weight_0_is_context_and_not_a_target(nano_tokenizer):
    tok = nano_tokenizer
    msgs = [{"role": "user", "content": "Solve: 2 × 3"}, {"role": "assistant", "content": "Answer: 5", "weight": 0},
            {"role": "user", "content": "Wrong. Again?"}, {"role": "assistant", "content": "Answer: 6", "weight": 1}]
    [ex] = tokenize_sft([SFTExample(messages=msgs)], tok, max_len=512, use_chat_template=True)
    assert masked_text(tok, ex) == "Answer: 6<|im_end|>"  # neither the wrong reply nor its end of turn
    assert "Answer: 5" in unmasked_text(tok, ex)
    [plain] = tokenize_sft([SFTExample(messages=[{k: v for k, v in m.items() if k != "weight"} for m in msgs])], tok,
                           max_len=512, use_chat_template=True)
    assert plain.input_ids == ex.input_ids  # the same text: only the mask differs


def test_a_weight_0_reply_in_a_re_rendered_history_leaves_out_its_own_text(family_tokenizers):
    tok = family_tokenizers["qwen3"]
    weighted = [dict(m, weight=0) if i == 2 else m for i, m in enumerate(CONVERSATION)]
    [only] = tokenize_sft([SFTExample(messages=weighted)], tok, max_len=512, use_chat_template=True)
    assert tok.decode(only.input_ids) == tok.apply_chat_template(CONVERSATION, tokenize=False)
    assert masked_text(tok, only) == CONVERSATION[4]["content"] + "<|im_end|>"


def test_overlong_examples_dropped_or_truncated_and_counted(nano_tokenizer, caplog):
    tok = nano_tokenizer
    exs = [SFTExample(prompt="Solve: 17 × 13", completion=COMPLETION),
           SFTExample(prompt="Solve: 1 × 1", completion="Answer: 1")]
    full = len(tokenize_sft(exs[:1], tok, max_len=512, use_chat_template=True)[0])
    with caplog.at_level(logging.WARNING):
        kept = tokenize_sft(exs, tok, max_len=full - 1, use_chat_template=True)
    assert len(kept) == 1 and "1 of 2 examples" in caplog.text
    cut, report = tokenize_sft_report(exs, tok, max_len=full - 1, use_chat_template=True, overflow="truncate")
    assert (report.kept, report.too_long, report.truncated) == (2, 1, 1)
    assert len(cut[0]) == full - 1
    # Truncated into the prompt: nothing to learn, so dropped and counted.
    _, report = tokenize_sft_report(exs, tok, max_len=5, use_chat_template=True, overflow="truncate")
    assert report.no_loss_tokens == 2 and report.kept == 0


def test_raw_text_chunks_keep_document_boundaries(nano_tokenizer):
    tok = nano_tokenizer
    docs = ["the answer is 42", "def f(x):\n    return x", "solve"]
    lens = [len(tok(d, add_special_tokens=False)["input_ids"]) + 1 for d in docs]  # + EOS
    chunks = tokenize_raw_text(docs, tok, seq_len=8)
    stream = [t for c in chunks for t in c.input_ids]
    assert len(stream) == sum(lens) and all(len(c) <= 8 for c in chunks)
    assert stream.count(tok.eos_token_id) == 3 and stream[lens[0] - 1] == tok.eos_token_id
    for c in chunks:
        assert all(c.loss_mask) and c.position_ids[0] == 0
    # Position ids restart exactly at document starts (and at each chunk start).
    starts = {0, lens[0], lens[0] + lens[1]} | set(range(0, sum(lens), 8))
    flat_pos = [p for c in chunks for p in c.position_ids]
    assert {i for i, p in enumerate(flat_pos) if p == 0} == starts


CONVERSATION = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Solve: 2 + 2"},
                {"role": "assistant", "content": "<think>2 + 2 = 4</think>\nAnswer: 4"},
                {"role": "user", "content": "And 3 + 3?"},
                {"role": "assistant", "content": "<think>3 + 3 = 6</think>\nAnswer: 6"}]


@pytest.fixture(scope="module")
def family_tokenizers():
    from posttrain.models.tiny import TEMPLATES, build_tokenizer

    return {name: build_tokenizer(0, name) for name in TEMPLATES}


@pytest.mark.parametrize("template", ["chatml", "llama3", "gemma", "mistral", "phi3"])
def test_a_conversation_trains_every_reply_and_its_end_of_turn_in_each_family_shape(family_tokenizers, template):
    from posttrain.models.tiny import TEMPLATES

    tok = family_tokenizers[template]
    end = TEMPLATES[template][2]
    assert tok.convert_tokens_to_ids(end) in stop_token_ids(tok, True)
    exs, report = tokenize_sft_report([SFTExample(messages=CONVERSATION)], tok, max_len=512, use_chat_template=True)
    assert report.kept == len(exs) == (2 if template == "mistral" else 1)
    assert "".join(masked_text(tok, ex) for ex in exs) == \
        f"{CONVERSATION[2]['content']}{end}{CONVERSATION[4]['content']}{end}"
    if template == "mistral":  # the system message moves to the last user turn: each reply with its own prompt
        assert [tok.decode(ex.input_ids) for ex in exs] == \
            [tok.apply_chat_template(CONVERSATION[:k], tokenize=False) for k in (3, 5)]
        assert "Be brief." in tok.decode(exs[0].input_ids).split("[/INST]")[0]
    else:  # one text; Phi-3's ends with its eos, not trained
        assert [tok.decode(ex.input_ids) for ex in exs] == [tok.apply_chat_template(CONVERSATION, tokenize=False)]


def test_a_template_that_drops_earlier_thinking_trains_each_reply_as_the_model_saw_it(family_tokenizers):
    tok = family_tokenizers["qwen3"]
    first, second = tokenize_sft([SFTExample(messages=CONVERSATION)], tok, max_len=512, use_chat_template=True)
    # the first reply with the prompt it was written for, its thinking trained
    assert tok.decode(first.input_ids) == tok.apply_chat_template(CONVERSATION[:3], tokenize=False)
    assert masked_text(tok, first) == CONVERSATION[2]["content"] + "<|im_end|>"
    # the second with the history the template shows by then: the first reply's thinking dropped
    assert tok.decode(second.input_ids) == tok.apply_chat_template(CONVERSATION, tokenize=False)
    assert "2 + 2 = 4" not in tok.decode(second.input_ids)
    assert masked_text(tok, second) == CONVERSATION[4]["content"] + "<|im_end|>"
    # without thinking in the replies nothing is re-rendered: one text
    plain = [dict(m, content=m["content"].split("</think>\n")[-1]) for m in CONVERSATION]
    assert len(tokenize_sft([SFTExample(messages=plain)], tok, max_len=512, use_chat_template=True)) == 1


def test_thinking_is_the_templates_switch(nano_tokenizer, monkeypatch):
    # Qwen3's switch: a non-thinking prompt ends with an empty trace the model continues after
    switch = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
              "<|im_start|>assistant\n{% if enable_thinking is defined and not enable_thinking %}"
              "<think>\n\n</think>\n\n{% endif %}")
    monkeypatch.setattr(nano_tokenizer, "chat_template", switch)
    head = "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n"
    assert render_prompt(nano_tokenizer, "q", True) == head
    assert render_prompt(nano_tokenizer, "q", True, thinking=True) == head
    assert render_prompt(nano_tokenizer, "q", True, thinking=False) == head + "<think>\n\n</think>\n\n"
    assert nano_tokenizer.decode(encode_prompt(nano_tokenizer, "q", True, thinking=False)) == \
        head + "<think>\n\n</think>\n\n"
