"""`HTTPEngine`: a rollout engine that samples on OpenAI-compatible servers (``posttrain serve``,
vLLM, SGLang) and hands them new weights through a shared folder.

Generation: one ``POST /v1/completions`` per prompt, with the prompt as token ids and ``n`` = the
group size, so a group is always sampled by one server under one set of weights. Requests go out
concurrently (a thread pool over one ``httpx.Client``), each to the server with the fewest
requests in flight, and the answers are put back in prompt order. Every request asks for
``logprobs=1`` and ``return_token_ids=true``: the completion *is* the server's ``token_ids`` and
its sampler log-probs are ``logprobs.token_logprobs``, never a re-tokenisation of the text. The
seed of prompt ``i`` is ``sampling.seeds(...)[i]`` (`prompt_seed` ``(sampling.seed, i)`` unless the
call carries explicit ``prompt_seeds``), so a request retried on another
server holding the same weights draws the same samples.

Weights: `load_weights` writes the tensors as ``model.safetensors`` (or, for a LoRA adapter,
``adapter_model.safetensors`` + ``adapter_config.json``) into ``weights_dir/v{version}/`` (written in
a temporary folder, then renamed, so a server never sees half a file) and has every server load it.
How is the server's *dialect*: ``posttrain serve`` (`PosttrainDialect`) takes
``/update_weights_from_disk`` and must echo the version and checksum; vLLM (`posttrain.rollout.vllm`)
is paused, reloaded, versioned and resumed, then verified by the version it reads back and by its
log-probs of a probe sequence. A server that does not confirm raises `WeightSyncError` naming it
and its answer, so no rollout is ever attributed to weights a server did not confirm. The two
newest folders are kept.

Failures: a request that fails (connection error, timeout, an HTTP error, a malformed answer) is
retried on another server after a backoff, up to ``retries`` times; after that its ``n`` samples
come back with finish reason ``"error"`` and an empty completion (the RL loop scores them
INFRA_FAIL: masked and counted, never a reward). A server that does not answer ``GET /health`` when
the engine starts raises `ServerUnreachable`, a one-line error (exit status 1 from the CLI).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import torch

from posttrain.rollout.types import Rollouts, SamplingParams, WeightSyncError

log = logging.getLogger(__name__)

WEIGHTS_FILE = "model.safetensors"
ADAPTER_FILE = "adapter_model.safetensors"
MODEL_FILES = ("config.json", "generation_config.json")  # copied next to the weights when known
_VERSION_DIR = re.compile(r"^v(\d+)$")


class ServerUnreachable(RuntimeError):
    """A rollout server did not answer its health check: an outage, not bad input (exit 1)."""


class _RequestFailed(Exception):
    """One completion request failed on one server (the message says how)."""


def _error_choice() -> dict:
    """A sample the engine could not produce: empty, finish reason "error"."""
    return {"ids": [], "logprobs": [], "truncated": [], "finish": "error", "text": ""}


def _base(url: str) -> str:
    return url.rstrip("/")


class PosttrainDialect:
    """The routes and fields of ``posttrain serve`` (see `posttrain.rollout.vllm` for vLLM's)."""

    name = "posttrain"
    check_timeout_s = 10.0

    def check_server(self, client: httpx.Client, url: str, probe_prompt: list[int]) -> int:
        """Its weight version, once ``GET /health`` answers ``{"status": "ok"}``."""
        r = client.get(f"{url}/health")
        body = r.json() if r.status_code == 200 else None
        if not isinstance(body, dict) or body.get("status") != "ok":
            raise RuntimeError(f"GET /health answered {r.status_code} {_one_line(r.text)}")
        return int(body.get("version", 0))

    def body(self, body: dict) -> dict:
        return {**body, "return_token_ids": True}

    @staticmethod
    def truncated_logprobs(choice: dict) -> list[float] | None:
        truncated = choice.get("truncated_logprobs")
        return None if truncated is None else [float(x) for x in truncated]

    def push(self, client: httpx.Client, url: str, folder: str, version: int, checksum: str, probe) -> str:
        """'' when the server confirmed the version and checksum it loaded, else what it answered."""
        body = {"model_path": folder, "version": version, "checksum": checksum}
        r = client.post(f"{url}/update_weights_from_disk", json=body)
        try:
            got = r.json()
        except ValueError:
            return f"HTTP {r.status_code} {_one_line(r.text)}"
        confirmed = (r.status_code == 200 and isinstance(got, dict) and got.get("success") is True
                     and got.get("version") == version and got.get("checksum") == checksum)
        return "" if confirmed else f"HTTP {r.status_code} {_one_line(got)}"


PROBE_PROMPT = [1, 2, 3, 4]
"""Token ids a server is asked about when it starts (any model has them)."""


API_KEY_ENV = "POSTTRAIN_API_KEY"
"""The environment variable a client takes its servers' API key from (never a config file, which
runs write out)."""


def auth_headers(api_key: str | None) -> dict[str, str]:
    key = api_key if api_key is not None else os.environ.get(API_KEY_ENV)
    return {"Authorization": f"Bearer {key}"} if key else {}


def check_servers(urls: list[str], timeout_s: float | None = None, dialect=None, api_key: str | None = None) -> list[int]:
    """Every server's readiness (health, and what the dialect needs) and weight version, or
    `ServerUnreachable` naming the first server that is not ready. ``timeout_s`` per request;
    default: the dialect's ``check_timeout_s``. ``api_key``: default ``$POSTTRAIN_API_KEY``."""
    if not urls:
        raise ServerUnreachable("no rollout server given (set rollout.urls=[http://host:port, ...])")
    dialect = dialect or PosttrainDialect()
    versions = []
    with httpx.Client(timeout=timeout_s or dialect.check_timeout_s, headers=auth_headers(api_key)) as client:
        for url in urls:
            try:
                versions.append(dialect.check_server(client, _base(url), PROBE_PROMPT))
            except (httpx.HTTPError, ValueError, KeyError, TypeError, IndexError) as e:
                raise ServerUnreachable(f"rollout server {url} is unreachable: {_one_line(e)}") from None
            except RuntimeError as e:
                raise ServerUnreachable(f"rollout server {url} is not ready: {_one_line(e)}") from None
    return versions


def _one_line(x) -> str:
    text = " ".join(str(x).split()) or type(x).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def model_eos_ids(model_path: str, tokenizer=None) -> list[int]:
    """The end-of-sequence ids `TorchEngine` stops on: the generation config's, else the model
    config's, plus the tokenizer's."""
    from transformers import AutoConfig, GenerationConfig

    def as_list(v):
        return [] if v is None else [int(x) for x in (v if isinstance(v, (list, tuple)) else [v])]

    ids: list[int] = []
    try:
        ids = as_list(GenerationConfig.from_pretrained(model_path).eos_token_id)
    except (OSError, ValueError):
        pass
    if not ids:
        try:
            ids = as_list(AutoConfig.from_pretrained(model_path).eos_token_id)
        except (OSError, ValueError):
            pass
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.append(int(tokenizer.eos_token_id))
    return sorted(set(ids))


class HTTPEngine:
    """Rollout engine over OpenAI-compatible servers (see the module docstring).

    ``tokenizer`` decodes the completion texts from the token ids (as `TorchEngine` stores them:
    special tokens skipped, cut right after a stop string); without one the servers' texts are
    used. ``eos_ids`` tell an end-of-sequence stop from a stop-string stop (default: the
    tokenizer's EOS). ``model`` is the requests' "model" field (left out when None: the server's
    only model). ``weights_dir`` is needed by `load_weights` only; ``model_files`` is a model folder
    whose config files are copied next to each version's weights. ``dialect`` is how the servers
    are spoken to (default: `PosttrainDialect`); with ``adapter_config`` (peft's adapter_config.json
    as a dict) `load_weights` takes a LoRA adapter's tensors and writes them as peft does;
    ``servers`` (with a ``stop()``) are stopped by `close`. ``api_key`` (default
    ``$POSTTRAIN_API_KEY``) goes with every request as a bearer token.
    """

    def __init__(self, urls: list[str], *, weights_dir: str | None = None, tokenizer=None,
                 eos_ids: list[int] | None = None, model: str | None = None, model_files: str | None = None,
                 request_timeout_s: float = 600.0, sync_timeout_s: float = 600.0, retries: int = 2,
                 retry_backoff_s: float = 1.0, max_inflight: int = 64, keep_versions: int = 2, dialect=None,
                 adapter_config: dict | None = None, servers=None, api_key: str | None = None):
        if retries < 0 or retry_backoff_s < 0 or max_inflight < 1 or keep_versions < 1:
            raise ValueError("retries and retry_backoff_s must be >= 0, max_inflight and keep_versions >= 1")
        self.urls = [_base(u) for u in urls]
        self.dialect = dialect or PosttrainDialect()
        self.adapter_config = adapter_config
        self.servers = servers  # launched for this engine (`VLLMServers`): stopped by close()
        headers = auth_headers(api_key)  # sent on every request; /health needs none
        check_servers(self.urls, dialect=self.dialect, api_key=api_key)
        self.weights_dir = Path(weights_dir) if weights_dir else None
        self.tokenizer = tokenizer
        eos = eos_ids if eos_ids is not None else [getattr(tokenizer, "eos_token_id", None)]
        self.eos_ids = {int(e) for e in eos if e is not None}
        self.model, self.model_files = model, model_files
        self.request_timeout_s, self.sync_timeout_s = request_timeout_s, sync_timeout_s
        self.retries, self.retry_backoff_s = retries, retry_backoff_s
        self.max_inflight, self.keep_versions = max_inflight, keep_versions
        self.version = 0
        self.stats = {"requests": 0, "retries": 0, "failed": 0}
        self._client = httpx.Client(timeout=request_timeout_s, limits=httpx.Limits(max_connections=max_inflight),
                                    headers=headers)
        self._sync_client = httpx.Client(timeout=sync_timeout_s, headers=headers)
        self._lock = threading.Lock()
        self._inflight = dict.fromkeys(self.urls, 0)
        self._next = 0  # round-robin tie break
        self._written: list[Path] = []

    def close(self) -> None:
        self._client.close()
        self._sync_client.close()
        if self.servers is not None:
            self.servers.stop()

    # -------------------------------------------------------------------------------- generation

    def generate(self, prompts: list[list[int]], n: int, sampling: SamplingParams) -> Rollouts:
        """``n`` samples of each prompt, one request per prompt; samples of prompt i at i*n .. i*n+n-1."""
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("no prompts given, or an empty prompt")
        version = self.version
        bodies = [self._body(p, n, sampling, s) for p, s in zip(prompts, sampling.seeds(len(prompts)))]
        with ThreadPoolExecutor(max_workers=min(self.max_inflight, len(prompts))) as pool:
            groups = list(pool.map(self._complete, bodies))
        parts = [self._rollouts(i, p, n, choices, sampling, version)
                 for i, (p, choices) in enumerate(zip(prompts, groups))]
        return Rollouts.concat(parts)

    def _body(self, prompt: list[int], n: int, s: SamplingParams, seed: int | None) -> dict:
        body = {"prompt": list(prompt), "n": n, "temperature": s.temperature, "top_p": s.top_p,
                "max_tokens": s.max_new_tokens, "logprobs": 1}
        if self.model:
            body["model"] = self.model
        if s.top_k > 0:  # off is left out: servers disagree on how to spell it (0 or -1)
            body["top_k"] = s.top_k
        if s.stop:
            body["stop"] = list(s.stop)
        if seed is not None:
            body["seed"] = seed
        if s.ignore_eos:
            body["ignore_eos"] = True
        return self.dialect.body(body)

    def _complete(self, body: dict) -> list[dict] | None:
        """The ``n`` parsed choices of one request, retried on other servers; None when every try failed."""
        tried: list[str] = []
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.retry_backoff_s * 2 ** (attempt - 1))
            url = self._acquire(tried)
            tried.append(url)
            try:
                return self._post_completion(url, body)
            except _RequestFailed as e:
                log.warning("rollout server %s: completion request failed (try %d of %d): %s",
                            url, attempt + 1, self.retries + 1, e)
            finally:
                self._release(url, retried=attempt > 0)
        with self._lock:
            self.stats["failed"] += 1
        return None

    def _acquire(self, tried: list[str]) -> str:
        """The server with the fewest requests in flight, preferring ones this request has not tried."""
        with self._lock:
            fresh = [u for u in self.urls if u not in tried] or self.urls
            order = fresh[self._next % len(fresh):] + fresh[:self._next % len(fresh)]
            url = min(order, key=lambda u: self._inflight[u])
            self._next += 1
            self._inflight[url] += 1
            return url

    def _release(self, url: str, retried: bool) -> None:
        with self._lock:
            self._inflight[url] -= 1
            self.stats["requests"] += 1
            self.stats["retries"] += int(retried)

    def _post_completion(self, url: str, body: dict) -> list[dict]:
        try:
            r = self._client.post(f"{url}/v1/completions", json=body)
        except httpx.HTTPError as e:
            raise _RequestFailed(_one_line(e) or type(e).__name__) from None
        if r.status_code != 200:
            raise _RequestFailed(f"HTTP {r.status_code}: {_one_line(r.text)}")
        try:
            data = r.json()
            choices = sorted(data["choices"], key=lambda c: c["index"])
        except (ValueError, KeyError, TypeError) as e:
            raise _RequestFailed(f"malformed answer ({_one_line(e)}): {_one_line(r.text)}") from None
        if len(choices) != body["n"]:
            raise _RequestFailed(f"asked for {body['n']} choices, got {len(choices)}")
        echoed = data.get("prompt_token_ids", choices[0].get("prompt_token_ids"))
        if echoed is not None and list(echoed) != body["prompt"]:
            raise _RequestFailed("the server's prompt_token_ids differ from the prompt sent")
        versions = {c["policy_version"] for c in choices if "policy_version" in c}
        if versions - {self.version}:  # e.g. a server that restarted on its first weights
            raise _RequestFailed(f"sampled with weights version {sorted(versions)}, expected {self.version}")
        return [self._parse_choice(c) for c in choices]

    def _parse_choice(self, c: dict) -> dict:
        try:
            ids = [int(t) for t in c["token_ids"]]
            logprobs = [float(x) for x in c["logprobs"]["token_logprobs"]]
            truncated = self.dialect.truncated_logprobs(c)
            reason = c["finish_reason"]
        except (KeyError, TypeError, ValueError) as e:
            raise _RequestFailed(f"choice without token_ids / logprobs.token_logprobs / finish_reason "
                                 f"({_one_line(e)}); the server must support return_token_ids and logprobs") from None
        if len(logprobs) != len(ids) or (truncated is not None and len(truncated) != len(ids)):
            raise _RequestFailed(f"{len(ids)} token ids but {len(logprobs)} log-probs")
        if reason == "stop":
            reason = "eos" if ids and ids[-1] in self.eos_ids else "stop"
        elif reason != "length":  # aborted, filtered: no sample to learn from
            return _error_choice()
        return {"ids": ids, "logprobs": logprobs, "truncated": truncated, "finish": reason, "text": c.get("text", "")}

    def _rollouts(self, index: int, prompt: list[int], n: int, choices: list[dict] | None,
                  sampling: SamplingParams, version: int) -> Rollouts:
        if choices is None:
            choices = [_error_choice() for _ in range(n)]
        truncated = [c["truncated"] for c in choices]
        return Rollouts(
            prompt_idx=[index] * n, prompt_ids=[list(prompt) for _ in range(n)],
            completion_ids=[c["ids"] for c in choices], logprobs=[c["logprobs"] for c in choices],
            finish_reason=[c["finish"] for c in choices], policy_version=[version] * n, sampling=sampling,
            truncated_logprobs=None if any(t is None for t in truncated) else truncated,
            texts=[self._text(c, sampling.stop) for c in choices])

    def _text(self, choice: dict, stops: list[str]) -> str:
        if self.tokenizer is None or choice["finish"] == "error":
            return choice["text"]
        text = self.tokenizer.decode(choice["ids"], skip_special_tokens=True)
        ends = [text.find(s) + len(s) for s in stops if s in text] if choice["finish"] == "stop" else []
        return text[:min(ends)] if ends else text

    # ----------------------------------------------------------------------------------- weights

    def load_weights(self, weights: dict[str, torch.Tensor], version: int, checksum: str,
                     probe: tuple[list[int], list[float]] | None = None) -> None:
        """Write ``weights_dir/v{version}/``, have every server load it, and require each to confirm
        it (``checksum`` on our server; on vLLM the version read back and, given ``probe`` — token
        ids and the trainer's log-probs of ``ids[1:]`` — the server's own log-probs of it);
        `WeightSyncError` names every server that did not."""
        if self.weights_dir is None:
            raise WeightSyncError("HTTPEngine has no weights_dir: weights cannot be handed to the servers")
        folder = self._write(weights, version)
        with ThreadPoolExecutor(max_workers=len(self.urls)) as pool:
            answers = list(pool.map(lambda u: self._push(u, str(folder), version, checksum, probe), self.urls))
        refused = [f"{url}: {why}" for url, why in zip(self.urls, answers) if why]
        if refused:
            raise WeightSyncError(f"version {version} (checksum {checksum[:12]}) was not confirmed by "
                                  f"{len(refused)} of {len(self.urls)} rollout servers: " + "; ".join(refused))
        self.version = version
        self._prune(folder)

    def _push(self, url: str, folder: str, version: int, checksum: str, probe) -> str:
        try:
            return self.dialect.push(self._sync_client, url, folder, version, checksum, probe)
        except httpx.HTTPError as e:
            return f"no answer ({_one_line(e) or type(e).__name__})"

    def _write(self, weights: dict[str, torch.Tensor], version: int) -> Path:
        from safetensors.torch import save_file

        self.weights_dir.mkdir(parents=True, exist_ok=True)
        final = self.weights_dir / f"v{version}"
        tmp = self.weights_dir / f".v{version}.tmp-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        try:
            tensors, seen = {}, set()
            for name, t in weights.items():  # safetensors refuses tensors that share memory
                t = t.detach().to("cpu").contiguous()
                if t.untyped_storage().data_ptr() in seen:
                    t = t.clone()
                seen.add(t.untyped_storage().data_ptr())
                tensors[name] = t
            if self.adapter_config is not None:  # a LoRA adapter, as peft saves one
                save_file(tensors, str(tmp / ADAPTER_FILE), metadata={"format": "pt", "version": str(version)})
                (tmp / "adapter_config.json").write_text(json.dumps(self.adapter_config))
            else:
                save_file(tensors, str(tmp / WEIGHTS_FILE), metadata={"format": "pt", "version": str(version)})
            for name in MODEL_FILES if self.model_files and self.adapter_config is None else ():
                src = Path(self.model_files) / name
                if src.is_file():
                    shutil.copyfile(src, tmp / name)
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return final.resolve()

    def _prune(self, current: Path) -> None:
        """Keep the ``keep_versions`` folders written last (the current one included)."""
        self._written = [p for p in self._written if p != current] + [current]
        keep = set(self._written[-self.keep_versions:])
        for p in self.weights_dir.iterdir():
            if p.is_dir() and _VERSION_DIR.match(p.name) and p.resolve() not in keep:
                shutil.rmtree(p, ignore_errors=True)
