"""Your own agent as an environment (``env.name=agent``): it keeps its code, only its ``base_url``
points at posttrain.

The agent is named by ``env.agent`` (``package.module:function``, called as
``run(task, base_url, api_key) -> reward | {"reward": ...}`` in a thread) or ``env.agent_cmd`` (a
command, started per episode with ``POSTTRAIN_BASE_URL`` / ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY``
set and the task as JSON on stdin; the last line of its stdout is the reward as JSON). One runs per
episode, all of a step's episodes at once. Each episode has its own path and key on the loopback
endpoint (`posttrain.envs.proxy`), whose model calls the episode runner answers: batched with the
other episodes, token-exact, the sampler's log-probs kept. A call that extends the previous one
(the previous request, the model's reply, then tool or user messages) extends the same row, those
messages' tokens masked out; a call that rewrites the history starts a new row (counted in
``agent/rerender_breaks``).

Outcomes (never a silent 0):

- the agent's reward: PASS at ``pass_threshold`` or more, else MODEL_FAIL (``wrong_answer``, or the
  ``reason`` the agent returned) with that reward; ``scores`` it returns are averaged as
  ``env/<key>_mean``;
- the model's calls ran out (``env.max_turns``, the endpoint's ``agent_max_calls``): MODEL_FAIL
  ``max_turns`` — the model kept the agent going;
- INFRA_FAIL, masked: the agent raised or exited non-zero (``agent_error``, ``agent_exit``), never
  called the model (``no_model_call``), ran past ``agent_timeout_s`` (``agent_timeout``; a command
  is killed, a thread abandoned), or returned something that is not a number (``bad_reward``).

An agent decides itself what the model's mistakes are worth: one that raises on a reply it cannot
parse makes that episode INFRA_FAIL, masked — an outcome the policy could learn to provoke. Catch
such errors in the agent and return a reward (0) for them.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import queue
import secrets
import shlex
import shutil
import signal
import subprocess
import threading
import time
from typing import Callable

from posttrain.envs.base import EnvInfraError, StepResult
from posttrain.envs.proxy import MAX_REQUEST_BYTES, ProxiedEnv
from posttrain.outcome import Outcome

AGENT_END = "agent_end"  # the event the agent's thread or process puts on its channel when it is done


def resolve_agent(spec: str) -> Callable:
    """The callable ``package.module:function`` names (ValueError / ImportError when it cannot)."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"agent={spec!r}: name it package.module:function")
    fn = getattr(importlib.import_module(module_name), attr, None)
    if not callable(fn):
        raise ValueError(f"agent={spec!r}: module {module_name!r} has no callable {attr!r}")
    return fn


def command_argv(cmd: str) -> list[str]:
    """``cmd`` split as a shell would, its program found (ValueError when it cannot be)."""
    try:
        argv = shlex.split(cmd)
    except ValueError as e:
        raise ValueError(f"agent_cmd={cmd!r}: {e}") from None
    if not argv or shutil.which(argv[0]) is None:
        raise ValueError(f"agent_cmd={cmd!r}: no program {argv[0] if argv else ''!r} found")
    return argv


def outcome_of(result, pass_threshold: float) -> Outcome:
    """The verdict of what the agent returned: a number or ``{"reward", "reason"?, "scores"?}``."""
    reward = result.get("reward") if isinstance(result, dict) else result
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
        return Outcome.infra_fail("bad_reward", f"the agent returned {result!r:.200}, not a finite number "
                                                "or {'reward': number}")
    reason = result.get("reason") if isinstance(result, dict) else None
    if reward >= pass_threshold:
        return Outcome.passed(float(reward))
    return Outcome.model_fail(reason if isinstance(reason, str) and reason else "wrong_answer", reward=float(reward))


def scores_of(result) -> dict:
    """The numbers of the ``scores`` an agent returned (``env/<key>_mean``); others are left out."""
    scores = result.get("scores") if isinstance(result, dict) else None
    if not isinstance(scores, dict):
        return {}
    return {str(k): float(v) for k, v in scores.items() if type(v) in (int, float)}


class AgentEnv(ProxiedEnv):
    """One episode of the user's agent (see the module docstring)."""

    def __init__(self, agent: str = "", agent_cmd: str = "", timeout_s: float = 300.0, max_calls: int = 64,
                 max_request_bytes: int = 8 << 20, host: str = "127.0.0.1", pass_threshold: float = 1.0,
                 tools_style: str = "json", verdict: str = "", venv: str = ""):
        super().__init__()
        if verdict not in ("", "swe"):
            raise ValueError(f"env.options.verdict={verdict!r}: '' (the agent's reward) or 'swe' (the task's hidden tests)")
        if bool(agent) == bool(agent_cmd):
            raise ValueError("env.name=agent needs one of env.agent (package.module:function) or env.agent_cmd")
        self.fn = resolve_agent(agent) if agent else None
        self.argv = command_argv(agent_cmd) if agent_cmd else None
        self.timeout_s, self.max_calls, self.host = timeout_s, max_calls, host
        self.max_request_bytes = min(max_request_bytes, MAX_REQUEST_BYTES)
        self.pass_threshold, self.tools_style = pass_threshold, tools_style
        self.proc: subprocess.Popen | None = None
        self.deadline, self.calls = 0.0, 0
        self.verdict, self.venv, self.sandbox, self.sandbox_error = verdict, venv, None, ""

    # ------------------------------------------------------------------------------ the agent
    def _start(self, task: dict, base_url: str, key: str) -> None:
        events = self.channel.events
        if self.fn is not None:
            def work() -> None:
                try:
                    events.put((AGENT_END, ("result", self.fn(task, base_url, key))))
                except BaseException as e:  # noqa: BLE001 - every failure of the agent is a verdict
                    events.put((AGENT_END, ("raised", f"{type(e).__name__}: {e}")))

            threading.Thread(target=work, daemon=True, name="agent").start()
            return
        env = {**os.environ, "POSTTRAIN_BASE_URL": base_url, "OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": key}
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     env=env, text=True, start_new_session=True)
        threading.Thread(target=self._wait_command, args=(self.proc, json.dumps(task), events),
                         daemon=True, name="agent-cmd").start()

    @staticmethod
    def _wait_command(proc: subprocess.Popen, task: str, events: queue.Queue) -> None:
        try:
            out, err = proc.communicate(task)
        except (OSError, ValueError) as e:
            return events.put((AGENT_END, ("raised", f"{type(e).__name__}: {e}")))
        if proc.returncode != 0:
            tail = " ".join(err.split())[-400:]
            return events.put((AGENT_END, ("exit", f"exit status {proc.returncode}: {tail}")))
        lines = [line for line in out.splitlines() if line.strip()]
        try:
            result = json.loads(lines[-1]) if lines else None
        except json.JSONDecodeError:
            result = lines[-1][:200]
        events.put((AGENT_END, ("result", result)))

    def _kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass

    # ---------------------------------------------------------------------------- the episode
    def _next(self):
        """The next request (a `Pending`), or the episode's verdict as a done `StepResult`."""
        try:
            kind, value = self.channel.events.get(timeout=max(self.deadline - time.monotonic(), 0.0))
        except queue.Empty:  # past the deadline the door shuts, even for an episode the runner abandoned
            self.close_channel()
            self._kill()
            return self._end(Outcome.infra_fail("agent_timeout", f"the agent ran past agent_timeout_s="
                                                                 f"{self.timeout_s:g}"))
        if kind == "request":
            self.calls += 1
            return value
        if kind == "limit":
            return self._end(Outcome.model_fail("max_turns", detail=value))
        how, result = value
        if how != "result":
            return self._end(Outcome.infra_fail("agent_error" if how == "raised" else "agent_exit", result[:500]))
        if self.calls == 0:
            return self._end(Outcome.infra_fail("no_model_call", "the agent returned without calling the model"))
        if self.sandbox is not None:
            return self._judge()
        outcome = outcome_of(result, self.pass_threshold)
        return StepResult(reward=outcome.reward, done=True, outcome=outcome, info={"scores": scores_of(result)})

    def _judge(self) -> StepResult:
        """The task's hidden tests on the tree the agent's commands left (``verdict=swe``)."""
        if self.sandbox_error:
            return self._end(Outcome.infra_fail("sandbox", self.sandbox_error[:500]))
        outcome, fractions = self.sandbox.verdict()
        return StepResult(reward=outcome.reward, done=True, outcome=outcome, info={"scores": fractions})

    def _execute(self, body: dict) -> dict:
        try:
            return self.sandbox.execute(body)
        except EnvInfraError as e:  # the machinery failed, not the command: the episode is masked
            self.sandbox_error = str(e)
            raise

    def _end(self, outcome: Outcome) -> StepResult:
        return StepResult(done=True, outcome=outcome)

    def reset(self, example: dict) -> list[dict]:
        task = {k: v for k, v in example.items() if not k.startswith("_")}
        if self.verdict == "swe":  # the agent gets the issue, never the record's fix or hidden tests
            from posttrain.envs.agent_swe import SweSandbox

            self.sandbox = SweSandbox(venv=self.venv)
            task = self.sandbox.reset(example)
        key = secrets.token_urlsafe(24)
        base_url = self.open_channel(key, self.max_calls, self.max_request_bytes)
        if self.sandbox is not None:
            self.channel.executor = self._execute
        self.deadline = time.monotonic() + self.timeout_s
        self._start(task, base_url, key)
        first = self._next()
        if isinstance(first, StepResult):  # it ended before its first model call
            o = first.outcome
            reason = o.reason if o.cls.value == "INFRA_FAIL" else "no_model_call"
            raise EnvInfraError(f"the agent ended before its first model call: {o.detail}"[:600], reason=reason)
        return self.first_request(first)

    def step(self, text: str) -> StepResult:
        self.answer(text)
        nxt = self._next()
        return nxt if isinstance(nxt, StepResult) else self.next_request(nxt)

    def close(self) -> None:
        self.close_channel()
        self._kill()
