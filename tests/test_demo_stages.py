"""A finished demo stage is reused only when made with the same settings (paths aside), and a stage
made otherwise is refused, naming its folder; the code demo's start stages go through the check."""

import argparse
import shutil

import pytest

from posttrain.config import load_config, save_config
from posttrain.demo.stages import finished_stage
from posttrain.errors import UserError
from posttrain.train.sft import SFTConfig


def _cfg(out_dir, *more):
    return load_config(SFTConfig, None, [f"model.path={out_dir.parent / 'model'}", f"data.path={out_dir.parent / 'd.jsonl'}",
                                         "num_steps=4", "optim.lr=1e-3", f"out_dir={out_dir}", *more])


def _finished(out_dir, step=4):
    """What a finished SFT run leaves: its config and a complete checkpoint."""
    cfg = _cfg(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_config(cfg, out_dir / "config.yaml")
    ckpt = out_dir / "checkpoints" / f"step-{step}"
    ckpt.mkdir(parents=True)
    (ckpt / "trainer_state.pt").write_bytes(b"")
    return ckpt


def test_a_finished_stage_is_reused_only_with_the_same_settings(tmp_path, capsys):
    stage = tmp_path / "a" / "midtrain"
    assert finished_stage(_cfg(stage)) is None  # nothing there yet: train
    ckpt = _finished(stage)
    assert finished_stage(_cfg(stage, "logging.progress=false")) == str(ckpt)
    assert "finished with these settings" in capsys.readouterr().out
    # moved elsewhere (every path differs): the same stage
    moved = tmp_path / "b" / "midtrain"
    shutil.copytree(stage, moved)
    assert finished_stage(_cfg(moved)) == str(moved / "checkpoints" / "step-4")
    with pytest.raises(UserError, match=rf"^{stage}: holds a stage made with other settings \(differing: optim\.lr\)"):
        finished_stage(_cfg(stage, "optim.lr=3e-3"))
    with pytest.raises(UserError, match=r"\(differing: num_steps, seed\)"):
        finished_stage(_cfg(stage, "num_steps=8", "seed=1"))


def test_an_interrupted_stage_with_the_same_settings_is_left_to_resume(tmp_path):
    stage = tmp_path / "midtrain"
    _finished(stage, step=2)
    assert finished_stage(_cfg(stage)) is None
    with pytest.raises(UserError, match="optim.lr"):
        finished_stage(_cfg(stage, "optim.lr=3e-3"))


def test_the_code_demo_reuses_its_finished_midtraining_and_refuses_another(tmp_path, monkeypatch):
    from posttrain.demo import code
    from posttrain.train import sft

    monkeypatch.setattr(sft, "run_sft", lambda cfg: pytest.fail("trained again"))
    p = code.PROFILES["quick"]
    args = argparse.Namespace(seed=0, no_progress=True)
    paths = {"model": str(tmp_path / "model"), "stdlib": str(tmp_path / "stdlib.jsonl")}
    cfg = load_config(SFTConfig, None, [  # the demo's own settings, as its run saved them
        f"model.path={paths['model']}", f"data.path={paths['stdlib']}", "data.mode=raw", "data.max_len=256",
        "data.tokens_per_batch=4096", f"optim.lr={p['midtrain_lr']}", f"num_steps={p['midtrain_steps']}",
        "eval_every=0", "optim.warmup_steps=20", "save_every=0", "seed=0", f"out_dir={tmp_path / 'midtrain'}"])
    ckpt = tmp_path / "midtrain" / "checkpoints" / f"step-{p['midtrain_steps']}"
    ckpt.mkdir(parents=True)
    save_config(cfg, tmp_path / "midtrain" / "config.yaml")
    (ckpt / "trainer_state.pt").write_bytes(b"")
    assert code.stage_midtrain(tmp_path, p, paths, args) == str(ckpt)
    with pytest.raises(UserError, match=r"midtrain: holds a stage made with other settings \(differing: seed\)"):
        code.stage_midtrain(tmp_path, p, paths, argparse.Namespace(seed=1, no_progress=True))
