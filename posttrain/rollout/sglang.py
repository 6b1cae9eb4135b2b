"""How `HTTPEngine` speaks to a stock SGLang server (``rollout.backend: sglang``).

Written from SGLang 0.5's source (``python/sglang/srt/entrypoints/http_server.py``, the request
classes in ``managers/io_struct.py``, ``layers/sampler.py``) and tested here against ``posttrain
serve``, which answers the same routes and fields. It has not been run against a real SGLang
server: SGLang does not run on the CPUs the tests have.

Generation is the OpenAI completions route, with SGLang's ``return_token_ids``: each choice then
carries ``token_ids`` (the scheduler's ``output_ids``, never a re-tokenisation of the text) and
``prompt_token_ids``. That is the exact way, so the native ``/generate`` is not needed for
sampling: SGLang's sampler log-probs, which ``logprobs.token_logprobs`` returns, are
``log(softmax(logits / T))`` over the whole vocabulary, taken before top-k/top-p filtering
(``log_softmax(logits)`` for greedy) — the ``full_temperature_scaled`` log-probs a trainer
recomputes. SGLang reports no log-probs of the truncated distribution, so `truncated_logprobs` is
None: with top-k/top-p on, the importance weights divide by the full distribution's probability,
not the truncated one that drew the token; without truncation the two are the same.
``SGLANG_RETURN_ORIGINAL_LOGPROB=1`` makes SGLang report pre-temperature log-probs instead;
`check_server` detects it (a token sampled at temperature 2 must not carry its raw log-prob) and
refuses the server with one line naming the variable.

No seed is sent. SGLang honours a request's seed only under ``--enable-deterministic-inference``,
and then copies it to each of the request's ``n`` samples, which would all come out identical.
So SGLang's samples are not reproducible, and a retried request draws new ones.

Weight sync, for each server (the routes ``/update_weights_from_disk`` documents for RL):

1. ``POST /pause_generation`` ``{"mode": "retract"}`` — running requests go back to the waiting
   queue and their KV cache is freed: the push never waits for a generation to end, and those
   requests are recomputed under the new weights when generation continues. So a sample's
   tokens come from the version its request was sent under or a newer one, and its sampler
   log-probs are those of the weights that drew each token;
2. ``POST /update_weights_from_disk`` with ``model_path``, ``weight_version`` (the version, as a
   string), ``flush_cache: true`` and ``abort_all_requests: false``; it must answer
   ``success: true``;
3. ``POST /flush_cache`` — no prefix cached under the old weights is reused (200, or 400 when
   SGLang could not flush);
4. ``POST /continue_generation`` (always, also after a failure, the pause's own included);
5. ``GET /model_info`` must read the version back as ``weight_version``, and the server's log-probs
   of a fixed probe sequence — native ``/generate`` with ``input_ids``, ``return_logprob`` and
   ``logprob_start_len: 0``, read from ``meta_info.input_token_logprobs``, which SGLang computes at
   temperature 1 — must equal the trainer's within ``probe_tol``: a server that kept old weights,
   loaded half of them or another model shows in it.

Full weights only: a LoRA adapter is not sent to SGLang here.
"""

from __future__ import annotations

import httpx

from posttrain.rollout.http.transport import answer, one_line
from posttrain.rollout.vllm import parse_version, post_json, while_paused

ORIGINAL_LOGPROB_HINT = ("the server reports log-probs before temperature; start it without "
                         "SGLANG_RETURN_ORIGINAL_LOGPROB")


class SGLangDialect:
    """SGLang's routes and fields (see the module docstring)."""

    name = "sglang"
    check_timeout_s = 120.0
    """The readiness check generates a token: a fresh server's first request warms up."""

    def __init__(self, probe_tol: float = 1e-4):
        self.probe_tol = probe_tol

    # ------------------------------------------------------------------------------------ start

    def check_server(self, client: httpx.Client, url: str, probe_prompt: list[int]) -> int:
        """Health, token ids and log-prob kind of one server; its weight version (0 when unset)."""
        r = client.get(f"{url}/health")
        if r.status_code != 200:
            raise RuntimeError(f"GET /health answered {answer(r)}")
        info = client.get(f"{url}/model_info")
        if info.status_code != 200:
            raise RuntimeError(f"GET /model_info answered {answer(info)}: not an "
                               f"SGLang server?")
        self._check_scaled_logprobs(client, url, probe_prompt)
        return parse_version(info.json().get("weight_version"))

    def _check_scaled_logprobs(self, client: httpx.Client, url: str, prompt: list[int]) -> None:
        sampled = post_json(client, f"{url}/v1/completions", {
            "prompt": prompt, "max_tokens": 1, "temperature": 2.0, "logprobs": 0, "return_token_ids": True})
        choice = sampled["choices"][0]
        if "token_ids" not in choice:
            raise RuntimeError("/v1/completions answered without token_ids: the server does not take "
                               "return_token_ids (SGLang 0.5 or newer does)")
        token, logprob = int(choice["token_ids"][0]), float(choice["logprobs"]["token_logprobs"][0])
        raw = prompt_logprobs(client, url, prompt + [token])[-1]
        if abs(raw - logprob) < 1e-6 and raw < -1e-3:
            raise RuntimeError(ORIGINAL_LOGPROB_HINT)

    # ------------------------------------------------------------------------------- generation

    @staticmethod
    def body(body: dict) -> dict:
        """Token ids back, and no seed (SGLang gives each of the ``n`` samples the same one)."""
        return {**{k: v for k, v in body.items() if k != "seed"}, "return_token_ids": True}

    @staticmethod
    def truncated_logprobs(choice: dict) -> None:
        """SGLang reports the full distribution's log-probs only (see the module docstring)."""
        return None

    # ---------------------------------------------------------------------------------- weights

    def push(self, client: httpx.Client, url: str, folder: str, version: int, checksum: str, probe) -> str:
        """Pause (retract), reload with the version, flush the cache, continue; '' or why it failed.
        ``checksum`` is not sent: SGLang has none; the probe checks the weights instead."""
        def swap() -> None:
            got = post_json(client, f"{url}/update_weights_from_disk", {
                "model_path": folder, "weight_version": str(version), "flush_cache": True,
                "abort_all_requests": False})
            if got.get("success") is not True:
                raise RuntimeError(f"update_weights_from_disk answered {one_line(got)}")
            post_json(client, f"{url}/flush_cache")

        why = ""
        try:
            while_paused(lambda: post_json(client, f"{url}/pause_generation", {"mode": "retract"}), swap,
                         lambda: post_json(client, f"{url}/continue_generation", {}))
            got = client.get(f"{url}/model_info").json().get("weight_version")
            if got is None or parse_version(got) != version:
                return f"reads back weight version {got!r}, expected {version}"
            if probe is not None:
                why = self.check_probe(client, url, *probe)
        except (httpx.HTTPError, RuntimeError, ValueError, KeyError, TypeError, IndexError) as e:
            why = f"{type(e).__name__}: {one_line(e)}"
        return why

    def check_probe(self, client: httpx.Client, url: str, ids: list[int], expected: list[float]) -> str:
        got = prompt_logprobs(client, url, ids)
        if len(got) != len(expected):
            return f"probe: {len(got)} log-probs for {len(expected)} tokens"
        worst = max((abs(a - b) for a, b in zip(got, expected)), default=0.0)
        if not worst <= self.probe_tol:
            return (f"probe log-probs differ from the trainer's by {worst:.3g} (tolerance {self.probe_tol:g}): "
                    f"the server is not serving the weights it was sent")
        return ""


def prompt_logprobs(client: httpx.Client, url: str, ids: list[int]) -> list[float]:
    """The server's log-prob of each of ``ids[1:]`` given the ones before it (temperature 1), from
    native ``/generate``: ``meta_info.input_token_logprobs`` holds ``[logprob, token_id, text]`` per
    prompt token from ``logprob_start_len``, the first one's logprob null."""
    body = {"input_ids": list(ids), "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
            "return_logprob": True, "logprob_start_len": 0}
    entries = post_json(client, f"{url}/generate", body)["meta_info"]["input_token_logprobs"]
    if [int(e[1]) for e in entries] != list(ids):
        raise RuntimeError("/generate's input_token_logprobs are not of the token ids sent")
    return [float(e[0]) for e in entries[1:]]
