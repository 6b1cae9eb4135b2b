"""Resets per second of the repository environment, against copying the project for every episode.

Three ways to give an episode its own working copy of a task's project, measured side by side on
the same task (an embedded one, padded with ``--pad`` extra modules of ``--pad-kb`` KiB each to
show how each way scales with the project's size):

- ``overlay`` (posttrain's): a fresh `RepoEnv` and ``reset`` — the episode's copy is the task's
  files under an empty overlay of its own writes; nothing is copied;
- ``copy``: copy the project's tree into a new directory (``shutil.copytree`` from a template
  folder) and remove it at the end, as an environment that gives each episode a folder does;
- ``copy+sandbox``: that, plus a fresh sandbox (a new bubblewrap worker with its zygote) per
  episode, as an environment that starts a container per episode does (needs bubblewrap and root).

Then the per-episode overhead of a whole scripted good episode (run the visible tests, fix the
line, submit: two sandbox runs in the warm shared pool), to put the reset in proportion.

    .venv/bin/python bench/env_reset.py [--pad 0] [--pad-kb 4] [--seconds 2]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path


def per_second(fn, seconds: float, at_least: int = 3) -> float:
    n, t0 = 0, time.perf_counter()
    while n < at_least or time.perf_counter() - t0 < seconds:
        fn()
        n += 1
    return n / (time.perf_counter() - t0)


def padded_task(pad: int, pad_kb: int) -> dict:
    from posttrain.envs.repo_tasks import sample_tasks

    task = sample_tasks(1, split="train")[0]
    body = "".join(f"def helper_{i}(x):\n    return x + {i}\n\n\n" for i in range(pad_kb * 1024 // 32))
    task["files"] = {**task["files"], **{f"pkg/extra_{k}.py": body for k in range(pad)}}
    return task


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pad", type=int, default=0, help="extra modules in the project (default 0)")
    ap.add_argument("--pad-kb", type=int, default=4, help="KiB per extra module (default 4)")
    ap.add_argument("--seconds", type=float, default=2.0, help="time per side (default 2)")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds; the median is printed (default 3)")
    args = ap.parse_args()

    from posttrain.envs.repo import RepoEnv
    from posttrain.envs.tools import format_call
    from posttrain.sandbox.pool import CANARIES, SandboxPool, SandboxUnavailable
    from posttrain.sandbox.worker import SandboxConfig, Worker, probe

    task = padded_task(args.pad, args.pad_kb)
    size = sum(map(len, task["files"].values()))
    template = Path(tempfile.mkdtemp(prefix="env-reset-template-"))
    for path, text in task["files"].items():
        (template / path).parent.mkdir(parents=True, exist_ok=True)
        (template / path).write_text(text)
    scratch = Path(tempfile.mkdtemp(prefix="env-reset-episodes-"))

    def overlay():
        RepoEnv().reset(task)

    def copy():
        where = Path(tempfile.mkdtemp(dir=scratch))
        shutil.copytree(template, where / "work")
        shutil.rmtree(where)

    sides = {"overlay": overlay, "copy": copy}
    info = probe()
    sandbox = info["bwrap"] and info["root"] and info["seccomp"]
    if sandbox:
        cfg = SandboxConfig(workers=1)

        def copy_and_sandbox():
            copy()
            w = Worker(cfg, 0, 200000, info)
            try:
                w.run(CANARIES[0][1].request(cfg))  # the sandbox answers: it is ready for the episode
            finally:
                w.close()

        sides["copy+sandbox"] = copy_and_sandbox
    rates: dict[str, list[float]] = {k: [] for k in sides}
    for _ in range(args.rounds):
        for name, fn in sides.items():
            rates[name].append(per_second(fn, args.seconds))
    shutil.rmtree(template), shutil.rmtree(scratch)

    print(f"project: {len(task['files'])} files, {size / 1024:.1f} KiB; median of {args.rounds} rounds")
    base = statistics.median(rates["overlay"])
    for name, rs in rates.items():
        r = statistics.median(rs)
        print(f"{name:>13}: {r:12,.0f} resets/s  {1000 / r:9.3f} ms each  overlay is {base / r:8.1f}x faster")
    if not sandbox:
        print("copy+sandbox and the episode: skipped (the sandbox needs bubblewrap, root and libseccomp)")
        return
    try:
        pool = SandboxPool(SandboxConfig(workers=1))
    except SandboxUnavailable as e:
        print(f"episode: skipped ({e})")
        return
    with pool:
        bug = task["bug"]
        turns = [format_call("run_tests", {}), format_call("replace", {"path": bug["path"], "old": bug["old"],
                                                                        "new": bug["new"]}), format_call("submit", {})]

        def episode():
            env = RepoEnv(pool=pool)
            env.reset(task)
            for text in turns:
                result = env.step(text)
            assert result.done and result.outcome.cls.value == "PASS", result.outcome

        episode()  # warm
        r = statistics.median(per_second(episode, args.seconds) for _ in range(args.rounds))
    print(f"a whole good episode (2 sandbox runs, warm pool): {1000 / r:.1f} ms; the overlay reset is "
          f"{100 * r / base:.3f}% of it")


if __name__ == "__main__":
    main()
