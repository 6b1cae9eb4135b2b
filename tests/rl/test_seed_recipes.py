"""The seed's two recipes (examples/seed_direct.yaml, examples/seed_reasoning.yaml): the settings the
seed states, the reward each builds judged on KodCode records as published, and each run for two RL
steps on a tiny model with only paths and lengths overridden (slow; against a real vLLM server: -m vllm)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from posttrain.config import load_config
from posttrain.rl.config import RLConfig
from posttrain.sandbox.worker import probe

ROOT = Path(__file__).resolve().parents[2]
KODCODE = ROOT / "tests" / "data" / "formats" / "kodcode.jsonl"
RECIPES = {"direct": ROOT / "examples" / "seed_direct.yaml", "reasoning": ROOT / "examples" / "seed_reasoning.yaml"}
needs_sandbox = pytest.mark.skipif(not (probe()["bwrap"] and probe()["root"]), reason="no sandbox here")


def _config(name: str, overrides: dict | None = None) -> RLConfig:
    return load_config(RLConfig, str(RECIPES[name]), [f"{k}={v}" for k, v in (overrides or {}).items()])


@pytest.mark.parametrize("name,algorithm,aggregation,max_new,thinking,fmt", [
    ("direct", "grpo", "seq_mean_token_mean", 2048, False, 0.0),
    ("reasoning", "dr_grpo", "seq_mean_token_sum_norm", 8192, True, 0.05),
])
def test_the_recipes_state_the_seeds_settings(name, algorithm, aggregation, max_new, thinking, fmt):
    cfg = _config(name)
    assert (cfg.algorithm, cfg.aggregation_mode, cfg.rollout.max_new_tokens, cfg.data.thinking) == \
        (algorithm, aggregation, max_new, thinking)
    assert (cfg.verifier, cfg.format_weight, cfg.seed, cfg.rollout.group_size) == ("code", fmt, 42, 8)
    assert cfg.prompts_per_step * cfg.num_steps == 1000  # 1,000 prompts, one epoch
    assert (cfg.model.lora.enabled, cfg.model.lora.r) == (True, 32)
    assert (cfg.rollout.backend, cfg.rollout.vllm.launch, cfg.kl.coef) == ("vllm", 1, 0.0)
    assert cfg.rollout.vllm.max_model_len >= max_new + 1024  # room for the prompt
    if fmt:
        assert cfg.format_reward == "code_format"


def _kodcode() -> list[dict]:
    from posttrain.data.records import load_tasks

    return [task for _, task in load_tasks(KODCODE)]


@needs_sandbox
def test_each_recipes_reward_on_published_kodcode_records():
    """The reward a recipe's run builds, on each fixture record's reference solution: 1 for a passing
    program, + 0.05 in the reasoning recipe when it follows a closed trace; a draft in the trace is
    not the answer."""
    from posttrain.verifiers import build_reward, score_batch

    records = _kodcode()
    rewards = {}
    for name in RECIPES:
        cfg = _config(name)
        fn = build_reward(cfg.verifier, format_weight=cfg.format_weight, format_spec=cfg.format_reward)
        fenced = [f"```python\n{r['reference']}```" for r in records]
        traced = [f"<think>use the tests</think>\n{c}" for c in fenced]
        draft_only = [f"<think>{c}</think>\nDone." for c in fenced]
        rewards[name] = [[o.reward for o in score_batch(fn, texts, records)] for texts in (fenced, traced, draft_only)]
    n = len(records)
    assert rewards["direct"] == [[1.0] * n, [1.0] * n, [0.0] * n]
    assert rewards["reasoning"] == [[1.0] * n, [pytest.approx(1.05)] * n, [0.0] * n]


def _rows(run_dir: Path) -> list[dict]:
    return [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if r.get("step", 0) > 0]


def _check_two_steps(run_dir: Path, name: str) -> None:
    rows = _rows(run_dir)
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        # every program an untrained model writes is judged (PASS or MODEL_FAIL), none lost to the machinery
        assert r["outcomes/PASS_frac"] + r["outcomes/MODEL_FAIL_frac"] == pytest.approx(1.0)
        assert r["outcomes/INFRA_FAIL_frac"] == r["outcomes/TASK_FAIL_frac"] == 0.0
    resolved = yaml.safe_load((run_dir / "config.yaml").read_text())
    seed = yaml.safe_load(RECIPES[name].read_text())
    for key in ("algorithm", "verifier", "seed", "prompts_per_step"):
        assert resolved[key] == seed[key]
    assert resolved["model"]["lora"]["r"] == 32 and resolved["data"]["thinking"] == seed["data"]["thinking"]


def _lengths(model_dir, out: Path) -> dict:
    return {"model.path": model_dir, "data.path": KODCODE, "out_dir": out, "rollout.max_new_tokens": 24,
            "num_steps": 2}


@pytest.mark.slow
@needs_sandbox
@pytest.mark.parametrize("name", list(RECIPES))
def test_each_recipe_runs_two_steps_on_the_cpu(name, nano_model_dir, tmp_path):
    from posttrain.rl.run import run_rl

    cfg = _config(name, {**_lengths(nano_model_dir, tmp_path / "run"), "rollout.backend": "torch"})
    run_rl(cfg, printer=lambda *_: None)
    _check_two_steps(tmp_path / "run", name)
    assert (tmp_path / "run" / "checkpoints" / "step-2" / "adapter").is_dir()


@pytest.mark.vllm
@needs_sandbox
def test_the_direct_recipe_runs_two_steps_against_a_running_vllm_server(vllm_lora_server, vllm_model_dir, tmp_path):
    """The recipe with a server started beforehand (its header's ``rollout.vllm.launch=0
    rollout.urls=[...]``; the session's LoRA server, a CPU build: float32, eager): the adapter at
    rank 32 is synced each step and sampled from. (A run that launches and stops its own servers:
    tests/rl/test_rl_vllm.py.)"""
    from posttrain.rl.run import run_rl

    server = {"rollout.vllm.launch": 0, "rollout.urls": json.dumps(vllm_lora_server.urls),
              "rollout.vllm.probe_tol": 1e-4}
    cfg = _config("direct", {**_lengths(vllm_model_dir, tmp_path / "run"), **server})
    assert cfg.model.lora.r == 32
    run_rl(cfg, printer=lambda *_: None)
    _check_two_steps(tmp_path / "run", "direct")
    for r in _rows(tmp_path / "run"):
        assert r["mismatch/logprob_abs_diff_max"] < 1e-3  # the server sampled with the trainer's weights
    assert sorted(p.name for p in (tmp_path / "run" / "rollout_weights" / "v2").iterdir()) == \
        ["adapter_config.json", "adapter_model.safetensors"]


@pytest.mark.parametrize("overrides,message", [
    ({"data.use_chat_template": "false"}, "needs data.use_chat_template=true"),
    ({"env.name": "calculator"}, "has no effect with env.name"),
])
def test_thinking_is_refused_where_it_would_do_nothing(overrides, message):
    from posttrain.errors import UserError

    with pytest.raises(UserError, match=f"data.thinking.*{message}"):
        _config("reasoning", overrides)
