"""200 concurrent requests: every one answered with its own choices, batched, and no memory left behind."""

from __future__ import annotations

import asyncio
import gc
import os
import random

import pytest

from tests.serve.conftest import SERVED_NAME

REQUESTS = 200


def rss_mb() -> float:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        pytest.skip("no /proc/self/statm on this system")


def make_request(i: int) -> tuple[str, dict, int]:
    """(path, body, expected number of choices); a mix of shapes and sampling settings."""
    rng = random.Random(i)
    n = rng.choice([1, 1, 2, 3])
    common = {"model": SERVED_NAME, "n": n, "max_tokens": rng.choice([4, 8, 8, 12])}
    kind = i % 5
    if kind == 0:
        return "/v1/completions", {**common, "prompt": [rng.randrange(439) for _ in range(rng.randint(1, 12))],
                                   "temperature": 0}, n
    if kind == 1:
        prompts = [[rng.randrange(439) for _ in range(rng.randint(1, 8))] for _ in range(rng.randint(1, 3))]
        return "/v1/completions", {**common, "prompt": prompts, "temperature": 1.0, "logprobs": 0,
                                   "return_token_ids": True}, n * len(prompts)
    if kind == 2:
        return "/v1/completions", {**common, "prompt": ["Solve: 1 + 2", "def f(x):"], "temperature": 0.7,
                                   "top_k": 20, "seed": i}, 2 * n
    if kind == 3:
        return "/v1/chat/completions", {**common, "messages": [{"role": "user", "content": f"Solve: {i} + 1"}],
                                        "temperature": 0.9, "logprobs": True}, n
    return "/v1/completions", {**common, "prompt": "the answer is", "temperature": 1.0, "top_p": 0.9,
                               "stop": ["\n"]}, n


async def fire(url: str, count: int, offset: int = 0):
    import httpx

    limits = httpx.Limits(max_connections=count, max_keepalive_connections=count)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        reqs = [make_request(offset + i) for i in range(count)]
        responses = await asyncio.wait_for(asyncio.gather(*(client.post(p, json=b) for p, b, _ in reqs)), 120)
    return reqs, responses


def test_200_concurrent_requests(server, http):
    asyncio.run(fire(server.url, 40, offset=10_000))  # warm up allocator, caches and stop-string tables
    gc.collect()
    before = rss_mb()
    calls_before = http.get("/server_info").json()["generate_calls"]

    reqs, responses = asyncio.run(fire(server.url, REQUESTS))
    assert len(responses) == REQUESTS
    bad = [(r.status_code, r.text[:200]) for r in responses if r.status_code != 200]
    assert not bad, bad
    ids = set()
    for (path, body, expected), r in zip(reqs, responses):
        out = r.json()
        ids.add(out["id"])
        assert len(out["choices"]) == expected, (path, body)
        assert [c["index"] for c in out["choices"]] == list(range(expected))
        for c in out["choices"]:
            assert c["finish_reason"] in ("stop", "length")
            if body.get("return_token_ids"):
                assert 1 <= len(c["token_ids"]) <= body["max_tokens"]
            if body.get("logprobs") is not None:
                assert c["logprobs"] is not None and len(c["truncated_logprobs"]) > 0
    assert len(ids) == REQUESTS  # every answer is its own

    calls = http.get("/server_info").json()["generate_calls"] - calls_before
    assert calls < REQUESTS, calls  # requests that arrived together shared engine calls
    gc.collect()
    grown = rss_mb() - before
    assert grown < 100, f"RSS grew by {grown:.1f} MB over {REQUESTS} requests"
    assert http.get("/health").json()["status"] == "ok"
