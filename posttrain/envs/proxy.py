"""The per-episode OpenAI-compatible endpoint, for environments whose program drives the model.

An agent or a harness (`posttrain.envs.agent`, `posttrain.envs.vf_env`) calls the model itself,
through an OpenAI client pointed at ``<endpoint>/ep/<episode>/v1``. posttrain keeps the tokens: a
request on that path is *the episode's next model turn*. Its environment is an ordinary
`Environment` built on `ProxiedEnv`: ``reset`` returns the messages of the first request,
``step(text)`` answers the pending request with the model's turn and returns the messages the next
request adds. The episode runner samples every turn (batched with the other episodes, sampler ids
and log-probs kept, never re-tokenised), so async RL, evaluation and limits work unchanged.

A request that does not extend the conversation the model saw (the program dropped, edited or
summarised turns) comes back as the whole new conversation (``StepResult.history``): the runner
starts a new sample (row) from its rendering and counts a prefix break, so no token is mis-aligned.

The door (what an agent can reach):

- one loopback server per process (``127.0.0.1`` unless the environment names another host);
- each episode has its own random path, and its own key when one is set: another episode's path
  or key gets 404 / 401;
- one request at a time per episode (409), a bounded body (413) and a bounded number of calls
  (429; the environment then ends the episode at its call limit);
- ``POST .../exec`` (an episode with a sandbox only) runs no more commands than the call bound;
- ``POST .../chat/completions`` and ``GET .../models`` are the only other routes: nothing else of
  posttrain (weights, servers, other episodes' trajectories) is reachable through it.

Sampling parameters in the requests are ignored: posttrain's sampling decides, as its trainer must
know what it sampled from. Function tools a request offers become the episode's `tools` (shown to
the model as any environment's), and a turn's ``<tool_call>`` blocks go back in ``tool_calls``.
"""

from __future__ import annotations

import atexit
import json
import queue
import secrets
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from posttrain.envs.base import Environment, StepResult
from posttrain.envs.tools import MalformedCall, Tool, parse_tool_calls

MAX_REQUEST_BYTES = 64 << 20  # an episode's whole history, as the program sends it
_LOCK = threading.Lock()
_ENDPOINTS: dict[str, "Endpoint"] = {}


class Pending:
    """One model request of an episode, waiting for its answer (a turn's text, or None: refused)."""

    def __init__(self, body: dict):
        self.body, self.answer, self.tool_calls, self.ready = body, None, [], threading.Event()

    def reply(self, answer: str | None, tool_calls: list[dict] | None = None) -> None:
        self.answer, self.tool_calls = answer, tool_calls or []
        self.ready.set()


class Channel:
    """One episode's door: the events its environment waits on, its key and its bounds.

    Events are ``("request", Pending)``, ``("limit", why)`` when a call was refused at the call
    bound, and whatever the environment's own machinery puts there (its program's end)."""

    def __init__(self, key: str | None, max_calls: int, max_request_bytes: int):
        self.events: queue.Queue = queue.Queue()
        self.key, self.max_calls, self.max_request_bytes = key, max_calls, max_request_bytes
        self.calls, self.busy, self.lock = 0, False, threading.Lock()
        self.executor = None  # the ``exec`` route's handler, set by an environment that runs commands
        self.exec_lock, self.execs = threading.Lock(), 0

    def admit(self) -> int:
        """0 when a request may go on (it is then counted and the channel busy), else its HTTP code."""
        with self.lock:
            if self.busy:
                return 409
            if self.max_calls and self.calls >= self.max_calls:
                return 429
            self.calls, self.busy = self.calls + 1, True
            return 0

    def release(self) -> None:
        with self.lock:
            self.busy = False


def _error(message: str) -> bytes:
    return json.dumps({"error": {"message": message}}).encode()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out in two writes: no 40 ms delayed-ACK stall

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

    def _channel(self, route: list[str]) -> Channel | None:
        """The episode's channel when the path is ``/ep/<id>/v1/<route>``, else None."""
        parts = self.path.split("?")[0].strip("/").split("/")
        if len(parts) != 3 + len(route) or parts[0] != "ep" or parts[2] != "v1" or parts[3:] != route:
            return None
        return self.server.channels.get(parts[1])

    def _authorised(self, channel: Channel) -> bool:
        if channel.key is None:
            return True
        given = (self.headers.get("authorization") or "").removeprefix("Bearer ").strip()
        return secrets.compare_digest(given.encode(), channel.key.encode())

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        channel = self._channel(["models"])
        if channel is None:
            return self._send(404, _error("no such episode or route"))
        if not self._authorised(channel):
            return self._send(401, _error("wrong key for this episode"))
        models = {"object": "list", "data": [{"id": "posttrain", "object": "model", "owned_by": "posttrain"}]}
        self._send(200, json.dumps(models).encode())

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        channel = self._channel(["chat", "completions"])
        execute = channel is None and self._channel(["exec"])
        if execute and execute.executor is not None:
            return self._exec(execute)
        raw = self._read_body(channel.max_request_bytes if channel is not None else MAX_REQUEST_BYTES)
        if raw is None:
            return None
        try:
            body = json.loads(raw or b"{}")
            if not isinstance(body, dict):
                raise ValueError("the body is not a JSON object")
        except ValueError as e:  # malformed JSON is a ValueError too
            return self._send(400, _error(str(e)[:200]))
        if channel is None:
            return self._send(404, _error("no such episode or route"))
        if not self._authorised(channel):
            return self._send(401, _error("wrong key for this episode"))
        refused = channel.admit()
        if refused == 429:
            channel.events.put(("limit", f"more than {channel.max_calls} model calls"))
        if refused:
            why = "one request at a time per episode" if refused == 409 else "too many model calls in this episode"
            return self._send(refused, _error(why))
        try:
            pending = Pending(body)
            channel.events.put(("request", pending))
            if not pending.ready.wait(self.server.answer_timeout_s) or pending.answer is None:
                return self._send(503, _error("the episode was ended by posttrain"))
        finally:
            channel.release()
        self._answer(body, pending.answer, pending.tool_calls)

    def _read_body(self, limit: int) -> bytes | None:
        """The request's body, or None once a 400 (no valid content-length) or 413 (over ``limit``) is sent."""
        try:
            size = int(self.headers.get("content-length") or 0)
        except ValueError:
            size = -1
        if size < 0:
            self._send(400, _error("a request needs a content-length of 0 or more bytes"), close=True)
            return None
        if size > limit:
            self._send(413, _error(f"a request body may have at most {limit} bytes"), close=True)
            return None
        return self.rfile.read(size)

    def _exec(self, channel: Channel) -> None:
        """``POST .../exec``: a command for the episode's sandbox (`posttrain.envs.agent_swe`); one
        at a time, inside the same key and size bounds as a model call."""
        body = self._read_body(channel.max_request_bytes)
        if body is None:
            return None
        if not self._authorised(channel):
            return self._send(401, _error("wrong key for this episode"))
        if not channel.exec_lock.acquire(blocking=False):
            return self._send(409, _error("one command at a time per episode"))
        # an agent runs a command per model call at most in the usual loop: the call bound bounds both
        if channel.max_calls and channel.execs >= channel.max_calls:
            channel.exec_lock.release()
            return self._send(429, _error(f"more than {channel.max_calls} commands"))
        channel.execs += 1
        try:
            payload = json.loads(body or b"{}")
            result = channel.executor(payload if isinstance(payload, dict) else {})
        except ValueError as e:
            return self._send(400, _error(str(e)[:200]))
        except Exception as e:  # noqa: BLE001 - the sandbox failed: the agent sees it; the episode's verdict says more
            return self._send(503, _error(f"the sandbox failed: {type(e).__name__}: {e}"[:300]))
        finally:
            channel.exec_lock.release()
        self._send(200, json.dumps(result).encode())

    def _answer(self, body: dict, text: str, tool_calls: list[dict]) -> None:
        model, rid = body.get("model", "posttrain"), f"chatcmpl-{uuid.uuid4().hex[:12]}"
        message, finish = {"role": "assistant", "content": text}, "tool_calls" if tool_calls else "stop"
        if tool_calls:
            message["tool_calls"] = tool_calls
        usage = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
        if not body.get("stream"):
            out = {"id": rid, "object": "chat.completion", "created": int(time.time()), "model": model,
                   "choices": [{"index": 0, "message": message, "finish_reason": finish}], "usage": usage}
            return self._send(200, json.dumps(out).encode())
        chunk = {"id": rid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model}
        delta = {**message, "tool_calls": [{"index": i, **c} for i, c in enumerate(tool_calls)]} if tool_calls else message
        events = [{**chunk, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
                  {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]},
                  {**chunk, "choices": [], "usage": usage}]
        data = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
        self._send(200, data.encode(), "text/event-stream")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # every episode of a step connects at once (socketserver's default: 5)

    def handle_error(self, request, client_address) -> None:
        pass  # a program that hung up on a refused request; the episode's verdict says what happened


class Endpoint:
    """The process's endpoint on ``host``: episodes open and close channels on it."""

    def __init__(self, host: str = "127.0.0.1", answer_timeout_s: float = 3600.0):
        self.server = _Server((host, 0), _Handler)
        self.server.channels = {}
        self.server.answer_timeout_s = answer_timeout_s
        self.url = f"http://{host}:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True, name="posttrain-endpoint").start()

    def open(self, key: str | None = None, max_calls: int = 0,
             max_request_bytes: int = MAX_REQUEST_BYTES) -> tuple[str, Channel]:
        """A new episode's ``(id, channel)``: its base URL is ``base_url(id)``."""
        eid, channel = secrets.token_hex(16), Channel(key, max_calls, min(max_request_bytes, MAX_REQUEST_BYTES))
        self.server.channels[eid] = channel
        return eid, channel

    def close(self, eid: str) -> None:
        self.server.channels.pop(eid, None)

    def base_url(self, eid: str) -> str:
        return f"{self.url}/ep/{eid}/v1"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def endpoint(host: str = "127.0.0.1") -> Endpoint:
    """The process's endpoint on ``host`` (started on first use)."""
    with _LOCK:
        if host not in _ENDPOINTS:
            _ENDPOINTS[host] = Endpoint(host)
        return _ENDPOINTS[host]


@atexit.register
def stop_endpoints() -> None:
    with _LOCK:
        for e in _ENDPOINTS.values():
            e.stop()
        _ENDPOINTS.clear()


# ------------------------------------------------------------------------------------ messages
def _text(content) -> str:
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def message(m: dict) -> dict:
    """A request's message as the runner renders it: role, text content, name."""
    out = {"role": m.get("role", "user"), "content": _text(m.get("content"))}
    if m.get("name"):
        out["name"] = m["name"]
    return out


def offered_tools(body: dict) -> dict[str, Tool]:
    """The function tools a request offers (``tools``), as `Tool`s to parse calls against; the
    program runs them, not posttrain."""
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
    calls nothing or a call is malformed: the program then gets the text alone and judges it."""
    try:
        calls = parse_tool_calls(text, tools) if tools else []
    except MalformedCall:
        return []
    return [{"id": f"call_{uuid.uuid4().hex[:12]}", "type": "function",
             "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)}} for c in calls]


def extends(messages: list[dict], sent: list[dict]) -> bool:
    """Whether ``messages`` starts with the conversation the model saw (role and text, in order)."""
    return len(messages) >= len(sent) and all(
        a["role"] == b["role"] and a["content"] == b["content"] for a, b in zip(messages, sent))


# ------------------------------------------------------------------------------------ episodes
class ProxiedEnv(Environment):
    """An environment whose program calls the model through the endpoint (module docstring).

    Subclasses start the program in ``reset`` (after `open_channel`), take events from
    ``self.channel.events`` and hand each model request to `first_request` / `next_request`."""

    tools_style = "json"
    proxied = True  # the runner counts its episodes in the agent/* metrics

    def __init__(self):
        self.channel: Channel | None = None
        self.eid, self.host, self.pending, self.sent, self._offered = "", "127.0.0.1", None, [], {}

    @property
    def tools(self) -> list[Tool]:
        """The tools the program's last request offered (the runner shows them to the model)."""
        return list(self._offered.values())

    def open_channel(self, key: str | None = None, max_calls: int = 0,
                     max_request_bytes: int = MAX_REQUEST_BYTES) -> str:
        """Open the episode's channel; returns its base URL (``.../ep/<id>/v1``)."""
        e = endpoint(self.host)
        self.eid, self.channel = e.open(key, max_calls, max_request_bytes)
        return e.base_url(self.eid)

    def first_request(self, pending: Pending) -> list[dict]:
        """The opening messages: those of the program's first request."""
        self.pending, self.sent = pending, [message(m) for m in pending.body.get("messages") or []]
        self._offered = offered_tools(pending.body)
        return list(self.sent)

    def answer(self, text: str) -> None:
        """Answer the pending request with the model's turn."""
        self.pending.reply(text, wire_calls(text, self._offered))
        self.pending = None
        self.sent.append({"role": "assistant", "content": text})

    def next_request(self, pending: Pending) -> StepResult:
        """The program's next request: the messages it adds, or, when it rewrote the conversation,
        the whole new one (the runner then starts a new row)."""
        self.pending = pending
        messages = [message(m) for m in pending.body.get("messages") or []]
        self._offered = offered_tools(pending.body) if "tools" in pending.body else self._offered
        if not extends(messages, self.sent):
            self.sent = messages
            return StepResult(history=list(messages))
        new, self.sent = messages[len(self.sent):], messages
        return StepResult(observation=new)

    def close_channel(self) -> None:
        """Refuse the pending request and shut the episode's door."""
        if self.eid:
            endpoint(self.host).close(self.eid)
        if self.pending is not None:
            self.pending.reply(None)
            self.pending = None
