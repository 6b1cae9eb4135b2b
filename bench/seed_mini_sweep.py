"""The code demo's RL settings chosen on the training split: a small sweep of RL learning rate (and SFT length).

Builds the demo's model, data, mid-training and SFT starts once (`posttrain.demo.code`, full profile
sizes), then runs each arm's RL recipe at every learning rate, one run after another, and prints one
row per (arm, sft steps, lr): the training pass fraction (``outcomes/PASS_frac``, the format bonus
left out) and reward over the first and last ``--window`` steps, the zero-variance fraction, KL to
the start and entropy at the last steps. Only the training split's reward is read: never a benchmark.

    python bench/seed_mini_sweep.py --out runs/seed-sweep --lrs 1e-3 3e-4 1e-4 --rl-steps 24 --sft-steps 150 300
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from posttrain.demo import code as demo

COLUMNS = ("outcomes/PASS_frac", "reward/mean", "groups/zero_variance_frac", "kl/ref", "entropy")


def window(metrics: Path, key: str, width: int) -> tuple[float, float]:
    """Mean of ``key`` over the first and the last ``width`` steps that report it."""
    values = [row[key] for row in map(json.loads, metrics.read_text().splitlines()) if key in row]
    if not values:
        return float("nan"), float("nan")
    return sum(values[:width]) / len(values[:width]), sum(values[-width:]) / len(values[-width:])


def row(arm: str, sft_steps: int, lr: float, metrics: Path, width: int) -> str:
    cells = []
    for key in COLUMNS:
        first, last = window(metrics, key, width)
        cells.append(f"{first:.3f} → {last:.3f}" if key in COLUMNS[:2] else f"{last:.3f}")
    return f"| {arm} | {sft_steps} | {lr:g} | " + " | ".join(cells) + " |"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--lrs", type=float, nargs="+", default=[1e-3, 3e-4, 1e-4])
    ap.add_argument("--sft-steps", type=int, nargs="+", default=[150])
    ap.add_argument("--rl-steps", type=int, default=24)
    ap.add_argument("--arms", nargs="+", default=list(demo.RECIPES), choices=list(demo.RECIPES))
    ap.add_argument("--window", type=int, default=4, help="steps averaged at each end (default 4)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    args.no_progress = True
    out = Path(args.out)
    p = demo.PROFILES["full"] | {"progress": False, "rl_steps": args.rl_steps}
    paths = demo.prepare(out, p, args.seed)
    base = demo.stage_midtrain(out, p, paths, args)
    lines = ["| arm | SFT steps | RL lr | pass frac first → last | reward first → last | zero-variance | KL | entropy |",
             "|---|---|---|---|---|---|---|---|"]
    for sft_steps in args.sft_steps:
        for arm in args.arms:
            start = demo.stage_sft(out / f"sft{sft_steps}", p | {"sft_steps": sft_steps}, paths, base, arm, args)
            for lr in args.lrs:
                run_dir = out / f"sft{sft_steps}" / f"lr{lr:g}"
                demo.stage_rl(run_dir, p | {"rl_lr": lr}, paths, start, arm, args)
                lines.append(row(arm, sft_steps, lr, run_dir / arm / "metrics.jsonl", args.window))
                print(lines[-1], flush=True)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
