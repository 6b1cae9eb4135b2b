"""The step limit on a saturated sandbox pool: time queued for a sandbox, or running a program under
the sandbox's own limit, is not the environment hanging; a tool that hangs outside the sandbox is.
More episodes than sandboxes, each program an infinite loop killed at the sandbox's 1 s limit."""

from __future__ import annotations

import importlib
import json
import textwrap
import time

import pytest

from posttrain.cli import main
from posttrain.data.records import write_jsonl
from posttrain.envs import EpisodeLimits, run_episodes
from posttrain.outcome import OutcomeClass
from posttrain.rollout import SamplingParams
from posttrain.sandbox.pool import Job
from tests.envs.pools import start_pool

PLUGIN = textwrap.dedent('''
    import time

    from posttrain.envs import Environment, StepResult
    from posttrain.sandbox.pool import Job

    JOBS = {"loop": Job("def f():\\n    while True:\\n        pass\\n", "f", "def check(c):\\n    c()\\n"),
            "fine": Job("def f():\\n    return 1\\n", "f", "def check(c):\\n    assert c() == 1\\n")}


    class Submits(Environment):
        """One turn, whatever the model wrote: the prompt's words in order, each ``loop`` (an infinite
        loop) or ``fine`` (a right answer) submitted to the sandbox pool (the shared one unless given),
        each ``hang`` a tool that never returns, outside the sandbox. The verdict is the last program's."""

        def __init__(self, pool=None):
            self.pool = pool

        def reset(self, example):
            self.words = example["prompt"].split()
            return [{"role": "user", "content": example["prompt"]}]

        def step(self, text):
            if self.pool is None:
                from posttrain.verifiers.code import shared_pool

                self.pool = shared_pool()
            outcome = None
            for word in self.words:
                if word == "hang":
                    time.sleep(600)
                else:
                    (outcome,) = self.pool.run([JOBS[word]])
            return StepResult(reward=outcome.reward, done=True, outcome=outcome)
''')

TIMEOUT = (OutcomeClass.MODEL_FAIL, "timeout")
HUNG = (OutcomeClass.INFRA_FAIL, "env_timeout")


@pytest.fixture(scope="module")
def pool():
    """Two sandboxes, 1 s per program, started (with their canaries) before any test measures."""
    p = start_pool(workers=2, timeout_s=1.0)
    p.run([Job("def f():\n    return 1\n", "f", "def check(c):\n    assert c() == 1\n")] * 2)
    yield p
    p.close()


@pytest.fixture
def envs(tmp_path, monkeypatch):
    """The plugin module, importable as ``pool_test_envs`` (as `posttrain eval` imports it)."""
    (tmp_path / "pool_test_envs.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    return importlib.import_module("pool_test_envs")


@pytest.fixture
def episodes(nano_tokenizer, scripted, envs, pool):
    """``episodes(prompts, n, step_timeout_s)``: (class, reason) per episode, and the seconds taken."""
    def run(prompts: list[str], n: int, step_timeout_s: float):
        t0 = time.perf_counter()
        eps = run_episodes(scripted(lambda p, i: "ok"), nano_tokenizer, lambda: envs.Submits(pool),
                           [{"prompt": p} for p in prompts], n, SamplingParams(),
                           EpisodeLimits(step_timeout_s=step_timeout_s))
        return [(e.outcome.cls, e.outcome.reason) for e in eps], time.perf_counter() - t0

    return run


def test_every_looping_program_on_a_saturated_pool_is_the_models_timeout(episodes):
    """6 loops on 2 sandboxes: the last wait ~2 s for a sandbox, past the 1.5 s step limit."""
    got, _ = episodes(["loop"], 6, step_timeout_s=1.5)
    assert got == [TIMEOUT] * 6


def test_healthy_episodes_queued_behind_looping_ones_are_scored(episodes):
    got, _ = episodes(["loop", "fine"], 4, step_timeout_s=1.5)
    assert got == [TIMEOUT] * 4 + [(OutcomeClass.PASS, "")] * 4


def test_a_step_running_several_programs_is_bounded_by_their_own_limits(episodes):
    """Three 1 s loops in one step (a turn of three tool calls) outlast a 1.5 s step limit: still the model's."""
    got, _ = episodes(["loop loop loop"], 1, step_timeout_s=1.5)
    assert got == [TIMEOUT]


def test_a_hung_tool_is_still_the_environments_fault_on_a_busy_pool(episodes):
    """A tool that never returns ends at the step limit (its time on the pool aside), whether it hangs
    at once or after its program ran; the loops beside it stay the model's."""
    got, took = episodes(["hang", "loop hang", "loop"], 2, step_timeout_s=1.5)
    assert got == [HUNG] * 4 + [TIMEOUT] * 2
    assert took < 10  # 4 programs of 1 s on 2 sandboxes, then at most the 1.5 s limit


def test_posttrain_eval_of_looping_episodes_on_a_saturated_pool_counts_model_timeouts(nano_model_dir, envs, pool,
                                                                                     tmp_path):
    """8 looping episodes on 2 sandboxes through `posttrain eval`: each the model's timeout, none masked."""
    data = write_jsonl(tmp_path / "loops.jsonl", [{"prompt": "loop"}, {"prompt": "loop"}])
    assert main(["eval", "benchmarks=[{kind: env, name: loops, path: " + str(data) + ", env: {name: "
                 "'pool_test_envs:Submits', max_turns: 1, step_timeout_s: 1.5}}]",
                 "profiles=[{name: sampled, temperature: 1.0, n: 4, max_new_tokens: 2}]", f"model={nano_model_dir}",
                 "sandbox.workers=2", "sandbox.timeout_s=1", f"out_dir={tmp_path / 'eval'}", "--no-progress"]) == 0
    (result,) = json.loads((tmp_path / "eval" / "eval.json").read_text())["results"]
    assert result["outcomes"] == {"PASS": 0, "MODEL_FAIL": 8, "TASK_FAIL": 0, "INFRA_FAIL": 0}
    assert result["fail_reasons"] == {"timeout": 8}
