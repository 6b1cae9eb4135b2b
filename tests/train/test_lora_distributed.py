"""LoRA sharded with FSDP2: 2 ranks equal 1 process, and the consolidated checkpoint holds the
merged weights plus an adapter gathered from the shards."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from posttrain.cli import main

LORA = ["model.lora.enabled=true", "model.lora.r=4", "optim.lr=1e-2", "optim.eps=1e-6", "num_steps=2",
        "grad_accum=2", "eval_every=0", "save_every=0", "data.max_len=64", "data.tokens_per_batch=512",
        "logging.progress=false"]


def _losses(run):
    return [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_lora_sft_two_ranks_equal_one_process(nano_model_dir, arith_data_dir, tmp_path, torchrun):
    args = [f"model.path={nano_model_dir}", f"data.path={arith_data_dir / 'train.jsonl'}", *LORA]
    assert main(["sft", *args, f"out_dir={tmp_path / 'one'}"]) == 0
    torchrun(2, "sft", *args, f"out_dir={tmp_path / 'two'}")
    assert _losses(tmp_path / "two") == pytest.approx(_losses(tmp_path / "one"), rel=1e-5)
    one, two = (tmp_path / run / "checkpoints" / "step-2" for run in ("one", "two"))
    for name in ("model.safetensors", "adapter/adapter_model.safetensors"):
        a, b = load_file(str(one / name)), load_file(str(two / name))
        assert a.keys() == b.keys() and a, name
        for k in a:
            torch.testing.assert_close(b[k], a[k], rtol=1e-5, atol=1e-5, msg=k)
    base = load_file(str(Path(nano_model_dir) / "model.safetensors"))
    merged = load_file(str(two / "model.safetensors"))
    assert any(not torch.equal(base[k], merged[k]) for k in base), "the adapter must be merged into the export"
