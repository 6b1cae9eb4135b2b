"""The episode runner: token-exact trajectories, loss masks, sampler/trainer agreement, the
prefix-break split, and every fault ending only its own episode with the right class."""

from __future__ import annotations

import time
import types

import pytest
import torch

from posttrain.algos import token_logprobs
from posttrain.envs import (Environment, EnvInfraError, EnvTaskError, EpisodeLimits, StepResult, Tool, ToolEnv,
                            episodes_to_rollouts, run_episodes)
from posttrain.envs.calculator import CalculatorEnv
from posttrain.envs.tools import format_call
from posttrain.outcome import Outcome, OutcomeClass
from posttrain.rl.batch import build_batch
from posttrain.rollout import SamplingParams, TorchEngine
from tests.envs.conftest import ScriptedEngine, drop_old_thinking


class Talk(Environment):
    """Replies "obs N" after each of the first ``turns - 1`` model turns, then ends with reward 1."""

    def __init__(self, turns: int = 3):
        self.turns, self.seen = turns, 0

    def reset(self, example):
        return [{"role": "user", "content": example["prompt"]}]

    def step(self, text):
        self.seen += 1
        if self.seen >= self.turns:
            return StepResult(reward=1.0, done=True)
        return StepResult(observation=[{"role": "user", "content": f"obs {self.seen}"}], reward=0.25)


class Recorder:
    """Wraps an engine, keeping every (prompt ids, completion ids) it produced, and their log-probs."""

    def __init__(self, engine):
        self.engine, self.calls, self.logprobs = engine, [], []

    @property
    def version(self):
        return self.engine.version

    def generate(self, prompts, n, sampling):
        ro = self.engine.generate(prompts, n, sampling)
        self.calls += list(zip(ro.prompt_ids, ro.completion_ids))
        self.logprobs += ro.logprobs
        return ro


@pytest.fixture(scope="module")
def nano_engine(nano_model_dir, nano_tokenizer):
    return TorchEngine(str(nano_model_dir), tokenizer=nano_tokenizer)


def three_turns(nano_engine, nano_tokenizer, n=2, temperature=1.0):
    engine = Recorder(nano_engine)
    episodes = run_episodes(engine, nano_tokenizer, lambda: Talk(3), [{"prompt": "Say: a b"}, {"prompt": "Say: c"}], n,
                            SamplingParams(temperature=temperature, max_new_tokens=6, seed=3),
                            EpisodeLimits(max_turns=5, max_total_tokens=400))
    return engine, episodes


def test_three_turn_trajectory_is_the_concatenation_of_model_and_environment_tokens(nano_engine, nano_tokenizer):
    engine, episodes = three_turns(nano_engine, nano_tokenizer)
    assert len(episodes) == 4 and all(e.turns == 3 and e.outcome.cls is OutcomeClass.PASS for e in episodes)
    for e in episodes:
        (seg,) = e.segments
        model_turns = [c for p, c in engine.calls if p[: len(seg.prompt_ids)] == seg.prompt_ids
                       and (p + c) == (seg.prompt_ids + seg.completion_ids)[: len(p) + len(c)]]
        assert len(model_turns) == 3
        # what the model saw at turn k+1 is exactly the ids before it: prompt, its turns, the replies
        prompts = [p for p, c in engine.calls if (p + c) == (seg.prompt_ids + seg.completion_ids)[: len(p) + len(c)]
                   and p[: len(seg.prompt_ids)] == seg.prompt_ids]
        env_parts = [prompts[k + 1][len(prompts[k]) + len(model_turns[k]):] for k in range(2)]
        assert seg.completion_ids == model_turns[0] + env_parts[0] + model_turns[1] + env_parts[1] + model_turns[2]
        for k, part in enumerate(env_parts):  # the reply is the template's text after the model's turn
            text = nano_tokenizer.decode(part)
            assert text.endswith(f"<|im_start|>user\nobs {k + 1}<|im_end|>\n<|im_start|>assistant\n")
        expected_mask = [1] * len(model_turns[0]) + [0] * len(env_parts[0]) + [1] * len(model_turns[1]) + \
            [0] * len(env_parts[1]) + [1] * len(model_turns[2])
        assert seg.loss_mask == expected_mask
        assert all(lp == 0.0 for lp, m in zip(seg.logprobs, seg.loss_mask) if m == 0)
        assert all(lp < 0.0 for lp, m in zip(seg.logprobs, seg.loss_mask) if m == 1)
        assert e.turn_rewards == [0.25, 0.25, 1.0]


def test_trainer_logprobs_on_model_tokens_match_the_sampler(nano_engine, nano_tokenizer, nano_model_dir):
    from transformers import AutoModelForCausalLM

    _, episodes = three_turns(nano_engine, nano_tokenizer, n=3, temperature=0.8)
    ro, _ = episodes_to_rollouts(episodes, SamplingParams(temperature=0.8))
    batch = build_batch(ro, [1.0] * len(ro), [True] * len(ro), pad_id=nano_tokenizer.pad_token_id)
    assert batch.mask_BT.sum(1).tolist() == [e.model_tokens for e in episodes]  # exactly the model's tokens
    model = AutoModelForCausalLM.from_pretrained(nano_model_dir).eval()
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids_BT, attention_mask=batch.attention_mask_BT).logits
    logp = token_logprobs(logits[:, :-1], batch.input_ids_BT[:, 1:], temperature=0.8)
    diff = (logp - batch.sampler_logp_BT).abs()[batch.mask_BT]
    assert diff.numel() > 60 and float(diff.max()) < 1e-5
    assert float(batch.sampler_logp_BT[~batch.mask_BT].abs().max()) == 0.0


def test_a_template_that_rewrites_history_splits_the_episode_into_samples(nano_tokenizer, scripted):
    tok = drop_old_thinking(nano_tokenizer)
    engine = scripted(lambda prompt, i: "<think>hmm</think>first" if "obs 1" not in prompt else "second")
    (e,) = run_episodes(engine, tok, lambda: Talk(2), [{"prompt": "hi"}], 1, SamplingParams(max_new_tokens=20))
    assert e.outcome.cls is OutcomeClass.PASS and e.prefix_breaks == 1 and len(e.segments) == 2
    first, second = e.segments
    # each sample is exactly what the engine was given and what it returned
    assert engine.prompts == [first.prompt_ids, second.prompt_ids]
    assert nano_tokenizer.decode(first.completion_ids) == "<think>hmm</think>first<|im_end|>"
    assert nano_tokenizer.decode(second.prompt_ids).endswith(
        "<|im_start|>assistant\nfirst<|im_end|>\n<|im_start|>user\nobs 1<|im_end|>\n<|im_start|>assistant\n")
    assert "<think>" not in nano_tokenizer.decode(second.prompt_ids)
    assert all(second.loss_mask) and nano_tokenizer.decode(second.completion_ids) == "second<|im_end|>"
    ro, rows = episodes_to_rollouts([e], SamplingParams())
    assert len(ro) == 2 and rows == [0, 0] and ro.loss_mask == [first.loss_mask, second.loss_mask]
    last, _ = episodes_to_rollouts([e], SamplingParams(), segments="last")
    assert last.prompt_ids == [second.prompt_ids]


def test_without_a_template_change_there_is_no_split(nano_tokenizer, scripted):
    engine = scripted(lambda prompt, i: "<think>hmm</think>first" if "obs 1" not in prompt else "second")
    (e,) = run_episodes(engine, nano_tokenizer, lambda: Talk(2), [{"prompt": "hi"}], 1, SamplingParams(max_new_tokens=20))
    assert e.prefix_breaks == 0 and len(e.segments) == 1 and e.outcome.cls is OutcomeClass.PASS


@pytest.mark.parametrize("template", ["qwen3", "llama3", "gemma", "mistral", "phi3"])
def test_episodes_are_token_exact_under_each_family_template_shape(template):
    """Qwen3's shape drops the first reply's thinking from the history (a split into two samples),
    the others keep it (one sample); either way each sample is exactly the template's
    rendering of what the model saw, and the reply's own end-of-turn token ends each turn."""
    from posttrain.models.tiny import TEMPLATES, build_tokenizer

    tok = build_tokenizer(0, template)
    end = TEMPLATES[template][2]
    engine = ScriptedEngine(tok, lambda prompt, i: "<think>hmm</think>first" if "obs 1" not in prompt else "second",
                            end=end)
    (e,) = run_episodes(engine, tok, lambda: Talk(2), [{"prompt": "hi"}], 1, SamplingParams(max_new_tokens=20))
    assert e.outcome.cls is OutcomeClass.PASS and e.turns == 2
    user, first = [{"role": "user", "content": "hi"}], {"role": "assistant", "content": "<think>hmm</think>first"}
    whole = user + [first, {"role": "user", "content": "obs 1"}, {"role": "assistant", "content": "second"}]
    rendered = tok.apply_chat_template(whole, tokenize=False)
    if template == "qwen3":
        assert e.prefix_breaks == 1 and len(e.segments) == 2
        one, two = e.segments
        assert tok.decode(one.prompt_ids + one.completion_ids) == tok.apply_chat_template(user + [first], tokenize=False).rstrip("\n")
        assert "<think>" not in tok.decode(two.prompt_ids)
    else:
        assert e.prefix_breaks == 0 and len(e.segments) == 1
        two = e.segments[0]
    # the template's rendering through the last reply's end (Phi-3's closes a finished one with its eos)
    assert tok.decode(two.prompt_ids + two.completion_ids) == rendered[:rendered.rindex(end) + len(end)]
    assert tok.decode([t for t, m in zip(two.completion_ids, two.loss_mask) if m]).endswith("second" + end)


def boom(x: int) -> str:
    """Raise."""
    raise RuntimeError("tool broke")


def down(x: int) -> str:
    """A service that is down."""
    raise EnvInfraError("service down")


class Tools(ToolEnv):
    def __init__(self, **kw):
        super().__init__([Tool.from_function(boom), Tool.from_function(down)], tools_style="none", **kw)

    def judge(self, text):
        return Outcome.passed() if text == "done" else Outcome.model_fail("wrong_answer")


def by_prompt(table):
    """A script answering each example (found by its prompt text) with its list of turns in order."""
    seen = {}

    def script(prompt, i):
        key = next(k for k in table if k in prompt)
        seen[key] = seen.get(key, -1) + 1
        return table[key][min(seen[key], len(table[key]) - 1)]
    return script


def test_malformed_calls_and_raising_tools_are_the_models_fault_and_the_run_goes_on(nano_tokenizer, scripted):
    table = {"A": ["<tool_call>{bad json</tool_call>", "done"],
             "B": [format_call("boom", {"x": 1}), "done"],
             "C": [format_call("nope", {}), "done"],
             "D": ["done"]}
    examples = [{"prompt": k} for k in table]
    eps = run_episodes(scripted(by_prompt(table)), nano_tokenizer, lambda: Tools(), examples, 1, SamplingParams())
    assert [e.outcome.cls for e in eps] == [OutcomeClass.PASS] * 4
    assert [(e.turns, e.tool_calls, e.tool_errors) for e in eps] == [(2, 1, 1), (2, 1, 1), (2, 1, 1), (1, 0, 0)]
    assert eps[1].messages[2] == {"role": "tool", "name": "boom", "content": "error: RuntimeError: tool broke"}
    assert eps[0].messages[2]["content"].startswith("error: the tool call is not valid JSON")

    ended = run_episodes(scripted(by_prompt(table)), nano_tokenizer, lambda: Tools(on_malformed="end"), examples, 1,
                         SamplingParams())
    assert ended[0].outcome == Outcome.model_fail("malformed_tool_call", detail=ended[0].outcome.detail)
    assert ended[0].turns == 1 and ended[2].outcome.reason == "malformed_tool_call"
    assert ended[1].outcome.cls is ended[3].outcome.cls is OutcomeClass.PASS


class Faulty(Environment):
    """Misbehaves according to the example: raise in step, raise a task error, hang, raise in reset."""

    def reset(self, example):
        self.kind = example["prompt"]
        if self.kind == "reset":
            raise ValueError("cannot start")
        return [{"role": "user", "content": self.kind}]

    def step(self, text):
        if self.kind == "raise":
            raise KeyError("bug in the environment")
        if self.kind == "task":
            raise EnvTaskError("the example is broken")
        if self.kind == "hang":
            time.sleep(5)
        if self.kind == "wrong":
            return "not a StepResult"
        return StepResult(reward=1.0, done=True)


def test_environment_failures_are_infra_or_task_fail_and_only_end_their_own_episode(nano_tokenizer, scripted):
    kinds = ["raise", "task", "hang", "reset", "wrong", "fine"]
    t0 = time.perf_counter()
    eps = run_episodes(scripted(lambda p, i: "ok"), nano_tokenizer, Faulty, [{"prompt": k} for k in kinds], 2,
                       SamplingParams(), EpisodeLimits(step_timeout_s=0.5))
    assert time.perf_counter() - t0 < 4  # the hung step was abandoned at its limit
    got = [(e.outcome.cls, e.outcome.reason) for e in eps[::2]]
    assert got == [(OutcomeClass.INFRA_FAIL, "env_error"), (OutcomeClass.TASK_FAIL, "env_task_error"),
                   (OutcomeClass.INFRA_FAIL, "env_timeout"), (OutcomeClass.INFRA_FAIL, "env_error"),
                   (OutcomeClass.INFRA_FAIL, "env_error"), (OutcomeClass.PASS, "")]
    assert [e.outcome for e in eps[::2]] == [e.outcome for e in eps[1::2]]
    assert "KeyError" in eps[0].outcome.detail and "not StepResult" in eps[8].outcome.detail


class Slow(Environment):
    """Each step takes 0.2 s and the episode never ends by itself ("straggler"); "quick" ends at once."""

    def reset(self, example):
        self.kind = example["prompt"]
        return [{"role": "user", "content": self.kind}]

    def step(self, text):
        if self.kind == "quick":
            return StepResult(reward=1.0, done=True)
        time.sleep(0.2)
        return StepResult(observation=[{"role": "user", "content": "more"}], reward=0.0)


def test_a_straggler_episode_is_cut_at_its_wall_clock_limit_and_the_others_keep_their_verdicts(nano_tokenizer,
                                                                                               scripted):
    """Each step is within ``step_timeout_s``, the turns within ``max_turns``; only the episode's
    own wall-clock limit stops it: INFRA_FAIL (masked, never a reward of 0), the quick one passes."""
    t0 = time.perf_counter()
    eps = run_episodes(scripted(lambda p, i: "ok"), nano_tokenizer, Slow, [{"prompt": "slow"}, {"prompt": "quick"}], 2,
                       SamplingParams(), EpisodeLimits(max_turns=1000, step_timeout_s=5, episode_timeout_s=0.7))
    assert time.perf_counter() - t0 < 2.5
    assert [(e.outcome.cls, e.outcome.reason) for e in eps] == [(OutcomeClass.INFRA_FAIL, "episode_timeout")] * 2 + \
        [(OutcomeClass.PASS, "")] * 2
    assert 2 <= eps[0].turns <= 5
    unlimited = run_episodes(scripted(lambda p, i: "ok"), nano_tokenizer, Slow, [{"prompt": "slow"}], 1,
                             SamplingParams(), EpisodeLimits(max_turns=3, step_timeout_s=5))
    assert unlimited[0].outcome.cls is OutcomeClass.MODEL_FAIL  # without the limit: max_turns, the model's


def test_a_tool_raising_an_infra_error_is_infra_fail(nano_tokenizer, scripted):
    (e,) = run_episodes(scripted(lambda p, i: format_call("down", {"x": 1})), nano_tokenizer, lambda: Tools(),
                        [{"prompt": "x"}], 1, SamplingParams())
    assert e.outcome.cls is OutcomeClass.INFRA_FAIL and "service down" in e.outcome.detail


def test_turn_and_token_limits_end_the_episode_as_the_models_fault(nano_tokenizer, scripted):
    call = format_call("calculator", {"expression": "1 + 1"})
    (e,) = run_episodes(scripted(lambda p, i: call), nano_tokenizer, lambda: CalculatorEnv(tools_style="none"),
                        [{"prompt": "Solve: 1 + 1", "answer": "2"}], 1, SamplingParams(), EpisodeLimits(max_turns=3))
    assert e.outcome == Outcome.model_fail("max_turns") and e.turns == 3 and e.tool_calls == 3
    (e,) = run_episodes(scripted(lambda p, i: call), nano_tokenizer, lambda: CalculatorEnv(tools_style="none"),
                        [{"prompt": "Solve: 1 + 1", "answer": "2"}], 1, SamplingParams(), EpisodeLimits(max_turns=50,
                                                                                                     max_total_tokens=150))
    assert e.outcome == Outcome.model_fail("max_tokens") and len(e.segments[0]) <= 150
    (e,) = run_episodes(scripted(lambda p, i: "x"), nano_tokenizer, lambda: CalculatorEnv(tools_style="json"),
                        [{"prompt": "Solve: 1 + 1", "answer": "2"}], 1, SamplingParams(), EpisodeLimits(max_total_tokens=50))
    assert e.outcome.cls is OutcomeClass.TASK_FAIL and e.outcome.reason == "prompt_too_long"


def test_calculator_episode_end_to_end(nano_tokenizer, scripted):
    table = {"347": [format_call("calculator", {"expression": "347 * 86"}), "Answer: 29842"],
             "12 ×": [format_call("calculator", {"expression": "12 * 4"}), "Answer: 49"]}
    eps = run_episodes(scripted(by_prompt(table)), nano_tokenizer, lambda: CalculatorEnv(),
                       [{"prompt": "Solve: 347 × 86", "answer": "29842"}, {"prompt": "Solve: 12 × 4", "answer": "48"}],
                       1, SamplingParams())
    assert eps[0].outcome.cls is OutcomeClass.PASS and eps[0].messages[-2]["content"] == "29842"
    assert eps[1].outcome == Outcome.model_fail("wrong_answer", detail="got 49, expected 48")
    assert eps[0].messages[0]["role"] == "user"  # the tools are offered by the runner's rendering
    assert "Tools: calculator" in nano_tokenizer.decode(eps[0].segments[0].prompt_ids)


def test_an_episodes_version_is_the_oldest_that_served_its_turns(nano_tokenizer, scripted):
    """Weights may change between the turns of an episode (async RL): the sample is as stale as its
    oldest turn, so the staleness bound holds for every turn."""
    engine = scripted(lambda prompt, i: "more")

    class Updating:
        version = 5

        def generate(self, prompts, n, sampling):
            ro = engine.generate(prompts, n, sampling)
            ro.policy_version = [self.version] * len(ro)
            self.version += 1  # new weights arrive after every turn
            return ro

    (e,) = run_episodes(Updating(), nano_tokenizer, lambda: Talk(3), [{"prompt": "hi"}], 1,
                        SamplingParams(max_new_tokens=5), EpisodeLimits(max_turns=5, max_total_tokens=400))
    assert e.turns == 3 and e.policy_version == 5


class PerEpisodeReset(Environment):
    """A reset that differs per episode (a session id in the system prompt); one turn, reward 1."""

    opened = 0

    def reset(self, example):
        PerEpisodeReset.opened += 1
        return [{"role": "system", "content": f"session {PerEpisodeReset.opened}"},
                {"role": "user", "content": example["prompt"]}]

    def step(self, text):
        return StepResult(reward=1.0, done=True)


def test_episodes_whose_resets_differ_are_each_sampled_from_their_own_prompt(nano_engine, nano_tokenizer):
    engine = Recorder(nano_engine)
    episodes = run_episodes(engine, nano_tokenizer, PerEpisodeReset, [{"prompt": "Say: a b"}, {"prompt": "Say: c"}],
                            3, SamplingParams(temperature=1.0, max_new_tokens=6, seed=3),
                            EpisodeLimits(max_turns=2, max_total_tokens=400))
    assert len({tuple(e.segments[0].prompt_ids) for e in episodes}) == 6  # six different openings
    for e in episodes:  # each trajectory is a (prompt, completion) the engine really produced
        (seg,) = e.segments
        assert (seg.prompt_ids, seg.completion_ids) in engine.calls


def test_episodes_that_open_alike_share_one_prefill(nano_engine, nano_tokenizer):
    engine = Recorder(nano_engine)
    calls = []
    engine_generate = engine.generate
    engine.generate = lambda prompts, n, s: calls.append((len(prompts), n)) or engine_generate(prompts, n, s)
    run_episodes(engine, nano_tokenizer, lambda: Talk(1), [{"prompt": "Say: a b"}, {"prompt": "Say: c"}], 3,
                 SamplingParams(temperature=1.0, max_new_tokens=6, seed=3), EpisodeLimits(max_turns=2))
    assert calls == [(2, 3)]


class NoTruncated:
    """An engine that reports sampler log-probs but no truncated ones (a server that has none)."""

    def __init__(self, engine):
        self.engine = engine
        self.version = engine.version

    def generate(self, prompts, n, sampling):
        import dataclasses

        return dataclasses.replace(self.engine.generate(prompts, n, sampling), truncated_logprobs=None)


def test_without_truncated_logprobs_the_behaviour_logprobs_are_the_samplers(nano_engine, nano_tokenizer):
    s = SamplingParams(temperature=0.8, top_p=0.8, max_new_tokens=6, seed=3)
    episodes = run_episodes(NoTruncated(nano_engine), nano_tokenizer, lambda: Talk(2), [{"prompt": "Say: a b"}], 2, s,
                            EpisodeLimits(max_turns=3, max_total_tokens=400))
    ro, _ = episodes_to_rollouts(episodes, s)
    batch = build_batch(ro, [1.0] * len(ro), [True] * len(ro), pad_id=nano_tokenizer.pad_token_id)
    m = batch.mask_BT
    assert m.sum() > 4
    assert torch.equal(batch.behaviour_logp_BT[m], batch.sampler_logp_BT[m])  # never 0: π/μ, not π
    assert float(batch.behaviour_logp_BT[m].max()) < 0


class OneTurn(Environment):
    """Ends at its first step with ``verdict()``."""

    def __init__(self, verdict):
        self.verdict = verdict

    def reset(self, example):
        return [{"role": "user", "content": "go"}]

    def step(self, text):
        return self.verdict()


class FakeOpenEnvClient:
    """openenv's GenericEnvClient whose server scores every step ``reward``."""

    reward = float("nan")

    def __init__(self, **kwargs):
        pass

    def sync(self):
        return self

    def reset(self, **kwargs):
        return types.SimpleNamespace(observation={"feedback": "Guess."}, reward=None, done=False)

    def step(self, action):
        return types.SimpleNamespace(observation={"feedback": "?"}, reward=self.reward, done=True)

    def close(self):
        pass


class FakeSkyRLEnv:
    """A SkyRL-gym environment whose reward is ``reward``."""

    reward = float("nan")

    def init(self, messages):
        return messages, {}

    def step(self, text):
        return {"observations": [], "reward": self.reward, "done": True, "metadata": {}}

    def close(self):
        pass


def _adapter(name: str, reward: float, monkeypatch):
    """A maker of environments of adapter ``name`` whose reward source answers ``reward``."""
    from posttrain.envs.vf_env import outcome_of

    if name == "openenv":
        import openenv.core

        from posttrain.envs.openenv import OpenEnvEnv

        monkeypatch.setattr(FakeOpenEnvClient, "reward", reward)
        monkeypatch.setattr(openenv.core, "GenericEnvClient", FakeOpenEnvClient)
        return lambda: OpenEnvEnv(url="http://127.0.0.1:9", action_field="guess")
    if name == "skyrl":
        import skyrl_gym

        from posttrain.envs.skyrl import SkyRLEnv

        monkeypatch.setattr(FakeSkyRLEnv, "reward", reward)
        monkeypatch.setattr(skyrl_gym, "make", lambda *a, **k: FakeSkyRLEnv())
        return lambda: SkyRLEnv("gsm8k")
    verdicts = {
        "step_reward": lambda: StepResult(reward=reward, done=True),
        "outcome": lambda: StepResult(done=True, outcome=Outcome.passed(reward)),
        "verifiers": lambda: StepResult(done=True, outcome=outcome_of({"ok": True, "traces": [{"reward": reward}]},
                                                                      1.0)),
    }
    return lambda: OneTurn(verdicts[name])


@pytest.mark.parametrize("reward", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("adapter", ["step_reward", "outcome", "verifiers", "openenv", "skyrl"])
def test_a_non_finite_reward_from_any_environment_is_infra_fail(adapter, reward, nano_tokenizer, scripted, monkeypatch):
    make = _adapter(adapter, reward, monkeypatch)
    [ep] = run_episodes(scripted(lambda p, i: "5"), nano_tokenizer, make, [{"prompt": "q", "answer": "5"}], 1,
                        SamplingParams(), EpisodeLimits(max_turns=2))
    assert (ep.outcome.cls, ep.outcome.reason) == (OutcomeClass.INFRA_FAIL, "verifier_error")
    assert not ep.outcome.is_reward and "not a finite number" in ep.outcome.detail
