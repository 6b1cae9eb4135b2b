"""What HTTP costs: tokens/s through `posttrain serve` on loopback vs `TorchEngine.generate` in-process.

Same model (the embedded ``tiny`` Llama by default, built into a temporary folder), same 64 prompts
(random token ids, 8-32 tokens), same sampling (temperature 1, no top-k/top-p, unseeded), 128 new
tokens each with EOS ignored, so both sides generate exactly 64 x 128 tokens; the script checks the
count. The server is a separate ``posttrain serve`` process with the same number of torch threads;
the client sends the way an RL loop does: one ``/v1/completions`` request per prompt, all at once
(asyncio + httpx), asking for ``logprobs`` and ``return_token_ids``. A second HTTP row sends the 64
prompts in one request. Each timing is the best of ``--repeats`` runs after one warm-up run; the
ratio is HTTP tokens/s over in-process tokens/s. The three are measured in turns (in-process, HTTP,
HTTP, again), so a busy spell on the machine slows them alike.

    .venv/bin/python bench/serve_overhead.py
    .venv/bin/python bench/serve_overhead.py --size small --prompts 64 --new 128 --repeats 3
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

import torch


def make_prompts(count: int, vocab: int, seed: int = 1) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(8, 33, (count,), generator=g).tolist()
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]


def time_engine(engine, prompts, new: int) -> tuple[float, int]:
    from posttrain.rollout import SamplingParams

    start = time.perf_counter()
    r = engine.generate(prompts, 1, SamplingParams(temperature=1.0, max_new_tokens=new, ignore_eos=True))
    return time.perf_counter() - start, sum(len(c) for c in r.completion_ids)


async def _http_round(url: str, prompts, new: int, one_request: bool) -> tuple[float, int]:
    import httpx

    body = {"max_tokens": new, "temperature": 1.0, "ignore_eos": True, "logprobs": 1, "return_token_ids": True}
    limits = httpx.Limits(max_connections=len(prompts), max_keepalive_connections=len(prompts))
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        await client.get("/health")  # open one connection before the clock starts
        start = time.perf_counter()
        if one_request:
            responses = [await client.post("/v1/completions", json={**body, "prompt": prompts})]
        else:
            responses = await asyncio.gather(*(client.post("/v1/completions", json={**body, "prompt": p})
                                               for p in prompts))
        elapsed = time.perf_counter() - start
    tokens = 0
    for r in responses:
        r.raise_for_status()
        tokens += sum(len(c["token_ids"]) for c in r.json()["choices"])
    return elapsed, tokens


def interleaved_best(fns: list, repeats: int) -> list[tuple[float, int]]:
    """Best (seconds, tokens) of each function; one warm-up each, then rounds that run every function
    once, so a busy spell on the machine hits all of them alike."""
    for fn in fns:
        fn()
    runs = [[fn() for fn in fns] for _ in range(repeats)]
    return [min(r[i] for r in runs) for i in range(len(fns))]


def start_server(model_dir, threads: int):
    cmd = [sys.executable, "-m", "posttrain", "serve", str(model_dir), "--port", "0", "--threads", str(threads)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": str(threads)})
    line = proc.stdout.readline()
    m = re.search(r"at (http://[^ ]+)/v1", line)
    if not m:
        proc.kill()
        raise RuntimeError(f"server did not start: {line}{proc.stderr.read()}")
    return proc, m.group(1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="tiny", choices=["nano", "tiny", "small"])
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = ap.parse_args()

    from transformers import AutoTokenizer

    from posttrain.models.hf import quiet_transformers
    from posttrain.models.tiny import build_tiny
    from posttrain.rollout import TorchEngine

    quiet_transformers()
    torch.set_num_threads(args.threads)
    expected = args.prompts * args.new
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny(tmp, args.size, seed=0)
        tok = AutoTokenizer.from_pretrained(model_dir)
        prompts = make_prompts(args.prompts, len(tok))

        engine = TorchEngine(str(model_dir), tokenizer=tok)
        proc, url = start_server(model_dir, args.threads)
        try:
            calls = []

            def concurrent_round():
                import httpx

                before = httpx.get(f"{url}/server_info").json()["generate_calls"]
                result = asyncio.run(_http_round(url, prompts, args.new, False))
                calls.append(httpx.get(f"{url}/server_info").json()["generate_calls"] - before)
                return result

            (local_s, local_n), (many_s, many_n), (one_s, one_n) = interleaved_best([
                lambda: time_engine(engine, prompts, args.new), concurrent_round,
                lambda: asyncio.run(_http_round(url, prompts, args.new, True))], args.repeats)
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
    for label, n in [("in-process", local_n), ("http, one request per prompt", many_n), ("http, one request", one_n)]:
        if n != expected:
            raise SystemExit(f"{label}: {n} tokens generated, expected {expected}")

    print(f"model: {args.size}, {args.prompts} prompts x {args.new} new tokens, temperature 1, "
          f"torch threads {args.threads}, best of {args.repeats}")
    print(f"{'path':<44}{'seconds':>9}{'tokens/s':>11}{'ratio':>8}")
    local_tps = local_n / local_s
    for label, s, n in [("TorchEngine.generate (in-process)", local_s, local_n),
                        (f"HTTP, {args.prompts} concurrent requests x 1 prompt", many_s, many_n),
                        (f"HTTP, 1 request x {args.prompts} prompts", one_s, one_n)]:
        print(f"{label:<44}{s:>9.3f}{n / s:>11.0f}{n / s / local_tps:>8.2f}")
    print(f"engine calls per round of {args.prompts} concurrent requests: {calls}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
