"""The HTTP application: routes, error handling, and loading the served model.

`create_app(engine, tokenizer, ...)` returns a Starlette ASGI app (run it with uvicorn). Routes:

* ``GET /health`` -> ``{"status": "ok", "version": <weights version>}``
* ``GET /v1/models`` -> the OpenAI model list (one model)
* ``POST /v1/completions``, ``POST /v1/chat/completions`` -> OpenAI responses with the extensions
  described in `posttrain.serve.protocol`
* ``POST /update_weights_from_disk`` -> SGLang's route: load a folder's safetensors, verify the
  checksum, swap them in between two generation rounds
* ``GET /get_model_info`` (and ``/model_info``) -> path, version and checksum of the loaded weights
  (SGLang's ``weight_version`` among them)
* ``GET /server_info`` -> batching counters and limits
* SGLang's other routes a rollout client uses (`posttrain.rollout.sglang`): ``POST /generate`` (token
  ids in; the sample and, from ``logprob_start_len``, the prompt's own log-probs out),
  ``POST /pause_generation`` / ``POST /continue_generation`` (generation requests that arrive in
  between wait; a round in flight finishes under the weights it started with, so nothing needs
  retracting or aborting) and ``GET|POST /flush_cache`` (no cache outlives a request here)

Only the `EngineWorker` thread touches the engine. Handlers run on the event loop; they tokenize
with their own tokenizer object (the engine decodes with another), so no tokenizer is shared
between threads. Every handler turns any exception into a JSON error response: a bad request is a
4xx, an engine failure a 500 for that request only, and the server keeps serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import hmac
import json
import logging
import math
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import torch
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from posttrain.errors import UserError
from posttrain.rollout.types import LOGPROB_KIND, WeightSyncError, weights_checksum
from posttrain.serve.batcher import EngineWorker
from posttrain.serve.protocol import (
    APIError,
    Limits,
    bad,
    chat_body,
    check_model,
    choices_of,
    completion_body,
    get_bool,
    get_int,
    get_str,
    native_body,
    parse_chat,
    parse_completion,
    parse_native,
)
from posttrain.serve.weights import folder_checksum, load_folder, resolve_model_dir, safetensors_files

log = logging.getLogger("posttrain.serve")

MAX_BODY_BYTES = 64 * 1024 * 1024


# ------------------------------------------------------------------------------ JSON plumbing

def _finite(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_finite(v) for v in x]
    return x


class JSON(Response):
    """Strict JSON: a non-finite float (a model that produced NaN) is written as null, not NaN."""

    media_type = "application/json"

    def render(self, content) -> bytes:
        try:
            text = json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        except ValueError:
            text = json.dumps(_finite(content), ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        return text.encode("utf-8")


def error_response(e: APIError, **extra) -> JSON:
    return JSON({**e.body(), **extra}, status_code=e.status)


async def read_body(request: Request) -> bytes:
    """The body's bytes, refused past ``MAX_BODY_BYTES`` whatever its declared length says."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise APIError(413, f"request body over {MAX_BODY_BYTES} bytes", code="request_too_large")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise APIError(413, f"request body over {MAX_BODY_BYTES} bytes", code="request_too_large")
        chunks.append(chunk)
    return b"".join(chunks)


async def read_json(request: Request, empty_ok: bool = False) -> dict:
    """The body's JSON object; with ``empty_ok``, no body at all reads as ``{}``."""
    raw = await read_body(request)
    if not raw.strip() and empty_ok:
        return {}
    if not raw.strip():
        raise bad("request body is empty; send a JSON object", code="invalid_json")
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise bad(f"request body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise bad(f"request body must be a JSON object, got {type(body).__name__}", code="invalid_type")
    return body


def endpoint(fn):
    """Any exception becomes a JSON error response; the server never dies of a request."""

    async def handler(request: Request) -> Response:
        try:
            return await fn(request)
        except APIError as e:
            return error_response(e)
        except Exception as e:
            log.exception("request to %s failed", request.url.path)
            return error_response(APIError(500, f"internal error: {type(e).__name__}: {e}", code="internal_error"))

    handler.__name__ = fn.__name__
    return handler


# ------------------------------------------------------------------------------ access

@dataclass(frozen=True)
class Access:
    """Who may use the server, and what a weight reload may load.

    ``api_key``: every route but ``/health`` needs ``Authorization: Bearer <key>`` (None: open, which
    `posttrain serve` allows only on a loopback address). ``weights_root``: reloads read folders
    inside it only (None: reloads are refused). A reload must carry every weight of the model
    unless ``allow_partial_weights``, and a version at least the loaded one, never the loaded one
    for other weights, unless ``allow_version_rollback`` (a replayed old request must not roll the
    policy back, nor one version name two sets of weights)."""

    api_key: str | None = None
    weights_root: Path | None = None
    allow_version_rollback: bool = False
    allow_partial_weights: bool = False


class RequireKey:
    """ASGI middleware: 401 for a request without the API key (``/health`` stays open for probes)."""

    OPEN = ("/health",)

    def __init__(self, app, api_key: str):
        self.app, self.expected = app, f"Bearer {api_key}".encode()
        self.state = app.state  # the app's state, as tests and the CLI read it

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] not in self.OPEN:
            sent = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not hmac.compare_digest(sent, self.expected):
                response = error_response(APIError(401, "missing or wrong API key: send Authorization: Bearer <key>",
                                                   code="invalid_api_key"))
                response.headers["WWW-Authenticate"] = "Bearer"  # RFC 6750: the scheme the key goes in
                return await response(scope, receive, send)
        return await self.app(scope, receive, send)


# ------------------------------------------------------------------------------ state

@dataclass
class ServeState:
    engine: object
    worker: EngineWorker
    tokenizer: object
    served_name: str
    model_path: Path
    checksum: str | None
    limits: Limits
    weight_label: str | None = None
    created: int = 0
    access: Access = Access()
    reloaded: bool = False
    """Whether the loaded weights came from a reload (their version was then named by a trainer)."""

    def __post_init__(self):
        self._token_text: dict[int, str] = {}
        self.update_lock = asyncio.Lock()
        self.generating = asyncio.Event()  # cleared by /pause_generation: new generations wait
        self.generating.set()

    def tokenize(self, text: str) -> list[int]:
        return list(self.tokenizer(text)["input_ids"])

    def render_chat(self, messages: list[dict], add_generation_prompt: bool, template_kwargs: dict) -> list[int]:
        if not getattr(self.tokenizer, "chat_template", None):
            raise bad("this model's tokenizer has no chat template; use /v1/completions", "messages",
                      "unsupported_parameter")
        try:
            text = self.tokenizer.apply_chat_template(messages, tokenize=False,
                                                      add_generation_prompt=add_generation_prompt, **template_kwargs)
        except Exception as e:  # jinja errors, raise_exception() in a template, bad kwargs
            raise bad(f"the chat template could not render these messages: {e}", "messages") from None
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def token_text(self, token_id: int) -> str:
        text = self._token_text.get(token_id)
        if text is None:
            text = self._token_text[token_id] = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return text

    @property
    def version(self) -> int:
        return int(self.engine.version)


# ------------------------------------------------------------------------------ routes

def _routes(state: ServeState) -> list[Route]:
    return _openai_routes(state) + _info_routes(state) + _control_routes(state)


def _openai_routes(state: ServeState) -> list[Route]:
    """The OpenAI-compatible API: health, the model list, completions and chat completions."""

    @endpoint
    async def health(request: Request) -> Response:
        if not state.worker.alive:
            return JSON({"status": "error", "version": state.version, "message": "engine worker stopped"},
                        status_code=503)
        return JSON({"status": "ok", "version": state.version})

    @endpoint
    async def models(request: Request) -> Response:
        return JSON({"object": "list", "data": [{
            "id": state.served_name, "object": "model", "created": state.created, "owned_by": "posttrain",
            "root": str(state.model_path), "max_model_len": state.limits.max_model_len}]})

    async def generate(request: Request, parse, body, rid_prefix: str) -> Response:
        """The shared path of both generation routes: parse, generate in the engine worker, answer."""
        payload = await read_json(request)
        check_model(payload, state.served_name)
        req = parse(payload, state.limits)
        await state.generating.wait()
        r = await state.worker.generate(req.prompts, req.n, req.sampling)
        return JSON(body(rid=f"{rid_prefix}-{uuid.uuid4().hex}", created=int(time.time()), model=state.served_name,
                         req=req, choices=choices_of(r, req), token_text=state.token_text))

    @endpoint
    async def completions(request: Request) -> Response:
        return await generate(request, lambda b, lim: parse_completion(b, lim, state.tokenize), completion_body,
                              "cmpl")

    @endpoint
    async def chat_completions(request: Request) -> Response:
        return await generate(request, lambda b, lim: parse_chat(b, lim, state.render_chat), chat_body, "chatcmpl")

    return [
        Route("/health", health, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
    ]


def _info_routes(state: ServeState) -> list[Route]:
    """What a trainer reads of the server (SGLang's names): the model and its weights' version, the
    batching figures, and the native generate route with the prompt's log-probs (the sync probe)."""

    @endpoint
    async def model_info(request: Request) -> Response:
        engine = state.engine
        return JSON({"model_path": str(state.model_path), "served_model_name": state.served_name,
                     "is_generation": True, "version": state.version,
                     "weight_version": state.weight_label or str(state.version), "checksum": state.checksum,
                     "dtype": _held_dtype(engine),
                     "device": str(engine.device), "max_model_len": state.limits.max_model_len,
                     "vocab_size": state.limits.vocab_size, "logprob_kind": LOGPROB_KIND})

    @endpoint
    async def server_info(request: Request) -> Response:
        w = state.worker
        return JSON({"generate_calls": w.generate_calls, "requests_served": w.requests_served,
                     "max_batch_prompts": w.max_batch_prompts, "batch_wait_ms": w.batch_wait_s * 1000,
                     "batch_seeded": w.batch_seeded,
                     "max_samples_per_request": state.limits.max_samples_per_request, "version": state.version,
                     "paused": not state.generating.is_set()})

    @endpoint
    async def native_generate(request: Request) -> Response:
        native = parse_native(await read_json(request), state.limits)
        await state.generating.wait()

        def run(engine):  # the sample and the prompt's log-probs under one set of weights
            r = engine.generate(native.req.prompts, 1, native.req.sampling)
            lp = prompt_logprobs(engine, native.req.prompts[0]) if native.logprob_start_len >= 0 else None
            return r, lp

        r, lp = await state.worker.call(run)
        return JSON(native_body(rid=native.rid or uuid.uuid4().hex, native=native,
                                choice=choices_of(r, native.req)[0], prompt_logprobs=lp,
                                weight_version=state.weight_label or str(r.policy_version[0])))

    return [
        Route("/get_model_info", model_info, methods=["GET"]),
        Route("/model_info", model_info, methods=["GET"]),
        Route("/server_info", server_info, methods=["GET"]),
        Route("/generate", native_generate, methods=["POST"]),
    ]


def _control_routes(state: ServeState) -> list[Route]:
    """What a trainer does to the server around a weight sync (SGLang's names): pause and continue
    new generations, flush the cache, load new weights."""

    @endpoint
    async def pause_generation(request: Request) -> Response:
        body = _known(await read_json(request, empty_ok=True), {"mode"})
        mode = get_str(body, "mode", "abort")
        if mode not in ("retract", "in_place"):
            raise bad(f"mode={mode!r}: only retract or in_place (a round in flight here always finishes under the "
                      f"weights it started with; nothing is aborted)", "mode", "unsupported_parameter")
        state.generating.clear()
        return JSON({"message": "Generation paused successfully.", "status": "ok"})

    @endpoint
    async def continue_generation(request: Request) -> Response:
        get_bool(_known(await read_json(request, empty_ok=True), {"torch_empty_cache"}), "torch_empty_cache", True)
        state.generating.set()
        return JSON({"message": "Generation continued successfully.", "status": "ok"})

    @endpoint
    async def flush_cache(request: Request) -> Response:
        _known(await read_json(request, empty_ok=True), set())
        _known(dict(request.query_params), {"timeout"})
        timeout = request.query_params.get("timeout", "0")
        try:
            ok = float(timeout) >= 0
        except ValueError:
            ok = False
        if not ok:
            raise bad(f"timeout={timeout!r} must be a number >= 0", "timeout")
        return JSON({"success": True, "message": "Cache flushed (this server keeps no cache between requests)."})

    async def update_weights(request: Request) -> Response:
        try:
            return await _update_weights(state, request)
        except APIError as e:
            return error_response(e, success=False, message=e.message)
        except Exception as e:
            log.exception("weight update failed")
            msg = f"internal error: {type(e).__name__}: {e}; weights left at version {state.version}"
            return error_response(APIError(500, msg, code="internal_error"), success=False, message=msg)

    return [
        Route("/update_weights_from_disk", update_weights, methods=["POST"]),
        Route("/pause_generation", pause_generation, methods=["POST"]),
        Route("/continue_generation", continue_generation, methods=["POST"]),
        Route("/flush_cache", flush_cache, methods=["GET", "POST"]),
    ]


def _known(body: dict, fields: set[str]) -> dict:
    """``body``, once it holds no field outside ``fields`` (else 400 naming the first)."""
    unknown = sorted(set(body) - fields)
    if unknown:
        raise bad(f"unknown field {unknown[0]!r}", unknown[0], "unknown_parameter")
    return body


@torch.no_grad()
def prompt_logprobs(engine, ids: list[int]) -> list[float]:
    """log p(ids[t] | ids[:t]) at temperature 1 for t >= 1, from the engine's model."""
    x = torch.tensor([ids], device=engine.device)
    logits = engine.model(input_ids=x).logits[0, :-1].float()
    return logits.log_softmax(-1).gather(-1, x[0, 1:, None]).squeeze(-1).tolist()


# SGLang's request fields with nothing to do here (one engine, no KV cache kept between requests).
_SGLANG_IGNORED = {"abort_all_requests", "is_async", "torch_empty_cache", "keep_pause", "recapture_cuda_graph",
                   "token_step", "flush_cache"}
_UPDATE_FIELDS = {"model_path", "load_format", "version", "weight_version", "checksum", "dtype"} | _SGLANG_IGNORED


@dataclass(frozen=True)
class _Reload:
    """What an ``/update_weights_from_disk`` request asks for, checked."""

    folder: Path
    version: int | None
    label: str | int | None
    checksum: str | None
    dtype: torch.dtype | None  # None: the engine keeps its own


async def _update_weights(state: ServeState, request: Request) -> Response:
    reload = _reload_request(state, await read_json(request))
    async with state.update_lock:
        weights, actual = await _load_checked(state, reload)
        new_version = await _swap_in(state, reload, weights, actual)
    msg = f"loaded the weights of {reload.folder} as version {new_version}"
    log.info(msg)
    return JSON({"success": True, "message": msg, "num_paused_requests": 0, "version": new_version,
                 "checksum": actual, "dtype": _held_dtype(state.engine)})


def _reload_request(state: ServeState, body: dict) -> _Reload:
    """The body's fields checked, then its folder (inside the weights root) and its version (not
    older than the loaded one): a 4xx before anything is read from the disk."""
    _known(body, _UPDATE_FIELDS)
    model_path = get_str(body, "model_path", None)
    if not model_path:
        raise bad("model_path is required (a folder with *.safetensors)", "model_path", "missing_required_parameter")
    load_format = get_str(body, "load_format", None)
    if load_format not in (None, "auto", "safetensors"):
        raise bad(f"load_format={load_format!r}: only safetensors folders are read here", "load_format",
                  "unsupported_parameter")
    version, label = _reload_version(body)
    checksum = get_str(body, "checksum", None)
    dtype = _engine_dtype(get_str(body, "dtype", None))
    for key in _SGLANG_IGNORED:  # type-checked, then ignored
        get_int(body, key, None) if key == "token_step" else get_bool(body, key, False)

    folder = _reload_folder(state.access, model_path)
    _check_not_older(state, version)
    return _Reload(folder=folder, version=version, label=label, checksum=checksum, dtype=dtype)


def _reload_version(body: dict) -> tuple[int | None, str | int | None]:
    """``(version, weight_version label)``; a label of digits stands for the version when none is given."""
    version = get_int(body, "version", None, lo=0)
    label = body.get("weight_version")
    if isinstance(label, bool) or (label is not None and not isinstance(label, (str, int))):
        raise bad("weight_version must be a string", "weight_version", "invalid_type")
    if version is None and label is not None and str(label).strip().isdigit():
        version = int(str(label).strip())
    return version, label


def _check_not_older(state: ServeState, version: int | None) -> None:
    if version is not None and version < state.version and not state.access.allow_version_rollback:
        raise APIError(409, f"version {version} is older than the loaded version {state.version}: refused (a "
                            f"replayed request must not roll the policy back; a new run against this server "
                            f"restarts it, or start the server with --allow-version-rollback)",
                       param="version", code="version_rollback")


async def _load_checked(state: ServeState, reload: _Reload) -> tuple[dict, str]:
    """The folder's tensors and their checksum, once they fit the served model, match the checksum
    the request sent, and do not reuse the loaded version for other weights."""
    try:
        weights = await asyncio.to_thread(load_folder, reload.folder)
    except Exception as e:
        raise bad(f"model_path={reload.folder}: could not read the safetensors: {e}", "model_path") from None
    _check_complete(state, weights, reload.folder)
    actual = await asyncio.to_thread(weights_checksum, weights)
    if reload.checksum is not None and reload.checksum != actual:
        raise bad(f"checksum mismatch: expected {reload.checksum}, the tensors in {reload.folder} hash to {actual}; "
                  f"weights left at version {state.version}", "checksum", "checksum_mismatch")
    _check_not_reused(state, reload.version, actual)
    return weights, actual


async def _swap_in(state: ServeState, reload: _Reload, weights: dict, actual: str) -> int:
    """Load the checked weights into the engine between two generation rounds; their version."""

    def swap(engine) -> int:
        v = reload.version if reload.version is not None else engine.version + 1
        if reload.dtype is not None:  # a trainer's precision fallback: the weights copied in next are the real ones
            engine.set_dtype(reload.dtype)
        # verifies the checksum again before touching a weight; the trainer owns the version count,
        # so a new or resumed run may restart it below the loaded one
        engine.load_weights(weights, v, actual, allow_older=state.access.allow_version_rollback)
        return v

    try:
        new_version = await state.worker.call(swap)
    except WeightSyncError as e:
        raise bad(str(e), "model_path", "weight_sync_error") from None
    state.checksum = actual
    state.reloaded = True
    state.model_path = reload.folder
    state.weight_label = str(reload.label) if reload.label is not None else None
    return new_version


def _engine_dtype(name: str | None):
    """The torch dtype a reload asks the engine to hold its weights in (None: keep its own)."""
    from posttrain.models.hf import DTYPES

    if name is not None and name not in DTYPES:
        raise bad(f"dtype={name!r}: choose from {', '.join(DTYPES)}", "dtype", "invalid_value")
    return None if name is None else DTYPES[name]


def _held_dtype(engine) -> str:
    return str(next(engine.model.parameters()).dtype).replace("torch.", "")


def _reload_folder(access: Access, model_path: str) -> Path:
    """The folder a reload names, if it lies inside the weights root (symlinks and ``..`` resolved)."""
    if access.weights_root is None:
        raise APIError(403, "weight reloads are off: start the server with --weights-root DIR (the folder the "
                            "trainer writes its weights under)", param="model_path", code="forbidden")
    root = access.weights_root.resolve()
    try:  # nothing outside the root is looked at; a run directory means its newest complete checkpoint
        folder = Path(model_path).resolve()
        if folder.is_relative_to(root):
            folder = resolve_model_dir(folder, key="model_path").resolve()
    except UserError as e:
        raise bad(str(e), "model_path") from None
    except (OSError, RuntimeError, ValueError) as e:
        raise bad(f"model_path={model_path}: {e}", "model_path") from None
    if not folder.is_relative_to(root):
        raise APIError(403, f"model_path={model_path}: outside the weights root {root}", param="model_path",
                       code="forbidden")
    if not folder.is_dir():
        raise bad(f"model_path={model_path}: not a folder", "model_path")
    files = safetensors_files(folder)
    if not files:
        raise bad(f"model_path={folder}: no *.safetensors files", "model_path")
    for f in files:  # a file may be a link out of the root, too
        if not f.resolve().is_relative_to(root):
            raise APIError(403, f"model_path={model_path}: {f.name} links outside the weights root {root}",
                           param="model_path", code="forbidden")
    return folder


def _check_not_reused(state: ServeState, version: int | None, checksum: str) -> None:
    """409 for other weights under the version a reload already named: clients tell weights apart by
    version. The same weights again are a replay (harmless); the weights the server started with,
    at version 0, may be replaced once, as a run's first sync re-sends them as the trainer exports them."""
    if (version is not None and version == state.version and state.reloaded and checksum != state.checksum
            and not state.access.allow_version_rollback):
        raise APIError(409, f"version {version} is loaded with other weights (checksum {state.checksum}): refused "
                            f"(one version, one set of weights; start the server with --allow-version-rollback "
                            f"for a new run that restarts the count)", param="version", code="version_reused")


def _check_complete(state: ServeState, weights: dict, folder: Path) -> None:
    """Every weight of the served model, each of its shape and kind of dtype (float to float is cast;
    integers into a float weight would load as garbage): else 400, the served model unchanged."""
    targets = state.engine.model.state_dict()
    missing = sorted(set(targets) - set(weights))
    if missing and not state.access.allow_partial_weights:
        raise bad(f"model_path={folder}: {len(missing)} of the model's {len(targets)} weights are missing "
                  f"(e.g. {missing[0]}); a partial reload is refused unless the server allows it "
                  f"(--allow-partial-weights)", "model_path", "partial_weights")
    unknown = sorted(set(weights) - set(targets))
    if unknown:
        raise bad(f"model_path={folder}: unknown weight {unknown[0]}", "model_path", "weight_mismatch")
    for name in sorted(weights):
        got, want = weights[name], targets[name]
        if tuple(got.shape) != tuple(want.shape):
            raise bad(f"model_path={folder}: {name} has shape {tuple(got.shape)}, the model's is "
                      f"{tuple(want.shape)}", "model_path", "weight_mismatch")
        if got.dtype.is_floating_point != want.dtype.is_floating_point or got.dtype.is_complex != want.dtype.is_complex:
            raise bad(f"model_path={folder}: {name} is {str(got.dtype).replace('torch.', '')}, the model's is "
                      f"{str(want.dtype).replace('torch.', '')}", "model_path", "weight_mismatch")


# ------------------------------------------------------------------------------ the app

async def _http_error(request: Request, exc: HTTPException) -> Response:
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    detail = exc.detail if exc.status_code != 404 else f"no route {request.method} {request.url.path}"
    return error_response(APIError(exc.status_code, str(detail), code=code))


async def _server_error(request: Request, exc: Exception) -> Response:
    return error_response(APIError(500, f"internal error: {type(exc).__name__}", code="internal_error"))


def max_model_len(engine, tokenizer) -> int:
    cfg = engine.model.config
    cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    n = getattr(cfg, "max_position_embeddings", None)
    if isinstance(n, int) and n > 0:
        return n
    m = getattr(tokenizer, "model_max_length", None)
    return m if isinstance(m, int) and 0 < m < 10**8 else 2048


def create_app(engine, tokenizer, *, served_model_name: str, model_path: str | Path, checksum: str | None = None,
               max_batch_prompts: int = 256, batch_wait_ms: float = 5.0, batch_seeded: bool = False,
               max_samples_per_request: int = 4096, access: Access = Access()):
    """The ASGI app serving ``engine``; ``tokenizer`` is used by the handlers (a copy is made when it
    is the engine's own, so the two threads never share one)."""
    if tokenizer is engine.tokenizer:
        tokenizer = copy.deepcopy(tokenizer)
    worker = EngineWorker(engine, max_batch_prompts=max_batch_prompts, batch_wait_s=batch_wait_ms / 1000,
                          batch_seeded=batch_seeded)
    state = ServeState(engine=engine, worker=worker, tokenizer=tokenizer, served_name=served_model_name,
                       model_path=Path(model_path), checksum=checksum, created=int(time.time()),
                       limits=Limits(vocab_size=int(engine.vocab_size), max_model_len=max_model_len(engine, tokenizer),
                                     max_samples_per_request=max_samples_per_request), access=access)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        worker.start()
        try:
            yield
        finally:
            await asyncio.to_thread(worker.stop)

    app = Starlette(routes=_routes(state), lifespan=lifespan,
                    exception_handlers={HTTPException: _http_error, Exception: _server_error})
    app.state.serve = state
    return RequireKey(app, access.api_key) if access.api_key else app


def load_engine(path: str | Path, *, dtype: str = "float32", device: str = "cpu", key: str = "MODEL"):
    """``(engine, tokenizer, checksum)`` for a model folder or hub id; one-line `UserError` when it
    cannot be loaded. The checksum is the folder's (see `posttrain.serve.weights`), None for a hub id."""
    from posttrain.models.hf import DTYPES, check_model_path, load_errors, load_tokenizer, model_folder, resolve_device
    from posttrain.rollout.engine import TorchEngine

    path = str(path)
    if dtype not in DTYPES:
        raise UserError(f"--dtype={dtype}: choose from {', '.join(DTYPES)}")
    check_model_path(path, key)
    path = model_folder(path, key)  # a GGUF file's cached folder: one conversion for every reader
    engine_tokenizer = load_tokenizer(path, key)
    api_tokenizer = load_tokenizer(path, key)
    with load_errors(key, path, "model"):
        engine = TorchEngine(path, tokenizer=engine_tokenizer, dtype=DTYPES[dtype], device=resolve_device(device))
    checksum = folder_checksum(path) if safetensors_files(path) else None
    return engine, api_tokenizer, checksum
