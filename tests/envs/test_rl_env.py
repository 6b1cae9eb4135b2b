"""RL over environments: one row per episode with the model's tokens masked in, the same learn
step for every algorithm, sampler and trainer agreeing on the model's tokens, env/* metrics."""

from __future__ import annotations

import textwrap

import pytest

from posttrain.config import load_config
from posttrain.errors import UserError
from posttrain.rl.config import RLConfig
from posttrain.rl.loop import rl_step, setup
from posttrain.tracking import StageTimer

PLUGIN = textwrap.dedent('''
    from posttrain.envs import Environment, StepResult
    from posttrain.outcome import Outcome

    class Chat3(Environment):
        """Three turns; the reward is the fraction of letters in the last one (dense, learnable)."""

        def reset(self, example):
            self.n = 0
            return [{"role": "user", "content": example["prompt"]}]

        def step(self, text):
            self.n += 1
            if self.n < 3:
                return StepResult(observation=f"go on ({self.n})")
            frac = sum(c.isalpha() for c in text) / max(len(text), 1)
            return StepResult(reward=frac, done=True, outcome=Outcome.model_fail("wrong_answer", reward=frac))
''')


@pytest.fixture
def env_plugin(tmp_path, monkeypatch):
    (tmp_path / "rl_test_envs.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "rl_test_envs:Chat3"


def overrides(nano_model_dir, arith_data_dir, tmp_path, **extra):
    base = {"model.path": nano_model_dir, "data.path": arith_data_dir / "prompts_train.jsonl",
            "rollout.group_size": 4, "rollout.max_new_tokens": 6, "prompts_per_step": 2, "num_steps": 1,
            "eval_every": 0, "save_every": 0, "logging.progress": False, "out_dir": tmp_path / "run",
            "optim.lr": 1e-3, "env.max_total_tokens": 128}
    return [f"{k}={v}" for k, v in (base | extra).items()]


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_an_rl_step_over_three_turn_episodes(nano_model_dir, arith_data_dir, tmp_path, env_plugin, algorithm):
    cfg = load_config(RLConfig, None, overrides(nano_model_dir, arith_data_dir, tmp_path, **{
        "env.name": env_plugin, "algorithm": algorithm}))
    run = setup(cfg)
    m = rl_step(run, 1, StageTimer())
    assert m["env/turns_mean"] == 3.0 and m["env/env_tokens_mean"] > 0 and m["outcomes/MODEL_FAIL_frac"] == 1.0
    assert m["env/tool_calls_mean"] == 0.0 and m["env/tool_error_frac"] == 0.0
    # the trainer's log-probs of the model's tokens are the sampler's (environment tokens are off the mask)
    assert m["mismatch/logprob_abs_diff_max"] < 1e-5
    (ep,) = run.env.last[:1]
    assert m["response_length/mean"] == pytest.approx(sum(e.model_tokens + e.env_tokens for e in run.env.last) / 8)
    assert ep.turns == 3 and len(ep.segments) == 1


def test_calculator_episodes_in_the_loop_and_held_out_eval(nano_model_dir, tmp_path):
    from posttrain.envs.calculator import write_calculator_data
    from posttrain.rl.loop import held_out_eval

    data = write_calculator_data(tmp_path / "calc", n_train=8, n_eval=4, tools_style="none")
    cfg = load_config(RLConfig, None, overrides(nano_model_dir, tmp_path, tmp_path, **{
        "data.path": data["prompts_train"], "data.eval_path": data["prompts_eval"], "env.name": "calculator",
        "env.tools_style": "none", "env.max_turns": 2}))
    run = setup(cfg)
    m = rl_step(run, 1, StageTimer())
    assert {"env/turns_mean", "env/tool_calls_mean", "env/tool_error_frac"} <= set(m)
    assert m["outcomes/MODEL_FAIL_frac"] == 1.0  # a random model cannot multiply
    ev = held_out_eval(run)
    assert ev["eval/heldout/greedy/pass@1"] == 0.0 and "eval/heldout/greedy/env/turns_mean" in ev


def test_environments_need_the_sync_mode(nano_model_dir, arith_data_dir, tmp_path):
    cfg = load_config(RLConfig, None, overrides(nano_model_dir, arith_data_dir, tmp_path, **{
        "env.name": "calculator", "mode": "async"}))
    with pytest.raises(UserError, match="mode=sync"):
        setup(cfg)


@pytest.mark.parametrize("override, needle", [
    ("env.name=nosuch", "env.name"),
    ("env.name=nosuch_module:Env", "cannot import module"),
    ("env.on_malformed_tool_call=ignore", "on_malformed_tool_call"),
    ("env.tools_style=xml", "tools_style"),
])
def test_bad_environment_settings_are_one_line_errors(nano_model_dir, arith_data_dir, tmp_path, override, needle):
    with pytest.raises(UserError, match=needle):
        setup(load_config(RLConfig, None, overrides(nano_model_dir, arith_data_dir, tmp_path) + [override]))
