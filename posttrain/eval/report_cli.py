"""`posttrain report RUN_DIR [RUN_DIR ...] [--out report.html]`: one self-contained HTML page.

See `posttrain.eval.report` for what is drawn. Several run directories are compared on the same
charts; sub-runs (a demo's ``sft/`` and ``rl/``) are found by themselves. Runs evaluated on the
seed's code benchmarks also get their table as Markdown (`posttrain.eval.seed_table`), printed and
written next to the page.
"""

from __future__ import annotations

import argparse

from posttrain.eval.report import write_report_files


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directories (nested runs are found)")
    parser.add_argument("--out", default=None,
                        help="where to write the HTML (default: the first RUN_DIR's report.html)")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    # next to the runs it draws, not into whatever folder the command was typed in
    out = args.out or str(Path(args.runs[0]) / "report.html")
    path, table = write_report_files(args.runs, out)
    print(f"report: {path}")
    if table is not None:
        print(f"table: {table}\n\n{table.read_text()}", end="")
    return 0
