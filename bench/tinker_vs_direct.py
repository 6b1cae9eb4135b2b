"""What the Tinker-compatible API costs: SFT and GRPO steps through `posttrain tinker-serve` on
loopback vs the same steps by `posttrain sft` / `posttrain rl`'s own training code, in-process.

Same model (the embedded ``tiny`` Llama, built into a temporary folder), same LoRA (rank 8, alpha
8, every linear layer and the output head, as the API's default), same work per step:

* **SFT**: ``--batch`` datums of ``--length`` tokens, forward/backward of the next-token loss, Adam
  step. *cli*: `posttrain sft`'s model loading, optimizer and ``SFTTrainer.train_step`` on one
  micro-batch of those datums (one row each, as the API forwards them).
* **GRPO**: ``--groups`` arithmetic prompts x ``--group-size`` samples of ``--new`` tokens with
  log-probs, advantages centred per group, the policy-gradient loss, Adam step, the new weights
  handed to the sampler. *cli*: ``posttrain.rl.loop.rl_step`` on a run built by ``setup(cfg)``
  (GRPO, the torch engine, the arithmetic verifier; EOS ignored so every completion is ``--new``
  tokens, no KL, every row trained); it also scores the samples with the trainer (its old
  log-probs), which the API's loop takes from the sampler. The API side samples the same prompts
  and stops at EOS (the last column says how many tokens each side generated per step).

Two baselines, side by side: *cli* (what the API is measured against) and *base*, the server's own
`Base` called in-process (the same peft model, `TrainCore` step and `TorchEngine` without HTTP,
futures, protobuf or JSON): API/base is the serving overhead alone. The API side speaks plain
HTTP the way the SDK does (protobuf forward_backward, polling ``retrieve_future``), submitting a
step's forward_backward and optim_step before collecting either, as the SDK's loops do. Each
figure is the best of ``--repeats`` rounds of ``--steps`` steps, taken in turns (cli, base, API,
cli, ...) so a busy spell slows all alike; ratio = API steps/s over the baseline's.

A last line measures the batching of waiting ``asample`` requests: ``--sample-prompts`` prompts'
requests on one sampling session sent together (the server runs them as one engine call) vs each
collected before the next is sent (one call each), in tokens per second.

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


LORA = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"]  # the API's default
OPTIM = {"lr": 1e-4, "beta1": 0.9, "beta2": 0.95, "eps": 1e-12, "weight_decay": 0.0, "schedule": "constant",
         "warmup_steps": 0, "grad_clip": 0.0}


class SftCli:
    """`posttrain sft`'s step: its model loading (LoRA rank 8, alpha 8, the API's layers), optimizer,
    schedule and `SFTTrainer.train_step` on one micro-batch of the same datums (one row each)."""

    def __init__(self, model_dir, data):
        from posttrain.core.optim import OptimConfig, build_optimizer, build_scheduler
        from posttrain.data.packing import collate
        from posttrain.data.sft import TokenizedExample
        from posttrain.models.hf import LoraConfig, ModelConfig, load_model
        from posttrain.train.sft import SFTTrainer

        model = load_model(ModelConfig(path=str(model_dir), lora=LoraConfig(enabled=True, r=8, alpha=8,
                                                                             target_modules=LORA)))
        optim = OptimConfig(**OPTIM)
        optimizer = build_optimizer(model.parameters(), optim)
        self.trainer = SFTTrainer(model, optimizer, build_scheduler(optimizer, optim, 10_000), grad_clip=0.0)
        examples = [TokenizedExample(tokens + [int(x["target_tokens"][-1])], [0] + [1] * len(tokens))
                    for tokens, x in data]
        self.batch = collate(examples, list(range(len(examples))), pack=False, seq_len=len(examples[0]))

    def sft_step(self, data):
        self.trainer.train_step([self.batch])


class RlCli:
    """`posttrain rl`'s step: ``rl_step`` on a run built by ``setup`` (GRPO, LoRA rank 8, the torch
    engine with a weight sync per step, the arithmetic task and verifier), every completion
    ``--new`` tokens long (EOS ignored, as `bench/grpo_vs_trl.py` does), no KL, every row trained."""

    def __init__(self, model_dir, out, args):
        import dataclasses

        from posttrain.config import load_config
        from posttrain.rl.config import RLConfig
        from posttrain.rl.loop import encode_prompts, load_prompt_records, setup
        from posttrain.tasks.arithmetic import write_arithmetic

        prompts = write_arithmetic(os.path.join(out, "data"), digits=1, ops="+", n_train=70, n_eval=8, seed=0)
        overrides = {"model.path": model_dir, "model.lora.enabled": True, "model.lora.r": 8, "model.lora.alpha": 8,
                     "model.lora.target_modules": "[" + ",".join(LORA) + "]", "data.path": prompts["prompts_train"],
                     "prompts_per_step": args.groups, "rollout.group_size": args.group_size,
                     "rollout.max_new_tokens": args.new, "rollout.temperature": 1.0, "verifier": "arithmetic",
                     "algorithm": "grpo", "kl.coef": 0.0, "kl.track": False, "ppo_epochs": 1, "mini_batches": 1,
                     "skip_zero_variance_backward": False, "eval_every": 0, "num_steps": 10_000, "seed": 0,
                     "out_dir": os.path.join(out, "rl"), "logging.progress": False} | {f"optim.{k}": v for k, v in OPTIM.items()}
        self.run = setup(load_config(RLConfig, None, [f"{k}={v}" for k, v in overrides.items()]))
        engine = self.run.engine

        class FixedLength:
            def generate(self, prompts, n, sampling):
                return engine.generate(prompts, n, dataclasses.replace(sampling, ignore_eos=True))

            def __getattr__(self, name):
                return getattr(engine, name)

        self.run.engine = FixedLength()
        records = load_prompt_records(str(prompts["prompts_train"]))[:args.groups]
        self.prompts = encode_prompts(self.run.tokenizer, records, self.run.cfg.data.use_chat_template)
        self.steps, self.tokens = 0, 0

    def rl_step(self, prompts, group_size: int, new: int, label: str):
        from posttrain.rl.loop import rl_step
        from posttrain.tracking import StageTimer

        self.steps += 1
        self.tokens += rl_step(self.run, self.steps, StageTimer())["tokens/generated"]


class Direct:
    """The server's own `Base` in-process: the API's work without HTTP, futures, protobuf or JSON."""

    def __init__(self, model_dir):
        from posttrain.tinker.cli import load_base
        from posttrain.tinker.training import LoraSpec

        self.base = load_base("tiny", model_dir, None)
        self.base.add_adapter("m", LoraSpec(rank=8, seed=0))
        self.tokens = 0

    def sft_step(self, data):
        from posttrain.tinker.wire import Datum

        self.base.forward_backward("m", "cross_entropy", [Datum(t, x) for t, x in data], {}, True)
        self.base.optim_step("m", ADAM)

    def rl_step(self, prompts, group_size: int, new: int, label: str):
        from posttrain.tinker.wire import Datum

        self.base.use_snapshot(label, self.base.adapter_state("m"))
        samples = []
        for seqs, *_ in self.base.sample_batch(prompts, group_size, PARAMS | {"max_tokens": new}, False):
            samples += [(t, lp) for _, t, lp in seqs]
        self.tokens += sum(len(t) for t, _ in samples)
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
        self.tokens = 0

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
        # every prompt's request sent before any is collected, as the cookbook's loops do (the
        # server runs them as one engine call)
        sent = [self.http.post("/api/v1/asample", json={
            "sampling_session_id": sampler, "num_samples": group_size,
            "prompt": {"chunks": [{"type": "encoded_text", "tokens": p}]},
            "sampling_params": {"max_tokens": new, "temperature": 1.0}}) for p in prompts]
        for out in map(self.wait, sent):
            for seq in fields(out)[1]:
                f = fields(seq)
                samples.append((np.frombuffer(f[2][0], dtype="<i4").tolist(),
                                np.frombuffer(f[3][0], dtype="<f4").tolist()))
        self.tokens += sum(len(t) for t, _ in samples)
        self.fb("importance_sampling", rl_data(prompts, samples, group_size))

    def sample_prompts(self, prompts, group_size: int, new: int, together: bool) -> int:
        """One ``asample`` per prompt on the base: all sent before any is collected (as the
        cookbook's loops do; the server runs them as one engine call), or each collected before
        the next is sent. The tokens generated."""
        sampler = self.http.post("/api/v1/create_sampling_session", json={"base_model": "tiny"}).json()
        body = lambda p: {"sampling_session_id": sampler["sampling_session_id"], "num_samples": group_size,  # noqa: E731
                          "prompt": {"chunks": [{"type": "encoded_text", "tokens": p}]},
                          "sampling_params": {"max_tokens": new, "temperature": 1.0}}
        if together:
            outs = [self.wait(r) for r in [self.http.post("/api/v1/asample", json=body(p)) for p in prompts]]
        else:
            outs = [self.wait(self.http.post("/api/v1/asample", json=body(p))) for p in prompts]
        from posttrain.tinker.wire import fields

        return sum(len(fields(seq)[2][0]) // 4 for out in outs for seq in fields(out)[1])

    def close(self):
        self.http.close()
        self.proc.terminate()
        self.proc.wait(30)


def rounds(fn, steps: int) -> float:
    t0 = time.perf_counter()
    for i in range(steps):
        fn(i)
    return time.perf_counter() - t0


def sample_line(api: Api, prompts, args) -> None:
    """Sampling alone through the API, the prompts' requests sent together (one engine call) vs
    one at a time."""
    prompts = (prompts * args.sample_prompts)[:args.sample_prompts]
    best, tokens = {}, {}
    for together in (False, True):
        api.sample_prompts(prompts, args.group_size, args.new, together)  # warm-up
    for _ in range(args.repeats):
        for together in (False, True):
            t0 = time.perf_counter()
            tokens[together] = api.sample_prompts(prompts, args.group_size, args.new, together)
            best[together] = min(best.get(together, float("inf")), time.perf_counter() - t0)
    print(f"sampling through the API, {len(prompts)} prompts x {args.group_size} samples x {args.new} tokens: "
          f"one request at a time {tokens[False] / best[False]:.0f} tokens/s, sent together (one engine call) "
          f"{tokens[True] / best[True]:.0f} tokens/s, ratio {tokens[True] / best[True] / (tokens[False] / best[False]):.2f}")


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
    p.add_argument("--sample-prompts", type=int, default=8, help="prompts of the sampling line")
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    from posttrain.models.hf import quiet_transformers
    from posttrain.models.tiny import build_tiny

    quiet_transformers()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny(os.path.join(tmp, "tiny"), "tiny", seed=0)
        os.mkdir(os.path.join(tmp, "root"))
        base = Direct(model_dir)
        data = sft_data(args.batch, args.length, base.base.vocab)
        rl_cli = RlCli(model_dir, tmp, args)
        sides = {"cli": {"sft": SftCli(model_dir, data), "grpo": rl_cli}, "base": {"sft": base, "grpo": base}}
        api = Api(model_dir, os.path.join(tmp, "root"), args.threads)
        sides["api"] = {"sft": api, "grpo": api}
        try:
            work = {"sft": lambda side: (lambda i: side.sft_step(data)),
                    "grpo": lambda side: (lambda i: side.rl_step(rl_cli.prompts, args.group_size, args.new, f"s{i}"))}
            print(f"tiny model, LoRA rank 8; SFT: {args.batch} x {args.length} tokens; GRPO: {args.groups} arithmetic "
                  f"prompts x {args.group_size} samples x {args.new} new tokens; {args.steps} steps, best of {args.repeats}")
            print("cli = `posttrain sft` / `posttrain rl`'s own step (SFTTrainer.train_step, rl_step on setup(cfg)); "
                  "base = the server's Base in-process; api = HTTP to tinker-serve")
            print(f"{'work':<6}{'cli steps/s':>13}{'base steps/s':>14}{'API steps/s':>13}{'API/cli':>9}{'API/base':>10}"
                  f"{'new tokens/step cli, base, api':>32}")
            for name, make in work.items():
                for side in sides.values():
                    make(side[name])(0)  # warm-up
                    side[name].tokens = 0
                best = {k: float("inf") for k in sides}
                for _ in range(args.repeats):
                    for k, side in sides.items():
                        best[k] = min(best[k], rounds(make(side[name]), args.steps))
                rate = {k: args.steps / best[k] for k in sides}
                tokens = ", ".join(f"{side[name].tokens / (args.steps * args.repeats):.0f}" for side in sides.values())
                print(f"{name:<6}{rate['cli']:>13.2f}{rate['base']:>14.2f}{rate['api']:>13.2f}"
                      f"{rate['api'] / rate['cli']:>9.2f}{rate['api'] / rate['base']:>10.2f}"
                      f"{tokens if name == 'grpo' else '-':>32}")
            sample_line(api, rl_cli.prompts, args)
        finally:
            api.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
