"""`posttrain sweep CONFIG [key=value ...] --grid key=v1,v2 [--grid ...] [--seeds N] [--out DIR] [--command rl]`.

Runs the grid of any training command (sft, dpo, rm, rl, distill) one run after another, each in
its own directory OUT/runs/<settings>/seed-<s>, then writes OUT/sweep.md (a table of the final and
best held-out metrics per setting, mean ± 95% interval across seeds), OUT/sweep.json and
OUT/sweep.png. Every point's config is checked first: a bad key or value exits 2 before anything
runs. Re-running the same command skips finished runs and resumes an interrupted one.
"""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from posttrain.study.sweep import CONFIGS

    parser.description = __doc__
    parser.add_argument("config", nargs="?", help="YAML recipe of the command (optional)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="overrides shared by every run")
    parser.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2",
                        help="a config key and its values; several --grid flags make their product")
    parser.add_argument("--seeds", type=int, default=1, help="seeds 0..N-1 for every setting (default 1)")
    parser.add_argument("--out", default="runs/sweep", help="sweep directory (default runs/sweep)")
    parser.add_argument("--command", default="rl", choices=list(CONFIGS), help="training command (default rl)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.epilog = ("example:\n  posttrain sweep examples/grpo_arith.yaml num_steps=30 --grid optim.lr=1e-4,1e-3 "
                     "--grid rollout.group_size=8,16 --seeds 3 --out runs/sweep-lr")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from posttrain.study.sweep import format_table, parse_grid, run_sweep

    config, overrides = args.config, list(args.overrides)
    if config is not None and "=" in config and not Path(config).exists():
        config, overrides = None, [config, *overrides]
    out = Path(args.out)
    summary = run_sweep(args.command, config, overrides, parse_grid(args.grid), args.seeds, out,
                        progress=not args.no_progress)
    print(format_table(summary))
    print(f"report: {out / 'sweep.md'}, {out / 'sweep.png'}, {out / 'sweep.json'}")
    for line in summary["failed"]:
        print(f"failed: {line}")
    return 1 if summary["failed"] else 0
