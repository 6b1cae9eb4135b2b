"""`posttrain make-tiny --arch`: every family builds offline, loads with the Auto classes, keeps the
embedded tokenizer's splits, and runs in the rollout engine as `model.generate` does."""

from __future__ import annotations

import functools

import pytest
import torch

from posttrain.cli import main
from posttrain.models import tiny
from posttrain.rollout import SamplingParams, TorchEngine

MODEL_TYPES = {"llama": "llama", "qwen3": "qwen3", "mistral": "mistral", "phi3": "phi3", "gemma2": "gemma2",
               "gemma3": "gemma3_text"}
FAST = {"llama", "qwen3", "mistral"}
TEXT = "<|im_start|>user\nSolve: 417 × 38<|im_end|>\n<|im_start|>assistant\n<think>def f(x):\n    return x</think>"


@pytest.fixture(scope="module", autouse=True)
def one_tokenizer():
    """The tokenizer is trained once for the module (the same seed gives the same one)."""
    original = tiny.build_tokenizer
    tiny.build_tokenizer = functools.cache(original)
    yield original(0)
    tiny.build_tokenizer = original


def test_every_family_has_a_test():
    assert set(MODEL_TYPES) == set(tiny.ARCHS)


@pytest.mark.parametrize("arch", list(tiny.ARCHS))
def test_make_tiny_builds_each_family(arch, tmp_path, capsys, one_tokenizer):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert main(["make-tiny", str(tmp_path), "--size", "nano", "--arch", arch]) == 0
    assert f"nano {arch} model" in capsys.readouterr().out
    model = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    tok = AutoTokenizer.from_pretrained(tmp_path)
    assert model.config.model_type == MODEL_TYPES[arch]
    if arch in ("mistral", "gemma2", "gemma3"):
        assert model.config.sliding_window == tiny.WINDOW
    assert tok(TEXT)["input_ids"] == one_tokenizer(TEXT)["input_ids"]
    engine = TorchEngine(str(tmp_path))
    assert engine.backend == ("fast" if arch in FAST else "hf")
    prompt = tok(TEXT)["input_ids"]
    r = engine.generate([prompt], n=1, sampling=SamplingParams(temperature=0.0, max_new_tokens=12, ignore_eos=True))
    ids = torch.tensor([prompt])
    expected = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=12,
                              eos_token_id=None)[0, len(prompt):].tolist()
    assert r.completion_ids[0] == expected


def test_unknown_arch_is_refused_before_the_tokenizer_is_trained(tmp_path):
    with pytest.raises(ValueError, match="unknown arch 'falcon'"):
        tiny.build_tiny(tmp_path / "m", "nano", arch="falcon")
    assert not (tmp_path / "m").exists()


def test_think_tokens_are_plain_added_tokens_that_decoding_keeps(one_tokenizer):
    from posttrain.models.tiny import SPECIAL_TOKENS

    assert one_tokenizer.convert_tokens_to_ids(SPECIAL_TOKENS) == [0, 1, 2, 3, 4]  # reserved ids, first
    ids = one_tokenizer(TEXT)["input_ids"]
    assert ids.count(3) == 1 and ids.count(4) == 1  # one token each, never split
    text = one_tokenizer.decode(ids, skip_special_tokens=True)
    assert "<think>def f(x):\n    return x</think>" in text  # as Qwen3's: a trace's ends survive decoding
    assert "<|im_start|>" not in text and "<|im_end|>" not in text  # the chat markers stay special
