"""The embedded tiny models: random-weight models of several architectures and a BPE tokenizer built locally.

Nothing is downloaded. The tokenizer is a byte-level BPE trained with `tokenizers` on a small
synthetic corpus (arithmetic traces, chat markup, short Python); digits are split one per token so
arithmetic is learnable digit by digit. It is wrapped in `PreTrainedTokenizerFast` and saved with
`save_pretrained`, so `AutoTokenizer.from_pretrained(dir)` and `AutoModelForCausalLM.from_pretrained(dir)`
load the pair unchanged. (A Qwen2 config would make AutoTokenizer swap in Qwen2's tokenizer, which
splits text differently, so there is no ``qwen2`` arch: ``qwen3`` stands for the family; the other
families keep ours.)

Architectures (`ARCHS`): the same sizes in each family's own config class, so every family the
rollout engine runs can be tried offline. Families with sliding-window attention get a window
(`WINDOW`) shorter than a typical rollout, so the window is actually exercised.

Special tokens: ``<|endoftext|>`` (eos and pad), ``<|im_start|>``, ``<|im_end|>`` (ends a chat
turn). Chat templates (`TEMPLATES`), written here in the shape of each family's own: ``chatml``
(the default, and Llama's here, so the embedded demo model keeps its vocabulary), ``qwen3``
(ChatML whose rendering drops the ``<think>...</think>`` of assistant turns before the last user
message, as Qwen3's does), ``llama3`` (header tokens, ``<|eot_id|>``), ``gemma`` (turn markers,
the assistant called ``model``, a system message folded into the first user turn), ``mistral``
(``[INST] ... [/INST]``, replies ending ``</s>``, a system message moved to the last user turn, so
each new turn re-renders the history) and ``phi3`` (``<|user|>``, ``<|end|>``, a finished
conversation ending with ``<|endoftext|>``). A template's
own markers are added to the vocabulary after the trained tokens, and generation stops at
``<|endoftext|>`` or the template's end-of-turn token (both in ``generation_config.eos_token_id``).
``make-tiny --template`` picks one; by default each family gets its own shape (Llama ``chatml``).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import torch

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
# Reserved like the others (their ids come first) but plain added tokens, as Qwen3's are: decoding
# with ``skip_special_tokens`` keeps them, so a reasoning reward sees a trace open and close.
TEXT_TOKENS = ("<think>", "</think>")

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# name -> config keyword arguments. Parameter counts (Llama) are printed by `posttrain make-tiny`.
SIZES: dict[str, dict] = {
    "nano": dict(hidden_size=64, intermediate_size=192, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2),       # ~0.15M params, for tests
    "tiny": dict(hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                 num_attention_heads=4, num_key_value_heads=2),       # ~2.6M params, the demo
    "small": dict(hidden_size=384, intermediate_size=1024, num_hidden_layers=6,
                  num_attention_heads=6, num_key_value_heads=2),      # ~10M params, a teacher
    "0.5b": dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24,
                 num_attention_heads=16, num_key_value_heads=8),      # ~0.38B params, GPU checks
}
QWEN3_TEMPLATE = (
    "{% set ns = namespace(last_user=-1) %}"
    "{% for m in messages %}{% if m['role'] == 'user' %}{% set ns.last_user = loop.index0 %}{% endif %}"
    "{% endfor %}"
    "{% for m in messages %}"
    "{% set content = m['content'] %}"
    "{% if m['role'] == 'assistant' and loop.index0 < ns.last_user and '</think>' in content %}"
    "{% set content = content.split('</think>')[-1].lstrip('\n') %}"
    "{% endif %}"
    "<|im_start|>{{ m['role'] }}\n{{ content }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
LLAMA3_TEMPLATE = (
    "<|begin_of_text|>"
    "{% for m in messages %}"
    "<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n{{ m['content'] }}<|eot_id|>"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
GEMMA_TEMPLATE = (
    "{% set system = messages[0]['content'] + '\n\n' if messages and messages[0]['role'] == 'system' else '' %}"
    "{% for m in messages if m['role'] != 'system' %}"
    "<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
    "{{ system if loop.first and m['role'] == 'user' else '' }}{{ m['content'] }}<end_of_turn>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
MISTRAL_TEMPLATE = (  # a system message goes to the last user turn: every new turn re-renders the history
    "{% set system = messages[0]['content'] if messages and messages[0]['role'] == 'system' else '' %}"
    "{% set ns = namespace(last_user=-1) %}"
    "{% for m in messages %}{% if m['role'] == 'user' %}{% set ns.last_user = loop.index0 %}{% endif %}{% endfor %}"
    "<s>"
    "{% for m in messages if m['role'] != 'system' %}"
    "{% if m['role'] == 'user' %}"
    "[INST] {{ system + '\n\n' if system and loop.index0 + (1 if system else 0) == ns.last_user else '' }}"
    "{{ m['content'] }}[/INST]"
    "{% else %}{{ m['content'] }}</s>{% endif %}"
    "{% endfor %}"
)
PHI3_TEMPLATE = (  # a finished conversation ends with the eos token, one being answered does not
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% else %}<|endoftext|>{% endif %}"
)
# name -> (template, markers added to the vocabulary, the token that ends a turn)
TEMPLATES: dict[str, tuple[str, list[str], str]] = {
    "chatml": (CHATML_TEMPLATE, [], "<|im_end|>"),
    "qwen3": (QWEN3_TEMPLATE, [], "<|im_end|>"),
    "llama3": (LLAMA3_TEMPLATE, ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
               "<|eot_id|>"),
    "gemma": (GEMMA_TEMPLATE, ["<start_of_turn>", "<end_of_turn>"], "<end_of_turn>"),
    "mistral": (MISTRAL_TEMPLATE, ["<s>", "</s>", "[INST]", "[/INST]"], "</s>"),
    "phi3": (PHI3_TEMPLATE, ["<|system|>", "<|user|>", "<|assistant|>", "<|end|>"], "<|end|>"),
}
DEFAULT_TEMPLATE = {"qwen3": "qwen3", "gemma2": "gemma", "gemma3": "gemma", "mistral": "mistral", "phi3": "phi3"}
"""Each family's template shape when ``--template`` is not given (else ``chatml``)."""

VOCAB_SIZE = 512
MAX_POSITIONS = 512
WINDOW = 64
"""Sliding window of the tiny Mistral, Gemma 2 and Gemma 3 models (tokens)."""


def _gemma3_layer_types(n: int) -> list[str]:
    """Five local layers to one global, as Gemma 3; the last layer is global however few there are."""
    return ["full_attention" if (i + 1) % 6 == 0 or i == n - 1 else "sliding_attention" for i in range(n)]


# arch -> (config class in transformers, extra keyword arguments given the size's arguments).
ARCHS: dict[str, tuple[str, Callable[[dict], dict]]] = {
    "llama": ("LlamaConfig", lambda size: {}),
    "qwen3": ("Qwen3Config", lambda size: {}),
    "mistral": ("MistralConfig", lambda size: {"sliding_window": WINDOW}),
    "phi3": ("Phi3Config", lambda size: {}),
    "gemma2": ("Gemma2Config", lambda size: {"sliding_window": WINDOW, "query_pre_attn_scalar": _head_dim(size)}),
    "gemma3": ("Gemma3TextConfig", lambda size: {"sliding_window": WINDOW, "query_pre_attn_scalar": _head_dim(size),
                                                 "layer_types": _gemma3_layer_types(size["num_hidden_layers"])}),
}


def _head_dim(size: dict) -> int:
    return size["hidden_size"] // size["num_attention_heads"]


def tiny_config(arch: str, size: str, *, vocab_size: int, eos_ids: list[int] | None, pad_id: int | None):
    """The config of a tiny ``arch`` model of ``size`` (head_dim pinned: Gemma and Qwen3 default to far
    larger heads than these sizes have)."""
    import transformers

    if arch not in ARCHS:
        raise ValueError(f"unknown arch {arch!r}; choose from {', '.join(ARCHS)}")
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; choose from {', '.join(SIZES)}")
    cls, extra = ARCHS[arch]
    dims = SIZES[size]
    return getattr(transformers, cls)(
        vocab_size=vocab_size, max_position_embeddings=MAX_POSITIONS, bos_token_id=None, eos_token_id=eos_ids,
        pad_token_id=pad_id, tie_word_embeddings=False, rope_theta=10000.0, head_dim=_head_dim(dims),
        **dims, **extra(dims))


def _corpus(seed: int = 0, n: int = 4000) -> list[str]:
    """Synthetic text covering what the embedded tasks and chat markup use."""
    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        a, b = rng.randint(0, 999), rng.randint(0, 99)
        op = rng.choice(["×", "+", "-"])
        lines.append(f"<|im_start|>user\nSolve: {a} {op} {b}<|im_end|>\n<|im_start|>assistant\n")
        lines.append(f"<think>{a} × 10 = {a * 10}\n{a} + {b} = {a + b}</think>\nAnswer: {a * b}<|endoftext|>")
    words = ("the of and to in is for that with as answer solve think step first then so result "
             "def return if else for while in range print input int str list len sum max min "
             "lambda x y n i j k import assert true false none").split()
    for _ in range(n // 4):
        lines.append(" ".join(rng.choice(words) for _ in range(12)))
        k, c = rng.randint(1, 9), rng.randint(0, 9)
        lines.append(f"def f(x):\n    return x * {k} + {c}\n\nassert f({c}) == {c * k + c}\n")
    return lines


def build_tokenizer(seed: int = 0, template: str = "chatml", corpus: list[str] | None = None,
                    vocab_size: int = VOCAB_SIZE):
    """Train the byte-level BPE tokenizer of ``vocab_size`` on ``corpus`` (None: the synthetic one) and
    wrap it for transformers, with the chat ``template``."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(_corpus(seed) if corpus is None else corpus, trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TEXT_TOKENS])  # same ids
    chat_tokens = [t for t in SPECIAL_TOKENS[1:] if t not in TEXT_TOKENS]
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>",
                                   pad_token="<|endoftext|>",
                                   additional_special_tokens=chat_tokens)
    chat, markers, _ = TEMPLATES[template]
    if markers:  # after the trained tokens: the ids of everything else stay as they are
        fast.add_special_tokens({"additional_special_tokens": chat_tokens + markers})
    fast.chat_template = chat
    fast.model_max_length = MAX_POSITIONS
    return fast


def build_tiny(out_dir: str | Path, size: str = "tiny", seed: int = 0, arch: str = "llama",
               template: str | None = None, corpus: list[str] | None = None, vocab_size: int = VOCAB_SIZE) -> Path:
    """Build and save a randomly initialised ``arch`` model of `size` with the embedded tokenizer and
    the chat ``template`` (None: the family's, `DEFAULT_TEMPLATE`); ``corpus`` and ``vocab_size`` are
    the tokenizer's (`build_tokenizer`), e.g. Python source for a model that will learn code."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    template = template or DEFAULT_TEMPLATE.get(arch, "chatml")
    if template not in TEMPLATES:
        raise ValueError(f"unknown template {template!r}; choose from {', '.join(TEMPLATES)}")
    if size not in SIZES or arch not in ARCHS:  # before the tokenizer's training, not after
        tiny_config(arch, size, vocab_size=VOCAB_SIZE, eos_ids=None, pad_id=None)
    out = Path(out_dir)
    tokenizer = build_tokenizer(seed, template, corpus, vocab_size)
    eos_ids = [tokenizer.convert_tokens_to_ids(t) for t in ("<|endoftext|>", TEMPLATES[template][2])]
    config = tiny_config(arch, size, vocab_size=len(tokenizer), eos_ids=eos_ids, pad_id=eos_ids[0])
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.generation_config = GenerationConfig(eos_token_id=eos_ids, pad_token_id=eos_ids[0])
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def count_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
