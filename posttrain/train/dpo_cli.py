"""`posttrain dpo CONFIG.yaml [key=value ...]`: direct preference optimisation (DPO, cDPO, IPO).

Writes OUT_DIR/config.yaml, OUT_DIR/metrics.jsonl (step, loss, rewards/chosen, rewards/rejected,
rewards/margin, rewards/accuracy, logps/chosen, logps/rejected, grad_norm, lr, the same under
eval/ for held-out pairs, time/<stage>_s) and OUT_DIR/checkpoints/step-N/ (plain Hugging Face
causal LM folders, plus dcp/ and trainer_state.pt for resuming). Re-running with the same out_dir
resumes from the last checkpoint, at any number of processes. Many GPUs: torchrun --nproc-per-node N
-m posttrain dpo CONFIG.yaml (batch_pairs must divide by N).
"""

from __future__ import annotations

import argparse

from posttrain.config import add_recipe_arguments, load_recipe
from posttrain.train.dpo import DPOConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__
    add_recipe_arguments(parser, DPOConfig, "posttrain dpo examples/dpo_arith.yaml model.path=runs/sft-arith/checkpoints/step-300 beta=0.1")


def run(args: argparse.Namespace) -> int:
    from posttrain.core.dist import current_world
    from posttrain.train.dpo import run_dpo

    cfg = load_recipe(DPOConfig, args)
    summary = run_dpo(cfg)
    if not current_world().main:
        return 0
    keys = ("eval/rewards/accuracy", "eval/rewards/margin", "eval/loss")
    evals = " ".join(f"{k}={summary[k]:.4f}" for k in keys if k in summary)
    print(f"dpo done: loss={summary.get('loss', float('nan')):.4f} {evals}; checkpoint {summary.get('checkpoint')}")
    return 0
