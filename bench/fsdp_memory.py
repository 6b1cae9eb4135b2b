"""Per-rank training memory with FSDP2: parameters + gradients + AdamW state, 1 rank vs 2 ranks.

Side by side in one run: the script builds the embedded ``small`` model (9.8 M parameters) into a
temporary folder, then launches itself under ``torchrun`` at world size 1 and at world size 2 (gloo,
CPU, one thread a rank). Each rank loads the model, shards it with `posttrain.core.fsdp.shard_model`
(per decoder layer, then the root; nothing is wrapped at world size 1), builds AdamW with
`posttrain.core.optim.build_optimizer`, runs one forward/backward on random tokens and one optimizer
step, then sums the bytes it holds locally: its parameter shards, its gradient shards and its
optimizer state (``DTensor.to_local()`` for every sharded tensor). These are the tensors whose size
scales with the model; activations depend on the batch and are not counted.

Prints a table per world size and rank, and the ratio (world size 2) / (world size 1) per rank:
ideally 0.5; the goal is at most 0.55.

Run: ``.venv/bin/python bench/fsdp_memory.py`` (about half a minute on 2 CPU cores).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch

GOAL = 0.55


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _bytes(tensors) -> int:
    return sum(_local(t).numel() * _local(t).element_size() for t in tensors)


def measure(model_dir: str) -> None:
    """One rank under torchrun: print this rank's bytes as one JSON line."""
    import resource

    from posttrain.core.dist import init_world
    from posttrain.core.fsdp import shard_model
    from posttrain.core.optim import OptimConfig, build_optimizer
    from posttrain.models.hf import ModelConfig, load_model, quiet_transformers

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    quiet_transformers()
    world = init_world("cpu")
    torch.manual_seed(0)
    model = load_model(ModelConfig(path=model_dir))
    num_params = sum(p.numel() for p in model.parameters())
    model = shard_model(model, world)
    optimizer = build_optimizer(model.parameters(), OptimConfig())
    ids = torch.randint(0, model.config.vocab_size, (2, 64))
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    params = list(model.parameters())
    row = {
        "world_size": world.world_size, "rank": world.rank, "model_params": num_params,
        "params": _bytes(params),
        "grads": _bytes(p.grad for p in params if p.grad is not None),
        "optim": _bytes(v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)),
        "max_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }
    print("ROW " + json.dumps(row), flush=True)
    world.barrier()


def launch(nproc: int, model_dir: str) -> list[dict]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           __file__, "--measure", model_dir]
    r = subprocess.run(cmd, check=False, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if r.returncode != 0:
        sys.exit(f"torchrun --nproc-per-node={nproc} failed:\n{r.stderr[-4000:]}")
    rows = [json.loads(line[4:]) for line in r.stdout.splitlines() if line.startswith("ROW ")]
    return sorted(rows, key=lambda x: x["rank"])


def mib(n: int) -> str:
    return f"{n / 2**20:8.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="small", help="embedded model size (nano, tiny, small)")
    parser.add_argument("--measure", metavar="MODEL_DIR", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        from posttrain.core.dist import exit_rank

        measure(args.measure)
        exit_rank(0)  # a rank leaves as `python -m posttrain` leaves one

    from posttrain.models.hf import quiet_transformers
    from posttrain.models.tiny import build_tiny

    quiet_transformers()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(build_tiny(tmp, args.size, seed=0))
        runs = {n: launch(n, model_dir) for n in (1, 2)}
    print(f"model: {args.size}, {runs[1][0]['model_params'] / 1e6:.2f} M parameters (fp32), AdamW, CPU/gloo")
    print(f"{'world':>5} {'rank':>4} {'params MiB':>10} {'grads MiB':>10} {'AdamW MiB':>10} {'total MiB':>10}"
          f" {'max RSS MiB':>12}")
    for n, rows in runs.items():
        for x in rows:
            total = x["params"] + x["grads"] + x["optim"]
            print(f"{n:>5} {x['rank']:>4} {mib(x['params']):>10} {mib(x['grads']):>10} {mib(x['optim']):>10}"
                  f" {mib(total):>10} {mib(x['max_rss']):>12}")
    one = runs[1][0]
    base = one["params"] + one["grads"] + one["optim"]
    worst = 0.0
    for x in runs[2]:
        ratio = (x["params"] + x["grads"] + x["optim"]) / base
        worst = max(worst, ratio)
        print(f"rank {x['rank']}: world 2 / world 1 = {ratio:.3f}  (params+grads+AdamW)")
    print(f"max ratio {worst:.3f}: {'meets' if worst <= GOAL else 'misses'} the goal <= {GOAL}")
    print("max RSS is the whole process (torch, Python, activations, the unsharded load); it is not the ratio's input")


if __name__ == "__main__":
    main()
