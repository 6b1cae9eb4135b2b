"""`posttrain rl` and `posttrain eval` with ``env.name=swe`` on the tiny model: a few steps, sync and
async, on SWE-bench-format records read as published (no ``prompt`` field), every episode judged by
the project's tests in the sandbox: none INFRA_FAIL, and the report's Episodes panel filled."""

from __future__ import annotations

import json

import pytest

from posttrain.cli import main
from posttrain.config import load_config
from posttrain.rl.config import RLConfig
from posttrain.rl.run import run_rl
from tests.envs.swe_project import make_record


@pytest.fixture
def swe_data(tmp_path):
    record = make_record(tmp_path)
    path = tmp_path / "swe.jsonl"
    path.write_text(json.dumps(record) + "\n" + json.dumps({**record, "instance_id": "calc__calc-2"}) + "\n")
    return path


def _rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_few_rl_steps_on_swe_tasks(nano_model_dir, swe_data, tmp_path, mode):
    extra = {"mode": "async", "max_staleness": 1, "asynchrony.self_test": False} if mode == "async" else {}
    settings = {"model.path": nano_model_dir, "data.path": swe_data, "rollout.group_size": 2,
                "rollout.max_new_tokens": 24, "prompts_per_step": 2, "num_steps": 2, "eval_every": 0, "save_every": 0,
                "logging.progress": False, "out_dir": tmp_path / "run", "env.name": "swe",
                "env.tools_style": "none", "env.max_turns": 2, "env.max_total_tokens": 1024, **extra}
    cfg = load_config(RLConfig, None, [f"{k}={v}" for k, v in settings.items()])
    run_rl(cfg, printer=lambda *_: None)
    rows = [r for r in _rows(tmp_path / "run") if "env/turns_mean" in r]
    assert len(rows) == 2
    assert all(r["outcomes/INFRA_FAIL_frac"] == 0.0 and r["outcomes/TASK_FAIL_frac"] == 0.0 for r in rows), rows
    assert all(r["env/turns_mean"] >= 1 for r in rows)
    assert all(r["env/fail_to_pass_mean"] == 0.0 and r["env/pass_to_pass_mean"] == 1.0 for r in rows)
    assert main(["report", str(tmp_path / "run"), "--out", str(tmp_path / "report.html")]) == 0
    assert "<h3>Episodes</h3>" in (tmp_path / "report.html").read_text()


@pytest.mark.slow
def test_eval_on_swe_tasks(nano_model_dir, swe_data, tmp_path):
    out = tmp_path / "eval"
    assert main(["eval", "benchmarks=[{kind: env, name: swe, path: " + str(swe_data) + ", env: {name: swe, "
                 "tools_style: none, max_turns: 2, max_total_tokens: 1024}}]",
                 "profiles=[{name: sampled, temperature: 1.0, n: 2, max_new_tokens: 24}]", f"model={nano_model_dir}",
                 f"out_dir={out}", "--no-progress"]) == 0
    (result,) = json.loads((out / "eval.json").read_text())["results"]
    assert result["n"] == 2 and result["num_problems"] == 2
    assert 1.0 <= result["env"]["env/turns_mean"] <= 2.0
    assert result["env"]["env/fail_to_pass_mean"] == 0.0 and result["env"]["env/pass_to_pass_mean"] == 1.0
    samples = [json.loads(line) for line in (out / "samples" / "swe.sampled.jsonl").read_text().splitlines()]
    assert len(samples) == 4 and all(s["outcome"] in ("PASS", "MODEL_FAIL") for s in samples), samples
