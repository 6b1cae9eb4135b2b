"""`posttrain decontam TRAIN.jsonl --against BENCH [...] --out CLEAN.jsonl`: drop overlapping records.

See `posttrain.eval.decontam` for the n-gram test. Prints one summary line; with ``--report`` also
writes a JSON report listing every flagged record, the benchmark item and the shared n-gram.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from posttrain.errors import UserError
from posttrain.eval.decontam import BENCHMARK_FIELDS, decontaminate


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("train", help="training JSONL to clean")
    parser.add_argument("--against", nargs="+", required=True, metavar="BENCH",
                        help="benchmark JSONL files (.jsonl or .jsonl.gz) to test against")
    parser.add_argument("--out", required=True, help="where to write the clean JSONL")
    parser.add_argument("--n", type=int, default=13, help="n-gram size in words (default 13)")
    parser.add_argument("--min-words", type=int, default=8,
                        help="benchmark texts shorter than n but at least this many words are matched whole "
                             "(default 8); shorter ones are reported as unchecked")
    parser.add_argument("--fields", default=None,
                        help="comma-separated training fields to scan (default: every string in the record)")
    parser.add_argument("--bench-fields", default=None,
                        help="comma-separated benchmark fields to index, those present per item (default: "
                             "each published format's own text fields, detected per item (KodCode, MBPP, "
                             f"evalplus, LiveCodeBench), else {','.join(BENCHMARK_FIELDS)})")
    parser.add_argument("--report", default=None, help="write a JSON report of flagged records here")


def run(args: argparse.Namespace) -> int:
    if args.n < 1:
        raise UserError(f"command line: --n must be >= 1, got {args.n}")
    if not 1 <= args.min_words <= args.n:
        raise UserError(f"command line: --min-words must be in [1, --n={args.n}], got {args.min_words}")
    fields = _split(args.fields, "--fields") if args.fields is not None else None
    report = decontaminate(args.train, args.against, args.out, n=args.n, min_words=args.min_words,
                           fields=fields, bench_fields=_split(args.bench_fields, "--bench-fields")
                           if args.bench_fields is not None else None)
    if args.report:
        Path(args.report).parent.mkdir(parents=True, exist_ok=True)
        Path(args.report).write_text(json.dumps(report.to_json(), indent=1) + "\n")
    print(f"decontam: {report.records} records, {report.flagged} flagged, {report.kept} kept -> {args.out} "
          f"({report.benchmark_items} benchmark items, {report.benchmark_ngrams} distinct {args.n}-grams, "
          f"{report.unchecked_benchmark_items} too short to check)")
    for bench, dropped in report.by_benchmark.items():
        print(f"  dropped for {bench}: {dropped}")
    return 0


def _split(value: str, flag: str) -> list[str]:
    names = [v.strip() for v in value.split(",") if v.strip()]
    if not names:
        raise UserError(f"command line: {flag} names no fields")
    return names
