"""A run stopped or killed while sampling on a ``posttrain serve`` resumes against that same server,
which still holds the versions the stopped run sent (started without --allow-version-rollback)."""

from __future__ import annotations

import json

import pytest

from posttrain.cli import main
from posttrain.config import load_config
from posttrain.rl.config import RLConfig
from posttrain.rl.loop import drive_rl, rl_step, setup
from tests.rollout.test_http_engine import real_server


class Killed(Exception):
    """The trainer dies between two steps (after a sync the last checkpoint does not hold)."""


def _rows(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_stopped_then_killed_run_resumes_twice_against_the_same_server(rl_overrides, reward_plugin,
                                                                         nano_model_dir, tmp_path):
    server = real_server(nano_model_dir)
    args = dict(verifier=f"{reward_plugin}:letters", save_every=2, **{"kl.track": False},
                **{"rollout.backend": "openai", "rollout.urls": json.dumps([server.url])})
    try:
        assert main(["rl", *rl_overrides(**args, num_steps=2)]) == 0  # stopped after 2 steps, checkpointed
        assert server.app.state.serve.version == 2

        run = setup(load_config(RLConfig, None, rl_overrides(**args, num_steps=4)))

        def killed_before_step_4(run, n, timer):
            if n == 4:
                raise Killed
            return rl_step(run, n, timer)

        try:
            with pytest.raises(Killed):
                drive_rl(run, killed_before_step_4, config=run.cfg, name="rl", printer=lambda *_: None)
        finally:
            run.engine.close()
        killed_at = server.app.state.serve.version
        assert killed_at > 2 and not (tmp_path / "run" / "checkpoints" / "step-3").exists()

        assert main(["rl", *rl_overrides(**args, num_steps=4)]) == 0  # resumes from step 2 once more
    finally:
        server.stop()
    rows = _rows(tmp_path / "run")
    assert [m["step"] for m in rows] == [1, 2, 3, 4]
    versions = [m["policy_version"] for m in rows]
    assert versions == sorted(set(versions)) and versions[2] > killed_at  # never a version sent twice
    assert server.app.state.serve.version == versions[-1]
    assert all(m["outcomes/INFRA_FAIL_frac"] == 0 for m in rows)


def test_an_async_run_resumes_against_the_same_server(rl_overrides, reward_plugin, nano_model_dir, tmp_path):
    server = real_server(nano_model_dir)
    args = dict(verifier=f"{reward_plugin}:letters", mode="async", max_staleness=1, save_every=2,
                **{"rollout.backend": "openai", "rollout.urls": json.dumps([server.url])})
    try:
        assert main(["rl", *rl_overrides(**args, num_steps=2)]) == 0
        assert main(["rl", *rl_overrides(**args, num_steps=4)]) == 0
    finally:
        server.stop()
    rows = [m for m in _rows(tmp_path / "run") if m["step"] > 0]
    assert [m["step"] for m in rows] == [1, 2, 3, 4]
    assert server.app.state.serve.version == rows[-1]["policy_version"]
