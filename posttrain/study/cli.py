"""`posttrain study compare`: SFT vs RLVR (GRPO) vs on-policy distillation from one weak student.

Builds (or reuses) the embedded teacher and a weak SFT student in OUT, runs the three arms on the
same budget of trajectory tokens, evaluates each on the held-out split (greedy pass@1, sampled
pass@k), prints a table and writes OUT/summary.json, OUT/study.md and OUT/report.html (learning
curves of all arms on one chart). Re-running in the same OUT reuses finished parts.
"""

from __future__ import annotations

import argparse

STUDIES = ("compare",)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from posttrain.study.compare import ARMS, PROFILES

    parser.description = __doc__
    parser.add_argument("study", choices=STUDIES, help="which study (compare: SFT vs GRPO vs distillation)")
    parser.add_argument("--profile", choices=list(PROFILES), default="full",
                        help="full (~12 minutes on 2 cores with the teacher build, ~5 once it is cached) or smoke (CI)")
    parser.add_argument("--out", default="runs/study-compare", help="study directory (default runs/study-compare)")
    parser.add_argument("--seed", type=int, default=0, help="seed of data, models, sampling and batch order")
    parser.add_argument("--teacher-steps", type=int, default=None,
                        help="SFT steps of the teacher (default: the profile's); the teacher is rebuilt, or its "
                             "SFT resumed, when this changes")
    parser.add_argument("--arms", default=",".join(ARMS), type=arm_list,
                        help=f"comma-separated arms to run (default {','.join(ARMS)}); the teacher is built only "
                             "for sft and distill")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def arm_list(text: str) -> tuple[str, ...]:
    from posttrain.study.compare import ARMS

    arms = tuple(a.strip() for a in text.split(",") if a.strip())
    unknown = [a for a in arms if a not in ARMS]
    if unknown or not arms:
        raise argparse.ArgumentTypeError(f"unknown arm(s) {unknown or text!r}; choose from {', '.join(ARMS)}")
    return arms


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from posttrain.study.compare import budget_note, format_table, run_compare

    summary = run_compare(args.out, args.profile, seed=args.seed, progress=not args.no_progress,
                          teacher_steps=args.teacher_steps, arms=args.arms)
    table = format_table(summary)
    note = budget_note(summary)
    Path(args.out, "study.md").write_text(f"{table}\n\n{note}\n")
    print(table)
    print(note)
    print(f"report: {Path(args.out) / 'report.html'}")
    return 0
