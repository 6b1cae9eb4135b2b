"""FastLlamaDecoder's CPU paths against the model's own forward, on a tiny random Llama."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from posttrain.rollout import fast_llama
from posttrain.rollout.fast_llama import FastLlamaDecoder, lm_head_blocks
from tests.rollout.conftest import make_model


def test_the_lm_head_in_blocks_gives_the_models_logits(monkeypatch):
    model = make_model()
    weight = model.lm_head.weight  # (128, 64)
    monkeypatch.setattr(fast_llama, "LM_HEAD_BLOCK_BYTES", 48 * weight.shape[1] * weight.element_size())
    decoder = FastLlamaDecoder(model)
    assert [w.shape[0] for w, _ in decoder.lm_head_blocks] == [48, 48, 32]
    prompt = [5, 6, 7, 8]
    prefill = decoder.prefill(torch.tensor([prompt]), torch.tensor([0]), torch.tensor([0, 0]), 8)
    step = decoder.step(torch.tensor([9, 10]))
    with torch.no_grad():
        ref = model(torch.tensor([prompt + [9], prompt + [10]])).logits
    torch.testing.assert_close(prefill, ref[:, 3], atol=1e-5, rtol=0)
    torch.testing.assert_close(step, ref[:, 4], atol=1e-5, rtol=0)


def test_lm_head_blocks_keep_each_rows_bias(monkeypatch):
    monkeypatch.setattr(fast_llama, "LM_HEAD_BLOCK_BYTES", 3 * 4 * 4)
    weight, bias, x = torch.randn(10, 4), torch.randn(10), torch.randn(2, 4)
    blocks = lm_head_blocks(weight, bias)
    assert [w.shape[0] for w, _ in blocks] == [3, 3, 3, 1]
    torch.testing.assert_close(torch.cat([F.linear(x, w, b) for w, b in blocks], -1), F.linear(x, weight, bias))
    monkeypatch.setattr(fast_llama, "LM_HEAD_BLOCK_BYTES", 10 * 4 * 4)  # one block: one matmul
    assert lm_head_blocks(weight, bias) is None
