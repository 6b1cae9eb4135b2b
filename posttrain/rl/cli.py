"""`posttrain rl CONFIG.yaml [key=value ...]`: RL with verifiable rewards (GRPO, Dr. GRPO, RLOO, REINFORCE++).

Writes OUT_DIR/config.yaml, OUT_DIR/metrics.jsonl (one line per step: reward/mean, kl/ref, entropy,
response_length/mean, groups/zero_variance_frac, mismatch/kl, mismatch/logprob_abs_diff_max,
outcomes/<class>_frac, time/<stage>_s, eval/heldout/greedy/pass@1 ...) and checkpoints/step-N/.
Re-running with the same out_dir resumes. ``mode=async max_staleness=K`` runs the rollout engine in its own
process, generating ahead of the trainer (docs/async.md).
"""

from __future__ import annotations

import argparse
import sys

from posttrain.config import add_recipe_arguments, load_recipe
from posttrain.rl.config import RLConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__
    add_recipe_arguments(parser, RLConfig,
                         "posttrain rl examples/grpo_arith.yaml model.path=runs/sft/checkpoints/step-300 num_steps=40")


def run(args: argparse.Namespace) -> int:
    from posttrain.rl.run import run_rl

    cfg = load_recipe(RLConfig, args)
    try:
        last = run_rl(cfg)
    except RuntimeError as e:  # async: a hung or dead engine, a refused weight sync, a failed self-test
        from posttrain.rollout.protocol import EngineError
        from posttrain.rl.async_.selftest import SelfTestError
        from posttrain.rollout.types import WeightSyncError

        if not isinstance(e, (EngineError, SelfTestError, WeightSyncError)):
            raise
        print(f"posttrain rl: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    evals = {k: round(v, 4) for k, v in last.items() if k.startswith("eval/")}
    print(f"rl done: reward/mean={last.get('reward/mean', float('nan')):.4f} {evals}")
    return 0
