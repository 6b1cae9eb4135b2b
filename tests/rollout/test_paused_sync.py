"""A weight sync that fails once a server may have paused still resumes it: against a loopback
server that answers vLLM's and SGLang's sync routes and can be told to answer the pause too late
(the server paused, the client timed out) or to fail or hang in the reload."""

from __future__ import annotations

import asyncio

import httpx
import pytest
import torch

from posttrain.rollout import HTTPEngine, WeightSyncError, weights_checksum
from posttrain.rollout.sglang import SGLangDialect
from posttrain.rollout.vllm import VLLMDialect
from tests.rollout.test_http_engine import InThread

SLOW_S, TIMEOUT_S = 2.0, 0.5


class PausingServer:
    """vLLM's and SGLang's weight-sync routes, enough of them for a client to start and push. It
    records the sync calls in order and whether it is paused; ``fault`` names the step that
    misbehaves: "pause-late" (pauses, then answers after the client gave up), "reload-late",
    "reload-error"."""

    def __init__(self, fault: str):
        from starlette.applications import Starlette
        from starlette.responses import JSONResponse
        from starlette.routing import Route

        self.json, self.fault = JSONResponse, fault
        self.calls: list[str] = []
        self.paused, self.version = False, 0
        get = [("/health", self.health), ("/weight_info", self.info), ("/model_info", self.info),
               ("/server_info", self.server_info)]
        post = [("/v1/completions", self.completions), ("/pause", self.pause), ("/pause_generation", self.pause),
                ("/collective_rpc", self.reload), ("/update_weights_from_disk", self.reload),
                ("/reset_prefix_cache", self.ok), ("/flush_cache", self.ok),
                ("/update_weight_version", self.set_version), ("/resume", self.resume),
                ("/continue_generation", self.resume), ("/sleep", self.sleep), ("/wake_up", self.wake)]
        self.http = InThread(Starlette(routes=[Route(p, f) for p, f in get] +
                                       [Route(p, f, methods=["POST"]) for p, f in post]))
        self.url = self.http.url

    async def health(self, request):
        return self.json({"status": "ok"})

    async def info(self, request):
        return self.json({"weight_version": str(self.version)})

    async def server_info(self, request):
        return self.json({"vllm_config": {"lora_config": None}})

    async def completions(self, request):
        """vLLM's readiness check: a token sampled at temperature 2 whose log-prob is not the raw one."""
        body = await request.json()
        if body.get("prompt_logprobs") is not None:
            entries = [None] + [{str(t): {"logprob": -2.0}} for t in body["prompt"][1:]]
            return self.json({"choices": [{"index": 0, "prompt_logprobs": entries}]})
        return self.json({"choices": [{"index": 0, "token_ids": [7], "logprobs": {"token_logprobs": [-1.0]},
                                       "text": "x", "finish_reason": "length"}]})

    async def pause(self, request):
        self.calls.append("pause")
        self.paused = True
        if self.fault == "pause-late":
            await asyncio.sleep(SLOW_S)
        return self.json({"status": "ok"})

    async def reload(self, request):
        self.calls.append("reload")
        if self.fault == "reload-late":
            await asyncio.sleep(SLOW_S)
        if self.fault == "reload-error":
            return self.json({"error": "reload failed"}, status_code=500)
        return self.json({"success": True})

    async def ok(self, request):
        return self.json({"success": True})

    async def set_version(self, request):
        self.version = int((await request.json())["new_version"])
        return self.json({})

    async def resume(self, request):
        self.calls.append("resume")
        self.paused = False
        return self.json({})

    async def sleep(self, request):
        self.calls.append("sleep")
        await asyncio.sleep(SLOW_S)  # asleep now, answering after the client gave up
        return self.json({})

    async def wake(self, request):
        self.calls.append("wake")
        return self.json({})


@pytest.fixture(params=["pause-late", "reload-late", "reload-error"])
def server(request):
    s = PausingServer(request.param)
    yield s
    s.http.stop()


def test_a_vllm_sync_that_fails_after_the_pause_resumes_the_server(server, tmp_path):
    engine = HTTPEngine([server.url], weights_dir=str(tmp_path / "w"), dialect=VLLMDialect(), eos_ids=[],
                        sync_timeout_s=TIMEOUT_S, printer=lambda *_: None)
    weights = {"w": torch.ones(3)}
    try:
        with pytest.raises(WeightSyncError, match=server.url):
            engine.load_weights(weights, 1, weights_checksum(weights))
    finally:
        engine.close()
    assert server.calls[0] == "pause" and server.calls[-1] == "resume"
    assert not server.paused and engine.version == 0


def test_an_sglang_sync_that_fails_after_the_pause_continues_generation(server, tmp_path):
    with httpx.Client(timeout=TIMEOUT_S) as client:
        why = SGLangDialect().push(client, server.url, str(tmp_path), 1, "", None)
    assert why  # refused, with the reason
    assert server.calls[0] == "pause" and server.calls[-1] == "resume"
    assert not server.paused


def test_servers_put_to_sleep_are_woken_also_when_the_sleep_did_not_answer(tmp_path):
    server = PausingServer("none")
    try:
        engine = HTTPEngine([server.url], weights_dir=str(tmp_path / "w"), dialect=VLLMDialect(), eos_ids=[],
                            sync_timeout_s=TIMEOUT_S, printer=lambda *_: None)
        with pytest.raises(httpx.TimeoutException):
            with engine.asleep():
                pass
        engine.close()
    finally:
        server.http.stop()
    assert server.calls == ["sleep", "wake"]
