"""verifiers environments (``env.name=verifiers:<taskset>``): Prime Intellect's ``verifiers`` v1
(Taskset / Harness / Env) driven by posttrain's episode runner, token-exact.

In verifiers the environment drives the model: a harness program calls an OpenAI-compatible
endpoint through verifiers' interception server, and the rewards land on the episode's traces.
Trainers run it that way too (prime-rl: an env server per environment, its model calls sent to the
trainer's inference server, rewards read off the returned episode). posttrain does the same, with
its own endpoint in front of its own engine:

- **the environment** runs in a process of its own, under ``.venv-verifiers`` (verifiers wants
  openai<3 and pins mcp; ``bash scripts/setup.sh verifiers``): `posttrain.envs.vf_driver` builds it
  as verifiers' entry points do and runs one episode per request (``env.run_slot``), one driver per
  environment spec per process;
- **the endpoint** is a loopback HTTP server in posttrain's process (`posttrain.envs.proxy`,
  ``/ep/<episode>/v1/chat/completions``, JSON or SSE): each episode gets its own path, and a request on it is *the episode's next model
  turn*. The adapter is an ordinary `Environment`: ``reset`` starts the verifiers episode and returns
  the messages of its first model request; ``step(text)`` answers the pending request with the
  model's turn and returns the messages the next request adds (the harness's feedback, tool results)
  or, when the episode ends, its reward. So the runner owns every token as for any environment: the
  G episodes' turns are batched into one ``generate`` call, the trajectory is the engine's sampled
  ids plus the chat template's ids for the environment's messages, never re-tokenised, with the
  sampler's log-probs; async RL, limits and evaluation work unchanged. The model's turn is sent to
  verifiers as the text of those ids, so the trace verifiers scores holds exactly what was sampled.

Tools: the function tools a request offers are the episode's `tools` (the runner shows them to the
model as it shows any environment's), and a turn's ``<tool_call>`` blocks go back to the harness
in the response's ``tool_calls``; a malformed call is sent as text alone.

Sampling parameters in the harness's requests are ignored: posttrain's sampling (``rollout.*``, the
eval profile) decides, as its trainer must know what it sampled from. A harness that rewrites the
history it sends (compaction, dropped turns) no longer extends what the model saw: the episode
goes on in a new sample (row) from the rewritten conversation, counted as a prefix break
(``env.split_on_prefix_break=false``: INFRA_FAIL ``history_rewritten``, masked). The endpoint and
the episode's side of it are `posttrain.envs.proxy`, shared with ``env.name=agent``.

Outcomes: the episode's reward is the sum of its traces' weighted rewards; PASS when it reaches
``pass_threshold`` (1.0), else MODEL_FAIL (``wrong_answer``, or verifiers' stop condition
``max_turns`` / ``max_*_tokens``) with that reward — a reply the environment cannot parse scores
0 there, as verifiers' rewards score it. verifiers' own fault attribution is kept: a ``TaskError``
(the task's setup or reward raised) or task data that does not validate is TASK_FAIL; a
``HarnessError``, ``SandboxError``, ``InterceptionError``, ``ProviderError``, ``ToolsetError``,
``EnvError``, a stage deadline, the driver process dying or not answering within ``timeout_s`` is
INFRA_FAIL. Both are masked from the gradient and counted.
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import subprocess
import tempfile
import threading
from pathlib import Path

from posttrain.envs.base import EnvInfraError, EnvTaskError, StepResult
from posttrain.envs.proxy import MAX_REQUEST_BYTES, Endpoint, ProxiedEnv, endpoint, offered_tools, wire_calls
from posttrain.outcome import Outcome

__all__ = ["MAX_REQUEST_BYTES", "VerifiersEnv", "bridge", "offered_tools", "outcome_of", "stop_drivers",
           "wire_calls"]

TASK_ERRORS = ("TaskError",)
LIMIT_STOPS = ("max_turns", "max_input_tokens", "max_output_tokens", "max_total_tokens")
DRIVER = Path(__file__).with_name("vf_driver.py")
_LOCK = threading.Lock()
_DRIVERS: dict[str, "_Driver"] = {}


def default_python() -> str:
    """``$POSTTRAIN_VERIFIERS_PYTHON``, else the repository's ``.venv-verifiers`` interpreter."""
    return os.environ.get("POSTTRAIN_VERIFIERS_PYTHON") or str(
        Path(__file__).resolve().parents[2] / ".venv-verifiers" / "bin" / "python")


# ------------------------------------------------------------------------------------ the driver
class _Driver:
    """The verifiers process: requests out on stdin, episode results back on stdout by id."""

    def __init__(self, python: str, spec: dict, start_timeout_s: float):
        self.log = tempfile.NamedTemporaryFile(prefix="posttrain-verifiers-", suffix=".log", delete=False)
        self.proc = subprocess.Popen([python, str(DRIVER), json.dumps(spec)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log, text=True, start_new_session=True)
        self.waiters: dict[str, queue.Queue] = {}
        self.lock = threading.Lock()
        ready: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, args=(ready,), daemon=True, name="verifiers-driver").start()
        try:
            first = ready.get(timeout=start_timeout_s)
        except queue.Empty:
            self.stop()
            raise EnvInfraError(f"verifiers: the environment did not start in {start_timeout_s:g} s "
                                f"({self.log_tail()})") from None
        if not first or not first.get("ready"):
            self.stop()
            why = first.get("error") if first else f"the driver exited ({self.log_tail()})"
            raise ValueError(f"verifiers: cannot load taskset {spec['taskset']!r}: {' '.join(str(why).split())[:400]}")

    def _read(self, ready: queue.Queue) -> None:
        first = True
        for line in self.proc.stdout:
            try:
                msg = json.loads(line)
            except json.JSONDecodeError:
                continue
            if first:
                ready.put(msg)
                first = False
                continue
            with self.lock:
                waiter = self.waiters.pop(msg.get("id"), None)
            if waiter is not None:
                waiter.put(("done", msg))
        if first:
            ready.put(None)
        with self.lock:  # the process is gone: every episode still waiting learns it
            waiters, self.waiters = list(self.waiters.values()), {}
        for waiter in waiters:
            waiter.put(("dead", f"the verifiers process exited ({self.log_tail()})"))

    def log_tail(self, n: int = 600) -> str:
        try:
            text = Path(self.log.name).read_text(errors="replace").strip()
        except OSError:
            return "no log"
        return text[-n:] or "no output"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def send(self, request: dict, waiter: queue.Queue | None = None) -> None:
        with self.lock:
            if waiter is not None:
                self.waiters[request["id"]] = waiter
            try:
                self.proc.stdin.write(json.dumps(request) + "\n")
                self.proc.stdin.flush()
            except (OSError, ValueError) as e:
                self.waiters.pop(request["id"], None)
                raise EnvInfraError(f"verifiers: the environment process is gone ({e}; {self.log_tail()})") from None

    def forget(self, rid: str) -> None:
        with self.lock:
            self.waiters.pop(rid, None)

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(5)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()


def driver(python: str, spec: dict, start_timeout_s: float = 120.0) -> _Driver:
    """The running driver for ``spec`` (started once per process; again if it died)."""
    key = json.dumps([python, spec], sort_keys=True)
    with _LOCK:
        d = _DRIVERS.get(key)
        if d is None or not d.alive():
            if not Path(python).exists():
                raise ImportError(f"verifiers environments run under {python}, which does not exist: "
                                  "bash scripts/setup.sh verifiers (or set POSTTRAIN_VERIFIERS_PYTHON)")
            d = _DRIVERS[key] = _Driver(python, spec, start_timeout_s)
        return d


@atexit.register
def stop_drivers() -> None:
    """Stop the verifiers processes this process started."""
    with _LOCK:
        for d in _DRIVERS.values():
            d.stop()
        _DRIVERS.clear()


def bridge() -> Endpoint:
    """The loopback endpoint the harnesses call (`posttrain.envs.proxy`)."""
    return endpoint()


# ------------------------------------------------------------------------------------ the episode
def outcome_of(result: dict, pass_threshold: float) -> Outcome:
    """The episode's verdict from the driver's summary (the module docstring's table)."""
    traces = result.get("traces") or []
    errors = list(result.get("errors") or []) + [e for t in traces for e in t.get("errors") or []]
    if errors:
        last = errors[-1]
        detail = f"{last['type']}: {last['message']}"[:500]
        if last["type"] in TASK_ERRORS:
            return Outcome.task_fail("verifiers_task_error", detail)
        return Outcome.infra_fail("verifiers_error", detail)
    if result.get("is_timeout") or any(t.get("is_timeout") for t in traces):
        return Outcome.infra_fail("env_timeout", "a verifiers stage deadline expired")
    if not result.get("ok") or not traces:
        return Outcome.infra_fail("verifiers_error", "the verifiers episode did not complete")
    reward = sum(float(t.get("reward") or 0.0) for t in traces)
    if reward >= pass_threshold:
        return Outcome.passed(reward)
    stop = traces[-1].get("stop_condition")
    return Outcome.model_fail(stop if stop in LIMIT_STOPS else "wrong_answer", reward=reward)


class VerifiersEnv(ProxiedEnv):
    """One episode of a verifiers environment (see the module docstring)."""

    def __init__(self, taskset: str, *, taskset_options: dict | None = None, env_options: dict | None = None,
                 python: str = "", pass_threshold: float = 1.0, timeout_s: float = 120.0,
                 max_turns: int | None = None, tools_style: str = "json"):
        super().__init__()
        if not taskset:
            raise ValueError("verifiers: name the taskset, env.name=verifiers:<taskset id>")
        env_options = dict(env_options or {})
        env_options.setdefault("agent", {"runtime": {"type": "subprocess"}})  # local, offline: no Prime sandbox
        self.spec = {"taskset": taskset, "taskset_options": dict(taskset_options or {}), "env_options": env_options}
        self.python = python or default_python()
        self.pass_threshold, self.timeout_s, self.max_turns = pass_threshold, timeout_s, max_turns
        self.tools_style = tools_style
        self.driver = driver(self.python, self.spec, start_timeout_s=max(timeout_s, 60.0))
        self.done = True
        self.result: dict | None = None
        """What verifiers returned for the episode (rewards, errors, the replies its traces hold)."""

    def _task(self, example: dict) -> dict:
        if isinstance(example.get("task"), dict):
            return {"task": example["task"]}
        if example.get("task_idx") is not None:
            return {"task_idx": int(example["task_idx"])}
        return {"task": {k: v for k, v in example.items() if not k.startswith("_")}}

    def _next(self):
        """The episode's next event: ("request", Pending) or ("done", summary)."""
        try:
            kind, value = self.channel.events.get(timeout=self.timeout_s)
        except queue.Empty:
            raise EnvInfraError(f"verifiers: no model request and no result in {self.timeout_s:g} s") from None
        if kind == "dead":
            raise EnvInfraError(value)
        if kind == "done":
            self.done, self.result = True, value
            if value.get("task_error"):
                raise EnvTaskError(f"verifiers: the task does not validate: {value['task_error']}"[:600])
        return kind, value

    def reset(self, example: dict) -> list[dict]:
        self.done = False
        base_url = self.open_channel()
        self.driver.send({"op": "run", "id": self.eid, **self._task(example), "model": "posttrain",
                          "base_url": base_url}, waiter=self.channel.events)
        kind, value = self._next()
        if kind == "done":
            outcome = outcome_of(value, self.pass_threshold)
            raise (EnvTaskError if outcome.cls.value == "TASK_FAIL" else EnvInfraError)(
                f"verifiers: the episode ended before its first model call ({outcome.reason}: {outcome.detail})")
        return self.first_request(value)

    def step(self, text: str) -> StepResult:
        self.answer(text)
        kind, value = self._next()
        if kind == "done":
            outcome = outcome_of(value, self.pass_threshold)
            return StepResult(reward=outcome.reward, done=True, outcome=outcome)
        return self.next_request(value)

    def close(self) -> None:
        self.close_channel()  # a pending request is refused: posttrain ended the episode
        if self.eid and not self.done:
            self.driver.forget(self.eid)
            try:
                self.driver.send({"op": "cancel", "id": self.eid})
            except EnvInfraError:
                pass
