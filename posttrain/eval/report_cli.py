"""`posttrain report RUN_DIR [RUN_DIR ...] [--out report.html]`: one self-contained HTML page.

See `posttrain.eval.report` for what is drawn. Several run directories are compared on the same
charts; sub-runs (a demo's ``sft/`` and ``rl/``) are found by themselves.
"""

from __future__ import annotations

import argparse

from posttrain.eval.report import write_report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directories (nested runs are found)")
    parser.add_argument("--out", default=None,
                        help="where to write the HTML (default: RUN_DIR/report.html for one run, ./report.html for several)")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    out = args.out or (str(Path(args.runs[0]) / "report.html") if len(args.runs) == 1 else "report.html")
    path = write_report(args.runs, out)
    print(f"report: {path}")
    return 0
