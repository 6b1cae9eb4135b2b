"""`posttrain sft CONFIG.yaml [key=value ...]`: supervised fine-tuning or mid-training (data.mode=raw).

Writes OUT_DIR/config.yaml (resolved), OUT_DIR/metrics.jsonl (step, loss, lr, tokens_per_s,
time/step_s, eval/loss) and OUT_DIR/checkpoints/step-N/ (plain Hugging Face folders).
Re-running with the same out_dir resumes from the last checkpoint.
"""

from __future__ import annotations

import argparse

from posttrain.config import add_recipe_arguments, load_recipe
from posttrain.train.sft import SFTConfig, run_sft


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__
    add_recipe_arguments(parser, SFTConfig,
                         "posttrain sft examples/sft_arith.yaml model.path=/tmp/m optim.lr=1e-3 num_steps=300")


def run(args: argparse.Namespace) -> int:
    cfg = load_recipe(SFTConfig, args)
    summary = run_sft(cfg)
    if "finished_before" in summary:
        print(f"sft: {cfg.out_dir} already ran its {summary['finished_before']} steps, nothing to train "
              f"(raise num_steps to go on); checkpoint {summary['checkpoint']}")
        return 0
    parts = [f"{k}={v:.4f}" for k, v in summary.items() if isinstance(v, float)]
    print(f"sft done: {' '.join(parts)}; checkpoint {summary.get('checkpoint')}")
    return 0
