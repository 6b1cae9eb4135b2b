"""Programs per second on HumanEval's canonical solutions: the verifier farm (1 and 2 sandbox
actors on Ray) against one in-process `SandboxPool`.

Every side judges the same 164 programs, warm (sandboxes started and canaries run before the
clock), in rounds that alternate the sides so host noise hits them alike. The pool runs
``--workers`` sandboxes; each farm actor runs ``--cpus`` sandboxes (default: the same number),
so the 2-actor farm has twice the sandboxes — on a machine with fewer cores than that it
measures the farm's overhead under oversubscription, not its scaling, which needs a core per
sandbox (on one machine, or actors on several). The local Ray is started with as many logical
CPUs as both farms reserve together.

The 1-minute load average is printed before and after: other work on the machine slows every
side, and not always equally.

    .venv/bin/python bench/verifier_farm.py [--rounds 3] [--workers N] [--cpus N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


def rate(judge, jobs) -> tuple[float, int]:
    t = time.perf_counter()
    outs = judge.run(jobs)
    return len(jobs) / (time.perf_counter() - t), sum(o.cls.value == "PASS" for o in outs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="sandboxes of the in-process pool")
    ap.add_argument("--cpus", type=int, default=0, help="sandboxes (CPUs) per farm actor (default: --workers)")
    args = ap.parse_args()
    cpus = args.cpus or args.workers

    from posttrain.distributed.cluster import connect
    from posttrain.distributed.farm import VerifierFarm
    from posttrain.sandbox.pool import SandboxPool
    from posttrain.sandbox.records import humaneval_records, to_job
    from posttrain.sandbox.worker import SandboxConfig

    load_before = os.getloadavg()[0]
    jobs = [to_job(r, r["id"], timeout_s=3.0) for r in humaneval_records("canonical")]
    connect("", num_cpus=3 * cpus)  # both farms stay up, so the rounds can alternate
    sides = {"pool": SandboxPool(SandboxConfig(workers=args.workers)),
             "farm x1": VerifierFarm(SandboxConfig(replicas=1, cpus=cpus)),
             "farm x2": VerifierFarm(SandboxConfig(replicas=2, cpus=cpus))}
    rates: dict[str, list[float]] = {name: [] for name in sides}
    try:
        for judge in sides.values():
            judge.run(jobs[:2 * cpus])  # warm-up: every sandbox started, canaries run
        for r in range(args.rounds):
            line = []
            for name, judge in sides.items():
                per_s, passed = rate(judge, jobs)
                if passed != len(jobs):
                    raise SystemExit(f"{name}: {passed}/{len(jobs)} passed; every canonical solution must pass")
                rates[name].append(per_s)
                line.append(f"{name} {per_s:6.1f} prog/s")
            print(f"round {r}: " + "   ".join(line) + f"   ({len(jobs)}/{len(jobs)} pass on every side)",
                  flush=True)
        farm_stats = {name: dict(judge.stats) for name, judge in sides.items() if name != "pool"}
    finally:
        for judge in sides.values():
            judge.close()
    load_after = os.getloadavg()[0]
    pool = rates["pool"]
    print(f"\n{'':10s}{'sandboxes':>10s}{'prog/s':>10s}{'vs pool':>9s}")
    for name, runs in rates.items():
        n = args.workers if name == "pool" else cpus * int(name[-1])
        ratio = statistics.median(s / p for s, p in zip(runs, pool))
        print(f"{name:10s}{n:10d}{statistics.median(runs):10.1f}{ratio:8.2f}x")
    for name, stats in farm_stats.items():
        keys = ("requests", "retries", "infra_fail", "actor_deaths", "timeouts")
        print(f"{name}: " + ", ".join(f"{k}={stats.get(k, 0)}" for k in keys))
    print(f"medians of {args.rounds} rounds (ratio: median of the rounds' ratios); load average (1 min) "
          f"{load_before:.2f} before, {load_after:.2f} after, {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
