"""Completion requests to the rollout servers, retried on other servers, answers read into `Rollouts`.

One ``POST /v1/completions`` per prompt, with the prompt as token ids and ``n`` = the group size, so
a group is always sampled by one server under one set of weights. Requests go out concurrently,
each to the server with the fewest requests in flight (`ServerPool`), and the answers are put back
in prompt order. Every request asks for ``logprobs=1`` and the token ids: the completion *is* the
server's ``token_ids`` and its sampler log-probs are ``logprobs.token_logprobs``, never a
re-tokenisation of the text. The seed of prompt ``i`` is ``sampling.seeds(...)[i]``, so a request
retried on another server holding the same weights draws the same samples.

A request that fails (connection error, timeout, an HTTP error, a malformed answer, samples of an
older version than the client holds) is retried on another server after a backoff, up to
``retries`` times; after that its ``n`` samples come back with finish reason ``"error"`` and an empty
completion (the RL loop scores them INFRA_FAIL: masked and counted, never a reward), or the call
raises `AllTriesFailed` when asked to (async RL then sends its prompts again). The first failure
of a kind on a server is logged at once; the same failure again within the call is counted and
summed up in one line when the call ends (a dead server fails every request the same way).
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from posttrain.rollout.http.gate import RequestGate
from posttrain.rollout.http.pool import ServerPool
from posttrain.rollout.http.transport import answer, one_line
from posttrain.rollout.types import Rollouts, SamplingParams

log = logging.getLogger(__name__)


class AllTriesFailed(Exception):
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


class Completions:
    """Sampling on the servers of ``pool`` through ``client`` (see the module docstring); requests
    pass the ``gate``. ``tokenizer``, ``eos_ids`` and ``model`` as `HTTPEngine` takes them."""

    def __init__(self, pool: ServerPool, gate: RequestGate, dialect, client: httpx.Client, *, tokenizer=None,
                 eos_ids: set[int], model: str | None = None, retries: int = 2, retry_backoff_s: float = 1.0,
                 max_inflight: int = 64):
        self.pool, self.gate, self.dialect, self.client = pool, gate, dialect, client
        self.tokenizer, self.eos_ids, self.model = tokenizer, eos_ids, model
        self.retries, self.retry_backoff_s, self.max_inflight = retries, retry_backoff_s, max_inflight
        self.stats = {"requests": 0, "retries": 0, "failed": 0}
        self._lock = threading.Lock()

    def generate(self, prompts: list[list[int]], n: int, sampling: SamplingParams, version: int,
                 lost_if_failed: bool) -> Rollouts:
        """``version``: the weights the client held when the call was made; a sample is tagged with
        it, or with the newer one its server reports. A prompt no server could answer gives error
        samples, or with ``lost_if_failed`` raises `AllTriesFailed`."""
        bodies = [self._body(p, n, sampling, s) for p, s in zip(prompts, sampling.seeds(len(prompts)))]
        failures: dict[tuple[str, str], int] = {}
        try:
            with ThreadPoolExecutor(max_workers=min(self.max_inflight, len(prompts))) as pool:
                groups = list(pool.map(lambda b: self._complete(b, version, failures), bodies))
        finally:
            for (url, why), count in failures.items():
                if count > 1:
                    log.warning("rollout server %s: %d more completion requests failed the same way (%s)",
                                url, count - 1, why)
        if lost_if_failed and any(g is None for g in groups):
            raise AllTriesFailed(f"{sum(g is None for g in groups)} of {len(groups)} prompts found no server "
                                 f"that answered in {self.retries + 1} tries")
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

    def _complete(self, body: dict, version: int, failures: dict[tuple[str, str], int]) -> list[dict] | None:
        """The ``n`` parsed choices of one request, retried on other servers; None when every try
        failed. ``failures`` counts the call's failures by server and message."""
        tried: list[str] = []
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.retry_backoff_s * 2 ** (attempt - 1))
            url = self.pool.acquire(tried)
            tried.append(url)
            try:
                return self._post(url, body, version)
            except _RequestFailed as e:
                with self._lock:
                    seen = failures.get((url, str(e)), 0)
                    failures[(url, str(e))] = seen + 1
                if not seen:
                    log.warning("rollout server %s: completion request failed (try %d of %d): %s",
                                url, attempt + 1, self.retries + 1, e)
                self.pool.check_alive(url)
            finally:
                self.pool.release(url)
                with self._lock:
                    self.stats["requests"] += 1
                    self.stats["retries"] += int(attempt > 0)
        with self._lock:
            self.stats["failed"] += 1
        return None

    def _post(self, url: str, body: dict, version: int) -> list[dict]:
        try:
            with self.gate.sending():
                r = self.client.post(f"{url}/v1/completions", json=body)
        except httpx.HTTPError as e:
            raise _RequestFailed(one_line(e) or type(e).__name__) from None
        if r.status_code != 200:
            raise _RequestFailed(f"HTTP {answer(r)}")
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
