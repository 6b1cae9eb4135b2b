"""OpenEnv environments (``env.name=openenv``): episodes against an OpenEnv server over WebSocket.

An OpenEnv environment (``openenv-core`` on PyPI, Meta's environment spec) is a server: a FastAPI
app made by ``openenv.core.env_server.create_app(EnvClass, ActionClass, ObservationClass)``, where
every WebSocket session (``/ws``) holds its own environment instance. Each posttrain episode opens
one session with OpenEnv's own client (`GenericEnvClient`), calls ``reset`` and then ``step`` once
per model turn, and closes it.

Options (``env.options``):

- ``url``: a running server (``http://host:port``), or ``launch``: ``module:app`` — posttrain
  starts it with uvicorn on 127.0.0.1 (a free port), as OpenEnv's servers are started
  (``uvicorn server.app:app``), waits for ``/health``, and stops it when the process exits;
- ``action_field``: the action's text field that gets the model's turn (e.g. ``message``); empty:
  the model writes the whole action as a JSON object (a malformed one is its fault);
- ``observation_field``: the observation field shown to the model (empty: every field but
  ``done``/``reward``/``metadata``, as JSON when there are several);
- ``reset_fields``: the example's fields passed to ``reset`` (default ``[seed]``; e.g. a task id);
- ``pass_threshold`` (1.0): when the server says ``done``, the verdict is PASS if the step's
  reward reaches it, else MODEL_FAIL with that reward; ``timeout_s`` (30): per message.

The opening message is the example's ``prompt`` (if any) followed by the reset observation.

Faults: the server unreachable, a dropped connection, a timeout, or the server's
``EXECUTION_ERROR`` / ``CAPACITY_REACHED`` / ``SESSION_ERROR`` / ``FACTORY_ERROR`` codes are
INFRA_FAIL (`EnvInfraError`); a ``VALIDATION_ERROR`` is the model's fault when it writes the action
(MODEL_FAIL malformed_action) and the task's when posttrain builds it from ``action_field``
(TASK_FAIL: that field does not fit the server's action).
"""

from __future__ import annotations

import atexit
import json
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request

from posttrain.envs.base import EnvInfraError, Environment, EnvTaskError, StepResult
from posttrain.outcome import Outcome

_INFRA_CODES = ("EXECUTION_ERROR", "CAPACITY_REACHED", "SESSION_ERROR", "FACTORY_ERROR", "UNKNOWN_TYPE", "INVALID_JSON")
_CODE_RE = re.compile(r"\(code: ([A-Z_]+)\)")
_SERVERS: dict[str, tuple[subprocess.Popen, str]] = {}
_LOCK = threading.Lock()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def launch(app: str, timeout_s: float = 60.0) -> str:
    """The URL of a server running ``app`` (``module:app``), started once per process on loopback."""
    with _LOCK:
        if app in _SERVERS and _SERVERS[app][0].poll() is None:
            return _SERVERS[app][1]
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        proc = subprocess.Popen([sys.executable, "-m", "uvicorn", app, "--host", "127.0.0.1", "--port", str(port),
                                 "--log-level", "warning"], start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while not _healthy(url):
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise EnvInfraError(f"openenv: the server {app} did not start at {url} "
                                    f"({'exited' if proc.poll() is not None else f'no /health in {timeout_s:g} s'})")
            time.sleep(0.2)
        _SERVERS[app] = (proc, url)
        return url


@atexit.register
def stop_servers() -> None:
    """Stop the servers `launch` started."""
    with _LOCK:
        for proc, _ in _SERVERS.values():
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    proc.kill()
        _SERVERS.clear()


class OpenEnvEnv(Environment):
    """One episode = one OpenEnv WebSocket session (see the module docstring)."""

    def __init__(self, *, url: str = "", launch: str = "", action_field: str = "message", observation_field: str = "",
                 reset_fields: list[str] | None = None, pass_threshold: float = 1.0, timeout_s: float = 30.0,
                 max_turns: int | None = None):
        if bool(url) == bool(launch):
            raise ValueError("give exactly one of options.url (a running server) and options.launch (module:app)")
        try:
            from openenv.core import GenericEnvClient
        except ImportError as e:
            raise ImportError("OpenEnv environments need openenv-core (bash scripts/setup.sh envs; from a checkout: pip install -e '.[envs]')") from e
        self._client_cls, self.url, self.app = GenericEnvClient, url.rstrip("/"), launch
        self.action_field, self.observation_field = action_field, observation_field
        self.reset_fields = ["seed"] if reset_fields is None else list(reset_fields)
        self.pass_threshold, self.timeout_s, self.max_turns = pass_threshold, timeout_s, max_turns
        self.client = None

    def _call(self, what: str, fn):
        """Run one client call; its failures as our exceptions (the module docstring's faults)."""
        try:
            return fn()
        except RuntimeError as e:
            m = _CODE_RE.search(str(e))
            code = m.group(1) if m else ""
            if code == "VALIDATION_ERROR" and what == "step" and not self.action_field:
                return Outcome.model_fail("malformed_action", detail=str(e)[:300])
            if code == "VALIDATION_ERROR":
                raise EnvTaskError(f"openenv {what}: the server refused the action built from "
                                   f"action_field={self.action_field!r}: {e}") from None
            raise EnvInfraError(f"openenv {what} at {self.url}: {e}") from None
        except Exception as e:  # connection refused or dropped, timeouts
            raise EnvInfraError(f"openenv {what} at {self.url}: {type(e).__name__}: {e}") from None

    def _text(self, observation: dict) -> str:
        if self.observation_field:
            if self.observation_field not in observation:
                raise EnvTaskError(f"openenv: the observation has no field {self.observation_field!r} "
                                   f"(it has {', '.join(observation)})")
            value = observation[self.observation_field]
            return value if isinstance(value, str) else json.dumps(value)
        rest = {k: v for k, v in observation.items() if k not in ("done", "reward", "metadata")}
        if len(rest) == 1:
            value = next(iter(rest.values()))
            return value if isinstance(value, str) else json.dumps(value)
        return json.dumps(rest)

    def reset(self, example: dict) -> list[dict]:
        if not self.url:
            self.url = launch(self.app)
        self.client = self._client_cls(base_url=self.url, connect_timeout_s=self.timeout_s,
                                       message_timeout_s=self.timeout_s).sync()
        kwargs = {k: example[k] for k in self.reset_fields if k in example}
        result = self._call("reset", lambda: self.client.reset(**kwargs))
        opening = self._text(result.observation)
        prompt = example.get("prompt")
        text = f"{prompt}\n{opening}" if isinstance(prompt, str) and prompt else opening
        return [{"role": "user", "content": text}]

    def _action(self, text: str) -> dict | Outcome:
        if self.action_field:
            return {self.action_field: text}
        try:
            action = json.loads(text)
        except json.JSONDecodeError as e:
            return Outcome.model_fail("malformed_action", detail=f"the action is not JSON ({e.msg})")
        return action if isinstance(action, dict) else Outcome.model_fail("malformed_action",
                                                                          detail="the action is not a JSON object")

    def step(self, text: str) -> StepResult:
        action = self._action(text)
        if isinstance(action, Outcome):
            return StepResult(done=True, outcome=action)
        result = self._call("step", lambda: self.client.step(action))
        if isinstance(result, Outcome):
            return StepResult(done=True, outcome=result)
        reward = float(result.reward or 0.0)
        if not result.done:
            return StepResult(observation=self._text(result.observation), reward=reward)
        outcome = Outcome.passed(reward) if reward >= self.pass_threshold else Outcome.model_fail("wrong_answer",
                                                                                                  reward=reward)
        return StepResult(reward=reward, done=True, outcome=outcome)

    def close(self) -> None:
        if self.client is not None:
            try:
                self.client._run(_close_session(self.client._async, self.timeout_s))
                self.client.close()
            except Exception:  # the session is gone either way
                pass
            self.client = None


async def _close_session(client, timeout_s: float) -> None:
    """Say ``close`` and wait for the server to close the connection from its side. OpenEnv's own
    ``close`` (0.3) sends the message and drops the connection at once; the server then closes a
    connection that is already gone and uvicorn logs a 50-line traceback
    (``ClientDisconnected`` / ``WebSocketDisconnect``) for every episode."""
    import asyncio

    ws = getattr(client, "_ws", None)
    if ws is None:
        return
    await ws.send(json.dumps({"type": "close"}))
    try:
        await asyncio.wait_for(ws.wait_closed(), timeout_s)
    except asyncio.TimeoutError:
        pass  # `close` then drops it
