"""Programs per second: pytest-style verdicts against our function-call verdicts, on the same programs.

HumanEval's 164 canonical programs are judged two ways in one pool, round by round alternating
so host noise hits both alike:

- **call**: today's function-call form: the judge runs the task's ``check(candidate)`` with the
  program behind the typed proxy;
- **pytest**: the same ``check`` wrapped in a pytest module (``from solution import ENTRY`` then
  ``def test_check(): check(ENTRY)``), run by the real pytest in the judge with the program
  behind `pytest_judge`'s proxy (KodCode's form).

Both see the same program and the same asserts, so the gap is what pytest costs per task
(collection, its hooks, the test module written to the judge's tmpfs) and the proxy's round
trips. A third line, **kodcode**, judges the KodCode fixture's references (several tests each,
fixtures, classes, tmp_path) in pytest form, for a task of the shape pytest is used for.

``--baseline-judge FILE`` adds a second pool whose judges run another ``pytest_judge.py`` (an
earlier commit's, from ``git show COMMIT:posttrain/sandbox/pytest_judge.py``) on the same pytest
jobs, its rounds interleaved with the others: a before/after of the judge under the same load.

    .venv/bin/python bench/pytest_vs_call.py [--rounds 5] [--workers N] [--baseline-judge FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def call_jobs():
    from posttrain.sandbox.pool import Job
    from posttrain.sandbox.records import humaneval_records

    return [Job(r["reference"], r["entry_point"], r["tests"], r["prelude"]) for r in humaneval_records()]


def pytest_jobs():
    from posttrain.sandbox.pool import Job
    from posttrain.sandbox.records import humaneval_records

    out = []
    for r in humaneval_records():
        module = (f"{r['prelude']}\nfrom solution import {r['entry_point']}\n{r['tests']}\n\n"
                  f"def test_check():\n    check({r['entry_point']})\n")
        out.append(Job(r["reference"], tests=module, module="solution"))
    return out


def kodcode_jobs():
    from posttrain.data.records import load_tasks
    from posttrain.sandbox.pool import Job

    tasks = [t for _, t in load_tasks(str(ROOT / "tests" / "data" / "formats" / "kodcode.jsonl"))]
    return [Job(t["reference"], tests=t["tests"], module="solution") for t in tasks] * 8


def rate(pool, jobs) -> tuple[float, int]:
    t = time.perf_counter()
    outcomes = pool.run(jobs)
    return len(jobs) / (time.perf_counter() - t), sum(o.cls.value == "PASS" for o in outcomes)


def started_pool(stack: contextlib.ExitStack, workers: int, judge: str | None = None):
    """A started pool, closed with ``stack``; ``judge``: the ``pytest_judge.py`` its judges run
    (default: this tree's)."""
    from posttrain.sandbox import worker
    from posttrain.sandbox.pool import SandboxPool

    # The binds are read when a worker starts: the workers started here keep ``judge`` (a worker
    # restarted later, after `recycle_after` tasks or a crash, would get this tree's judge).
    ours = worker.PYTEST_JUDGE_PATH
    worker.PYTEST_JUDGE_PATH = Path(judge).resolve() if judge else ours
    worker.judge_lib_binds.cache_clear()
    try:
        pool = stack.enter_context(SandboxPool(worker.SandboxConfig(workers=workers)))
        rate(pool, pytest_jobs()[: pool.cfg.n_workers * 4])  # start the workers, import pytest in each judge
    finally:
        worker.PYTEST_JUDGE_PATH = ours
        worker.judge_lib_binds.cache_clear()
    return pool


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--workers", type=int, default=0, help="sandboxes (default: one per core)")
    ap.add_argument("--baseline-judge", default=None, help="another pytest_judge.py, run on the pytest jobs")
    args = ap.parse_args()
    if args.baseline_judge and not os.path.isfile(args.baseline_judge):
        raise SystemExit(f"--baseline-judge: {args.baseline_judge}: no such file")

    sides = {"call": call_jobs(), "pytest": pytest_jobs(), "kodcode": kodcode_jobs()}
    rates: dict[str, list[float]] = {k: [] for k in sides}
    passed: dict[str, int] = {}
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    with contextlib.ExitStack() as stack:
        pool = started_pool(stack, args.workers)
        baseline = args.baseline_judge and started_pool(stack, args.workers, args.baseline_judge)
        if baseline:
            rates["pytest_baseline_judge"] = []
        for _ in range(args.rounds):
            for name, jobs in sides.items():
                r, passed[name] = rate(pool, jobs)
                rates[name].append(r)
            if baseline:
                r, passed["pytest_baseline_judge"] = rate(baseline, sides["pytest"])
                rates["pytest_baseline_judge"].append(r)
        workers = pool.cfg.n_workers
    sides["pytest_baseline_judge"] = sides["pytest"]
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    summary = {name: {"programs": len(sides[name]), "passed": passed[name],
                      "programs_per_s_median": round(statistics.median(v), 1),
                      "ms_per_program": round(1000 * workers / statistics.median(v), 1),
                      "rounds": [round(x, 1) for x in v]} for name, v in rates.items()}
    summary["pytest_over_call"] = round(summary["call"]["programs_per_s_median"]
                                        / summary["pytest"]["programs_per_s_median"], 2)
    if baseline:
        summary["baseline_judge_over_call"] = round(summary["call"]["programs_per_s_median"]
                                                    / summary["pytest_baseline_judge"]["programs_per_s_median"], 2)
    print(json.dumps({"workers": workers, **summary}, indent=2))


if __name__ == "__main__":
    main()
