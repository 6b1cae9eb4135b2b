"""SFT trainer: learning, gradient-accumulation invariance, resume after kill -9, bad input, CLI."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from posttrain.cli import main
from posttrain.config import load_config
from posttrain.train.sft import SFTConfig, run_sft


def sft_args(model_dir, data_dir, out, *extra):
    return [f"model.path={model_dir}", f"data.path={data_dir / 'train.jsonl'}",
            f"data.eval_path={data_dir / 'eval.jsonl'}", "data.max_len=64", "data.tokens_per_batch=512",
            "optim.lr=3e-3", "optim.warmup_steps=2", "logging.progress=false", f"out_dir={out}", *extra]


def losses(run_dir):
    return [json.loads(l)["loss"] for l in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def test_sft_lowers_eval_loss_and_checkpoint_loads(nano_model_dir, arith_data_dir, tmp_path):
    cfg = load_config(SFTConfig, None, sft_args(nano_model_dir, arith_data_dir, tmp_path / "run",
                                                "num_steps=30", "eval_every=10", "eval_generate=4"))
    summary = run_sft(cfg, printer=lambda *_: None)
    rows = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    evals = [r["eval/loss"] for r in rows if "eval/loss" in r]
    assert len(evals) == 3 and evals[-1] < evals[0] - 0.5
    accuracies = [r["eval/heldout/greedy/pass@1"] for r in rows if "eval/heldout/greedy/pass@1" in r]
    assert len(accuracies) == 3 and all(a in (0.0, 0.25, 0.5, 0.75, 1.0) for a in accuracies)
    for key in ("step", "loss", "lr", "tokens_per_s", "time/step_s"):
        assert key in rows[-1]
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(summary["checkpoint"])
    tok = AutoTokenizer.from_pretrained(summary["checkpoint"])
    out = model.generate(**tok("Solve: 12 × 34", return_tensors="pt"), max_new_tokens=4, do_sample=False)
    assert out.shape[1] > 4
    assert (tmp_path / "run" / "config.yaml").exists()


def test_grad_accum_matches_one_big_batch(nano_model_dir, arith_data_dir, tmp_path):
    """2 micro-batches of 256 tokens vs 1 of 512 give the same step when packing yields the same rows."""
    from posttrain.data.packing import collate
    from posttrain.models.hf import ModelConfig, load_model, load_tokenizer
    from posttrain.core.optim import OptimConfig, build_optimizer, build_scheduler
    from posttrain.train.sft import SFTDataConfig, SFTTrainer, load_sft_data

    tok = load_tokenizer(str(nano_model_dir))
    ex = load_sft_data(SFTDataConfig(path="x", max_len=64), tok, str(arith_data_dir / "train.jsonl"))[:8]
    results = []
    for split in ([list(range(8))], [list(range(4)), list(range(4, 8))]):
        torch.manual_seed(0)
        model = load_model(ModelConfig(path=str(nano_model_dir)))
        opt = build_optimizer(model.parameters(), OptimConfig(lr=1e-3, warmup_steps=0))
        trainer = SFTTrainer(model, opt, build_scheduler(opt, OptimConfig(lr=1e-3, warmup_steps=0), 1), grad_clip=0)
        micro = [collate(ex, idx, pack=False, seq_len=64) for idx in split]
        m = trainer.train_step(micro)
        results.append((m["loss"], m["grad_norm"]))
    assert results[0][0] == pytest.approx(results[1][0], rel=1e-5)
    assert results[0][1] == pytest.approx(results[1][1], rel=1e-4)


@pytest.mark.parametrize("pack", [False, True])
def test_the_chunked_head_takes_the_steps_full_logits_take(nano_model_dir, arith_data_dir, pack):
    """The default SFT loss (hidden states out of the forward, the head in chunks) against the model's
    own logits: the same losses, gradient norms and weights over three steps, packed rows too."""
    from posttrain.data.packing import collate
    from posttrain.models.hf import ModelConfig, load_model, load_tokenizer
    from posttrain.train.sft import SFTDataConfig, SFTTrainer, load_sft_data

    tok = load_tokenizer(str(nano_model_dir))
    ex = load_sft_data(SFTDataConfig(path="x", max_len=64), tok, str(arith_data_dir / "train.jsonl"))[:12]
    trainers = []
    for chunked in (False, True):
        model = load_model(ModelConfig(path=str(nano_model_dir)))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
        trainers.append(SFTTrainer(model, opt, sched, grad_clip=0, chunked_head=chunked))
    for step in range(3):
        micro = [collate(ex, list(range(4 * step, 4 * step + 4)), pack=pack, seq_len=64)]
        full, chunked = (t.train_step(micro) for t in trainers)
        assert chunked["loss"] == pytest.approx(full["loss"], rel=1e-6)
        assert chunked["grad_norm"] == pytest.approx(full["grad_norm"], rel=1e-5)
    for (name, p), q in zip(trainers[0].model.named_parameters(), trainers[1].model.parameters()):
        torch.testing.assert_close(q, p, atol=1e-6, rtol=1e-5, msg=name)


def _cli(*args):
    return [sys.executable, "-m", "posttrain.cli", *args]


def test_resume_after_kill_reaches_same_losses(nano_model_dir, arith_data_dir, tmp_path):
    common = ["num_steps=10", "save_every=2", "keep_last=3", "eval_every=0"]
    ref = tmp_path / "ref"
    assert main(["sft", *sft_args(nano_model_dir, arith_data_dir, ref, *common)]) == 0  # in-process: no kill
    killed = tmp_path / "killed"
    proc = subprocess.Popen(_cli("sft", *sft_args(nano_model_dir, arith_data_dir, killed, *common)),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while not (killed / "checkpoints" / "step-4" / "trainer_state.pt").exists():
        assert proc.poll() is None and time.time() < deadline, "run ended before its step-4 checkpoint"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert len(losses(killed)) < 10, "the run finished before it was killed"
    done = subprocess.run(_cli("sft", *sft_args(nano_model_dir, arith_data_dir, killed, *common)),
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "resumed from" in done.stdout
    assert losses(killed) == pytest.approx(losses(ref), rel=1e-4, abs=1e-5)


@pytest.mark.parametrize("bad,needle", [
    ("model.path={tmp}/missing", "model.path={tmp}/missing: model folder does not exist"),
    ("data.path={tmp}/bad.jsonl", "bad.jsonl:2: "),
    ("num_steps=abc", "num_steps: expected an integer"),
    ("optim.lrr=1", "unknown key 'optim.lrr'"),
])
def test_bad_input_exit_2_one_line(nano_model_dir, arith_data_dir, tmp_path, capsys, bad, needle):
    (tmp_path / "bad.jsonl").write_text('{"prompt": "a", "completion": "b"}\n{"prompt": oops}\n')
    args = sft_args(nano_model_dir, arith_data_dir, tmp_path / "out") + [bad.format(tmp=tmp_path)]
    assert main(["sft", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert needle.format(tmp=tmp_path) in err and len(err.splitlines()) == 1
    assert not (tmp_path / "out").exists(), "bad input must not leave a half-written run directory"


def test_malformed_yaml_exit_2(tmp_path, capsys):
    (tmp_path / "r.yaml").write_text("model:\n  path: [unclosed\n")
    assert main(["sft", str(tmp_path / "r.yaml")]) == 2
    err = capsys.readouterr().err
    assert "r.yaml:3: malformed YAML" in err and len(err.strip().splitlines()) == 1


def test_help_lists_keys(capsys):
    with pytest.raises(SystemExit) as e:
        main(["sft", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "optim.lr" in out and "data.path" in out


def test_latest_checkpoint_skips_a_save_killed_half_way(tmp_path):
    from posttrain.tracking import latest_checkpoint

    for name in ("step-2", "step-10", "step-12.tmp"):
        (tmp_path / "checkpoints" / name).mkdir(parents=True)
        (tmp_path / "checkpoints" / name / "trainer_state.pt").write_bytes(b"x")
    (tmp_path / "checkpoints" / "step-11").mkdir()  # no trainer state: incomplete
    assert latest_checkpoint(tmp_path).name == "step-10"


def test_resuming_another_kind_of_run_is_one_line_not_a_traceback(nano_model_dir, arith_data_dir, tmp_path):
    """A LoRA run pointed at a full-weights run's folder: its checkpoint holds other weights."""
    common = ["num_steps=2", "save_every=2", "eval_every=0"]
    run = tmp_path / "run"
    assert main(["sft", *sft_args(nano_model_dir, arith_data_dir, run, *common)]) == 0  # the run to resume
    again = subprocess.run(_cli("sft", *sft_args(nano_model_dir, arith_data_dir, run, *common,
                                                  "model.lora.enabled=true", "num_steps=4")),
                           capture_output=True, text=True)
    assert again.returncode == 2, again.stderr
    assert "Traceback" not in again.stderr
    assert again.stderr.strip().splitlines()[-1] == (
        f"posttrain sft: error: {run}/checkpoints/step-2: holds other weights than this run trains (written with "
        "other settings: LoRA or full weights, another model or algorithm); use a new out_dir, or resume=false")


def test_running_a_finished_run_again_says_so(nano_model_dir, arith_data_dir, tmp_path):
    args = sft_args(nano_model_dir, arith_data_dir, tmp_path / "run", "num_steps=2", "save_every=2", "eval_every=0")
    assert main(["sft", *args]) == 0  # the finished run; the command line runs it again
    again = subprocess.run(_cli("sft", *args), capture_output=True, text=True, check=True)
    assert again.stdout.strip().splitlines()[-1] == (
        f"sft: {tmp_path / 'run'} already ran its 2 steps, nothing to train (raise num_steps to go on); "
        f"checkpoint {tmp_path / 'run' / 'checkpoints' / 'step-2'}")
