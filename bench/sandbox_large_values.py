"""Large values through the sandbox: HumanEval+ tasks judged in the sandbox vs the same check run natively.

For each task (default HumanEval/130, whose plus inputs ask for lists of up to a million
floats) both sides run the same ``check(candidate)``: every base and plus input of the published
HumanEval+ file (tests/data/realbench/HumanEvalPlus.jsonl.gz), the canonical solution as the
reference computing the expected output, compared with ``==`` as evalplus does. Natively the
program is a function in this process; in the sandbox it runs in its own process and every
return value crosses the boundary (`posttrain.sandbox.inside.wire`). Rounds alternate the two
sides so host noise hits both alike; the ratio is sandbox time over native time.

``--verdict evalplus`` runs, on both sides, the project's own evalplus verdict instead
(`posttrain.data.formats.evalplus`: expected outputs from the reference while the tests load,
per-input time limits, evalplus' comparison), the canonical solution as the program: what
``posttrain eval`` and ``posttrain sandbox check`` pay per task.

    .venv/bin/python bench/sandbox_large_values.py [--tasks HumanEval/130 ...] [--rounds 3] [--verdict same|evalplus]
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import time
from pathlib import Path

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "realbench" / "HumanEvalPlus.jsonl.gz"
CHECK = """
def check(candidate):
    for args in _INPUTS:
        assert candidate(*args) == _reference(*args), args
"""


def task_job(rec: dict):
    """(program, entry point, prelude, tests) for one HumanEval+ record."""
    program = rec["prompt"] + rec["canonical_solution"]
    prelude = (rec["prompt"] + rec["canonical_solution"]).replace(f"def {rec['entry_point']}(", "def _reference(", 1)
    inputs = rec["base_input"] + rec["plus_input"]
    tests = f"_INPUTS = {json.dumps(inputs)}\n" + CHECK
    return program, rec["entry_point"], prelude, tests


def evalplus_job(rec: dict):
    """(program, entry point, prelude, tests) as the project judges an evalplus record."""
    from posttrain.data.formats import evalplus

    task = evalplus(rec, rec["task_id"])
    return task["reference"], task["entry_point"], task["prelude"], task["tests"]


def native_s(program: str, entry: str, prelude: str, tests: str) -> float:
    """Loading the tests (where a verdict may run the reference) and ``check``, in this process."""
    prog: dict = {}
    exec(compile(program, "<program>", "exec", dont_inherit=True), prog)
    t = time.perf_counter()
    ns: dict = {}
    exec(compile(prelude + "\n" + tests, "<tests>", "exec", dont_inherit=True), ns)
    ns["check"](prog[entry])
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", nargs="+", default=["HumanEval/130"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--verdict", choices=("same", "evalplus"), default="same",
                    help="the check both sides run: the same plain check, or the project's evalplus verdict")
    args = ap.parse_args()
    from posttrain.sandbox.pool import Job, SandboxPool
    from posttrain.sandbox.worker import SandboxConfig

    recs = {r["task_id"]: r for r in map(json.loads, gzip.open(DATA, "rt")) if r["task_id"] in args.tasks}
    print(f"{'task':16s}{'native':>10s}{'sandbox':>10s}{'ratio':>8s}  verdict")
    with SandboxPool(SandboxConfig(workers=1, timeout_s=120.0, cpu_s=120)) as pool:
        pool.run([Job("def f(x):\n    return x\n", "f", "def check(c):\n    assert c(1) == 1\n")])  # warm
        for task in args.tasks:
            program, entry, prelude, tests = (task_job if args.verdict == "same" else evalplus_job)(recs[task])
            native, sandbox, verdict = [], [], ""
            for _ in range(args.rounds):
                native.append(native_s(program, entry, prelude, tests))
                t = time.perf_counter()
                out = pool.run([Job(program, entry, tests, prelude)])[0]
                sandbox.append(time.perf_counter() - t)
                verdict = f"{out.cls.value} {out.reason}".strip()
            n, s = statistics.median(native), statistics.median(sandbox)
            print(f"{task:16s}{n:9.2f}s{s:9.2f}s{s / n:7.2f}x  {verdict}", flush=True)
    print(f"verdict: {args.verdict}; medians of {args.rounds} rounds; ratio = sandbox / native")


if __name__ == "__main__":
    main()
