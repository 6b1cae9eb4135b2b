"""SFT under torchrun: 2 ranks (gloo, FSDP2) equal 1 process on the same global batch, and resume
across world sizes."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from posttrain.cli import main
from tests.train.test_sft import sft_args


def _metrics(run_dir):
    return [json.loads(l) for l in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def _weights(ckpt):
    return load_file(str(Path(ckpt) / "model.safetensors"))


def assert_same_run(a, b, steps, rel=1e-5):
    ma, mb = _metrics(a), _metrics(b)
    assert [m["step"] for m in ma] == [m["step"] for m in mb] == list(range(1, steps + 1))
    for x, y in zip(ma, mb):
        assert y["loss"] == pytest.approx(x["loss"], rel=rel), (x["step"], x["loss"], y["loss"])
        assert y["grad_norm"] == pytest.approx(x["grad_norm"], rel=rel)  # the sum, not the mean, over ranks
        assert y["tokens"] == x["tokens"]  # the same examples reached the same step
    wa, wb = _weights(Path(a) / "checkpoints" / f"step-{steps}"), _weights(Path(b) / "checkpoints" / f"step-{steps}")
    assert wa.keys() == wb.keys()
    for k in wa:
        torch.testing.assert_close(wb[k], wa[k], rtol=1e-5, atol=1e-6, msg=k)


def test_two_ranks_equal_one_process(nano_model_dir, arith_data_dir, tmp_path, torchrun):
    common = ["num_steps=3", "grad_accum=2", "eval_every=0", "save_every=0", "data.eval_path="]
    assert main(["sft", *sft_args(nano_model_dir, arith_data_dir, tmp_path / "one", *common)]) == 0
    torchrun(2, "sft", *sft_args(nano_model_dir, arith_data_dir, tmp_path / "two", *common))
    assert_same_run(tmp_path / "one", tmp_path / "two", 3)
    w1 = _weights(tmp_path / "one" / "checkpoints" / "step-3")
    w0 = load_file(str(Path(nano_model_dir) / "model.safetensors"))
    assert any(not torch.equal(w0[k], w1[k]) for k in w0), "the run must train for the comparison to mean anything"


def test_grad_accum_not_divisible_by_world_size_is_one_line(nano_model_dir, arith_data_dir, tmp_path, torchrun):
    r = torchrun(2, "sft", *sft_args(nano_model_dir, arith_data_dir, tmp_path / "x", "grad_accum=3"), check=False)
    assert r.returncode != 0 and "grad_accum=3: must be a multiple of the world size (2)" in r.stderr
