"""FSDP2 at 2 ranks (gloo, CPU, float32) equals one process on SmolLM2-135M-Instruct, whose lm_head
is tied to its embedding.

One `posttrain sft` step over four chat records, once in this process and once under torchrun at 2
ranks (each rank takes half the records): the step's loss and gradient norm, and every updated
weight of the step-1 checkpoint, equal the one-process run's. The tie is the trap: where FSDP2
sharded the embedding and lm_head as two parameters, the embedding would get only its input
gradient and would differ from the one-process embedding, which gets both. The checkpoint writes
the tied matrix once, as the embedding."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from posttrain.cli import main

pytestmark = pytest.mark.real

CHATS = [("What is the capital of France?", "The capital of France is Paris."),
         ("Name a primary colour.", "Red is a primary colour."),
         ("What is 2 + 3?", "2 + 3 = 5."),
         ("Write a Python expression for the square of x.", "x ** 2")]

WEIGHT_TOL = {"rtol": 1e-5, "atol": 1e-6}
"""float32: the 2 ranks sum each gradient in another order (reduce-scatter) than one process does."""


def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _sft_args(model_dir: str, data: Path, out: Path) -> list[str]:
    # Adam's eps above the rounding noise of near-zero gradients (tests/train/test_sft_distributed.py)
    return [f"model.path={model_dir}", f"data.path={data}", "data.max_len=64", "data.tokens_per_batch=256",
            "data.use_chat_template=true", "num_steps=1", "optim.lr=1e-4", "optim.eps=1e-5",
            "optim.warmup_steps=0", "optim.schedule=constant", "eval_every=0", "save_every=1",
            "logging.progress=false", f"out_dir={out}"]


def test_sft_step_two_ranks_equal_one_process_with_the_tie(smollm2_dir, tmp_path, torchrun):
    data = tmp_path / "chats.jsonl"
    data.write_text("".join(json.dumps({"messages": [{"role": "user", "content": q},
                                                     {"role": "assistant", "content": a}]}) + "\n"
                            for q, a in CHATS))
    assert main(["sft", *_sft_args(smollm2_dir, data, tmp_path / "one")]) == 0
    r = torchrun(2, "sft", *_sft_args(smollm2_dir, data, tmp_path / "two"))
    assert r.stdout.count("sft done") == 1, r.stdout
    (one,), (two,) = _metrics(tmp_path / "one"), _metrics(tmp_path / "two")
    assert two["tokens"] == one["tokens"]
    assert two["loss"] == pytest.approx(one["loss"], rel=1e-5)
    w1 = load_file(str(tmp_path / "one" / "checkpoints" / "step-1" / "model.safetensors"))
    w2 = load_file(str(tmp_path / "two" / "checkpoints" / "step-1" / "model.safetensors"))
    assert w1.keys() == w2.keys() and "lm_head.weight" not in w1  # tied: written once, as the embedding
    for k in w1:
        torch.testing.assert_close(w2[k], w1[k], **WEIGHT_TOL, msg=k)
    # the norm of 134.5M gradient entries, summed per shard then over ranks: 1.2e-5 apart (measured)
    assert two["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-4)
    base = load_file(str(Path(smollm2_dir) / "model.safetensors"))["model.embed_tokens.weight"]
    moved = (w1["model.embed_tokens.weight"] - base).abs().max()
    assert moved > 1e-5  # the step moved the tied matrix, so the comparison above means something
