"""How far the sampler's log-probs are from the trainer's, through the official `tinker` SDK.

The server samples with a `TorchEngine` holding the base with the client's adapter merged in
(``W + B·A``, fp32) and decodes token by token with a KV cache; the trainer scores the same tokens
with peft's unmerged adapter (``x·W + (x·A)·B``) on a padded batch in one forward. The two differ
only by float32 rounding, which grows with the adapter (training steps, learning rate) and the
size of the log-probs. This loop measures it: a LoRA client trained with ``cross_entropy`` on 4
fixed sequences, and after each number of steps in ``--steps`` a sampler snapshot, ``--samples``
samples of ``--new`` tokens at temperature 1, and the trainer's ``forward`` of the same tokens:
the largest and the mean absolute gap over every sampled token, and the smallest log-prob seen.

    .venv/bin/python bench/tinker_logprob_gap.py                  # starts tinker-serve on the tiny model
    .venv/bin/python bench/tinker_logprob_gap.py --lr 1e-2 --rank 32

The loop runs in `.venv-tinker` (bash scripts/setup.sh tinker), the server in `.venv`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
KEY = "tml-bench-key"


def client(args: argparse.Namespace) -> None:
    """The SDK loop (run by .venv-tinker's python): one JSON line per measured step count."""
    import numpy as np
    import tinker
    from tinker import types

    service = tinker.ServiceClient(base_url=args.url)
    tc = service.create_lora_training_client("posttrain/tiny", rank=args.rank, seed=0).result()
    prompt = [5, 17, 42, 99, 7, 13]

    def datum(tokens: list[int]) -> types.Datum:
        weights = [0.0] * (len(prompt) - 1) + [1.0] * (len(tokens) - len(prompt))
        return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                           loss_fn_inputs={"target_tokens": np.array(tokens[1:], dtype=np.int64),
                                           "weights": np.array(weights, dtype=np.float32)})

    data = [datum(prompt + [60 + i, 61 + i, 62 + i, 63 + i, 64 + i]) for i in range(4)]
    done = 0
    for steps in args.steps:
        for _ in range(steps - done):
            tc.forward_backward(data, "cross_entropy").result()
            tc.optim_step(types.AdamParams(learning_rate=args.lr)).result()
        done = steps
        sampler = tc.save_weights_and_get_sampling_client().result()
        params = types.SamplingParams(max_tokens=args.new, temperature=1.0, seed=1)
        res = sampler.sample(types.ModelInput.from_ints(prompt), num_samples=args.samples,
                             sampling_params=params).result()
        seqs = [(list(s.tokens), list(s.logprobs)) for s in res.sequences]
        out = tc.forward([datum(prompt + t) for t, _ in seqs], "cross_entropy").result()
        gaps, lows = [], []
        for (_, lp), o in zip(seqs, out.loss_fn_outputs):
            trainer = o["logprobs"].to_numpy()[len(prompt) - 1:]
            gaps += [abs(a - float(b)) for a, b in zip(lp, trainer)]
            lows += lp
        print(json.dumps({"steps": steps, "tokens": len(gaps), "gap_max": max(gaps),
                          "gap_mean": sum(gaps) / len(gaps), "logprob_min": min(lows)}), flush=True)
    service.close("success").result()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, nargs="+", default=[0, 12, 50, 150],
                        help="measure after each of these numbers of training steps (ascending)")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--new", type=int, default=32, help="new tokens per sample")
    parser.add_argument("--threads", type=int, default=1, help="the server's torch threads (OMP_NUM_THREADS)")
    parser.add_argument("--url", help="(internal) run the SDK loop against this server")
    args = parser.parse_args()
    if args.url:
        client(args)
        return
    env = dict(os.environ, POSTTRAIN_API_KEY=KEY, OMP_NUM_THREADS=str(args.threads))
    with tempfile.TemporaryDirectory() as root:
        server = subprocess.Popen([sys.executable, "-m", "posttrain", "tinker-serve", "--root", root, "--port", "0"],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO)
        try:
            url = next(line.split(" at ")[1].split()[0] for line in server.stdout
                       if line.startswith("posttrain tinker-serve:") and " at " in line)
            sdk_env = dict(os.environ, TINKER_API_KEY=KEY, TINKER_TELEMETRY="0", OMP_NUM_THREADS="1")
            sdk_env.pop("PYTHONPATH", None)
            print(f"tiny model, LoRA rank {args.rank}, lr {args.lr}, {args.samples} samples x {args.new} tokens, "
                  f"temperature 1, server threads {args.threads}", flush=True)
            subprocess.run([str(REPO / ".venv-tinker" / "bin" / "python"), __file__, "--url", url,
                            "--steps", *map(str, args.steps), "--lr", str(args.lr), "--rank", str(args.rank),
                            "--samples", str(args.samples), "--new", str(args.new)], env=sdk_env, check=True)
        finally:
            server.terminate()
            server.wait(30)


if __name__ == "__main__":
    main()
