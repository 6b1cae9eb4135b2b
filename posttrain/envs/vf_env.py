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
- **the endpoint** is a loopback HTTP server in posttrain's process (``/ep/<episode>/v1/chat/completions``,
  JSON or SSE): each episode gets its own path, and a request on it is *the episode's next model
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
history it sends (compaction, dropped turns) no longer extends what the model saw: that episode
ends as INFRA_FAIL (``history_rewritten``, masked).

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
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from posttrain.envs.base import EnvInfraError, Environment, EnvTaskError, StepResult
from posttrain.envs.tools import MalformedCall, Tool, parse_tool_calls
from posttrain.outcome import Outcome

TASK_ERRORS = ("TaskError",)
MAX_REQUEST_BYTES = 64 << 20  # the episode's whole history, as the harness sends it
LIMIT_STOPS = ("max_turns", "max_input_tokens", "max_output_tokens", "max_total_tokens")
DRIVER = Path(__file__).with_name("vf_driver.py")
_LOCK = threading.Lock()
_DRIVERS: dict[str, "_Driver"] = {}
_BRIDGE: "_Bridge | None" = None


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
    """Stop the verifiers processes (and the endpoint) this process started."""
    global _BRIDGE
    with _LOCK:
        for d in _DRIVERS.values():
            d.stop()
        _DRIVERS.clear()
        if _BRIDGE is not None:
            _BRIDGE.server.shutdown()
            _BRIDGE.server.server_close()
            _BRIDGE = None


# ---------------------------------------------------------------------------------- the endpoint
class _Pending:
    """One model request of an episode, waiting for its answer (a turn's text, or None: refused)."""

    def __init__(self, body: dict):
        self.body, self.answer, self.tool_calls, self.ready = body, None, [], threading.Event()

    def reply(self, answer: str | None, tool_calls: list[dict] | None = None) -> None:
        self.answer, self.tool_calls = answer, tool_calls or []
        self.ready.set()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # quiet
        pass

    def _send(self, code: int, payload: bytes, ctype: str = "application/json", close: bool = False) -> None:
        self.send_response(code)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(payload)))
        if close:  # the body was not read: the connection cannot carry another request
            self.send_header("connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(payload)

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        parts = self.path.strip("/").split("/")
        try:
            size = int(self.headers.get("content-length") or 0)
        except ValueError:
            size = -1
        if not 0 <= size <= MAX_REQUEST_BYTES:
            message = f"a request body must have a content-length of 0 to {MAX_REQUEST_BYTES} bytes"
            return self._send(400, json.dumps({"error": {"message": message}}).encode(), close=True)
        try:
            body = json.loads(self.rfile.read(size) or b"{}")
            if not isinstance(body, dict):
                raise ValueError("the body is not a JSON object")
        except ValueError as e:  # malformed JSON is a ValueError too
            return self._send(400, json.dumps({"error": {"message": str(e)[:200]}}).encode())
        channel = self.server.channels.get(parts[1]) if len(parts) >= 2 and parts[0] == "ep" else None
        if channel is None or parts[-2:] != ["chat", "completions"]:
            return self._send(404, b'{"error": {"message": "no such episode or route"}}')
        pending = _Pending(body)
        channel.put(("request", pending))
        if not pending.ready.wait(self.server.answer_timeout_s) or pending.answer is None:
            return self._send(503, b'{"error": {"message": "the episode was ended by posttrain"}}')
        self._answer(body, pending.answer, pending.tool_calls)

    def _answer(self, body: dict, text: str, tool_calls: list[dict]) -> None:
        model, rid = body.get("model", "posttrain"), f"chatcmpl-{uuid.uuid4().hex[:12]}"
        message, finish = {"role": "assistant", "content": text}, "tool_calls" if tool_calls else "stop"
        if tool_calls:
            message["tool_calls"] = tool_calls
        if not body.get("stream"):
            out = {"id": rid, "object": "chat.completion", "created": int(time.time()), "model": model,
                   "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                   "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}}
            return self._send(200, json.dumps(out).encode())
        chunk = {"id": rid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model}
        delta = {**message, "tool_calls": [{"index": i, **c} for i, c in enumerate(tool_calls)]} if tool_calls else message
        events = [{**chunk, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
                  {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]},
                  {**chunk, "choices": [], "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}}]
        data = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
        self._send(200, data.encode(), "text/event-stream")


class _Server(ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:
        pass  # a harness that hung up on a refused request; the episode's verdict says what happened


class _Bridge:
    def __init__(self, answer_timeout_s: float):
        self.server = _Server(("127.0.0.1", 0), _Handler)
        self.server.daemon_threads = True
        self.server.channels = {}
        self.server.answer_timeout_s = answer_timeout_s
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True, name="verifiers-endpoint").start()


def bridge() -> _Bridge:
    global _BRIDGE
    with _LOCK:
        if _BRIDGE is None:
            _BRIDGE = _Bridge(answer_timeout_s=3600.0)
        return _BRIDGE


# ------------------------------------------------------------------------------------ the episode
def _text(content) -> str:
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def offered_tools(body: dict) -> dict[str, Tool]:
    """The function tools a harness's request offers (``tools``), as `Tool`s to parse calls against;
    the harness runs them, not posttrain."""
    out = {}
    for t in body.get("tools") or []:
        f = t.get("function") if isinstance(t, dict) else None
        if not isinstance(f, dict) or not isinstance(f.get("name"), str):
            continue
        params = f.get("parameters") if isinstance(f.get("parameters"), dict) else {}
        out[f["name"]] = Tool(f["name"], None, str(f.get("description") or ""),
                              {"type": "object", "properties": dict(params.get("properties") or {}),
                               "required": list(params.get("required") or [])})
    return out


def wire_calls(text: str, tools: dict[str, Tool]) -> list[dict]:
    """The OpenAI ``tool_calls`` of a turn's text (posttrain's ``<tool_call>`` syntax); none when it
    calls nothing or a call is malformed: the harness then gets the text alone, and what the model
    wrote is scored as verifiers scores it."""
    try:
        calls = parse_tool_calls(text, tools) if tools else []
    except MalformedCall:
        return []
    return [{"id": f"call_{uuid.uuid4().hex[:12]}", "type": "function",
             "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)}} for c in calls]


def _message(m: dict) -> dict:
    out = {"role": m.get("role", "user"), "content": _text(m.get("content"))}
    if m.get("name"):
        out["name"] = m["name"]
    return out


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


class VerifiersEnv(Environment):
    """One episode of a verifiers environment (see the module docstring)."""

    def __init__(self, taskset: str, *, taskset_options: dict | None = None, env_options: dict | None = None,
                 python: str = "", pass_threshold: float = 1.0, timeout_s: float = 120.0,
                 max_turns: int | None = None, tools_style: str = "json"):
        if not taskset:
            raise ValueError("verifiers: name the taskset, env.name=verifiers:<taskset id>")
        env_options = dict(env_options or {})
        env_options.setdefault("agent", {"runtime": {"type": "subprocess"}})  # local, offline: no Prime sandbox
        self.spec = {"taskset": taskset, "taskset_options": dict(taskset_options or {}), "env_options": env_options}
        self.python = python or default_python()
        self.pass_threshold, self.timeout_s, self.max_turns = pass_threshold, timeout_s, max_turns
        self.tools_style, self._offered = tools_style, {}
        self.driver = driver(self.python, self.spec, start_timeout_s=max(timeout_s, 60.0))
        self.rid, self.events, self.pending, self.sent, self.done = "", None, None, [], True
        self.result: dict | None = None
        """What verifiers returned for the episode (rewards, errors, the replies its traces hold)."""

    @property
    def tools(self) -> list[Tool]:
        """The tools the harness offers (the runner shows them to the model, `EpisodeRunner.render`)."""
        return list(self._offered.values())

    def _task(self, example: dict) -> dict:
        if isinstance(example.get("task"), dict):
            return {"task": example["task"]}
        if example.get("task_idx") is not None:
            return {"task_idx": int(example["task_idx"])}
        return {"task": {k: v for k, v in example.items() if not k.startswith("_")}}

    def _next(self):
        """The episode's next event: ("request", _Pending) or ("done", summary)."""
        try:
            kind, value = self.events.get(timeout=self.timeout_s)
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
        self.rid, self.events, self.done = uuid.uuid4().hex, queue.Queue(), False
        b = bridge()
        b.server.channels[self.rid] = self.events
        self.driver.send({"op": "run", "id": self.rid, **self._task(example), "model": "posttrain",
                          "base_url": f"{b.url}/ep/{self.rid}/v1"}, waiter=self.events)
        kind, value = self._next()
        if kind == "done":
            outcome = outcome_of(value, self.pass_threshold)
            raise (EnvTaskError if outcome.cls.value == "TASK_FAIL" else EnvInfraError)(
                f"verifiers: the episode ended before its first model call ({outcome.reason}: {outcome.detail})")
        self.pending = value
        self.sent = [_message(m) for m in value.body.get("messages") or []]
        self._offered = offered_tools(value.body)
        return list(self.sent)

    def step(self, text: str) -> StepResult:
        self.pending.reply(text, wire_calls(text, self._offered))
        self.sent.append({"role": "assistant", "content": text})
        kind, value = self._next()
        if kind == "done":
            self.pending = None
            outcome = outcome_of(value, self.pass_threshold)
            return StepResult(reward=outcome.reward, done=True, outcome=outcome)
        self.pending = value
        messages = [_message(m) for m in value.body.get("messages") or []]
        if len(messages) < len(self.sent) or any(
                a["role"] != b["role"] or a["content"] != b["content"] for a, b in zip(messages, self.sent)):
            return StepResult(done=True, outcome=Outcome.infra_fail(
                "history_rewritten", "the harness's request does not extend the conversation the model saw"))
        new, self.sent = messages[len(self.sent):], messages
        return StepResult(observation=new)

    def close(self) -> None:
        b = _BRIDGE
        if b is not None:
            b.server.channels.pop(self.rid, None)
        if self.pending is not None:
            self.pending.reply(None)  # the harness's request is refused: posttrain ended the episode
            self.pending = None
        if self.rid and not self.done:
            self.driver.forget(self.rid)
            try:
                self.driver.send({"op": "cancel", "id": self.rid})
            except EnvInfraError:
                pass
