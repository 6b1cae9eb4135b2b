"""What the Tinker-compatible API costs: SFT and GRPO steps through `posttrain tinker-serve` on
loopback vs the same steps in-process.

Same model (the embedded ``tiny`` Llama, built into a temporary folder), same LoRA (rank 8, every
linear layer), same work per step:

* **SFT**: ``--batch`` datums of ``--length`` tokens, ``cross_entropy`` forward/backward, Adam step.
* **GRPO**: ``--groups`` prompts x ``--group-size`` samples of ``--new`` tokens with log-probs
  from a snapshot of the current weights, advantages centred per group, ``importance_sampling``
  forward/backward, Adam step, then a new snapshot for the next step's sampler.

In-process means the server's own `Base` (the same peft model, `TrainCore` step and `TorchEngine`)
called directly: no HTTP, futures, protobuf or JSON. The API side speaks plain HTTP the way the
SDK does (protobuf forward_backward, polling ``retrieve_future``), submitting a step's
forward_backward and optim_step before collecting either, as the SDK's loops do. (Before the
server set TCP_NODELAY on its listening socket, every request on loopback cost 40 ms more than its
work, a delayed ACK; the ratios were 0.73 SFT and 0.82 GRPO.) Each
figure is the best of ``--repeats`` rounds of ``--steps`` steps, taken in turns (direct, API,
direct, API) so a busy spell slows both alike; ratio = API steps/s over direct steps/s.

    .venv/bin/python bench/tinker_vs_direct.py
    .venv/bin/python bench/tinker_vs_direct.py --batch 16 --length 128 --steps 5
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time

import httpx
import numpy as np
import torch


def sft_data(batch: int, length: int, vocab: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(batch):
        ids = rng.integers(3, vocab, length + 1)
        out.append((ids[:-1].tolist(), {"target_tokens": ids[1:].astype(np.int64),
                                        "weights": np.ones(length, dtype=np.float32)}))
    return out


def rl_data(prompts, samples, group_size: int):
    """(tokens, inputs) per sample: the cookbook's RL datum with group-centred advantages."""
    out = []
    for g, prompt in enumerate(prompts):
        group = samples[g * group_size:(g + 1) * group_size]
        rewards = np.array([len(set(t)) for t, _ in group], dtype=np.float32)
        for (tokens, logprobs), adv in zip(group, rewards - rewards.mean()):
            full, n = prompt + tokens, len(prompt) - 1
            out.append((full[:-1], {"target_tokens": np.array(full[1:], dtype=np.int64),
                                    "logprobs": np.array([0.0] * n + logprobs, dtype=np.float32),
                                    "advantages": np.array([0.0] * n + [adv] * len(tokens), dtype=np.float32)}))
    return out


ADAM = {"learning_rate": 1e-4, "beta1": 0.9, "beta2": 0.95, "eps": 1e-12, "weight_decay": 0.0, "grad_clip_norm": 0.0}
PARAMS = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "seed": None, "stop": []}


class Direct:
    def __init__(self, model_dir):
        from posttrain.tinker.cli import load_base
        from posttrain.tinker.training import LoraSpec

        self.base = load_base("tiny", model_dir, None)
        self.base.add_adapter("m", LoraSpec(rank=8, seed=0))

    def sft_step(self, data):
        from posttrain.tinker.wire import Datum

        self.base.forward_backward("m", "cross_entropy", [Datum(t, x) for t, x in data], {}, True)
        self.base.optim_step("m", ADAM)

    def rl_step(self, prompts, group_size: int, new: int, label: str):
        from posttrain.tinker.training import merge_adapter
        from posttrain.tinker.wire import Datum

        self.base.use_snapshot(label, merge_adapter(self.base.base_weights, self.base.adapter_state("m")))
        samples = []
        for p in prompts:
            seqs, _ = self.base.sample(p, group_size, PARAMS | {"max_tokens": new}, False)
            samples += [(t, lp) for _, t, lp in seqs]
        data = [Datum(t, x) for t, x in rl_data(prompts, samples, group_size)]
        self.base.forward_backward("m", "importance_sampling", data, {}, True)
        self.base.optim_step("m", ADAM)


class Api:
    def __init__(self, model_dir, root, threads: int):
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        self.proc = subprocess.Popen([sys.executable, "-m", "posttrain", "tinker-serve", "--root", str(root),
                                      "--model", f"tiny={model_dir}", "--port", "0", "--threads", str(threads)],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        url = next(line.split(" at ")[1].split()[0] for line in self.proc.stdout if " at http" in line)
        # TCP_NODELAY as the SDK's default transport (pyqwest, on hyper) sets it
        nodelay = httpx.HTTPTransport(socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)])
        self.http = httpx.Client(base_url=url, timeout=120, transport=nodelay)
        session = self.http.post("/api/v1/create_session", json={"tags": []}).json()["session_id"]
        self.model = self.wait(self.http.post("/api/v1/create_model", json={
            "session_id": session, "model_seq_id": 0, "base_model": "tiny", "lora_config": {"rank": 8, "seed": 0}}))
        self.model = self.model["model_id"]

    def wait(self, r):
        r.raise_for_status()
        while True:
            out = self.http.post("/api/v1/retrieve_future", json={"request_id": r.json()["request_id"]})
            if out.headers["content-type"].startswith("application/x-protobuf"):
                return out.content
            body = out.json()
            if body.get("type") != "try_again":
                assert "error" not in body, body
                return body

    def fb(self, loss, data):
        from posttrain.tinker.wire import encode_forward_backward

        # as the SDK's loops do: both submitted, then both results collected (the worker keeps the order)
        fb = self.http.post("/api/v1/forward_backward", content=encode_forward_backward(self.model, 1, loss, data))
        step = self.http.post("/api/v1/optim_step", json={"model_id": self.model, "adam_params": ADAM})
        self.wait(fb), self.wait(step)

    def sft_step(self, data):
        self.fb("cross_entropy", data)

    def rl_step(self, prompts, group_size: int, new: int, label: str):
        from posttrain.tinker.wire import fields

        sampler = self.wait(self.http.post("/api/v1/save_weights_for_sampler", json={
            "model_id": self.model, "sampling_session_seq_id": 0}))["sampling_session_id"]
        samples = []
        for p in prompts:
            out = self.wait(self.http.post("/api/v1/asample", json={
                "sampling_session_id": sampler, "num_samples": group_size,
                "prompt": {"chunks": [{"type": "encoded_text", "tokens": p}]},
                "sampling_params": {"max_tokens": new, "temperature": 1.0}}))
            for seq in fields(out)[1]:
                f = fields(seq)
                samples.append((np.frombuffer(f[2][0], dtype="<i4").tolist(),
                                np.frombuffer(f[3][0], dtype="<f4").tolist()))
        self.fb("importance_sampling", rl_data(prompts, samples, group_size))

    def close(self):
        self.http.close()
        self.proc.terminate()
        self.proc.wait(30)


def rounds(fn, steps: int) -> float:
    t0 = time.perf_counter()
    for i in range(steps):
        fn(i)
    return time.perf_counter() - t0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--length", type=int, default=64)
    p.add_argument("--groups", type=int, default=4)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--new", type=int, default=32)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    from posttrain.models.hf import quiet_transformers
    from posttrain.models.tiny import build_tiny

    quiet_transformers()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny(os.path.join(tmp, "tiny"), "tiny", seed=0)
        os.mkdir(os.path.join(tmp, "root"))
        direct, api = Direct(model_dir), Api(model_dir, os.path.join(tmp, "root"), args.threads)
        try:
            vocab = direct.base.vocab
            data = sft_data(args.batch, args.length, vocab)
            rng = np.random.default_rng(1)
            prompts = [rng.integers(3, vocab, 12).tolist() for _ in range(args.groups)]
            work = {"sft": lambda side: (lambda i: side.sft_step(data)),
                    "grpo": lambda side: (lambda i: side.rl_step(prompts, args.group_size, args.new, f"s{i}"))}
            print(f"tiny model, LoRA rank 8; SFT: {args.batch} x {args.length} tokens; GRPO: {args.groups} prompts x "
                  f"{args.group_size} samples x {args.new} new tokens; {args.steps} steps, best of {args.repeats}")
            print(f"{'work':<6}{'direct steps/s':>16}{'API steps/s':>14}{'ratio':>8}")
            for name, make in work.items():
                make(direct)(0), make(api)(0)  # warm-up
                best = {"direct": float("inf"), "api": float("inf")}
                for _ in range(args.repeats):
                    for side_name, side in (("direct", direct), ("api", api)):
                        best[side_name] = min(best[side_name], rounds(make(side), args.steps))
                d, a = args.steps / best["direct"], args.steps / best["api"]
                print(f"{name:<6}{d:>16.2f}{a:>14.2f}{a / d:>8.2f}")
        finally:
            api.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
