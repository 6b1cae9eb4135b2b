"""Reward model: learns the embedded pairs, reloads and scores the same, resumes, bad input exit 2."""

import json
import math
from pathlib import Path

import pytest
import torch

from posttrain.cli import main
from posttrain.config import load_config
from posttrain.train.rm import RMConfig, evaluate_pairs, run_rm


@pytest.fixture(scope="module")
def add_pairs_dir(tmp_path_factory):
    """Embedded addition pairs: the rejected trace drops a carry (a slip a small model can spot)."""
    from posttrain.tasks.arithmetic import write_arithmetic

    out = tmp_path_factory.mktemp("add_pairs")
    write_arithmetic(out, digits=2, ops="+", n_train=200, n_eval=60, seed=0)
    return out


def rm_args(model_dir, data_dir, out, *extra):
    return [f"model.path={model_dir}", f"data.path={data_dir / 'pairs_train.jsonl'}",
            f"data.eval_path={data_dir / 'pairs_eval.jsonl'}", "batch_pairs=16", "micro_batch_pairs=8",
            "optim.lr=1e-3", "optim.warmup_steps=2", "logging.progress=false", f"out_dir={out}", *extra]


def rows(run_dir):
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_rm_learns_embedded_pairs_and_reloads_scoring_the_same(nano_model_dir, add_pairs_dir, tmp_path):
    cfg = load_config(RMConfig, None, rm_args(nano_model_dir, add_pairs_dir, tmp_path / "rm",
                                              "num_steps=20", "eval_every=10"))
    summary = run_rm(cfg, printer=lambda *_: None)
    evals = [r for r in rows(tmp_path / "rm") if "eval/accuracy" in r]
    assert [r["step"] for r in evals] == [0, 10, 20]
    assert evals[-1]["eval/accuracy"] >= 0.9 and evals[-1]["eval/accuracy"] > evals[0]["eval/accuracy"]
    assert evals[-1]["eval/loss"] < evals[0]["eval/loss"]
    # A plain transformers reload scores the held-out pairs exactly as the trainer did.
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from posttrain.data.preference import load_tokenized_pairs

    model = AutoModelForSequenceClassification.from_pretrained(summary["checkpoint"])
    tok = AutoTokenizer.from_pretrained(summary["checkpoint"])
    held_out = load_tokenized_pairs(cfg.data, tok, cfg.data.eval_path)
    again = evaluate_pairs(model, held_out, batch_pairs=8, pad_id=tok.pad_token_id)
    assert again["eval/accuracy"] == evals[-1]["eval/accuracy"]
    assert again["eval/margin"] == pytest.approx(evals[-1]["eval/margin"], rel=1e-4)


def test_resume_replays_the_same_batches(nano_model_dir, add_pairs_dir, tmp_path):
    common = ["optim.schedule=constant", "optim.warmup_steps=0", "save_every=2", "eval_every=0",
              "data.eval_path=", "batch_pairs=4", "micro_batch_pairs=2"]
    quiet = dict(printer=lambda *_: None)
    run_rm(load_config(RMConfig, None, rm_args(nano_model_dir, add_pairs_dir, tmp_path / "a", "num_steps=4", *common)), **quiet)
    run_rm(load_config(RMConfig, None, rm_args(nano_model_dir, add_pairs_dir, tmp_path / "b", "num_steps=2", *common)), **quiet)
    messages = []
    run_rm(load_config(RMConfig, None, rm_args(nano_model_dir, add_pairs_dir, tmp_path / "b", "num_steps=4", *common)),
           printer=messages.append)
    assert any("resumed from" in m for m in messages)
    a = [r["loss"] for r in rows(tmp_path / "a") if r["step"] > 0]
    b = [r["loss"] for r in rows(tmp_path / "b") if r["step"] > 0]
    assert len(b) == 4 and b == pytest.approx(a, rel=1e-4)


def test_resuming_a_checkpoint_without_dcp_is_one_line_exit_2(nano_model_dir, add_pairs_dir, tmp_path, capsys):
    # A step folder with trainer_state.pt but no sharded state (what earlier versions wrote).
    old = tmp_path / "old" / "checkpoints" / "step-2"
    old.mkdir(parents=True)
    torch.save({"step": 2}, old / "trainer_state.pt")
    assert main(["rm", *rm_args(nano_model_dir, add_pairs_dir, tmp_path / "old", "num_steps=3")]) == 2
    err = capsys.readouterr().err.strip()
    assert "step-2: no dcp/ folder" in err and "resume=false" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "old" / "metrics.jsonl").exists()


def test_lora_rm_trains_head_and_saves_a_plain_checkpoint(nano_model_dir, add_pairs_dir, tmp_path):
    cfg = load_config(RMConfig, None, rm_args(nano_model_dir, add_pairs_dir, tmp_path / "lora", "num_steps=1",
                                              "model.lora.enabled=true", "data.eval_path="))
    summary = run_rm(cfg, printer=lambda *_: None)
    ckpt = Path(summary["checkpoint"])
    assert (ckpt / "adapter").is_dir() and (ckpt / "config.json").is_file()
    assert math.isfinite(rows(tmp_path / "lora")[-1]["loss"])
    from transformers import AutoModelForSequenceClassification

    assert AutoModelForSequenceClassification.from_pretrained(ckpt).score.weight.shape[0] == 1


@pytest.mark.parametrize("row,needle", [
    ('{"prompt": "p", "chosen": "a"}', "bad.jsonl:2: missing field 'rejected'"),
    ('{"prompt": "p", "chosen": "", "rejected": "b"}', "bad.jsonl:2: field 'chosen' is empty"),
    ('{"prompt": "p", "chosen": "b", "rejected": "b"}', "bad.jsonl:2: 'chosen' and 'rejected' are identical"),
])
def test_bad_pairs_exit_2_one_line_nothing_written(nano_model_dir, add_pairs_dir, tmp_path, capsys, row, needle):
    (tmp_path / "bad.jsonl").write_text('{"prompt": "p", "chosen": "a", "rejected": "b"}\n' + row + "\n")
    args = rm_args(nano_model_dir, add_pairs_dir, tmp_path / "out") + [f"data.path={tmp_path / 'bad.jsonl'}"]
    assert main(["rm", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("override,needle", [
    ("data.invalid=maybe", "data.invalid: must be error or drop"),
    ("batch_pairs=0", "batch_pairs: must be >= 1"),
    ("model.path=/nonexistent/rm", "model.path=/nonexistent/rm: model folder does not exist"),
])
def test_bad_config_exit_2(nano_model_dir, add_pairs_dir, tmp_path, capsys, override, needle):
    assert main(["rm", *rm_args(nano_model_dir, add_pairs_dir, tmp_path / "out"), override]) == 2
    assert needle in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
