"""OpenEnv environments: a server written against openenv-core's API and started as OpenEnv starts
its servers (uvicorn on the app ``create_app`` makes), driven over its WebSocket sessions with its
own client; outcomes, faults mapped to our classes, RL and eval end to end."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("openenv.core")

from posttrain.data.records import write_jsonl  # noqa: E402
from posttrain.envs.openenv import OpenEnvEnv, launch, stop_servers  # noqa: E402
from posttrain.envs.runner import EpisodeLimits, run_episodes  # noqa: E402
from posttrain.outcome import OutcomeClass  # noqa: E402
from posttrain.rollout.types import SamplingParams  # noqa: E402
from tests.envs.conftest import rl_then_eval  # noqa: E402

GUESS = textwrap.dedent('''
    """Guess the digit: the OpenEnv way (Action / Observation / Environment, create_app)."""
    import uuid
    from openenv.core.env_server import Action, Environment, Observation, State, create_app


    class GuessAction(Action):
        guess: str


    class GuessObservation(Observation):
        feedback: str = ""


    class GuessEnvironment(Environment):
        SUPPORTS_CONCURRENT_SESSIONS = True

        def __init__(self):
            super().__init__()
            self._state = State(episode_id=str(uuid.uuid4()), step_count=0)
            self.secret = 0

        def reset(self, seed=None, episode_id=None, **kwargs):
            self.secret = (7 * (seed or 0) + 3) % 10
            self._state = State(episode_id=episode_id or str(uuid.uuid4()), step_count=0)
            return GuessObservation(feedback="Guess a digit from 0 to 9.")

        def step(self, action, timeout_s=None, **kwargs):
            self._state.step_count += 1
            text = action.guess.strip()
            if text == "crash":
                raise RuntimeError("the environment broke")
            if text == str(self.secret):
                return GuessObservation(feedback="right", done=True, reward=1.0)
            if self._state.step_count >= 3:
                return GuessObservation(feedback="out of guesses", done=True, reward=0.0)
            if not text.isdigit():
                return GuessObservation(feedback="not a digit", reward=0.0)
            return GuessObservation(feedback="higher" if int(text) < self.secret else "lower", reward=0.0)

        @property
        def state(self):
            return self._state


    app = create_app(GuessEnvironment, GuessAction, GuessObservation, env_name="guess", max_concurrent_envs=64)
''')


@pytest.fixture(scope="module")
def guess_module(tmp_path_factory):
    root = tmp_path_factory.mktemp("openenv")
    (root / "guess_env.py").write_text(GUESS)
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(root) + (os.pathsep + old if old else "")  # the server process imports it
    sys.path.insert(0, str(root))
    yield "guess_env:app"
    stop_servers()
    sys.path.remove(str(root))
    if old is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = old


@pytest.fixture(scope="module")
def server(guess_module):
    return launch(guess_module)


def episodes(tokenizer, scripted, url, turns, examples, **options):
    engine = scripted(lambda prompt, i: turns[prompt.count("<|im_start|>assistant") - 1])
    make = lambda: OpenEnvEnv(url=url, action_field=options.pop("action_field", "guess"), **options)  # noqa: E731
    return run_episodes(engine, tokenizer, make, examples, 1, SamplingParams(), EpisodeLimits(max_turns=4))


def test_episodes_reach_the_servers_verdict_turn_by_turn(nano_tokenizer, scripted, server):
    seeds = [0, 1, 2, 3]  # secrets 3, 0, 7, 4; every episode guesses 3, then 0, then 7
    eps = episodes(nano_tokenizer, scripted, server, ["3", "0", "7"], [{"prompt": "Play.", "seed": s} for s in seeds])
    assert [e.outcome.cls for e in eps] == [OutcomeClass.PASS] * 3 + [OutcomeClass.MODEL_FAIL]
    assert [e.turns for e in eps] == [1, 2, 3, 3]
    assert eps[1].messages[2] == {"role": "user", "content": "lower"}  # the server's observation, as sent
    assert eps[2].messages[2]["content"] == "higher" and eps[3].outcome.reason == "wrong_answer"
    assert eps[0].messages[0]["content"] == "Play.\nGuess a digit from 0 to 9."
    # each episode is its own session: four secrets from four seeds at once
    assert eps[0].turn_rewards == [1.0] and eps[1].turn_rewards == [0.0, 1.0] and eps[3].turn_rewards == [0.0] * 3


def test_a_server_error_is_infra_fail_and_the_other_episodes_go_on(nano_tokenizer, scripted, server):
    eps = episodes(nano_tokenizer, scripted, server, ["crash"], [{"seed": 0}])
    assert eps[0].outcome.cls is OutcomeClass.INFRA_FAIL and "EXECUTION_ERROR" in eps[0].outcome.detail
    eps = episodes(nano_tokenizer, scripted, server, ["3", "3", "3"], [{"seed": 0}, {"seed": 1}])
    assert [e.outcome.cls for e in eps] == [OutcomeClass.PASS, OutcomeClass.MODEL_FAIL]


def test_actions_the_model_writes_as_json_are_its_fault_when_malformed(nano_tokenizer, scripted, server):
    good = episodes(nano_tokenizer, scripted, server, ['{"guess": "3"}'], [{"seed": 0}], action_field="")
    assert good[0].outcome.cls is OutcomeClass.PASS
    for turn in ("not json", '{"guess": 3, "extra": 1}', "[1]"):
        [ep] = episodes(nano_tokenizer, scripted, server, [turn], [{"seed": 0}], action_field="")
        assert ep.outcome.cls is OutcomeClass.MODEL_FAIL and ep.outcome.reason == "malformed_action", turn
    # the action posttrain builds from a wrong action_field is the task's fault, never the model's
    [ep] = episodes(nano_tokenizer, scripted, server, ["3"], [{"seed": 0}], action_field="message")
    assert ep.outcome.cls is OutcomeClass.TASK_FAIL


def test_an_episode_closes_its_session_cleanly_so_the_server_logs_nothing(nano_tokenizer, scripted, guess_module,
                                                                         tmp_path):
    """OpenEnv's client dropped the connection before the server closed it: uvicorn logged a
    ClientDisconnected / WebSocketDisconnect traceback per episode (2,523 lines for 2 RL steps)."""
    import time

    from posttrain.envs.openenv import _free_port, _healthy

    port, log = _free_port(), tmp_path / "server.log"
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "uvicorn", guess_module, "--host", "127.0.0.1", "--port",
                                 str(port), "--log-level", "warning"], stderr=err, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while not _healthy(url):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        eps = episodes(nano_tokenizer, scripted, url, ["3", "0", "7"], [{"seed": s} for s in range(6)])
        assert [e.outcome.cls for e in eps] == [OutcomeClass.PASS] * 3 + [OutcomeClass.MODEL_FAIL] * 3
        time.sleep(0.5)  # what the server would log after the last close
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(10)
    assert "Traceback" not in log.read_text(), log.read_text()[:3000]


def test_a_dead_server_is_infra_fail_never_a_wrong_answer(nano_tokenizer, scripted, guess_module):
    port = __import__("posttrain.envs.openenv", fromlist=["_free_port"])._free_port()
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", guess_module, "--host", "127.0.0.1", "--port", str(port),
                             "--log-level", "warning"], start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        from posttrain.envs.openenv import _healthy
        import time

        deadline = time.monotonic() + 60
        while not _healthy(url) and time.monotonic() < deadline:
            time.sleep(0.2)

        def script(prompt, i):
            if "higher" in prompt or "lower" in prompt:
                return "5"
            os.killpg(proc.pid, signal.SIGKILL)  # the server dies while the model thinks
            proc.wait()
            return "1"

        eps = run_episodes(scripted(script), nano_tokenizer, lambda: OpenEnvEnv(url=url, action_field="guess", timeout_s=5),
                           [{"seed": 0}], 1, SamplingParams(), EpisodeLimits(max_turns=3))
        assert eps[0].outcome.cls is OutcomeClass.INFRA_FAIL and eps[0].outcome.reason == "env_infra_error"
        [never] = run_episodes(scripted(lambda p, i: "1"), nano_tokenizer,
                               lambda: OpenEnvEnv(url=url, action_field="guess", timeout_s=5), [{"seed": 0}], 1,
                               SamplingParams(), EpisodeLimits(max_turns=3))
        assert never.outcome.cls is OutcomeClass.INFRA_FAIL  # no server at all: reset fails
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_rl_and_eval_against_a_launched_openenv_server(nano_model_dir, guess_module, tmp_path):
    data = write_jsonl(tmp_path / "guess.jsonl", [{"prompt": "Guess the digit.", "seed": s} for s in range(8)])
    env = "{name: openenv, max_turns: 3, max_total_tokens: 160, options: {launch: '" + guess_module + "', action_field: guess}}"
    last, result = rl_then_eval(nano_model_dir, data, env, tmp_path)
    assert last["step"] == 2 and last["env/turns_mean"] >= 1.0 and last["outcomes/INFRA_FAIL_frac"] == 0.0
    assert "eval/heldout/greedy/pass@1" in last
    assert result["num_problems"] == 8 and 1.0 <= result["env"]["env/turns_mean"] <= 3.0
