"""`posttrain distill CONFIG.yaml [key=value ...]`: on-policy distillation from a frozen teacher.

The student samples completions; the teacher scores every token the student chose; the student
minimises the per-token reverse KL to the teacher (loss=full or loss=sampled), optionally plus a
verifier reward (reward_coef). Writes OUT_DIR/config.yaml, OUT_DIR/metrics.jsonl (one line per
step: distill/reverse_kl, distill/kl_pos/<positions>, distill/teacher_logp, reward/mean, entropy,
response_length/mean, mismatch/kl, tokens/total, time/<stage>_s, eval/heldout/greedy/pass@1 ...)
and checkpoints/step-N/. Re-running with the same out_dir resumes.

`posttrain distill --make-teacher DIR` builds the embedded teacher instead: the `small` tiny model
SFT'd on arithmetic traces, cached in DIR (a second call reuses it); it prints the checkpoint path.
"""

from __future__ import annotations

import argparse

from posttrain.config import add_recipe_arguments, load_recipe
from posttrain.rl.distill import DistillConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__
    parser.add_argument("--make-teacher", metavar="DIR", default=None,
                        help="build (or reuse) the embedded arithmetic teacher in DIR and exit")
    parser.add_argument("--teacher-steps", type=int, default=None,
                        help="SFT steps for --make-teacher (default: the study's full setting)")
    add_recipe_arguments(parser, DistillConfig,
                         "posttrain distill examples/distill_arith.yaml model.path=runs/sft/checkpoints/step-40")


def run(args: argparse.Namespace) -> int:
    if args.make_teacher:
        from posttrain.rl.teacher import make_teacher

        teacher = make_teacher(args.make_teacher, steps=args.teacher_steps)
        print(f"teacher: {teacher.checkpoint} (held-out greedy pass@1 {teacher.pass_at_1:.3f})")
        return 0
    from posttrain.rl.distill import run_distill

    cfg = load_recipe(DistillConfig, args)
    last = run_distill(cfg)
    evals = {k: round(v, 4) for k, v in last.items() if k.startswith("eval/")}
    print(f"distill done: reverse_kl={last.get('distill/reverse_kl', float('nan')):.4f} "
          f"tokens={last.get('tokens/total', 0)} {evals}")
    return 0
