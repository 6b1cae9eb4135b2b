"""`posttrain eval CONFIG.yaml [key=value ...]`: pass@k of a model on benchmarks, resumable.

See `posttrain.eval.runner` for the configuration (`EvalConfig`) and what is written:
OUT/eval.json (per benchmark and decoding profile) and OUT/samples/*.jsonl (every judged sample).
Re-running the same command after an interruption skips the problems already done.
"""

from __future__ import annotations

import argparse

from posttrain.config import add_recipe_arguments, load_recipe
from posttrain.eval.runner import EvalConfig, run_eval
from posttrain.outcome import UNGRADED_MARK


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__
    add_recipe_arguments(parser, EvalConfig, "posttrain eval model=runs/rl out_dir=evals/after "
                                             "'benchmarks=[{kind: humaneval}]' 'profiles=[{name: greedy}]'")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    cfg = load_recipe(EvalConfig, args)
    results = run_eval(cfg, show_progress=not args.no_progress)
    for r in results:
        first = r.pass_at_k[0]
        extra = " ".join(f"pass@{row.k}={row.mean:.3f}" for row in r.pass_at_k[1:])
        print(f"{r.benchmark} {r.profile}: n={r.n} problems={r.num_problems} "
              f"pass@{first.k}={first.mean:.3f} [{first.low:.3f}, {first.high:.3f}] {extra}".rstrip())
        masked = r.outcomes.get("INFRA_FAIL", 0) + r.outcomes.get("TASK_FAIL", 0)
        if masked >= UNGRADED_MARK * sum(r.outcomes.values()):
            print(f"  MOSTLY UNGRADED: {masked} of {sum(r.outcomes.values())} samples were not graded "
                  f"(INFRA_FAIL {r.outcomes.get('INFRA_FAIL', 0)}, TASK_FAIL {r.outcomes.get('TASK_FAIL', 0)}; "
                  f"reasons in {cfg.out_dir}/samples/): pass@k counts them as failed")
    print(f"eval: {cfg.out_dir}/eval.json")
    return 0
