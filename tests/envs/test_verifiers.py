"""verifiers (Prime Intellect) environments: a taskset and harness written against verifiers' v1
API, loaded in ``.venv-verifiers`` the way verifiers loads environments, its model calls served by
posttrain's engine through the episode runner; outcomes, faults mapped to our classes, token-exact
trajectories, RL and eval end to end. Lane: ``pytest -m verifiers`` (bash scripts/setup.sh verifiers)."""

from __future__ import annotations

import os
import signal
import sys
import textwrap
from pathlib import Path

import pytest

from posttrain.cli import main
from posttrain.data.records import write_jsonl
from posttrain.envs.config import EnvConfig
from posttrain.envs.runner import EpisodeLimits, run_episodes
from posttrain.envs.session import EnvSession
from posttrain.envs.vf_env import VerifiersEnv, default_python, stop_drivers
from posttrain.outcome import OutcomeClass
from posttrain.rollout import SamplingParams, TorchEngine
from tests.envs.conftest import rl_then_eval
from tests.envs.test_runner import Recorder

pytestmark = [pytest.mark.verifiers,
              pytest.mark.skipif(not Path(default_python()).exists(),
                                 reason="needs .venv-verifiers (bash scripts/setup.sh verifiers)")]

GUESS = textwrap.dedent('''
    """Guess the digit, the verifiers v1 way: a Taskset of typed tasks scored by a @reward, and a
    Harness whose chat loop runs in-process (verifiers allows it: every model call goes through the
    interception endpoint it is handed), answering each wrong guess with higher / lower."""
    import verifiers.v1 as vf
    from openai import AsyncOpenAI
    from verifiers.v1.runtimes import ProgramResult


    class GuessData(vf.TaskData):
        secret: int


    class GuessTask(vf.Task[GuessData]):
        @vf.reward(weight=1.0)
        async def correct(self, trace: vf.Trace) -> float:
            if self.data.secret < 0:
                raise ValueError("a broken reward")
            return float(trace.last_reply.strip() == str(self.data.secret))


    class GuessTaskset(vf.Taskset[GuessTask, vf.TasksetConfig]):
        def load(self):
            return [GuessTask(GuessData(prompt="Guess a digit.", secret=(7 * i + 3) % 10), self.config.task)
                    for i in range(8)]


    class GuessHarness(vf.Harness[vf.HarnessConfig]):
        APPENDS_SYSTEM_PROMPT = True
        NEEDS_CONTAINER = False
        EXECUTES_CODE = False

        async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, **kwargs):
            client = AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0)
            messages = [{"role": "user", "content": data.prompt}]
            try:
                for turn in range(3):
                    reply = await client.chat.completions.create(model=ctx.model, messages=messages,
                                                                 stream=turn == 1)  # streamed too
                    if turn == 1:
                        text = "".join([c.choices[0].delta.content or "" async for c in reply if c.choices])
                    else:
                        text = reply.choices[0].message.content or ""
                    if text.strip() == "crash":
                        return ProgramResult(exit_code=1, stdout="", stderr="the harness broke")
                    messages.append({"role": "assistant", "content": text})
                    guess = text.strip()
                    if guess == str(data.secret):
                        break
                    feedback = ("higher" if int(guess) < data.secret else "lower") if guess.isdigit() else "not a digit"
                    messages.append({"role": "user", "content": feedback})
            finally:
                await client.close()
            return ProgramResult(exit_code=0, stdout="", stderr="")


    __all__ = ["GuessTaskset", "GuessHarness"]
''')


ADD = textwrap.dedent('''
    """Add two numbers with a tool: the harness offers ``add`` as an OpenAI function tool, runs the
    calls it gets back in ``tool_calls`` and sends their results as ``tool`` messages; the reward is
    the final answer."""
    import json

    import verifiers.v1 as vf
    from openai import AsyncOpenAI
    from verifiers.v1.runtimes import ProgramResult

    ADD = {"type": "function", "function": {"name": "add", "description": "a + b",
           "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                          "required": ["a", "b"]}}}


    class AddData(vf.TaskData):
        a: int
        b: int


    class AddTask(vf.Task[AddData]):
        @vf.reward(weight=1.0)
        async def correct(self, trace: vf.Trace) -> float:
            return float(trace.last_reply.strip() == str(self.data.a + self.data.b))


    class AddTaskset(vf.Taskset[AddTask, vf.TasksetConfig]):
        def load(self):
            return [AddTask(AddData(prompt="Add 2 and 3.", a=2, b=3), self.config.task)]


    class AddHarness(vf.Harness[vf.HarnessConfig]):
        APPENDS_SYSTEM_PROMPT = True
        NEEDS_CONTAINER = False
        EXECUTES_CODE = False

        async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, **kwargs):
            client = AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0)
            messages = [{"role": "user", "content": data.prompt}]
            try:
                for turn in range(3):
                    reply = await client.chat.completions.create(model=ctx.model, messages=messages, tools=[ADD])
                    message = reply.choices[0].message
                    messages.append(message.model_dump(exclude_none=True))
                    if not message.tool_calls:
                        break
                    for call in message.tool_calls:
                        args = json.loads(call.function.arguments)
                        messages.append({"role": "tool", "tool_call_id": call.id,
                                         "content": f"the sum is {args['a'] + args['b']}"})
            finally:
                await client.close()
            return ProgramResult(exit_code=0, stdout="", stderr="")


    __all__ = ["AddTaskset", "AddHarness"]
''')


@pytest.fixture(scope="module")
def taskset(tmp_path_factory):
    root = tmp_path_factory.mktemp("verifiers")
    (root / "guess_digit").mkdir()
    (root / "guess_digit" / "__init__.py").write_text(GUESS)
    (root / "add_tool").mkdir()
    (root / "add_tool" / "__init__.py").write_text(ADD)
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(root) + (os.pathsep + old if old else "")  # the verifiers process imports it
    yield "guess_digit"
    stop_drivers()
    if old is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = old


class Made:
    """A factory keeping the environments it made (to read what verifiers returned)."""

    def __init__(self, **options):
        self.options, self.envs = options, []

    def __call__(self):
        env = VerifiersEnv(**self.options)
        self.envs.append(env)
        return env


def play(tokenizer, scripted, taskset, turns, examples, **options):
    engine = scripted(lambda prompt, i: turns[prompt.count("<|im_start|>assistant") - 1])
    return run_episodes(engine, tokenizer, Made(taskset=taskset, timeout_s=60, **options), examples, 1,
                        SamplingParams(), EpisodeLimits(max_turns=4))


def test_episodes_reach_the_verifiers_reward_turn_by_turn(nano_tokenizer, scripted, taskset):
    examples = [{"prompt": "Guess a digit.", "secret": s} for s in (3, 0, 7, 4)]
    eps = play(nano_tokenizer, scripted, taskset, ["3", "0", "7"], examples)
    assert [e.outcome.cls for e in eps] == [OutcomeClass.PASS] * 3 + [OutcomeClass.MODEL_FAIL]
    assert [e.turns for e in eps] == [1, 2, 3, 3] and eps[3].outcome.reason == "wrong_answer"
    assert eps[1].messages == [{"role": "user", "content": "Guess a digit."}, {"role": "assistant", "content": "3"},
                               {"role": "user", "content": "lower"}, {"role": "assistant", "content": "0"}]
    assert eps[2].messages[2]["content"] == "higher" and eps[0].outcome.reward == 1.0
    # the records' task_idx picks the taskset's own task (secret 3 for task 0)
    [ep] = play(nano_tokenizer, scripted, taskset, ["3"], [{"prompt": "", "task_idx": 0}])
    assert ep.outcome.cls is OutcomeClass.PASS


def test_tool_calls_reach_the_harness_as_tool_calls_and_their_results_come_back(nano_tokenizer, scripted, taskset):
    """The tools a harness offers are shown to the model in the system message; a turn's
    ``<tool_call>`` blocks go back in the response's ``tool_calls``, the harness runs them, and its
    ``tool`` messages are the next observation. A malformed call is plain text to the harness."""
    call = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
    prompts = []
    script = lambda prompt, i: prompts.append(prompt) or (call if "<|im_start|>tool" not in prompt else "5")  # noqa: E731
    [ep] = run_episodes(scripted(script), nano_tokenizer, Made(taskset="add_tool", timeout_s=60), [{"task_idx": 0}], 1,
                        SamplingParams(), EpisodeLimits(max_turns=4))
    assert ep.outcome.cls is OutcomeClass.PASS and ep.turns == 2
    assert prompts[0].startswith("<|im_start|>system\nYou may call these tools:") and '"name": "add"' in prompts[0]
    user, first, result, last = ep.messages
    assert user["content"] == "Add 2 and 3." and first == {"role": "assistant", "content": call}
    assert result == {"role": "tool", "content": "the sum is 5"}  # the harness ran the call it was handed
    assert last == {"role": "assistant", "content": "5"}
    bad = '<tool_call>{"name": "add", "arguments": {"a": "two"}}</tool_call>'
    [ep] = run_episodes(scripted(lambda prompt, i: bad), nano_tokenizer, Made(taskset="add_tool", timeout_s=60),
                        [{"task_idx": 0}], 1, SamplingParams(), EpisodeLimits(max_turns=4))
    assert ep.turns == 1 and ep.outcome.cls is OutcomeClass.MODEL_FAIL  # no tool_calls: the harness took it as an answer


def test_faults_map_to_outcome_classes_and_the_other_episodes_go_on(nano_tokenizer, scripted, taskset):
    ok, crash = {"prompt": "Guess.", "secret": 3}, {"prompt": "Guess.", "secret": 5}
    eps = play(nano_tokenizer, scripted, taskset, ["crash"], [crash])
    assert eps[0].outcome.cls is OutcomeClass.INFRA_FAIL and "HarnessError" in eps[0].outcome.detail
    eps = play(nano_tokenizer, scripted, taskset, ["3"] * 3, [{"prompt": "Guess.", "secret": -1}, ok])
    assert eps[0].outcome.cls is OutcomeClass.TASK_FAIL and "a broken reward" in eps[0].outcome.detail  # @reward raised
    assert eps[1].outcome.cls is OutcomeClass.PASS
    eps = play(nano_tokenizer, scripted, taskset, ["3"], [{"prompt": "no secret"}, ok])
    assert eps[0].outcome.cls is OutcomeClass.TASK_FAIL and "secret" in eps[0].outcome.detail  # does not validate
    assert eps[1].outcome.cls is OutcomeClass.PASS
    # posttrain's own limit ends an episode verifiers would go on with: the harness is refused, no hang
    [ep] = run_episodes(scripted(lambda p, i: "1"), nano_tokenizer, Made(taskset=taskset, timeout_s=60), [crash], 1,
                        SamplingParams(), EpisodeLimits(max_turns=2))
    assert ep.outcome.cls is OutcomeClass.MODEL_FAIL and ep.outcome.reason == "max_turns"


def test_a_dead_verifiers_process_is_infra_fail_never_a_wrong_answer(nano_tokenizer, scripted, taskset):
    made = Made(taskset=taskset, timeout_s=30, env_options={"timeout": {"episode": 600}})  # a driver of its own

    def script(prompt, i):
        os.killpg(made.envs[0].driver.proc.pid, signal.SIGKILL)  # it dies while the model thinks
        made.envs[0].driver.proc.wait()
        return "1"

    [ep] = run_episodes(scripted(script), nano_tokenizer, made, [{"prompt": "Guess.", "secret": 5}], 1,
                        SamplingParams(), EpisodeLimits(max_turns=3))
    assert ep.outcome.cls is OutcomeClass.INFRA_FAIL and "exited" in ep.outcome.detail


def test_trajectories_are_the_ids_and_logprobs_the_engine_generated(nano_model_dir, nano_tokenizer, taskset):
    engine = Recorder(TorchEngine(str(nano_model_dir), tokenizer=nano_tokenizer))
    made = Made(taskset=taskset, timeout_s=60)
    session = EnvSession(EnvConfig(name=f"verifiers:{taskset}", max_turns=3, max_total_tokens=200,
                                   options={"timeout_s": 60}), nano_tokenizer)
    session.make_env = made
    examples = [{"prompt": "Guess a digit.", "secret": s} for s in (3, 8)]
    ro, outcomes, rows = session.generate(engine, examples, 2, SamplingParams(temperature=1.0, max_new_tokens=5, seed=1))
    assert all(o.cls in (OutcomeClass.PASS, OutcomeClass.MODEL_FAIL) for o in outcomes)
    episodes = session.last
    assert sum(e.turns for e in episodes) >= 6  # the tiny model rarely guesses: several turns each
    for r, e in enumerate(rows):
        ids, mask, logp = ro.completion_ids[r], ro.loss_mask[r], ro.logprobs[r]
        spans, k = [], 0
        while k < len(ids):  # the model's turns: the maximal runs of mask 1
            if mask[k]:
                j = k
                while j < len(ids) and mask[j]:
                    j += 1
                spans.append((k, j))
                k = j
            else:
                k += 1
        full = ro.prompt_ids[r] + ids
        for a, b in spans:  # each is exactly one engine call: its prompt is everything before, ids and log-probs equal
            prompt = full[: len(ro.prompt_ids[r]) + a]
            [(gen, lps)] = [(c, lp) for (p, c), lp in zip(engine.calls, engine.logprobs)
                            if p == prompt and c[: b - a] == ids[a:b]]
            assert ids[a:b] == gen[: b - a] and logp[a:b] == lps[: b - a]
        # and verifiers scored exactly the text of those ids (the runner makes episode k's environment k-th)
        assert made.envs[e].result["traces"][0]["replies"] == episodes[e].turn_texts


def test_rl_and_eval_against_a_verifiers_environment(nano_model_dir, taskset, tmp_path):
    data = write_jsonl(tmp_path / "guess.jsonl", [{"prompt": "Guess a digit.", "secret": s} for s in range(8)])
    env = "{name: 'verifiers:" + taskset + "', max_turns: 3, max_total_tokens: 160}"
    last, result = rl_then_eval(nano_model_dir, data, env, tmp_path)
    assert last["step"] == 2 and last["env/turns_mean"] >= 1.0
    assert last["outcomes/INFRA_FAIL_frac"] == 0.0 and last["outcomes/TASK_FAIL_frac"] == 0.0
    assert last["mismatch/logprob_abs_diff_max"] < 1e-4 and "eval/heldout/greedy/pass@1" in last
    assert result["num_problems"] == 8 and 1.0 <= result["env"]["env/turns_mean"] <= 3.0


def test_bad_config_is_one_line_and_exit_2(nano_model_dir, taskset, tmp_path, capsys):
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "Guess.", "secret": 1}])
    base = ["rl", f"model.path={nano_model_dir}", f"data.path={data}", "num_steps=1", "logging.progress=false",
            f"out_dir={tmp_path / 'run'}"]
    for name, words in (("verifiers:no_such_taskset", "no_such_taskset"), ("verifiers:", "env.name")):
        capsys.readouterr()
        assert main(base + ["env={name: '" + name + "'}"]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and words in err and "name" in err, err
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
    assert sys.modules.get("verifiers") is None  # never imported into posttrain's process
