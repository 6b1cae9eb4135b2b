"""How `HTTPEngine` speaks to a stock vLLM server (``rollout.backend: vllm``).

Generation is the OpenAI completions route both servers share, with two vLLM fields:
``return_token_ids`` (the completion *is* the server's token ids) and
``return_tokens_as_token_ids`` (tokens that decode to the same text cannot collide). The server
must run with ``--logprobs-mode processed_logprobs``: its sampled log-probs are then those of the
distribution that drew the token, after temperature and top-k/top-p — the behaviour policy the
importance weights divide by. `check_server` proves the mode on the running server (a sampled
token's log-prob must differ from its raw log-prob at temperature 2) and refuses a server in raw
mode with one line naming the flag.

On a CPU build the requests carry no per-request ``seed``: vLLM 0.32's model runner rewinds a
seeded request's generator (``Generator.set_offset``) whenever that request's prefill is split over
steps (a batch past ``max_num_batched_tokens``, or requests preempted by a weight sync and
recomputed), and a CPU generator has no offset: the engine dies with ``RuntimeError: CPU Generator
does not use offset`` and every request after it answers HTTP 500. `check_server` reads the device
from ``/server_info``; unseeded, a request retried on another CPU server draws other samples (still
of the same weights). GPU builds keep the seeds.

With top-k/top-p on, vLLM reports only the truncated distribution's log-probs, so those stand in
for the full-distribution ones too: ``mismatch/*`` then include the log of the probability mass the
truncation kept. Without truncation the two are the same and the mismatch metrics are exact.

Weight sync uses the routes stock vLLM has (``VLLM_SERVER_DEV_MODE=1``): for each server,

1. ``POST /pause?mode=keep`` — requests in flight are frozen where they are, so a push need not
   wait for a generation to end and async RL keeps generating across syncs (when a decoding
   request freezes is the server's: the CPU build of 0.32 lets it finish first) (on a server started with
   LoRA on, the requests sent finish first and no new one is sent until the probe has answered,
   because vLLM's LoRA path cannot compute the probe's prompt log-probs beside decoding requests);
2. ``POST /collective_rpc`` ``reload_weights`` from the folder the engine wrote (or, with LoRA,
   ``/v1/load_lora_adapter`` in place: only the adapter moves);
3. ``POST /reset_prefix_cache?reset_running_requests=true`` — cached prefixes were computed by
   the old weights, and the frozen requests are preempted: they resume under the new weights with
   their caches recomputed, so no token is drawn from old keys under new weights. A sample's tokens
   then come from the version its request was sent under or a newer one, and its sampler
   log-probs are those of the weights that drew each token (the loss's behaviour policy);
4. ``POST /update_weight_version``, then ``POST /resume`` (always, also after a failure, the pause's
   own included: a pause whose answer was lost may have paused the server all the same);
5. ``GET /weight_info`` must read the version back, and the server's ``prompt_logprobs`` of a fixed
   probe sequence must equal the trainer's within ``probe_tol``. vLLM's own ``/weight_checker``
   hashes linear layers as empty on CPU builds, so the probe, not a checksum, is what verifies a
   sync: a server that kept old weights, loaded half of them or another model shows in it.
"""

from __future__ import annotations

from typing import Callable

import httpx

from posttrain.rollout.http.transport import answer

RAW_MODE_HINT = ("the server reports log-probs before temperature; start it with "
                 "--logprobs-mode processed_logprobs")


class VLLMDialect:
    """vLLM's routes and fields. ``lora_name``: generate with this adapter (sync sends adapters)."""

    name = "vllm"
    check_timeout_s = 120.0
    """The readiness check generates a token: a fresh server's first request warms up (~13 s on a CPU)."""

    def __init__(self, probe_tol: float = 1e-4, lora_name: str | None = None):
        self.probe_tol = probe_tol
        self.lora_name = lora_name
        # A server started with LoRA on (vLLM 0.32, CPU) crashes its engine computing prompt
        # log-probs in a batch that also decodes (the LoRA logits op indexes the decode batch's
        # rows), adapter or not: the probe must run alone. `HTTPEngine` then holds new requests back
        # and awaits those in flight before the push; without LoRA, requests are frozen in place.
        # `check_server` reads each server's config to know.
        self.probe_alone = lora_name is not None
        self.seeded = True
        """Whether requests carry their seed: false once any server is a CPU build (module docstring)."""

    @property
    def pause_mode(self) -> str:
        return "wait" if self.probe_alone else "keep"

    # ------------------------------------------------------------------------------------ start

    def check_server(self, client: httpx.Client, url: str, probe_prompt: list[int]) -> int:
        """Health, dev routes and log-prob mode of one server; its weight version (0 when unset)."""
        r = client.get(f"{url}/health")
        if r.status_code != 200:
            raise RuntimeError(f"GET /health answered {answer(r)}")
        info = client.get(f"{url}/weight_info")
        if info.status_code == 404:
            raise RuntimeError("GET /weight_info is 404: start the server with VLLM_SERVER_DEV_MODE=1 "
                               "(weight sync needs vLLM's dev routes)")
        self._check_processed_logprobs(client, url, probe_prompt)
        config = server_config(client, url)
        # unknown counts as the careful case: LoRA on (the probe runs alone), a CPU build (no seeds)
        self.probe_alone = self.probe_alone or config is None or config.get("lora_config") is not None
        self.seeded = self.seeded and config is not None and _device(config) not in ("cpu", "")
        return parse_version(info.json().get("weight_version"))

    def _check_processed_logprobs(self, client: httpx.Client, url: str, prompt: list[int]) -> None:
        # The base model: an adapter is only loaded by the first sync.
        sampled = post_json(client, f"{url}/v1/completions", {
            "prompt": prompt, "max_tokens": 1, "temperature": 2.0, "logprobs": 0, "seed": 0, "return_token_ids": True})
        choice = sampled["choices"][0]
        token, logprob = int(choice["token_ids"][0]), float(choice["logprobs"]["token_logprobs"][0])
        raw = prompt_logprobs(client, url, prompt + [token])[-1]
        if abs(raw - logprob) < 1e-6 and raw < -1e-3:
            raise RuntimeError(RAW_MODE_HINT)

    # ------------------------------------------------------------------------------- generation

    def body(self, body: dict) -> dict:
        body = {**body, "return_token_ids": True, "return_tokens_as_token_ids": True}
        if not self.seeded:
            body.pop("seed", None)
        if self.lora_name:
            body["model"] = self.lora_name
        return body

    @staticmethod
    def truncated_logprobs(choice: dict) -> list[float]:
        """processed_logprobs are the truncated distribution's (see the module docstring)."""
        return [float(x) for x in choice["logprobs"]["token_logprobs"]]

    # ---------------------------------------------------------------------------------- weights

    def push(self, client: httpx.Client, url: str, folder: str, version: int, checksum: str, probe) -> str:
        """Pause, reload, reset the caches, set the version, resume; '' or why it failed.

        Requests in flight are frozen where they are (``mode=keep``: the push need not wait for a
        generation to end) and the cache reset preempts them, so they resume under the new weights
        with their caches recomputed; no token is drawn from a mix of old keys and new weights.
        With LoRA they are drained instead (``probe_alone``)."""
        def swap() -> None:
            self._reload(client, url, folder)
            reset = post_json(client, f"{url}/reset_prefix_cache", params={"reset_running_requests": "true"})
            if reset.get("success") is False:
                raise RuntimeError("reset_prefix_cache answered success=false: cached keys of the old "
                                   "weights would be reused")
            post_json(client, f"{url}/update_weight_version", {"new_version": str(version)})

        why = ""
        try:
            while_paused(lambda: post_json(client, f"{url}/pause", params={"mode": self.pause_mode}), swap,
                         lambda: post_json(client, f"{url}/resume"))
            got = client.get(f"{url}/weight_info").json().get("weight_version")
            if parse_version(got) != version:
                return f"reads back weight version {got!r}, expected {version}"
            if probe is not None:
                why = self.check_probe(client, url, *probe)
        except (httpx.HTTPError, RuntimeError, ValueError, KeyError, TypeError) as e:
            why = f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"
        return why

    @staticmethod
    def sleep(client: httpx.Client, url: str) -> None:
        """Free the server's accelerator memory (weights to host memory, KV cache dropped)."""
        post_json(client, f"{url}/sleep", params={"level": 1, "mode": "wait"})

    @staticmethod
    def wake(client: httpx.Client, url: str) -> None:
        post_json(client, f"{url}/wake_up")

    def _reload(self, client: httpx.Client, url: str, folder: str) -> None:
        if self.lora_name:
            post_json(client, f"{url}/v1/load_lora_adapter",
                      {"lora_name": self.lora_name, "lora_path": folder, "load_inplace": True})
        else:
            post_json(client, f"{url}/collective_rpc",
                      {"method": "reload_weights", "kwargs": {"weights_path": folder}})

    def check_probe(self, client: httpx.Client, url: str, ids: list[int], expected: list[float]) -> str:
        got = prompt_logprobs(client, url, ids, model=self.lora_name)
        worst = max(abs(a - b) for a, b in zip(got, expected))
        if len(got) != len(expected) or not worst <= self.probe_tol:
            return (f"probe log-probs differ from the trainer's by {worst:.3g} (tolerance {self.probe_tol:g}): "
                    f"the server is not serving the weights it was sent")
        return ""


def prompt_logprobs(client: httpx.Client, url: str, ids: list[int], model: str | None = None) -> list[float]:
    """The server's log-prob of each of ``ids[1:]`` given the ones before it (temperature 1)."""
    body = {"prompt": ids, "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 0}
    if model:
        body["model"] = model
    entries = post_json(client, f"{url}/v1/completions", body)["choices"][0]["prompt_logprobs"]
    return [float(e[str(t)]["logprob"]) for e, t in zip(entries[1:], ids[1:])]


def server_config(client: httpx.Client, url: str) -> dict | None:
    """The server's ``vllm_config`` (dev route ``/server_info``), None when it cannot be read."""
    try:
        r = client.get(f"{url}/server_info", params={"config_format": "json"})
        config = r.json()["vllm_config"] if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return None
    return config if isinstance(config, dict) else None


def _device(config: dict) -> str:
    device = config.get("device_config")
    return str(device.get("device", "")) if isinstance(device, dict) else ""


def while_paused(pause: Callable[[], object], work: Callable[[], object], resume: Callable[[], object]) -> None:
    """``pause()``, ``work()``, then ``resume()`` whatever happened. The resume is sent also when the
    pause itself failed: a pause whose answer timed out may have paused the server all the same, and
    a server left paused serves nothing until someone resumes it. When the resume fails after an
    earlier failure, the error names both."""
    try:
        pause()
        work()
    except BaseException as first:
        try:
            resume()
        except Exception as then:  # noqa: BLE001 - reported with the failure that came first
            if isinstance(first, Exception):
                raise RuntimeError(f"{type(first).__name__}: {_brief(first)}; the resume after it failed too: "
                                   f"{type(then).__name__}: {_brief(then)}") from first
        raise
    resume()


def _brief(e: BaseException) -> str:
    return " ".join(str(e).split())[:300]


def post_json(client: httpx.Client, url: str, body: dict | None = None, params: dict | None = None) -> dict:
    r = client.post(url, json=body, params=params)
    if r.status_code != 200:
        raise RuntimeError(f"POST {url.rsplit('/', 1)[-1]} answered {answer(r)}")
    try:
        return r.json() if r.content else {}
    except ValueError:  # some routes answer plain text ("Success: LoRA adapter ... added")
        return {"text": r.text}


def parse_version(value) -> int:
    """vLLM's weight version is a string ("default" before any update)."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0
