"""The code verifier in the RL loop: a short GRPO run on the toy code task, outcomes in the metrics."""

from __future__ import annotations

import json

import pytest

from posttrain.config import load_config
from posttrain.sandbox.worker import probe
from posttrain.tasks.toy_code import write_toy_code

pytestmark = pytest.mark.skipif(not (probe()["bwrap"] and probe()["root"]), reason="no sandbox here")


@pytest.mark.slow
def test_grpo_step_on_toy_code_logs_outcome_classes(nano_model_dir, tmp_path):
    from posttrain.rl.config import RLConfig
    from posttrain.rl.run import run_rl

    data = tmp_path / "data"
    write_toy_code(data, n_train=8, n_eval=4)
    overrides = {"model.path": nano_model_dir, "data.path": data / "prompts_train.jsonl",
                 "data.eval_path": data / "prompts_eval.jsonl", "verifier": "code",
                 "rollout.group_size": 4, "rollout.max_new_tokens": 12, "prompts_per_step": 4,
                 "num_steps": 2, "eval_every": 0, "save_every": 0, "logging.progress": False,
                 "out_dir": tmp_path / "run"}
    cfg = load_config(RLConfig, None, [f"{k}={v}" for k, v in overrides.items()])
    run_rl(cfg, printer=lambda *_: None)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "outcomes/PASS_frac" in r]
    assert len(steps) == 2
    for r in steps:
        # An untrained model's completions are judged (PASS or MODEL_FAIL), never lost to the machinery.
        assert r["outcomes/PASS_frac"] + r["outcomes/MODEL_FAIL_frac"] == pytest.approx(1.0)
        assert r["outcomes/INFRA_FAIL_frac"] == 0.0 and "time/reward_s" in r
