"""`posttrain rm CONFIG.yaml [key=value ...]`: a reward model on preference pairs (Bradley–Terry).

Writes OUT_DIR/config.yaml, OUT_DIR/metrics.jsonl (step, loss, accuracy, margin, chosen_mean,
rejected_mean, grad_norm, lr, eval/accuracy, eval/loss, eval/margin, time/<stage>_s) and
OUT_DIR/checkpoints/step-N/, loadable with AutoModelForSequenceClassification.from_pretrained
(plus dcp/ and trainer_state.pt for resuming). Re-running with the same out_dir resumes from the
last checkpoint, at any number of processes. Many GPUs: torchrun --nproc-per-node N -m posttrain rm
CONFIG.yaml (batch_pairs must divide by N).
"""

from __future__ import annotations

import argparse

from posttrain.config import add_recipe_arguments, load_recipe
from posttrain.train.rm import RMConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__
    add_recipe_arguments(parser, RMConfig, "posttrain rm examples/rm_arith.yaml model.path=runs/tiny-model num_steps=100")


def run(args: argparse.Namespace) -> int:
    from posttrain.core.dist import current_world
    from posttrain.train.rm import run_rm

    cfg = load_recipe(RMConfig, args)
    summary = run_rm(cfg)
    if not current_world().main:
        return 0
    evals = " ".join(f"{k}={summary[k]:.4f}" for k in ("eval/accuracy", "eval/margin") if k in summary)
    print(f"rm done: loss={summary.get('loss', float('nan')):.4f} {evals}; checkpoint {summary.get('checkpoint')}")
    return 0
