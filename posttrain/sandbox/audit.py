"""Audit a code dataset: does each task's reference pass here, and do trivial wrong answers fail?

For every record the reference solution (``reference``, else ``program``) is run twice and must
PASS both times; three trivially wrong programs must not pass:

- function-call tasks: the prelude with the entry point's body replaced by ``pass``, by
  ``return None`` and by ``raise NotImplementedError``;
- pytest tasks: the names the tests import from the program, each a function with those bodies;
- stdin/stdout tasks: a program that prints nothing, one that prints an empty line, and one that
  exits with status 1.

Flags: ``false_negative`` (the reference does not pass: the task is broken here, TASK_FAIL),
``false_positive`` (a trivial answer passes: the tests have a hole), ``flaky`` (the two reference
runs disagree), ``task_fail`` (broken as published: ``task_error``), ``no_reference`` (the format
ships none, as LiveCodeBench: only the trivial answers run). Records without flags, or with only
``no_reference``, go to the cleaned dataset.
"""

from __future__ import annotations

import collections
import dataclasses
import json
from pathlib import Path

from posttrain.data.formats import imported_from
from posttrain.sandbox.pool import Job, SandboxPool
from posttrain.sandbox.records import to_job

TRIVIAL_BODIES = {"pass": "pass", "return_none": "return None", "raise": "raise NotImplementedError"}
TRIVIAL_IO = {"print_nothing": "pass", "print_blank": "print()", "exit_1": "raise SystemExit(1)"}


def trivial_jobs(job: Job) -> dict[str, Job]:
    """The trivially wrong programs for one task."""
    if job.io:
        return {name: dataclasses.replace(job, program=src) for name, src in TRIVIAL_IO.items()}
    if job.module:
        names = imported_from(job.tests, job.module)
        out = {"empty": dataclasses.replace(job, program="")}
        for name, body in TRIVIAL_BODIES.items():
            program = "".join(f"def {n}(*args, **kwargs):\n    {body}\n" for n in names)
            out[name] = dataclasses.replace(job, program=program)
        return out
    out = {}
    for name, body in TRIVIAL_BODIES.items():
        program = f"{job.prelude}\n\ndef {job.entry_point}(*args, **kwargs):\n    {body}\n"
        out[name] = Job(program, job.entry_point, job.tests, job.prelude, timeout_s=job.timeout_s)
    return out




def audit(records: list[dict], pool: SandboxPool, source: str, timeout_s: float | None = None) -> list[dict]:
    """One verdict row per record: id, flags, and the outcome of each run."""
    plan = []  # (record index, label, job)
    for i, rec in enumerate(records):
        where = rec.get("_where") or f"{source}:{rec.get('_line', i + 1)}"
        if rec.get("task_error"):
            continue
        key = "reference" if "reference" in rec else "program"
        ref = to_job(rec if key in rec else {**rec, key: ""}, where, program_key=key, timeout_s=timeout_s)
        if key in rec:
            plan += [(i, "reference_1", ref), (i, "reference_2", ref)]
        plan += [(i, name, job) for name, job in trivial_jobs(ref).items()]
    outcomes = pool.run([job for _, _, job in plan])
    rows = [{"id": rec.get("id", i), "flags": [], "runs": {}} for i, rec in enumerate(records)]
    for (i, label, _), outcome in zip(plan, outcomes):
        rows[i]["runs"][label] = f"{outcome.cls.value}/{outcome.reason}".rstrip("/")
    for rec, row in zip(records, rows):
        runs = row["runs"]
        if rec.get("task_error"):
            row["flags"].append("task_fail")
            row["runs"]["task_error"] = str(rec["task_error"])
            continue
        if "reference_1" not in runs:
            row["flags"].append("no_reference")
        elif runs["reference_1"] != "PASS" or runs["reference_2"] != "PASS":
            row["flags"].append("false_negative")
        if "reference_1" in runs and runs["reference_1"] != runs["reference_2"]:
            row["flags"].append("flaky")
        if any(v == "PASS" for k, v in runs.items() if not k.startswith("reference")):
            row["flags"].append("false_positive")
        if any(v.startswith("INFRA_FAIL") for v in runs.values()):
            row["flags"].append("infra_fail")
    return rows


def write_audit(records: list[dict], rows: list[dict], out_dir: Path) -> dict:
    """Write ``clean.jsonl`` (unflagged records), ``audit.jsonl`` (one row per record) and
    ``summary.json``; return the summary."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / "clean.jsonl", "w") as f:
        for rec, row in zip(records, rows):
            if set(row["flags"]) <= {"no_reference"}:
                f.write(json.dumps({k: v for k, v in rec.items() if k not in ("_line", "_where")}) + "\n")
    with open(out_dir / "audit.jsonl", "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    flags = collections.Counter(flag for row in rows for flag in row["flags"])
    summary = {"records": len(rows), "clean": sum(set(r["flags"]) <= {"no_reference"} for r in rows),
               "flags": dict(flags),
               "flagged_ids": {flag: [r["id"] for r in rows if flag in r["flags"]] for flag in flags}}
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
