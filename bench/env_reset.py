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

With ``--project DIR`` (a real project's folder, its tests included; ``--pad-mb`` pads it with
extra modules up to that many MiB) the same for the SWE environment (`posttrain.envs.swe`):
``overlay`` is a fresh `SweEnv` and ``reset`` on the project (the tree read once, then shared),
``copy`` a copy of its folder per episode; then a verdict run of the project's test files in the
warm sandbox, its wall time against the time pytest itself spent inside it, two ways side by side:
the tree mounted read-only from the shared copy under an overlay (posttrain's), and the whole tree
sent with the program and written into the sandbox per run.

    .venv/bin/python bench/env_reset.py --project runs/swe-data/src/six-1.17.0 [--pad-mb 10]
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
    ap.add_argument("--project", default="", help="a real project's folder: measure the SWE environment on it")
    ap.add_argument("--pad-mb", type=float, default=0.0, help="--project: pad the tree to this many MiB")
    args = ap.parse_args()
    if args.project:
        return project_bench(args)

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


def project_bench(args) -> None:
    """Reset and verdict overhead of the SWE environment on a real project (see the docstring)."""
    import secrets

    from posttrain.envs.swe import (SweEnv, is_test_path, load_task, read_verdict, tree_at, tree_job, verdict_files,
                                    verdict_program)
    from posttrain.sandbox.trees import Tree
    from posttrain.sandbox.pool import SandboxPool, SandboxUnavailable
    from posttrain.sandbox.worker import SandboxConfig

    source = Path(args.project)
    folder = Path(tempfile.mkdtemp(prefix="env-reset-project-")) / source.name
    shutil.copytree(source, folder)
    size = sum(map(len, tree_at(str(folder), "").values()))
    body = "".join(f"def helper_{i}(x):\n    return x + {i}\n\n\n" for i in range(256 * 1024 // 32))
    k = 0
    while size < args.pad_mb * 1024 * 1024:  # 256 KiB modules, never imported by the tests
        (folder / f"pad_{k}.py").write_text(body)
        size, k = size + len(body), k + 1
    files = tree_at(str(folder), "")
    tests = sorted(p for p in files if is_test_path(p) and p.rsplit("/", 1)[-1].startswith("test") and p.endswith(".py"))
    record = {"instance_id": source.name, "repo": source.name, "base_commit": "", "patch": "", "test_patch": "",
              "FAIL_TO_PASS": tests, "PASS_TO_PASS": [], "problem_statement": "bench", "repo_path": str(folder)}
    t0 = time.perf_counter()
    SweEnv().reset(record)
    first = time.perf_counter() - t0
    template, scratch = folder, Path(tempfile.mkdtemp(prefix="env-reset-episodes-"))

    def copy():
        where = Path(tempfile.mkdtemp(dir=scratch))
        shutil.copytree(template, where / "work")
        shutil.rmtree(where)

    sides = {"overlay": lambda: SweEnv().reset(record), "copy": copy}
    rates = {name: statistics.median(per_second(fn, args.seconds) for _ in range(args.rounds))
             for name, fn in sides.items()}
    print(f"project {source.name}: {len(files)} files, {size / 2**20:.2f} MiB; reading the tree once: "
          f"{first * 1000:.0f} ms; median of {args.rounds} rounds")
    for name, r in rates.items():
        print(f"{name:>13}: {r:12,.0f} resets/s  {1000 / r:9.3f} ms each  overlay is {rates['overlay'] / r:8.1f}x faster")
    try:
        pool = SandboxPool(SandboxConfig(workers=1, timeout_s=120, cpu_s=121, tmpfs_mb=96, file_mb=64))
    except SandboxUnavailable as e:
        print(f"verdict: skipped ({e})")
        return
    task = load_task(record)
    view = verdict_files(task, task["files"])
    # The same verdict two ways: the tree mounted from the shared copy (what SweEnv does), and the
    # whole tree sent with the program and written by it (an empty base: every file is a change).
    sides = {"tree mounted": task["tree"], "tree sent whole": Tree({})}
    walls: dict[str, list[float]] = {name: [] for name in sides}
    inside: dict[str, list[float]] = {name: [] for name in sides}
    with pool:
        for _ in range(args.rounds + 1):
            for name, base in sides.items():
                nonce = secrets.token_hex(8)
                job = tree_job(verdict_program(view, tests), base, view, nonce + "\n", 120)
                t0 = time.perf_counter()
                out = pool.run([job])[0]
                walls[name].append(time.perf_counter() - t0)
                outcome, fractions = read_verdict(out.detail, nonce, tests, [])
                inside[name].append(fractions.get("pytest_s", float("nan")))
    print(f"verdict of {len(tests)} test files ({outcome.cls.value}), median of {args.rounds} rounds after a warm-up:")
    over = {}
    for name in sides:
        wall, own = statistics.median(walls[name][1:]), statistics.median(inside[name][1:])
        over[name] = wall - own
        print(f"{name:>16}: {wall * 1000:6.0f} ms wall, pytest's own session {own * 1000:6.0f} ms, "
              f"overhead {(wall - own) * 1000:5.0f} ms ({wall / own:.2f}x pytest alone)")
    print(f"overhead beyond pytest: mounted is {over['tree sent whole'] / over['tree mounted']:.1f}x smaller")


if __name__ == "__main__":
    main()
