"""Colocated generation: rollout tokens/s of a GRPO run at 2 ranks vs 1 process, side by side.

The same recipe runs as one process pinned to one core (``taskset -c 0``, one torch thread) and
under ``torchrun --nproc-per-node 2`` pinned to two cores (one thread a rank), where each rank
generates its own half of every step's groups with its own engine (``rollout.colocate``, the
default) and the ranks then share the step. Generation speed is each run's model tokens divided
by its ``time/rollout_s`` (the whole rollout phase: sampling, judging and sharing the groups),
summed over the steps after the first (warm-up). Also printed: the same at 2 ranks with
``rollout.colocate=false`` (rank 0 generates alone, as before colocation), and whether the
2-rank runs took the same samples as the one process (they must: per-prompt seeds), and the
machine's ceiling: two one-process runs at once, a core each (independent decoders, nothing
shared), which no 2-rank layout can beat.

    .venv/bin/python bench/topology_scaling.py                  # tiny model, 6 steps x 8 prompts x G=8
    .venv/bin/python bench/topology_scaling.py --size small --new 96
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path


def run(label: str, cmd: list[str], out: Path) -> dict:
    return run_side_by_side(label, [cmd], [out])


def run_side_by_side(label: str, cmds: list[list[str]], outs: list[Path]) -> dict:
    """Run ``cmds`` at the same time; their generation speeds add up (each from its own run)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    logs = [tempfile.TemporaryFile("w+") for _ in cmds]  # not pipes: a full pipe would stall a run
    procs = [subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, text=True, env=env)
             for cmd, log in zip(cmds, logs)]
    for p, log in zip(procs, logs):
        if p.wait() != 0:
            log.seek(0)
            raise SystemExit(f"{label} failed:\n{log.read()[-3000:]}")
    each = [speed(label, out) for out in outs]
    return {**each[0], "tok_s": sum(e["tok_s"] for e in each)}


def speed(label: str, out: Path) -> dict:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [m for m in rows if m.get("step", 0) > 1]  # step 1 warms up
    tokens = sum(m["tokens/generated"] for m in rows)
    seconds = sum(m["time/rollout_s"] for m in rows)
    return {"label": label, "tokens": tokens, "seconds": seconds, "tok_s": tokens / seconds,
            "rewards": [m["reward/mean"] for m in rows]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="tiny")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--new", type=int, default=64)
    args = ap.parse_args()

    from posttrain.models.tiny import build_tiny
    from posttrain.tasks.arithmetic import write_arithmetic

    root = Path(tempfile.mkdtemp(prefix="topology-"))
    model = build_tiny(root / "model", args.size, seed=0)
    data = write_arithmetic(root / "data", n_train=400, n_eval=8, seed=0, digits=2, ops="+", fmt="trace")
    common = [f"model.path={model}", f"data.path={data['prompts_train']}", "data.eval_path=",
              f"num_steps={args.steps}", f"prompts_per_step={args.prompts}", f"rollout.group_size={args.group}",
              f"rollout.max_new_tokens={args.new}", "eval_every=0", "save_every=0", "logging.progress=false",
              "kl.track=false"]
    py = sys.executable
    results = [
        run("1 process, 1 core", ["taskset", "-c", "0", py, "-m", "posttrain", "rl", *common,
                                  f"out_dir={root / 'one'}"], root / "one"),
        run("2 ranks, 2 cores, colocated", ["taskset", "-c", "0,1", py, "-m", "torch.distributed.run", "--standalone",
                                            "--nproc-per-node=2", "-m", "posttrain", "rl", *common,
                                            f"out_dir={root / 'two'}"], root / "two"),
        run("2 ranks, 2 cores, rank 0 generates", ["taskset", "-c", "0,1", py, "-m", "torch.distributed.run",
                                                   "--standalone", "--nproc-per-node=2", "-m", "posttrain", "rl",
                                                   *common, "rollout.colocate=false", f"out_dir={root / 'rank0'}"],
            root / "rank0"),
    ]
    # The machine's own ceiling for two decoders: the one-process run twice at once, one a core.
    # Two ranks colocated cannot beat it; on a VM whose two vCPUs share caches, memory bandwidth
    # or a physical core it is well under 2x.
    ceiling = run_side_by_side("ceiling: 2 x 1 process, a core each", [
        ["taskset", "-c", str(core), py, "-m", "posttrain", "rl", *common, f"out_dir={root / f'alone{core}'}"]
        for core in (0, 1)], [root / "alone0", root / "alone1"])
    results.append(ceiling)
    base = results[0]["tok_s"]
    print(f"\nrollout tokens/s, steps 2-{args.steps}, {args.size} model, {args.prompts} prompts x G={args.group}, "
          f"up to {args.new} new tokens")
    for r in results:
        same = (r["rewards"], r["tokens"]) == (results[0]["rewards"], results[0]["tokens"])
        same = "same tokens and rewards as 1 process" if same else "DIFFERENT samples"
        print(f"  {r['label']:<36} {r['tok_s']:8.0f} tok/s  {r['tok_s'] / base:5.2f}x   ({same})")
    print(f"  2 ranks colocated reach {results[1]['tok_s'] / ceiling['tok_s']:.0%} of this machine's two-core "
          f"ceiling ({ceiling['tok_s'] / base:.2f}x)")


if __name__ == "__main__":
    main()
