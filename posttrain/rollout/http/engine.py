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

Weights: `load_weights` writes the tensors as ``model.safetensors``, or streamed in parts
(`load_buckets`) as one shard per part with ``model.safetensors.index.json`` (or, for a LoRA adapter,
``adapter_model.safetensors`` + ``adapter_config.json``) into ``weights_dir/v{version}/`` (written in
a temporary folder, then renamed, so a server never sees half a file: `posttrain.rollout.weights_folder`)
and has every server load it.
How is the server's *dialect*: ``posttrain serve`` (`PosttrainDialect`) takes
``/update_weights_from_disk`` and must echo the version and checksum; vLLM (`posttrain.rollout.vllm`)
is paused, reloaded, versioned and resumed, then verified by the version it reads back and by its
log-probs of a probe sequence. A server that does not confirm raises `WeightSyncError` naming it
and its answer, so no rollout is ever attributed to weights a server did not confirm. The two
newest folders are kept.

Failures: a request that fails (connection error, timeout, an HTTP error, a malformed answer) is
retried on another server after a backoff, up to ``retries`` times; after that its ``n`` samples
come back with finish reason ``"error"`` and an empty completion (the RL loop scores them
INFRA_FAIL: masked and counted, never a reward), or, for a request `submit`-ted by async RL, the
request comes back `Lost` and its prompts are sent again. A server that does not answer ``GET /health`` when
the engine starts raises `ServerUnreachable`, a one-line error (exit status 1 from the CLI).
A server that stops answering mid-run (a request or a push fails and ``/health`` gets no answer) is
taken out of the rotation; servers this engine launched (``servers``) are relaunched in the
background, handed the current weights, and put back once they confirm them (at most
``max_relaunches`` times). With no server left, `ServersDown` (an `EngineError`) ends the run.

Async RL (the `EngineHandle` interface: ``submit`` / ``poll``): each submitted call runs in a
thread like a `generate`, tagged with the version the client held when it was sent. A weight push
does not wait for those requests: vLLM pauses them (``mode=keep``; when a decoding one freezes is
the server's), reloads, and
preempts them so they resume under the new weights, recomputing their caches (their sampler
log-probs stay those of whatever weights drew each token). So a sample's tokens come from its
tagged version or newer, and the staleness bound, which counts the tag, holds for every token.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

import httpx
import torch

from posttrain.rollout.http.transport import PosttrainDialect, auth_headers, base_url, check_servers, one_line
from posttrain.rollout.protocol import Buckets, EngineError, Generated, Lost, Probe
from posttrain.rollout.types import Rollouts, SamplingParams, WeightsDigest, WeightSyncError
from posttrain.rollout.weights_folder import prune_versions, write_version

log = logging.getLogger(__name__)


class ServersDown(EngineError):
    """Every rollout server stopped answering: the run checkpoints and stops (exit 1)."""


class _AllTriesFailed(Exception):
    """A submitted request none of the servers could answer (async: its prompts are sent again)."""


class _RequestFailed(Exception):
    """One completion request failed on one server (the message says how)."""


def _error_choice() -> dict:
    """A sample the engine could not produce: empty, finish reason "error"."""
    return {"ids": [], "logprobs": [], "truncated": [], "finish": "error", "text": ""}


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
                 adapter_config: dict | None = None, servers=None, api_key: str | None = None,
                 max_relaunches: int = 2, printer=print):
        if retries < 0 or retry_backoff_s < 0 or max_inflight < 1 or keep_versions < 1:
            raise ValueError("retries and retry_backoff_s must be >= 0, max_inflight and keep_versions >= 1")
        self.urls = [base_url(u) for u in urls]
        self.dialect = dialect or PosttrainDialect()
        self.adapter_config = adapter_config
        self.servers = servers  # launched for this engine (`VLLMServers`): stopped by close()
        headers = auth_headers(api_key)  # sent on every request; /health needs none
        held = check_servers(self.urls, dialect=self.dialect, api_key=api_key)
        self.weights_dir = Path(weights_dir) if weights_dir else None
        self.tokenizer = tokenizer
        eos = eos_ids if eos_ids is not None else [getattr(tokenizer, "eos_token_id", None)]
        self.eos_ids = {int(e) for e in eos if e is not None}
        self.model, self.model_files = model, model_files
        self.request_timeout_s, self.sync_timeout_s = request_timeout_s, sync_timeout_s
        self.retries, self.retry_backoff_s = retries, retry_backoff_s
        self.max_inflight, self.keep_versions = max_inflight, keep_versions
        self.version = min(held)  # what every server holds at least; a resumed run sends a later one
        self.stats = {"requests": 0, "retries": 0, "failed": 0}
        self.max_relaunches, self.printer = max_relaunches, printer
        self.restarts = 0  # servers relaunched (`EngineHandle.restarts`)
        self._dead: set[str] = set()  # out of the rotation: not answering, or relaunching
        self._sync_lock = threading.Lock()  # one push at a time: the trainer's, or a relaunched server's
        # While a push needs the servers to itself (`VLLMDialect.probe_alone`), new completion
        # requests wait at the gate and the push waits for those on the wire to come back.
        self._gate = threading.Condition()
        self._held = False
        self._posting = 0
        self._last_push: tuple | None = None  # (folder, version, checksum, probe) of the newest version
        self._client = httpx.Client(timeout=request_timeout_s, limits=httpx.Limits(max_connections=max_inflight),
                                    headers=headers)
        self._sync_client = httpx.Client(timeout=sync_timeout_s, headers=headers)
        self._lock = threading.Lock()
        self._inflight = dict.fromkeys(self.urls, 0)
        self._next = 0  # round-robin tie break
        self._written: list[Path] = []
        self._submitted: dict[int, object] = {}  # rid -> Future of a `submit`-ted call
        self._rid = 0
        self._pool: ThreadPoolExecutor | None = None
        self._idle_since: float | None = time.perf_counter()
        self._idle_total, self._calls = 0.0, 0

    verifies_every_sync = True
    """`load_weights` returns only once every server confirmed the version (checksum or probe)."""

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
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
        return self._generate(prompts, n, sampling, self.version, lost_if_failed=False)

    def _generate(self, prompts: list[list[int]], n: int, sampling: SamplingParams, version: int,
                  lost_if_failed: bool) -> Rollouts:
        """``version``: the weights the client held when the call was made; a sample is tagged with
        it, or with the newer one its server reports. A prompt no server could answer gives error
        samples, or with ``lost_if_failed`` raises `_AllTriesFailed`."""
        bodies = [self._body(p, n, sampling, s) for p, s in zip(prompts, sampling.seeds(len(prompts)))]
        with ThreadPoolExecutor(max_workers=min(self.max_inflight, len(prompts))) as pool:
            groups = list(pool.map(lambda b: self._complete(b, version), bodies))
        if lost_if_failed and any(g is None for g in groups):
            raise _AllTriesFailed(f"{sum(g is None for g in groups)} of {len(groups)} prompts found no server "
                                  f"that answered in {self.retries + 1} tries")
        parts = [self._rollouts(i, p, n, choices, sampling, version)
                 for i, (p, choices) in enumerate(zip(prompts, groups))]
        return Rollouts.concat(parts)

    # ------------------------------------------------------------------ async RL (EngineHandle)

    def submit(self, prompts: list[list[int]], n: int, sampling: SamplingParams) -> int:
        """Start a `generate` in the background; its answer comes from `poll` (a `Generated`, or
        `Lost` when no server could answer it)."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self.max_inflight, thread_name_prefix="http-submit")
        self._rid += 1
        with self._lock:
            self._busy(+1)
        version, t0 = self.version, time.perf_counter()

        def call() -> Rollouts:
            try:
                return self._generate(prompts, n, sampling, version, lost_if_failed=True)
            finally:
                with self._lock:
                    self._busy(-1)

        self._submitted[self._rid] = (self._pool.submit(call), t0)
        return self._rid

    def poll(self, wait: bool) -> list[Generated | Lost]:
        """Answers of submitted calls, in submission order; with ``wait``, at least one (or
        `EngineError` once a call outlasts every try's timeout)."""
        from concurrent.futures import FIRST_COMPLETED, wait as wait_for

        if wait and self._submitted and not any(f.done() for f, _ in self._submitted.values()):
            limit = (self.request_timeout_s + self.retry_backoff_s * 2 ** self.retries) * (self.retries + 1)
            done, _ = wait_for([f for f, _ in self._submitted.values()], timeout=limit, return_when=FIRST_COMPLETED)
            if not done:
                raise EngineError(f"no rollout server answered requests {sorted(self._submitted)} within {limit:g} s "
                                  f"(rollout.request_timeout_s x tries)")
        elif wait and not self._submitted:
            raise EngineError("poll(wait=True) with no request in flight would wait forever")
        out = []
        for rid in [r for r, (f, _) in self._submitted.items() if f.done()]:
            future, t0 = self._submitted.pop(rid)
            try:
                out.append(Generated(rid, future.result(), time.perf_counter() - t0, self.idle_s))
            except _AllTriesFailed as e:
                out.append(Lost(rid, str(e)))
        return out

    def wait_synced(self) -> None:
        """Nothing to wait for: `load_weights` returns once every server confirmed."""

    @property
    def idle_s(self) -> float:
        """Seconds with no submitted call in flight (what the servers had nothing from us to do)."""
        with self._lock:
            since = self._idle_since
            return self._idle_total + (time.perf_counter() - since if since is not None else 0.0)

    def _busy(self, delta: int) -> None:
        """Count submitted calls in flight (under ``_lock``), timing the spans with none."""
        self._calls += delta
        if self._calls == 0:
            self._idle_since = time.perf_counter()
        elif delta > 0 and self._calls == 1 and self._idle_since is not None:
            self._idle_total += time.perf_counter() - self._idle_since
            self._idle_since = None

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

    def _complete(self, body: dict, version: int) -> list[dict] | None:
        """The ``n`` parsed choices of one request, retried on other servers; None when every try failed."""
        tried: list[str] = []
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.retry_backoff_s * 2 ** (attempt - 1))
            url = self._acquire(tried)
            tried.append(url)
            try:
                return self._post_completion(url, body, version)
            except _RequestFailed as e:
                log.warning("rollout server %s: completion request failed (try %d of %d): %s",
                            url, attempt + 1, self.retries + 1, e)
                self._check_alive(url)
            finally:
                self._release(url, retried=attempt > 0)
        with self._lock:
            self.stats["failed"] += 1
        return None

    def _acquire(self, tried: list[str]) -> str:
        """The live server with the fewest requests in flight, preferring ones this request has not
        tried; `ServersDown` when none is left."""
        with self._lock:
            live = [u for u in self.urls if u not in self._dead]
            if not live:
                raise ServersDown(f"every rollout server stopped answering ({', '.join(self.urls)}); "
                                  f"{self._relaunch_note()}")
            fresh = [u for u in live if u not in tried] or live
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

    def _post_completion(self, url: str, body: dict, version: int) -> list[dict]:
        with self._gate:
            self._gate.wait_for(lambda: not self._held)
            self._posting += 1
        try:
            r = self._client.post(f"{url}/v1/completions", json=body)
        except httpx.HTTPError as e:
            raise _RequestFailed(one_line(e) or type(e).__name__) from None
        finally:
            with self._gate:
                self._posting -= 1
                self._gate.notify_all()
        if r.status_code != 200:
            raise _RequestFailed(f"HTTP {r.status_code}: {one_line(r.text)}")
        try:
            data = r.json()
            choices = sorted(data["choices"], key=lambda c: c["index"])
        except (ValueError, KeyError, TypeError) as e:
            raise _RequestFailed(f"malformed answer ({one_line(e)}): {one_line(r.text)}") from None
        if len(choices) != body["n"]:
            raise _RequestFailed(f"asked for {body['n']} choices, got {len(choices)}")
        echoed = data.get("prompt_token_ids", choices[0].get("prompt_token_ids"))
        if echoed is not None and list(echoed) != body["prompt"]:
            raise _RequestFailed("the server's prompt_token_ids differ from the prompt sent")
        versions = [int(c["policy_version"]) for c in choices if "policy_version" in c]
        if versions and min(versions) < version:  # e.g. a server that restarted on its first weights
            raise _RequestFailed(f"sampled with weights version {min(versions)}, expected {version} or newer")
        return [self._parse_choice(c) for c in choices]

    def _parse_choice(self, c: dict) -> dict:
        try:
            ids = [int(t) for t in c["token_ids"]]
            logprobs = [float(x) for x in c["logprobs"]["token_logprobs"]]
            truncated = self.dialect.truncated_logprobs(c)
            reason = c["finish_reason"]
        except (KeyError, TypeError, ValueError) as e:
            raise _RequestFailed(f"choice without token_ids / logprobs.token_logprobs / finish_reason "
                                 f"({one_line(e)}); the server must support return_token_ids and logprobs") from None
        if len(logprobs) != len(ids) or (truncated is not None and len(truncated) != len(ids)):
            raise _RequestFailed(f"{len(ids)} token ids but {len(logprobs)} log-probs")
        if reason == "stop":
            reason = "eos" if ids and ids[-1] in self.eos_ids else "stop"
        elif reason != "length":  # aborted, filtered: no sample to learn from
            return _error_choice()
        return {"ids": ids, "logprobs": logprobs, "truncated": truncated, "finish": reason, "text": c.get("text", ""),
                "version": c.get("policy_version")}

    def _rollouts(self, index: int, prompt: list[int], n: int, choices: list[dict] | None,
                  sampling: SamplingParams, version: int) -> Rollouts:
        if choices is None:
            choices = [_error_choice() for _ in range(n)]
        truncated = [c["truncated"] for c in choices]
        return Rollouts(
            prompt_idx=[index] * n, prompt_ids=[list(prompt) for _ in range(n)],
            completion_ids=[c["ids"] for c in choices], logprobs=[c["logprobs"] for c in choices],
            finish_reason=[c["finish"] for c in choices], sampling=sampling,
            policy_version=[int(c["version"]) if c.get("version") is not None else version for c in choices],
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
        folder, _ = self._write([weights], version, digest=None)  # the servers check ``checksum``, as handed over
        self._push_all(folder, checksum, version, probe)

    def load_version(self, buckets: Buckets, version: int, digest: Callable[[], str],
                     probe: Probe | None = None) -> None:
        """`RolloutEngine.load_version`: the parts written as they arrive (as `load_buckets`), then
        every server must confirm the sender's ``digest()`` (our server hashes the files it read)
        or, on vLLM and SGLang, the version read back and the ``probe``."""
        folder, _ = self._write(buckets, version, digest=None)
        self._push_all(folder, digest(), version, probe)

    def load_buckets(self, buckets, version: int, probe: tuple[list[int], list[float]] | None = None) -> None:
        """`load_weights` of weights that arrive in parts (`export_buckets`): each part becomes one
        safetensors shard as it arrives (with ``model.safetensors.index.json`` when there are
        several), so the writer holds one part at a time; the servers must confirm the checksum of
        what was written."""
        self._push_all(*self._write(buckets, version, WeightsDigest()), version, probe)

    def _push_all(self, folder: Path, checksum: str, version: int, probe) -> None:
        push = (str(folder), version, checksum, probe)
        with self._sync_lock, self._alone():
            live = [u for u in self.urls if u not in self._dead]
            with ThreadPoolExecutor(max_workers=max(len(live), 1)) as pool:
                answers = list(pool.map(lambda u: self._push(u, *push), live))
            refused = [f"{url}: {why}" for url, why in zip(live, answers) if why and self._check_alive(url)]
            if refused:
                raise WeightSyncError(f"version {version} (checksum {checksum[:12]}) was not confirmed by "
                                      f"{len(refused)} of {len(live)} rollout servers: " + "; ".join(refused))
            if len(self._dead) == len(self.urls):
                raise ServersDown(f"every rollout server stopped answering ({', '.join(self.urls)}); "
                                  f"{self._relaunch_note()}")
            self.version, self._last_push = version, push
        self._prune(folder)

    def _push(self, url: str, folder: str, version: int, checksum: str, probe) -> str:
        try:
            return self.dialect.push(self._sync_client, url, folder, version, checksum, probe)
        except httpx.HTTPError as e:
            return f"no answer ({one_line(e) or type(e).__name__})"

    @contextlib.contextmanager
    def asleep(self):
        """The servers sleep inside the block (their accelerator memory freed for the trainer) and
        wake at its end, before the next push: dialects with ``sleep``/``wake`` only (vLLM)."""
        asked = []  # a sleep that failed may have put its server to sleep all the same: woken too
        try:
            for url in [u for u in self.urls if u not in self._dead]:
                asked.append(url)
                self.dialect.sleep(self._sync_client, url)
            yield
        finally:
            for url in asked:
                self.dialect.wake(self._sync_client, url)

    @contextlib.contextmanager
    def _alone(self):
        """The servers to this push alone when the dialect needs them so (`VLLMDialect.probe_alone`):
        new completion requests are held back and the ones already sent are awaited first. Waiting
        here rather than in the server's pause matters: a request sent just before the pause is
        queued by the server and would run beside the probe after the resume."""
        if not getattr(self.dialect, "probe_alone", False):
            yield
            return
        with self._gate:
            self._held = True
            self._gate.wait_for(lambda: self._posting == 0)
        try:
            yield
        finally:
            with self._gate:
                self._held = False
                self._gate.notify_all()

    # ------------------------------------------------------------------------ servers that die

    def _check_alive(self, url: str) -> bool:
        """False, and the server leaves the rotation (a launched one is relaunched), when it does not
        answer ``GET /health``: it is gone, not refusing. True while it answers."""
        try:
            if self._sync_client.get(f"{url}/health", timeout=5.0).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        with self._lock:
            if url in self._dead:
                return False
            self._dead.add(url)
        live = len(self.urls) - len(self._dead)
        self.printer(f"WARNING [server_lost] rollout server {url} stopped answering; {live} of "
                     f"{len(self.urls)} left")
        if self.servers is not None and self.restarts < self.max_relaunches:
            self.restarts += 1
            threading.Thread(target=self._relaunch, args=(url,), name="relaunch-server", daemon=True).start()
        return False

    def _relaunch(self, url: str) -> None:
        """Start a launched server again, hand it the newest weights, and put it back in rotation."""
        try:
            self.servers.restart(self.urls.index(url))
            with self._sync_lock, self._alone():  # no push of the trainer's lands between this one and the rotation
                why = self._push(url, *self._last_push) if self._last_push is not None else ""
                if why:
                    raise WeightSyncError(why)
                with self._lock:
                    self._dead.discard(url)
            self.printer(f"[server_back] rollout server {url} relaunched with weights version {self.version}")
        except Exception as e:  # noqa: BLE001 - a background thread: report, the server stays out
            self.printer(f"WARNING [server_lost] could not relaunch rollout server {url}: {one_line(e)}")

    def _relaunch_note(self) -> str:
        if self.servers is None:
            return "restart them and resume the run"
        return f"{self.restarts} relaunched (at most {self.max_relaunches}: asynchrony.max_engine_restarts)"

    @property
    def live(self) -> int:
        """Servers in the rotation."""
        with self._lock:
            return len(self.urls) - len(self._dead)

    def _write(self, buckets, version: int, digest: WeightsDigest | None) -> tuple[Path, str | None]:
        if self.weights_dir is None:
            raise WeightSyncError("HTTPEngine has no weights_dir: weights cannot be handed to the servers")
        return write_version(self.weights_dir, buckets, version, digest, adapter_config=self.adapter_config,
                             model_files=self.model_files)

    def _prune(self, current: Path) -> None:
        """Keep the ``keep_versions`` folders written last (the current one included)."""
        self._written = [p for p in self._written if p != current] + [current]
        prune_versions(self.weights_dir, set(self._written[-self.keep_versions:]))
