"""The code demo's RL settings chosen on the training split: a small sweep of RL settings (and SFT length).

Builds the demo's model, data, mid-training and SFT starts once (`posttrain.demo.code`, full profile
sizes; a stage already in ``--out`` is reused), then runs each arm's RL recipe at every sweep point,
one run after another, and prints one row per (arm, SFT steps, point): the training pass fraction
(``outcomes/PASS_frac``, the format bonus left out) and reward over the first and last ``--window``
steps, and over the last steps the zero-variance fraction, KL to the start, entropy and gradient norm; with ``--check N``,
the start's and the end's sampled pass rate on a fixed draw of N training problems (8 samples each
at T = 1, paired by problem: far less noisy than the per-step figures). Only the training split's reward is read: never a benchmark.

A point is a set of RL overrides, ``NAME=KEY=VALUE,KEY=VALUE`` (the demo's own settings otherwise,
a full fine-tune among them):

    python bench/seed_mini_sweep.py --out runs/seed-sweep --sft-steps 300 600 \\
        --points "lora3e-4=optim.lr=3e-4,model.lora.enabled=true" "full3e-5=optim.lr=3e-5"

``--rl-steps`` and ``--lrs`` (one point per rate) keep the older form working.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from posttrain.demo import code as demo
from posttrain.demo.code_check import describe, train_pass, train_sample
from posttrain.eval.seed_table import cell

FIRST_LAST = ("outcomes/PASS_frac", "reward/mean")
LAST = ("groups/zero_variance_frac", "kl/ref", "entropy", "grad_norm")


def read_metrics(metrics: Path) -> list[dict]:
    return [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]


def window(steps: list[dict], key: str, width: int) -> tuple[float, float]:
    """Mean of ``key`` over the first and the last ``width`` steps that report it."""
    values = [row[key] for row in steps if key in row]
    if not values:
        return float("nan"), float("nan")
    return sum(values[:width]) / len(values[:width]), sum(values[-width:]) / len(values[-width:])


def find_key(steps: list[dict], name: str) -> str:
    """The metric logged under ``name`` or, for the optimizer's figures, the first key ending in it."""
    keys = {k for row in steps for k in row}
    return name if name in keys else next((k for k in sorted(keys) if k.endswith(name)), name)


def row(arm: str, sft_steps: int, point: str, metrics: Path, width: int) -> str:
    steps = read_metrics(metrics)
    cells = []
    for key in FIRST_LAST:
        first, last = window(steps, key, width)
        cells.append(f"{first:.3f} → {last:.3f}")
    cells += [f"{window(steps, find_key(steps, key), width)[1]:.3g}" for key in LAST]
    return f"| {arm} | {sft_steps} | {point} | " + " | ".join(cells) + " |"


def parse_points(args) -> list[tuple[str, list[str]]]:
    points = [(f"lr={lr:g}", [f"optim.lr={lr:g}"]) for lr in args.lrs or []]
    for text in args.points or []:
        name, _, settings = text.partition("=")
        points.append((name, [s for s in settings.split(",") if s]))
    return points or [("default", [])]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--lrs", type=float, nargs="+")
    ap.add_argument("--points", nargs="+", help="NAME=KEY=VALUE,KEY=VALUE: one RL run per point")
    ap.add_argument("--sft-steps", type=int, nargs="+", default=[demo.PROFILES["full"]["sft_steps"]])
    ap.add_argument("--rl-steps", type=int, default=demo.PROFILES["full"]["rl_steps"])
    ap.add_argument("--arms", nargs="+", default=list(demo.RECIPES), choices=list(demo.RECIPES))
    ap.add_argument("--window", type=int, default=4, help="steps averaged at each end (default 4)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--check", type=int, default=0,
                    help="also measure start and end on this many training problems x 8 samples at T = 1 (paired)")
    args = ap.parse_args(argv)
    args.no_progress = True
    out = Path(args.out)
    p = demo.PROFILES["full"] | {"progress": False, "rl_steps": args.rl_steps}
    paths = demo.prepare(out, p, args.seed)
    base = demo.stage_midtrain(out, p, paths, args)
    check = " train pass@1 start → end (Δ [95% CI]) |" if args.check else ""
    lines = ["| arm | SFT steps | point | pass frac first → last | reward first → last | zero-variance | KL | "
             "entropy | grad norm |" + check, "|---" * (9 + bool(check)) + "|"]
    problems = train_sample(paths["train_kodcode"], out / "data", args.check, args.seed) if args.check else None
    for sft_steps in args.sft_steps:
        for arm in args.arms:
            start = demo.stage_sft(out / f"sft{sft_steps}", p | {"sft_steps": sft_steps}, paths, base, arm, args)
            for name, overrides in parse_points(args):
                run_dir = out / f"sft{sft_steps}" / name
                demo.stage_rl(run_dir, p | {"rl_overrides": overrides}, paths, start, arm, args)
                line = row(arm, sft_steps, name, run_dir / arm / "metrics.jsonl", args.window)
                if problems is not None:
                    tokens = p["reasoning_tokens" if arm == "reasoning" else "direct_tokens"]
                    before = train_pass(start, problems, out / f"sft{sft_steps}" / f"check-{arm}", arm, tokens, args.seed)
                    after = train_pass(str(run_dir / arm), problems, run_dir / f"check-{arm}", arm, tokens, args.seed)
                    line += f" {describe(cell(before, after))} |"
                lines.append(line)
                print(lines[-1], flush=True)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
