"""HumanEval+ and MBPP+ as published, judged in the sandbox, against evalplus' own verdicts.

Prints one JSON object: per benchmark (HumanEval, HumanEval+, MBPP, MBPP+) how many canonical
solutions pass, how many trivial programs pass (the audit's three per task), and how many of the
six models' verdicts that evalplus wrote (``tests/data/realbench/evalplus_results``) agree with
ours, with every disagreement listed (task, model, evalplus' verdict, ours and its detail).

A "+" verdict passes when the program passes base and plus inputs (evalplus' ``base_status`` and
``plus_status`` both "pass"); programs that fail the base inputs are not run on the plus ones.

    .venv/bin/python bench/evalplus_agreement.py [--only humaneval|mbpp] [--workers 2]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from posttrain.data.records import load_tasks
from posttrain.sandbox.audit import trivial_jobs
from posttrain.sandbox.pool import SandboxPool
from posttrain.sandbox.records import to_job
from posttrain.sandbox.worker import SandboxConfig

DATA = Path(__file__).parents[1] / "tests" / "data" / "realbench"
FILES = {"humaneval": ("HumanEvalPlus.jsonl.gz", "HumanEval"), "mbpp": ("MbppPlus.jsonl.gz", "MBPP")}


def judged(pool, jobs: list, step: int = 64) -> list[str]:
    out = []
    for k in range(0, len(jobs), step):
        out += [f"{o.cls.value}/{o.reason}".rstrip("/") + (f" {o.detail[:160]}" if o.cls.value != "PASS" else "")
                for o in pool.run(jobs[k:k + step])]
        print(f"{time.strftime('%H:%M:%S')} {len(out)}/{len(jobs)} judged", file=sys.stderr, flush=True)
    return out


def canonical_and_trivial(pool, tasks: dict) -> dict:
    out = {}
    for variant, by_id in tasks.items():
        refs = judged(pool, [to_job(t, t["id"], program_key="reference") for t in by_id.values()])
        trivial = [(t["id"], name, job) for t in by_id.values()
                   for name, job in trivial_jobs(to_job(t, t["id"], program_key="reference")).items()]
        passed = [(i, n) for (i, n, _), v in zip(trivial, judged(pool, [j for _, _, j in trivial])) if v == "PASS"]
        out[variant] = {"canonical_pass": sum(v == "PASS" for v in refs), "tasks": len(refs),
                        "canonical_fail": {i: v for i, v in zip(by_id, refs) if v != "PASS"},
                        "trivial_pass": passed}
    return out


def models(pool, tasks: dict, dataset: str) -> dict:
    rows = []  # (model, task id, evalplus base pass, evalplus plus pass, solution)
    for path in sorted((DATA / "evalplus_results" / dataset).glob("*.json")):
        model = path.name.split("_vllm")[0]
        for tid, results in json.loads(path.read_text())["eval"].items():
            if tid not in tasks["base"]:
                continue
            r = results[0]
            rows.append((model, tid, r["base_status"] == "pass",
                         r["base_status"] == "pass" and r["plus_status"] == "pass", r["solution"]))
    rows.sort(key=lambda row: row[1])  # one task's programs together: its ground truth is computed once per judge
    base = judged(pool, [to_job({**tasks["base"][tid], "program": sol}, tid) for _, tid, _, _, sol in rows])
    again = [k for k, v in enumerate(base) if v == "PASS"]
    plus_run = judged(pool, [to_job({**tasks["plus"][rows[k][1]], "program": rows[k][4]}, rows[k][1]) for k in again])
    plus = ["MODEL_FAIL/base inputs failed"] * len(rows)
    for k, v in zip(again, plus_run):
        plus[k] = v
    out = {}
    for name, col, ours in (("base", 2, base), ("plus", 3, plus)):
        differ = [{"task": row[1], "model": row[0], "evalplus": "pass" if row[col] else "fail", "ours": v}
                  for row, v in zip(rows, ours) if row[col] != (v == "PASS")]
        out[name] = {"verdicts": len(rows), "agree": len(rows) - len(differ),
                     "agreement": round(1 - len(differ) / len(rows), 4), "disagreements": differ}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", choices=sorted(FILES), default=None)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--tasks", default="", help="comma-separated task ids: judge only these (a re-check)")
    args = ap.parse_args()
    report = {}
    with SandboxPool(SandboxConfig(workers=args.workers)) as pool:
        for dataset, (name, label) in FILES.items():
            if args.only and dataset != args.only:
                continue
            start = time.time()
            keep = set(args.tasks.split(",")) if args.tasks else None
            tasks = {v: {t["id"]: t for _, t in load_tasks(DATA / name, "evalplus", variant=v)
                         if keep is None or t["id"] in keep} for v in ("base", "plus")}
            if not tasks["base"]:
                continue
            canon = canonical_and_trivial(pool, tasks)
            verdicts = models(pool, tasks, dataset)
            for variant, bench in (("base", label), ("plus", label + "+")):
                report[bench] = {**canon[variant], **verdicts[variant]}
            report[label + "_seconds"] = round(time.time() - start, 1)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
