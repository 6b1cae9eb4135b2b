"""RL over environments: one row per episode with the model's tokens masked in, the same learn
step for every algorithm, sampler and trainer agreeing on the model's tokens, env/* metrics."""

from __future__ import annotations

import itertools
import json
import math
import textwrap

import pytest
import torch

from posttrain.config import load_config
from posttrain.errors import UserError
from posttrain.rl.config import RLConfig
from posttrain.rl.loop import rl_step, setup
from posttrain.rl.run import run_rl
from posttrain.tracking import StageTimer
from tests.envs.conftest import ScriptedEngine, drop_old_thinking
from tests.rl.test_async import _comparable

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

    class TwoTurns(Environment):
        """Two turns; PASS when the second is "yes"."""

        def reset(self, example):
            self.n = 0
            return [{"role": "user", "content": example["prompt"]}]

        def step(self, text):
            self.n += 1
            if self.n < 2:
                return StepResult(observation="obs 1")
            return StepResult(reward=float(text == "yes"), done=True)

    from posttrain.envs.calculator import CalculatorEnv

    class DenseCalculator(CalculatorEnv):
        """The calculator environment, its answer judged with partial credit (the alphanumeric fraction)."""

        def judge(self, text):
            outcome = super().judge(text)
            frac = sum(c.isalnum() for c in text) / max(len(text), 1)
            return outcome if outcome.is_reward and outcome.reward == 1.0 else Outcome.model_fail(outcome.reason, reward=frac)

    import time

    class HangsOnEvenPrompts(Chat3):
        """Chat3 whose tool hangs (for 10 minutes) in the episodes of prompts ending in an even digit."""

        def reset(self, example):
            self.hangs = example["prompt"][-1] in "02468"
            return super().reset(example)

        def step(self, text):
            if self.hangs:
                time.sleep(600)
            return super().step(text)
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
    # lengths and the token budget count what the model generated; environment tokens apart
    model, env = sum(e.model_tokens for e in run.env.last), sum(e.env_tokens for e in run.env.last)
    assert env > 0 and m["response_length/mean"] == pytest.approx(model / 8)
    assert m["tokens/generated"] == model and m["tokens/env"] == env
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


def _rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_async_k0_with_the_calculator_equals_sync_step_for_step(nano_model_dir, tmp_path, env_plugin):
    """Async episodes are driven turn by turn through the engine process; with K = 0 they are the
    sync run's: same prompts, turns, rewards, losses and held-out episodes, step for step. (The
    calculator's judge gives partial credit here, so a random model has a gradient to follow.)"""
    from posttrain.envs.calculator import write_calculator_data

    data = write_calculator_data(tmp_path / "calc", n_train=16, n_eval=4, tools_style="none")
    common = {"data.path": data["prompts_train"], "data.eval_path": data["prompts_eval"], "num_steps": 2,
              "env.name": "rl_test_envs:DenseCalculator", "env.max_turns": 2, "env.tools_style": "none",
              "rollout.max_new_tokens": 8, "eval_every": 2}
    for name, extra in (("sync", {}), ("async", {"mode": "async", "max_staleness": 0})):
        cfg = load_config(RLConfig, None, overrides(nano_model_dir, tmp_path, tmp_path, **common, **extra,
                                                    out_dir=tmp_path / name))
        run_rl(cfg, printer=lambda *_: None)
    sync, asyn = _rows(tmp_path / "sync"), _rows(tmp_path / "async")
    assert [r["step"] for r in sync] == [r["step"] for r in asyn] == [0, 1, 2]
    assert all(r["grad_norm"] > 0 for r in sync[1:]), "the runs must learn for the comparison to mean anything"
    assert all(r["env/turns_mean"] >= 1 for r in sync[1:]) and "eval/heldout/greedy/pass@1" in sync[0]
    for s, a in zip(sync, asyn):
        assert _comparable(s) == pytest.approx(_comparable(a), rel=1e-5, abs=1e-7)
    assert all(r["async/staleness_max"] == 0 for r in asyn[1:]) and asyn[0]["selftest/passed"] == 1


def test_async_k1_three_turn_episodes_respect_the_staleness_bound(nano_model_dir, arith_data_dir, tmp_path,
                                                                  env_plugin):
    """K = 1: the second step trains on episodes whose first turn was served before the first update
    (their version is the oldest of their turns), so staleness reaches 1 and never passes it."""
    cfg = load_config(RLConfig, None, overrides(nano_model_dir, arith_data_dir, tmp_path, **{
        "env.name": env_plugin, "mode": "async", "max_staleness": 1, "num_steps": 3, "asynchrony.self_test": False}))
    run_rl(cfg, printer=lambda *_: None)
    rows = _rows(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2, 3]
    # a turn cut by the token limit ends without <|im_end|>: the template's rendering differs and that
    # episode is split, so the samples are the episodes' segments
    assert all(r["env/turns_mean"] == 3.0 and r["samples"] == pytest.approx(8 * r["env/segments_mean"]) for r in rows)
    assert all(r["async/staleness_max"] <= 1 and r["async/bound_requeued"] == 0 for r in rows)
    assert rows[0]["async/staleness_max"] == 0 and rows[1]["async/staleness_max"] == 1
    ledger = json.loads((tmp_path / "run" / "ledger.json").read_text())
    assert ledger["counts"]["trained"] == 6  # 3 steps of 2 prompts, none lost or trained twice


def test_async_a_hanging_tool_is_masked_and_counted_and_the_steps_go_on(nano_model_dir, arith_data_dir, tmp_path,
                                                                       env_plugin):
    """In async RL a tool that hangs ends its episode at ``env.step_timeout_s`` as INFRA_FAIL (masked,
    counted with its reason), the other episodes train, and every prompt is trained once."""
    import time

    prompts = [json.loads(line)["prompt"] for line in (arith_data_dir / "prompts_train.jsonl").read_text().splitlines()]
    assert {p[-1] in "02468" for p in prompts[:12]} == {True, False}  # both kinds are drawn
    cfg = load_config(RLConfig, None, overrides(nano_model_dir, arith_data_dir, tmp_path, **{
        "env.name": "rl_test_envs:HangsOnEvenPrompts", "env.step_timeout_s": 1, "mode": "async", "max_staleness": 1,
        "num_steps": 3, "prompts_per_step": 4, "asynchrony.self_test": False}))
    t0 = time.monotonic()
    run_rl(cfg, printer=lambda *_: None)
    assert time.monotonic() - t0 < 300  # a hang held to its end would take 600 s
    rows = _rows(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2, 3]
    infra = [r["outcomes/INFRA_FAIL_frac"] for r in rows]
    assert sum(infra) > 0 and all(f < 1 for f in infra), infra
    assert all(r["grad_norm"] > 0 for r in rows)  # the episodes that did not hang are trained on
    # a step without a timeout has no such key: read as 0, so a mismatch is an assertion, not a KeyError
    timeouts = [r.get("outcomes/INFRA_FAIL/env_timeout_frac", 0.0) for r in rows]
    assert timeouts == infra, (timeouts, infra)
    ledger = json.loads((tmp_path / "run" / "ledger.json").read_text())
    assert ledger["counts"]["trained"] + ledger["counts"]["dropped"] == 12, ledger["counts"]


@pytest.mark.parametrize("override, needle", [
    ("env.name=nosuch", "env.name"),
    ("env.name=nosuch_module:Env", "cannot import module"),
    ("env.on_malformed_tool_call=ignore", "on_malformed_tool_call"),
    ("env.tools_style=xml", "tools_style"),
])
def test_bad_environment_settings_are_one_line_errors(nano_model_dir, arith_data_dir, tmp_path, override, needle):
    with pytest.raises(UserError, match=needle):
        setup(load_config(RLConfig, None, overrides(nano_model_dir, arith_data_dir, tmp_path) + [override]))


class _Scripted(ScriptedEngine):
    """The scripted engine, receiving (and ignoring) the trainer's weights after the update. Its
    log-probs are -6 (near the nano model's), so importance weights vary around 1 and the loss is
    not a near-cancelling sum of tiny terms."""

    def generate(self, prompts, n, sampling):
        ro = super().generate(prompts, n, sampling)
        ro.logprobs = [[-6.0] * len(row) for row in ro.logprobs]
        return ro

    def load_version(self, buckets, version, digest, probe=None, dtype=None):
        self.version = version


def test_split_episodes_train_every_segment_with_the_episodes_advantage(nano_model_dir, arith_data_dir, tmp_path,
                                                                        env_plugin):
    """A template that drops earlier <think> blocks splits the episodes whose first turn thinks:
    both samples reach the trainer, each with its own loss mask and the episode's advantage, and
    the loss counts the episode once as a sequence."""
    cfg = load_config(RLConfig, None, overrides(nano_model_dir, arith_data_dir, tmp_path, **{
        "env.name": "rl_test_envs:TwoTurns", "rollout.max_new_tokens": 20, "kl.track": False, "optim.lr": 0.0}))
    run = setup(cfg)
    run.env.tokenizer = drop_old_thinking(run.tokenizer)
    calls = itertools.count()

    def script(prompt, i):  # turns are served episode by episode: e = episode within its group of 4
        e = next(calls) % 4
        if "obs 1" not in prompt:
            return "<think>hmm</think>first" if e % 2 == 0 else "first"  # episodes 0 and 2 split
        return "yes" if e < 2 else "no"  # rewards 1, 1, 0, 0 in every group

    run.engine = _Scripted(run.env.tokenizer, script)
    batches, train_step = [], run.policy.train_step
    run.policy.train_step = lambda batch, loss_fn, **kw: batches.append(batch) or train_step(batch, loss_fn, **kw)
    m = rl_step(run, 1, StageTimer())
    (batch,) = batches
    assert batch.episode_B.tolist() == [0, 0, 1, 2, 2, 3, 4, 4, 5, 6, 6, 7]
    assert m["samples"] == 12 and m["env/segments_mean"] == 1.5 and m["env/prefix_break_frac"] == 0.5
    a = 1.5 / math.sqrt(3)  # grpo on rewards (1, 1, 0, 0): ±0.5 / std 0.577
    torch.testing.assert_close(batch.adv_B, torch.tensor([a, a, a, -a, -a, -a] * 2))
    segments = [seg for ep in run.env.last for seg in ep.segments]
    assert "<think>" not in run.tokenizer.decode(segments[1].prompt_ids)  # the template's rendering
    for r, seg in enumerate(segments):  # column t of mask_BT scores token t + 1
        expected = torch.zeros(batch.mask_BT.shape[1], dtype=torch.bool)
        start = len(seg.prompt_ids) - 1
        expected[start: start + len(seg.loss_mask)] = torch.tensor(seg.loss_mask, dtype=torch.bool)
        assert torch.equal(batch.mask_BT[r], expected), r
    assert all(segments[1].loss_mask)  # the second sample is the model's last turn alone
    assert 0 in segments[2].loss_mask  # the unsplit episode carries the environment's reply, masked out
    # seq_mean_token_mean over episodes: each row divided by its episode's tokens, 8 sequences
    mask = batch.train_mask_BT
    ep_tokens = torch.zeros(8).index_add(0, batch.episode_B, mask.sum(1).float())[batch.episode_B]
    per_row = (-batch.adv_B[:, None] * batch.is_weights_BT * mask).sum(1) / ep_tokens
    assert abs(float(per_row.sum())) > 1e-3
    assert m["loss"] == pytest.approx(float(per_row.sum() / 8), rel=1e-4, abs=1e-7)
    # samples.jsonl: each group's best (episode 0, split: written as its last row) and worst (3)
    samples = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    assert [(s["group"], s["sample"], s["reward"]) for s in samples] == [(0, 0, 1.0), (0, 3, 0.0), (1, 0, 1.0),
                                                                         (1, 3, 0.0)]
    assert samples[0]["completion"] == run.env.tokenizer.decode(segments[1].completion_ids, skip_special_tokens=True)
    assert samples[0]["completion_tokens"] == run.env.last[0].model_tokens > sum(segments[1].loss_mask)
    assert "obs 1" in samples[0]["prompt"]
