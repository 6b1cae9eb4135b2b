"""The HTTP application of `posttrain tinker-serve`: the routes the Tinker SDK speaks.

Requests that do work (create a model, forward/backward, optim step, save, load, sample) answer at
once with a future (``{"request_id": ...}``); the SDK polls ``/api/v1/retrieve_future`` until the
result is there. One worker thread runs the work in arrival order (the model and the engine are
touched by it alone), so a client's ``forward_backward`` then ``optim_step`` apply in the order
sent. A poll waits up to `POLL_WAIT_S` for the result, then answers ``try_again``.

Errors: a request the server can check when it arrives (unknown model, unsupported loss name,
malformed body, over a bound) is a 4xx at once, which the SDK raises as its ``BadRequestError``
and friends; an error found while the work runs fails that future only (``{"error", "category":
"user"}``, which the SDK raises as ``RequestFailedError``), and nothing of another client changes.
Unknown routes are a 404 with the path named.

Checkpoints live under the server's root: ``tinker://RUN/weights/NAME`` is
``ROOT/RUN/weights/NAME/`` and ``tinker://RUN/sampler_weights/NAME`` its sampler sibling. RUN and
NAME are checked against a plain-name pattern before any path is built, so a request cannot name a
file outside the root.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import re
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from posttrain.serve.app import JSON, RequireKey, endpoint, error_response, read_body, read_json
from posttrain.serve.protocol import APIError, bad
from posttrain.tinker import wire
from posttrain.tinker.losses import LossInputError, check_request
from posttrain.tinker.training import Base, LoraSpec, Sampler

log = logging.getLogger("posttrain.tinker")

POLL_WAIT_S = 5.0
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
RUN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,199}$")
"""A training run's id is the SDK's model id, ``SESSION:train:SEQ``."""


@dataclass(frozen=True)
class Limits:
    """Bounds on what requests may ask for (each a 4xx beyond it)."""

    max_models: int = 16
    max_datums: int = 1024
    max_samples: int = 64
    max_new_tokens: int = 1024
    max_topk: int = 20
    """Most tokens per prompt position ``topk_prompt_logprobs`` may ask for."""
    max_sessions: int = 256
    """Sessions open at once; a new one beyond it ends the least recently heard from (its training
    clients unloaded, as at ``finish``)."""
    max_pending: int = 1024
    kept_results: int = 4096
    max_snapshots: int = 8
    """Sampling sessions holding a weight snapshot in memory (a copy of the adapter each); the
    oldest goes first, and a later request to it is a 404 naming it."""
    max_samplers: int = 1024
    session_timeout_s: float = 300.0
    """A session not heard from for this long (the SDK beats every 10 s) is over: when the training
    clients are at their bound, those of such sessions are unloaded to make room."""


ENDED_KEPT = 4096
"""Ended sessions remembered, so a late ``finish`` of one is answered 200, not 404."""

MAX_BATCH_ROWS = 1024
"""Most samples one engine call of batched ``asample`` requests makes."""


@dataclass(eq=False)
class _SampleRequest:
    sampler: Sampler
    prompt: list[int]
    n: int
    params: dict
    want_prompt: bool
    topk_prompt: int = 0
    answer: tuple | None = None  # (sequences, prompt log-probs, top-k prompt log-probs) once its batch ran
    error: Exception | None = None

    def key(self) -> tuple:
        """Requests with equal keys can share one engine call: the same snapshot, number of
        samples and sampling parameters. A seeded request is alone (its seed fixes its samples)."""
        if self.params["seed"] is not None:
            return (id(self),)
        return (self.sampler.base, self.sampler.label, self.n, self.want_prompt, self.topk_prompt,
                repr(sorted(self.params.items())))


class SampleQueue:
    """``asample`` requests waiting for the worker. The first of them the worker runs takes along
    every waiting request with its key (`_SampleRequest.key`), whichever client or sampling
    session sent it, and they share one engine call; the others' turns then only hand back their
    answer. Running a later request early is safe: a snapshot's weights never change."""

    def __init__(self):
        self.lock = threading.Lock()
        self.waiting: list[_SampleRequest] = []
        self.engine_calls = 0

    def add(self, request: _SampleRequest) -> None:
        with self.lock:
            self.waiting.append(request)

    def drop(self, request: _SampleRequest) -> None:
        with self.lock:
            self.waiting = [r for r in self.waiting if r is not request]

    def run(self, base: Base, request: _SampleRequest) -> tuple:
        with self.lock:
            if request.answer is None and request.error is None:
                batch, rows = [], 0
                for r in self.waiting:
                    if r.key() == request.key() and (r is request or rows + r.n <= MAX_BATCH_ROWS):
                        batch.append(r)
                        rows += r.n
                self.waiting = [r for r in self.waiting if r not in batch]
            else:
                batch = []
        if batch:
            self._generate(base, batch)
        if request.error is not None:
            raise request.error
        return request.answer

    def _generate(self, base: Base, batch: list[_SampleRequest]) -> None:
        first = batch[0]
        try:
            base.use_snapshot(first.sampler.label, first.sampler.adapter)
            answers = base.sample_batch([r.prompt for r in batch], first.n, first.params, first.want_prompt,
                                        first.topk_prompt)
            self.engine_calls += 1
        except Exception as e:  # noqa: BLE001 - every request of the batch fails with it
            for r in batch:
                r.error = e
            return
        for r, answer in zip(batch, answers):
            r.answer = answer


@dataclass
class State:
    bases: dict[str, Base]
    root: Path
    limits: Limits
    worker: concurrent.futures.ThreadPoolExecutor
    sessions: dict[str, float] = field(default_factory=dict)
    ended: OrderedDict = field(default_factory=OrderedDict)  # session id -> why it ended (the first reason)
    models: dict[str, str] = field(default_factory=dict)  # model id -> base name
    samplers: dict[str, Sampler] = field(default_factory=dict)
    futures: OrderedDict = field(default_factory=OrderedDict)
    ids: itertools.count = field(default_factory=itertools.count)
    sampler_lock: threading.Lock = field(default_factory=threading.Lock)
    """Samplers are added by handlers and by the worker (save_weights_for_sampler)."""
    samples: SampleQueue = field(default_factory=SampleQueue)

    def submit(self, fn, *args, extra: dict | None = None) -> JSON:
        """Queue ``fn(*args)`` on the worker; the future's handle as the SDK expects it."""
        pending = sum(not f.done() for f in self.futures.values())
        if pending >= self.limits.max_pending:
            raise APIError(429, f"{pending} requests in flight; retry later", code="too_many_requests")
        while len(self.futures) >= self.limits.kept_results:  # oldest finished results go first
            oldest = next((k for k, f in self.futures.items() if f.done()), None)
            if oldest is None:
                break
            del self.futures[oldest]
        request_id = f"req-{next(self.ids)}-{uuid.uuid4().hex[:8]}"
        self.futures[request_id] = self.worker.submit(fn, *args)
        return JSON({"request_id": request_id, **(extra or {})})

    def add_sampler(self, sampler: Sampler) -> str:
        """Register a sampling session, dropping the oldest beyond the bounds; its id."""
        sampler_id = f"sampler-{uuid.uuid4().hex[:12]}"
        with self.sampler_lock:
            self.samplers[sampler_id] = sampler
            held = [k for k, v in self.samplers.items() if v.adapter is not None]
            for old in held[:max(0, len(held) - self.limits.max_snapshots)]:
                del self.samplers[old]
            for old in list(self.samplers)[:max(0, len(self.samplers) - self.limits.max_samplers)]:
                del self.samplers[old]
        return sampler_id

    def end_session(self, session_id: str, why: str) -> None:
        """The session is over (finished, silent too long, or evicted): its training clients are
        unloaded and its sampling sessions dropped now, so their slots and memory are free at once."""
        self.sessions.pop(session_id, None)
        self.ended.setdefault(session_id, why)
        while len(self.ended) > ENDED_KEPT:
            self.ended.popitem(last=False)
        for model_id in [m for m in self.models if m.split(":train:")[0] == session_id]:
            # popped now, unloaded in its turn: the worker first runs what the client had queued
            # (a load still running finds its id gone and fails its own future)
            del self.models[model_id]
            self.worker.submit(self._unload, model_id)
        with self.sampler_lock:
            for sampler_id in [k for k, v in self.samplers.items() if v.session == session_id]:
                del self.samplers[sampler_id]

    def _unload(self, model_id: str) -> None:
        for base in self.bases.values():
            if model_id in base.adapters:
                base.remove_adapter(model_id)

    def base_of(self, model_id) -> Base:
        if not isinstance(model_id, str) or model_id not in self.models:
            raise APIError(404, f"model_id {model_id!r}: no such training client", code="not_found")
        if self.models[model_id] is None:
            raise APIError(409, f"model_id {model_id!r}: still being loaded", code="conflict")
        return self.bases[self.models[model_id]]


# ------------------------------------------------------------------------------ paths

def checkpoint_dir(root: Path, tinker_path, kind: str | None = None) -> Path:
    """``ROOT/RUN/{weights,sampler_weights}/NAME`` of a ``tinker://`` path, checked name by name."""
    if not isinstance(tinker_path, str) or not tinker_path.startswith("tinker://"):
        raise bad(f"path {tinker_path!r}: expected tinker://RUN/weights/NAME", code="invalid_path")
    parts = tinker_path[len("tinker://"):].split("/")
    if len(parts) != 3 or parts[1] not in ("weights", "sampler_weights") or not RUN.match(parts[0]) \
            or not NAME.match(parts[2]):
        raise bad(f"path {tinker_path!r}: expected tinker://RUN/weights/NAME with plain names", code="invalid_path")
    if kind is not None and parts[1] != kind:
        raise bad(f"path {tinker_path!r}: a {kind} checkpoint is needed here", code="invalid_path")
    return root / parts[0] / parts[1] / parts[2]


def _new_name(name) -> str:
    if name is None:
        return f"ckpt-{int(time.time() * 1000)}"
    if not isinstance(name, str) or not NAME.match(name):
        raise bad(f"path {name!r}: a checkpoint name is letters, digits, '_', '.', '-' (up to 100)",
                  code="invalid_path")
    return name


# ------------------------------------------------------------------------------ routes

def _client_routes(state: State) -> list[Route]:
    """What the SDK asks of the server before and around its work: health, its client settings, the
    served models; and the telemetry it sends, which is dropped."""

    async def healthz(request: Request) -> Response:
        return JSON({"status": "ok"})

    async def client_config(request: Request) -> Response:
        await read_json(request, empty_ok=True)
        return JSON({"pjwt_auth_enabled": False, "use_pyqwest_transport": False, "proto_compress_fwdbwd": False,
                     "sample_use_retrieve_futures": False, "custom_loss_server_side": False,
                     "sample_join_sampling_session": True, "fwdbwd_max_chunk_len": state.limits.max_datums})

    async def dynamic_config(request: Request) -> Response:
        await read_json(request, empty_ok=True)
        return JSON({"sample_cancel_enabled": False})

    async def capabilities(request: Request) -> Response:
        return JSON({"supported_models": [{"model_name": name, "max_context_length": b.max_context,
                                           "trainable": True, "sampleable": True} for name, b in state.bases.items()]})

    async def telemetry(request: Request) -> Response:
        await read_json(request, empty_ok=True)  # read and dropped: nothing leaves this machine
        return JSON({"status": "accepted"})

    return [Route("/api/v1/healthz", endpoint(healthz), methods=["GET"]),
            Route("/api/v1/client/config", endpoint(client_config), methods=["POST"]),
            Route("/api/v1/client/dynamic_config", endpoint(dynamic_config), methods=["POST"]),
            Route("/api/v1/get_server_capabilities", endpoint(capabilities), methods=["GET"]),
            Route("/api/v1/telemetry", endpoint(telemetry), methods=["POST"])]


def _session_routes(state: State) -> list[Route]:
    """A session's life: created, kept alive by the SDK's heartbeat, finished (or evicted, or timed out)."""

    async def create_session(request: Request) -> Response:
        await read_json(request)
        if len(state.sessions) >= state.limits.max_sessions:
            state.end_session(min(state.sessions, key=state.sessions.get), "evicted")
        session_id = f"session-{uuid.uuid4().hex[:12]}"
        state.sessions[session_id] = time.time()
        return JSON({"type": "create_session", "session_id": session_id})

    async def heartbeat(request: Request) -> Response:
        body = await read_json(request)
        if body.get("session_id") not in state.sessions:  # 410: the SDK then stops beating
            raise APIError(410, f"session_id {body.get('session_id')!r}: no such session (or it timed out)",
                           code="session_over")
        state.sessions[body["session_id"]] = time.time()
        return JSON({"type": "session_heartbeat"})

    async def finish(request: Request) -> Response:
        """What leaving ``with ServiceClient(...)`` or ``close()`` sends; the first reason stands."""
        session_id = request.path_params["session_id"]
        reason = (await read_json(request, empty_ok=True)).get("reason")
        if session_id in state.sessions:
            why = reason.get("type") if isinstance(reason, dict) else None
            state.end_session(session_id, f"finished: {why or 'no reason given'}")
        elif session_id not in state.ended:
            raise APIError(404, f"session {session_id!r}: no such session", code="not_found")
        return JSON({"type": "session_finished", "session_id": session_id, "reason": state.ended[session_id]})

    return [Route("/api/v1/create_session", endpoint(create_session), methods=["POST"]),
            Route("/api/v1/session_heartbeat", endpoint(heartbeat), methods=["POST"]),
            Route("/api/v1/sessions/{session_id}/finish", endpoint(finish), methods=["POST"])]


def _lora_spec(body: dict) -> LoraSpec:
    lora = body.get("lora_config")
    if not isinstance(lora, dict):
        raise bad("lora_config: required (full-weight training clients are not served here)", code="invalid_value")
    rank = lora.get("rank")
    if not isinstance(rank, int) or isinstance(rank, bool) or not 1 <= rank <= 256:
        raise bad(f"lora_config.rank: an integer in 1..256, got {rank!r}", code="invalid_value")
    seed = lora.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise bad(f"lora_config.seed: an integer, got {seed!r}", code="invalid_value")
    flags = {k: lora.get(k, True) for k in ("train_attn", "train_mlp", "train_unembed")}
    if not all(isinstance(v, bool) for v in flags.values()):
        raise bad("lora_config.train_attn/train_mlp/train_unembed: booleans", code="invalid_value")
    return LoraSpec(rank=rank, seed=seed, **flags)


def _check_base(state: State, name) -> Base:
    if name not in state.bases:
        raise bad(f"base_model {name!r}: not served here; served: {', '.join(state.bases)}", code="model_not_found")
    return state.bases[name]


def new_model_id(state: State, body: dict) -> str:
    """The id the SDK derives itself (``SESSION:train:SEQ``), checked free; a 4xx otherwise."""
    session, seq = body.get("session_id"), body.get("model_seq_id")
    if session not in state.sessions:
        raise bad(f"session_id {session!r}: no such session (create_session first)", code="invalid_value")
    if not isinstance(seq, int) or isinstance(seq, bool) or not 0 <= seq < 1_000_000:
        raise bad(f"model_seq_id: an integer in 0..999999, got {seq!r}", code="invalid_value")
    model_id = f"{session}:train:{seq}"
    if model_id in state.models:
        raise APIError(409, f"model {model_id} exists already", code="conflict")
    if len(state.models) >= state.limits.max_models:
        _reap(state)
    if len(state.models) >= state.limits.max_models:
        raise APIError(429, f"{len(state.models)} training clients already; unload one first", code="too_many_models")
    return model_id


def _reap(state: State) -> None:
    """Unload the training clients of sessions that stopped beating (a crashed or closed client)."""
    now = time.time()
    for session in [s for s, t in state.sessions.items() if now - t > state.limits.session_timeout_s]:
        state.end_session(session, "timed out")


def _model_routes(state: State) -> list[Route]:
    async def create_model(request: Request) -> Response:
        body = await read_json(request)
        base = _check_base(state, body.get("base_model"))
        spec = _lora_spec(body)
        model_id = new_model_id(state, body)
        state.models[model_id] = body["base_model"]

        def run():
            try:
                base.add_adapter(model_id, spec)
            except Exception:
                state.models.pop(model_id, None)
                raise
            return {"type": "create_model", "model_id": model_id}

        return state.submit(run, extra={"model_id": model_id})

    async def get_info(request: Request) -> Response:
        body = await read_json(request)
        base = state.base_of(body.get("model_id"))
        adapter = base.adapters.get(body["model_id"])
        return JSON({"type": "get_info", "model_id": body["model_id"], "model_name": base.name,
                     "model_data": {"arch": base.model.config.model_type, "model_name": base.name,
                                    "tokenizer_id": _tokenizer_id(base)},
                     "is_lora": True, "lora_rank": adapter.spec.rank if adapter else None})

    async def unload(request: Request) -> Response:
        body = await read_json(request)
        base = state.base_of(body.get("model_id"))
        model_id = body["model_id"]
        del state.models[model_id]
        return state.submit(lambda: (base.remove_adapter(model_id), {"model_id": model_id, "type": "unload_model"})[1])

    return [Route("/api/v1/create_model", endpoint(create_model), methods=["POST"]),
            Route("/api/v1/get_info", endpoint(get_info), methods=["POST"]),
            Route("/api/v1/unload_model", endpoint(unload), methods=["POST"])]


def _tokenizer_id(base: Base) -> str:
    """What the SDK's ``get_tokenizer()`` hands to ``AutoTokenizer.from_pretrained``: the base's
    folder, which loads offline on this machine (the served name would be looked up on the hub)."""
    return str(Path(base.path).resolve()) if base.path else base.name


async def _read_bytes(request: Request) -> bytes:
    body = await read_body(request)
    if request.headers.get("content-encoding", "identity") != "identity":
        raise APIError(415, "compressed bodies are not accepted (client/config says so)", code="unsupported_encoding")
    return body


_ADAM = {"learning_rate": 1e-4, "beta1": 0.9, "beta2": 0.95, "eps": 1e-12, "weight_decay": 0.0, "grad_clip_norm": 0.0}


def _adam(body: dict) -> dict:
    params = body.get("adam_params")
    if not isinstance(params, dict):
        raise bad("adam_params: required (only Adam is served here)", code="invalid_value")
    unknown = sorted(set(params) - set(_ADAM) - {"type"})
    if unknown:
        raise bad(f"adam_params: unknown {', '.join(unknown)}", code="invalid_value")
    out = _ADAM | {k: v for k, v in params.items() if k != "type"}
    for k, v in out.items():
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not v >= 0 or v == float("inf"):
            raise bad(f"adam_params.{k}: a finite number >= 0, got {v!r}", code="invalid_value")
    if out["beta1"] >= 1 or out["beta2"] >= 1:
        raise bad("adam_params.beta1/beta2: must be < 1", code="invalid_value")
    return {k: float(v) for k, v in out.items()}


def _training_routes(state: State) -> list[Route]:
    async def forward_backward(request: Request) -> Response:
        try:
            req = wire.decode_forward_backward(await _read_bytes(request))
            config = check_request(req.loss_fn, req.config)
        except (wire.WireError, LossInputError) as e:
            raise bad(str(e), code="invalid_request") from None
        base = state.base_of(req.model_id)
        if not req.data:
            raise bad("data: at least one datum", code="invalid_value")
        if len(req.data) > state.limits.max_datums:
            raise bad(f"data: {len(req.data)} datums, at most {state.limits.max_datums}", code="too_large")
        try:
            base.check_data(req.loss_fn, req.data)
        except LossInputError as e:
            raise bad(str(e), code="invalid_request") from None

        def run():
            outputs, metrics = base.forward_backward(req.model_id, req.loss_fn, req.data, config, not req.forward_only)
            return wire.encode_forward_backward_output(outputs, metrics)

        return state.submit(run, extra={"model_id": req.model_id})

    async def optim_step(request: Request) -> Response:
        body = await read_json(request)
        base = state.base_of(body.get("model_id"))
        adam = _adam(body)
        return state.submit(lambda: {"metrics": base.optim_step(body["model_id"], adam)},
                            extra={"model_id": body["model_id"]})

    return [Route("/api/v1/forward_backward", endpoint(forward_backward), methods=["POST"]),
            Route("/api/v1/optim_step", endpoint(optim_step), methods=["POST"])]


def _weights_routes(state: State) -> list[Route]:
    from posttrain.tinker.checkpoints import list_checkpoints, load_weights, save_for_sampler, save_weights

    async def save(request: Request) -> Response:
        body = await read_json(request)
        state.base_of(body.get("model_id"))
        name = _new_name(body.get("path"))
        return state.submit(save_weights, state, body["model_id"], name, bool(body.get("overwrite", False)),
                            extra={"model_id": body["model_id"]})

    async def save_sampler(request: Request) -> Response:
        body = await read_json(request)
        state.base_of(body.get("model_id"))
        name = None if body.get("path") is None else _new_name(body["path"])
        return state.submit(save_for_sampler, state, body["model_id"], name, extra={"model_id": body["model_id"]})

    async def load(request: Request) -> Response:
        body = await read_json(request)
        folder = checkpoint_dir(state.root, body.get("path"), "weights")
        model_id, new = body.get("model_id"), body.get("model_id") is None
        if new:  # a new training client made from the checkpoint
            model_id = new_model_id(state, body)
            base_name = body.get("base_model")
            if base_name is not None:
                _check_base(state, base_name)
            state.models[model_id] = base_name  # reserved; the checkpoint names the base
        else:
            state.base_of(model_id)
        return state.submit(load_weights, state, model_id, new, folder, body["path"], bool(body.get("optimizer")))

    async def checkpoints(request: Request) -> Response:
        run = request.path_params["model_id"]
        if not RUN.match(run):
            raise bad(f"training run {run!r}: not a plain name", code="invalid_path")
        return JSON({"checkpoints": list_checkpoints(state.root, run)})

    return [Route("/api/v1/save_weights", endpoint(save), methods=["POST"]),
            Route("/api/v1/save_weights_for_sampler", endpoint(save_sampler), methods=["POST"]),
            Route("/api/v1/load_weights", endpoint(load), methods=["POST"]),
            Route("/api/v1/training_runs/{model_id}/checkpoints", endpoint(checkpoints), methods=["GET"])]


def _sampling_params(body: dict, limits: Limits) -> dict:
    p = body.get("sampling_params")
    if not isinstance(p, dict):
        raise bad("sampling_params: required", code="invalid_value")
    max_tokens = p.get("max_tokens")
    if max_tokens is None:
        max_tokens = limits.max_new_tokens
    if not isinstance(max_tokens, int) or not 1 <= max_tokens <= limits.max_new_tokens:
        raise bad(f"sampling_params.max_tokens: 1..{limits.max_new_tokens}, got {max_tokens!r}", code="invalid_value")
    stop = p.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or len(stop) > 32 or not all(isinstance(s, (str, int)) for s in stop):
        raise bad("sampling_params.stop: a string, or up to 32 strings or token ids", code="invalid_value")
    temperature, top_p, top_k = p.get("temperature", 1.0), p.get("top_p", 1.0), p.get("top_k", -1)
    if not isinstance(temperature, (int, float)) or not 0 <= temperature <= 100:
        raise bad(f"sampling_params.temperature: in [0, 100] (0: greedy), got {temperature!r}", code="invalid_value")
    if not isinstance(top_p, (int, float)) or not 0 < top_p <= 1:
        raise bad(f"sampling_params.top_p: in (0, 1], got {top_p!r}", code="invalid_value")
    if not isinstance(top_k, int) or top_k < -1:
        raise bad(f"sampling_params.top_k: -1 (off) or a positive integer, got {top_k!r}", code="invalid_value")
    seed = p.get("seed")
    if seed is not None and not isinstance(seed, int):
        raise bad(f"sampling_params.seed: an integer, got {seed!r}", code="invalid_value")
    return {"max_tokens": max_tokens, "stop": stop, "temperature": float(temperature), "top_p": float(top_p),
            "top_k": top_k, "seed": seed}


def _prompt_tokens(body: dict, base: Base) -> list[int]:
    chunks = (body.get("prompt") or {}).get("chunks") if isinstance(body.get("prompt"), dict) else None
    if not isinstance(chunks, list) or not chunks:
        raise bad("prompt.chunks: a non-empty list of encoded_text chunks", code="invalid_value")
    tokens: list[int] = []
    for i, chunk in enumerate(chunks):
        if not isinstance(chunk, dict) or chunk.get("type", "encoded_text") != "encoded_text":
            raise bad(f"prompt.chunks[{i}]: only encoded_text chunks are served", code="invalid_value")
        ids = chunk.get("tokens")
        if not isinstance(ids, list) or not all(isinstance(t, int) and 0 <= t < base.vocab for t in ids):
            raise bad(f"prompt.chunks[{i}].tokens: token ids in [0, {base.vocab})", code="invalid_value")
        tokens.extend(ids)
    if not tokens or len(tokens) >= base.max_context:
        raise bad(f"prompt: 1..{base.max_context - 1} tokens, got {len(tokens)}", code="invalid_value")
    return tokens


async def _new_sampler(state: State, body: dict) -> Sampler:
    """The sampling session a ``create_sampling_session`` body asks for: a sampler checkpoint's
    weights (its path checked before the disk is read), or the bare base model."""
    if body.get("model_path") is not None:
        folder = checkpoint_dir(state.root, body["model_path"], "sampler_weights")
        from posttrain.tinker.checkpoints import read_sampler

        # a 4xx, not a 500: the SDK retries a 5xx for about a minute before it gives up
        try:
            base_name, adapter = await asyncio.to_thread(read_sampler, state, folder)
        except FileNotFoundError as e:
            raise APIError(404, f"model_path {body['model_path']!r}: {e}", code="not_found") from None
        except LossInputError as e:
            raise bad(f"model_path {body['model_path']!r}: {e}", code="model_not_found") from None
        return Sampler(base=base_name, label=f"{body['model_path']}#{uuid.uuid4().hex}", adapter=adapter,
                       model_path=body["model_path"], session=body.get("session_id"))
    _check_base(state, body.get("base_model"))
    return Sampler(base=body["base_model"], label="base", adapter=None, model_path=None,
                   session=body.get("session_id"))


def _sampler_of(state: State, sampler_id) -> Sampler:
    if sampler_id not in state.samplers:
        raise APIError(404, f"sampling_session_id {sampler_id!r}: no such sampler (or dropped: at most "
                            f"{state.limits.max_snapshots} weight snapshots are kept)", code="not_found")
    return state.samplers[sampler_id]


def _refuse_unserved(body: dict) -> None:
    """A 4xx for the ``asample`` options this server does not compute."""
    for key in ("topk_sample_logprobs", "prompt_alt_tokens_k"):
        if body.get(key):
            raise bad(f"{key}: not served here", code="unsupported")
    if body.get("target_prompt_logprobs") is not None or body.get("prompt_logprobs_last_n") is not None:
        raise bad("target_prompt_logprobs / prompt_logprobs_last_n: not served here", code="unsupported")


def _topk_prompt(body: dict, limits: Limits) -> int:
    topk = body.get("topk_prompt_logprobs") or 0
    if not isinstance(topk, int) or isinstance(topk, bool) or not 0 <= topk <= limits.max_topk:
        raise bad(f"topk_prompt_logprobs: 0..{limits.max_topk}, got {topk!r}", code="invalid_value")
    return topk


def _sample_request(state: State, body: dict) -> _SampleRequest:
    """An ``asample`` body checked against its sampler, its base and the limits: a 4xx at the first
    thing wrong, before anything is queued."""
    sampler = _sampler_of(state, body.get("sampling_session_id"))
    base = state.bases[sampler.base]
    prompt = _prompt_tokens(body, base)
    params = _sampling_params(body, state.limits)
    n = body.get("num_samples", 1)
    if not isinstance(n, int) or not 1 <= n <= state.limits.max_samples:
        raise bad(f"num_samples: 1..{state.limits.max_samples}, got {n!r}", code="invalid_value")
    if len(prompt) + params["max_tokens"] > base.max_context:
        raise bad(f"prompt ({len(prompt)}) + max_tokens ({params['max_tokens']}) exceeds the model's "
                  f"{base.max_context} positions", code="invalid_value")
    _refuse_unserved(body)
    want_prompt = bool(body.get("prompt_logprobs"))
    topk = _topk_prompt(body, state.limits)
    try:
        base.sampling.check(sampler.adapter, topk)
    except LossInputError as e:
        raise bad(str(e), code="unsupported") from None
    return _SampleRequest(sampler, prompt, n, params, want_prompt, topk)


def _queue_sample(state: State, waiting: _SampleRequest) -> Response:
    """Queue a checked ``asample`` request for the worker (`SampleQueue`); the future's handle."""
    base = state.bases[waiting.sampler.base]
    state.samples.add(waiting)

    def run():
        return wire.encode_sample_response(*state.samples.run(base, waiting))

    ids = [f"seq-{uuid.uuid4().hex[:12]}" for _ in range(waiting.n)]
    try:
        return state.submit(run, extra={"sample_sequence_ids": ids})
    except APIError:
        state.samples.drop(waiting)  # refused: it must not ride along in another's batch
        raise


def _sampling_routes(state: State) -> list[Route]:
    async def create_sampling_session(request: Request) -> Response:
        sampler = await _new_sampler(state, await read_json(request))
        return JSON({"type": "create_sampling_session", "sampling_session_id": state.add_sampler(sampler)})

    async def join(request: Request) -> Response:
        sampler = _sampler_of(state, (await read_json(request)).get("sampling_session_id"))
        sampler.clients += 1
        return JSON({"type": "join_sampling_session", "client_counter": sampler.clients})

    async def get_sampler(request: Request) -> Response:
        sampler_id = request.path_params["sampler_id"]
        sampler = _sampler_of(state, sampler_id)
        return JSON({"sampler_id": sampler_id, "base_model": sampler.base, "model_path": sampler.model_path})

    async def asample(request: Request) -> Response:
        return _queue_sample(state, _sample_request(state, await read_json(request)))

    return [Route("/api/v1/create_sampling_session", endpoint(create_sampling_session), methods=["POST"]),
            Route("/api/v1/join_sampling_session", endpoint(join), methods=["POST"]),
            Route("/api/v1/samplers/{sampler_id}", endpoint(get_sampler), methods=["GET"]),
            Route("/api/v1/asample", endpoint(asample), methods=["POST"])]


def _future_routes(state: State) -> list[Route]:
    async def retrieve(request: Request) -> Response:
        body = await read_json(request)
        request_id = body.get("request_id")
        future = state.futures.get(request_id)
        if future is None:
            raise APIError(404, f"request_id {request_id!r}: no such request (or its result was dropped)",
                           code="not_found")
        try:
            await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(future)), POLL_WAIT_S)
        except asyncio.TimeoutError:
            return JSON({"type": "try_again", "request_id": request_id, "queue_state": "active"})
        except Exception:
            pass  # the future's own error is reported below
        return _result(future)

    return [Route("/api/v1/retrieve_future", endpoint(retrieve), methods=["POST"])]


def _result(future: concurrent.futures.Future) -> Response:
    error = future.exception()
    if error is not None:
        user = isinstance(error, (LossInputError, APIError, ValueError, KeyError, FileNotFoundError, FileExistsError))
        if not user:
            log.error("request failed", exc_info=error)
        message = error.message if isinstance(error, APIError) else f"{type(error).__name__}: {error}"
        return JSON({"error": message, "category": "user" if user else "server"})
    result = future.result()
    if isinstance(result, bytes):
        return Response(result, media_type="application/x-protobuf")
    return JSON(result)


async def _not_found(request: Request, exc) -> Response:
    status = getattr(exc, "status_code", 404)
    message = (f"{request.method} {request.url.path}: no such route on this Tinker-compatible server"
               if status in (404, 405) else str(getattr(exc, "detail", exc)))
    return error_response(APIError(status, message, code="not_found" if status == 404 else "invalid_request"))


class TinkerKey(RequireKey):
    """The API key as the SDK sends it (``X-API-Key``) or as a bearer token; the health route open."""

    OPEN = ("/api/v1/healthz",)

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            headers = dict(scope.get("headers") or [])
            key = headers.get(b"x-api-key")
            if key is not None and b"authorization" not in headers:
                scope = dict(scope, headers=[*scope["headers"], (b"authorization", b"Bearer " + key)])
        return await super().__call__(scope, receive, send)


def create_app(bases: dict[str, Base], root: Path, *, api_key: str | None, limits: Limits = Limits()):
    """The ASGI app over ``bases`` (name -> loaded `Base`), checkpoints under ``root``."""
    from starlette.exceptions import HTTPException

    worker = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="tinker-worker")
    state = State(bases=bases, root=Path(root), limits=limits, worker=worker)
    routes = (_client_routes(state) + _session_routes(state) + _model_routes(state) + _training_routes(state)
              + _weights_routes(state) + _sampling_routes(state) + _future_routes(state))
    app = Starlette(routes=routes, exception_handlers={HTTPException: _not_found})
    app.state.tinker = state
    return TinkerKey(app, api_key) if api_key else app

