"""SFT under torchrun: 2 ranks (gloo, FSDP2) equal 1 process on the same global batch (LoRA too),
and resume across world sizes."""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
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


EQUAL = ["num_steps=3", "grad_accum=2", "eval_every=0", "save_every=0", "data.eval_path="]


def _shared(grad_accum):
    """The default grad_accum=1 (and 3) at 2 ranks. (Adam's eps above the rounding noise of
    near-zero gradients, whose sums run in another order when a micro-batch is split: at 1e-8 Adam
    turns that noise into lr-sized steps, 3.5e-6 apart after two steps.)"""
    return ["num_steps=2", f"grad_accum={grad_accum}", "eval_every=0", "save_every=0", "data.eval_path=",
            "optim.eps=1e-5"]


LORA = ["model.lora.enabled=true", "model.lora.r=4", "optim.lr=1e-2", "optim.eps=1e-6", "num_steps=2",
        "grad_accum=2", "eval_every=0", "save_every=0", "data.max_len=64", "data.tokens_per_batch=512",
        "logging.progress=false"]


def _lora_args(model_dir, data_dir, out):
    return [f"model.path={model_dir}", f"data.path={data_dir / 'train.jsonl'}", *LORA, f"out_dir={out}"]


# test -> its command line (model, data, run dir, the test's parameters)
TWO_RANK_RUNS = {
    "test_two_ranks_equal_one_process": lambda model, data, out: sft_args(model, data, out, *EQUAL),
    "test_fewer_or_unequal_micro_batches_than_ranks_share_each_one":
        lambda model, data, out, grad_accum: sft_args(model, data, out, *_shared(grad_accum)),
    "test_lora_sft_two_ranks_equal_one_process": _lora_args,
}


@pytest.fixture(scope="module")
def two_ranks(request, nano_model_dir, arith_data_dir, tmp_path_factory, torchrun_each):
    """Every selected test's 2-rank run, all in one torchrun launch (a launch's imports cost more
    than the runs' steps): (test name -> (run dir, process 0's output), the ranks' stderr)."""
    root, cases = tmp_path_factory.mktemp("sft-two-ranks"), {}
    for item in request.session.items:
        if item.path == request.path and item.originalname in TWO_RANK_RUNS:
            params = item.callspec.params if hasattr(item, "callspec") else {}
            argv = TWO_RANK_RUNS[item.originalname](nano_model_dir, arith_data_dir, root / item.name, **params)
            cases[item.name] = ["sft", *argv]
    outputs, stderr = torchrun_each(2, cases)
    return {name: (root / name, out) for name, out in outputs.items()}, stderr


def test_two_ranks_equal_one_process(nano_model_dir, arith_data_dir, tmp_path, request, two_ranks):
    assert main(["sft", *sft_args(nano_model_dir, arith_data_dir, tmp_path / "one", *EQUAL)]) == 0
    (two, out), stderr = two_ranks[0][request.node.name], two_ranks[1]
    assert out.count("sft done") == 1, out  # only process 0 prints
    assert "returned a view tensor" not in stderr  # FSDP2's warning about the chunked head's output
    assert_same_run(tmp_path / "one", two, 3)
    w1 = _weights(tmp_path / "one" / "checkpoints" / "step-3")
    w0 = load_file(str(Path(nano_model_dir) / "model.safetensors"))
    assert any(not torch.equal(w0[k], w1[k]) for k in w0), "the run must train for the comparison to mean anything"


@pytest.mark.parametrize("grad_accum", [1, pytest.param(3, marks=pytest.mark.slow)])  # 3: the slow lane
def test_fewer_or_unequal_micro_batches_than_ranks_share_each_one(nano_model_dir, arith_data_dir, tmp_path, request,
                                                                  two_ranks, grad_accum):
    """Each rank takes half of every micro-batch's examples, and the step is the one-process step."""
    assert main(["sft", *sft_args(nano_model_dir, arith_data_dir, tmp_path / "one", *_shared(grad_accum))]) == 0
    assert_same_run(tmp_path / "one", two_ranks[0][request.node.name][0], 2)


def test_lora_sft_two_ranks_equal_one_process(nano_model_dir, arith_data_dir, tmp_path, request, two_ranks):
    """LoRA sharded with FSDP2: 2 ranks equal 1 process, and the consolidated checkpoint holds the
    merged weights plus an adapter gathered from the shards."""
    assert main(["sft", *_lora_args(nano_model_dir, arith_data_dir, tmp_path / "one")]) == 0
    one, two = tmp_path / "one", two_ranks[0][request.node.name][0]
    assert [m["loss"] for m in _metrics(two)] == pytest.approx([m["loss"] for m in _metrics(one)], rel=1e-5)
    one, two = (run / "checkpoints" / "step-2" for run in (one, two))
    for name in ("model.safetensors", "adapter/adapter_model.safetensors"):
        a, b = load_file(str(one / name)), load_file(str(two / name))
        assert a.keys() == b.keys() and a, name
        for k in a:
            torch.testing.assert_close(b[k], a[k], rtol=1e-5, atol=1e-5, msg=k)
    base = load_file(str(Path(nano_model_dir) / "model.safetensors"))
    merged = load_file(str(two / "model.safetensors"))
    assert any(not torch.equal(base[k], merged[k]) for k in base), "the adapter must be merged into the export"


def _torchrun_cmd(nproc, *args):
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            "-m", "posttrain", *map(str, args)]


def _greedy(ckpt, prompt="Solve: 12 × 34", new_tokens=6):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(ckpt))
    tok = AutoTokenizer.from_pretrained(str(ckpt))
    return model.generate(**tok(prompt, return_tensors="pt"), max_new_tokens=new_tokens, do_sample=False,
                          min_new_tokens=new_tokens)[0].tolist()


# The slow lane's: four launches (~60 s on a worker). The default suite resumes across world sizes
# (tests/train/test_pairwise_distributed.py, one process to two ranks) and after kill -9 in one
# process (tests/train/test_sft.py).
@pytest.mark.slow
@pytest.mark.long
def test_kill_two_ranks_then_resume_on_two_and_on_one(nano_model_dir, arith_data_dir, tmp_path, torchrun):
    """kill -9 of a 2-rank run after a checkpoint; resuming its run directory at world size 2 and at
    world size 1 (DCP re-shards) both reach the uninterrupted 2-rank run's losses and weights."""
    steps = 10
    common = [f"num_steps={steps}", "grad_accum=2", "save_every=2", "keep_last=3", "eval_every=0",
              "data.eval_path="]
    ref = tmp_path / "ref"
    torchrun(2, "sft", *sft_args(nano_model_dir, arith_data_dir, ref, *common))

    killed = tmp_path / "killed"
    proc = subprocess.Popen(_torchrun_cmd(2, "sft", *sft_args(nano_model_dir, arith_data_dir, killed, *common)),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.time() + 120
        while not (killed / "checkpoints" / "step-2" / "trainer_state.pt").exists():
            assert proc.poll() is None and time.time() < deadline, "run ended before its step-2 checkpoint"
            time.sleep(0.01)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # torchrun and both ranks
        proc.wait()
    done = len(_metrics(killed))
    assert done < steps, "the run finished before it was killed"

    two, one = tmp_path / "resumed-2", tmp_path / "resumed-1"
    shutil.copytree(killed, two)
    shutil.copytree(killed, one)
    r = torchrun(2, "sft", *sft_args(nano_model_dir, arith_data_dir, two, *common))
    assert "resumed from" in r.stdout
    one_process = [sys.executable, "-m", "posttrain", "sft", *sft_args(nano_model_dir, arith_data_dir, one, *common)]
    r = subprocess.run(one_process, check=False, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-4000:]
    assert "resumed from" in r.stdout

    final = f"checkpoints/step-{steps}"
    expected = _greedy(ref / final)
    for run in (two, one):
        assert_same_run(ref, run, steps)  # per-step losses, grad norms, tokens and the final weights
        assert _greedy(run / final) == expected
