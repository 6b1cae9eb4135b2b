"""`posttrain env-audit TASKS.jsonl --out DIR`: audit repository tasks before training on them.

Plays the oracle (the reference fix), the null policy (submit unchanged) and the known hacks
(`posttrain.envs.audit`) through the repository environment, each task in the code sandbox.
``TASKS`` is a JSONL file of tasks (docs/envs.md) or ``embedded`` (``--n`` embedded tasks of
``--split``). A file of SWE-bench-format records (``FAIL_TO_PASS``, ``test_patch``...) is played
through ``env.name=swe`` (`posttrain.envs.swe`): the gold patch, null, and the forgeries of a
pytest verdict (`audit.swe_policies`); a row's ``left_out`` names the files a record's patches touch that
the tree leaves out (their parts are not applied). Writes ``DIR/clean.jsonl`` (the tasks without flags), ``DIR/audit.jsonl`` (one row
per task: flags and each policy's verdict) and ``DIR/summary.json``; prints each policy's pass rate
(oracle 1.0, every other 0.0 on a sound task set). ``--timeout`` is each run's time limit (the
verdict's, for SWE records), ``--cpu-limit`` the sandbox's CPU seconds per program. Exit 0 when every task is clean, 1 when some
were flagged (they are left out of clean.jsonl).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from posttrain.errors import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("tasks", help="JSONL repository tasks, or 'embedded'")
    parser.add_argument("--out", default="env-audit", help="output directory (default: env-audit)")
    parser.add_argument("--n", type=int, default=50, help="embedded: number of tasks (default 50)")
    parser.add_argument("--split", choices=("train", "eval"), default="train", help="embedded: split (default train)")
    parser.add_argument("--workers", type=int, default=0, help="parallel sandboxes (default: one per core)")
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds per sandbox run, the verdict's time limit (default 10; SWE records: 60, "
                             "as env.name=swe)")
    parser.add_argument("--cpu-limit", type=int, default=None,
                        help="CPU seconds a sandbox program may use (default: 30, or the timeout + 1 if larger)")
    parser.add_argument("--venv", default="", help="SWE records: the virtual environment the projects' tests "
                                                   "import their dependencies from (env.options.venv)")


def read_tasks(args) -> list[dict]:
    if args.tasks == "embedded":
        from posttrain.envs.repo_tasks import sample_tasks

        if args.n < 1:
            raise UserError(f"--n must be >= 1, got {args.n}")
        return sample_tasks(args.n, split=args.split)
    from posttrain.envs.base import EnvTaskError
    from posttrain.envs.repo import check_task
    from posttrain.envs.swe import is_swe_record, load_task
    from posttrain.jsonl import read_jsonl

    tasks = []
    for line, rec in read_jsonl(args.tasks):
        try:
            load_task(rec) if is_swe_record(rec) else check_task(rec)
        except EnvTaskError as e:
            raise UserError(f"{args.tasks}:{line}: {e}") from None
        tasks.append(rec)
    return tasks


def run(args) -> int:
    from posttrain.envs.audit import audit_tasks, pass_rates, repo_policies, swe_policies
    from posttrain.envs.repo import RepoEnv
    from posttrain.envs.swe import SweEnv, is_swe_record, load_task, venv_site
    from posttrain.sandbox.audit import write_audit
    from posttrain.sandbox.pool import SandboxPool, SandboxUnavailable
    from posttrain.sandbox.worker import SandboxConfig
    from posttrain.tracking import progress_bar

    if (args.timeout is not None and args.timeout <= 0) or args.workers < 0:
        raise UserError("--timeout must be > 0 and --workers >= 0")
    if args.cpu_limit is not None and args.cpu_limit < 1:
        raise UserError(f"--cpu-limit must be >= 1 CPU second, got {args.cpu_limit}")
    tasks = read_tasks(args)
    swe = bool(tasks) and is_swe_record(tasks[0])
    timeout = args.timeout if args.timeout is not None else (60.0 if swe else 10.0)
    cpu_s = args.cpu_limit if args.cpu_limit is not None else max(30, math.ceil(timeout) + 1)
    if any(is_swe_record(t) != swe for t in tasks):
        raise UserError(f"{args.tasks}: mixes SWE-bench-format records with repository tasks; audit them apart")
    env_class = SweEnv if swe else RepoEnv
    if args.venv and not swe:
        raise UserError(f"--venv: {args.tasks} holds repository tasks, not SWE-bench-format records")
    options = {"venv": args.venv} if args.venv else {}
    try:
        site = venv_site(args.venv, SandboxConfig().python) if args.venv else ""
        pool = SandboxPool(SandboxConfig(workers=args.workers, site_packages=site, cpu_s=cpu_s))
    except ValueError as e:
        raise UserError(f"--venv: {str(e).removeprefix('env.options.venv: ')}") from None
    except SandboxUnavailable as e:
        raise UserError(f"{args.tasks}: cannot run the tasks here: {e}") from None
    with pool, progress_bar() as bar:  # off a terminal: a plain line every 30 s
        job = bar.add_task("audit", total=len(tasks), info="")
        rows = audit_tasks(tasks, lambda: env_class(timeout_s=timeout, pool=pool, **options),
                           workers=2 * pool.cfg.n_workers, progress=lambda: bar.advance(job),
                           policies_of=(lambda rec: swe_policies(load_task(rec))) if swe else repo_policies)
    for task, row in zip(tasks, rows):
        if swe and load_task(task)["left_out"]:  # patch parts for files the tree leaves out: not applied
            row["left_out"] = load_task(task)["left_out"]
    summary = write_audit(tasks, rows, Path(args.out))
    summary["pass_rate"] = pass_rates(rows)
    (Path(args.out) / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    for name, rate in summary["pass_rate"].items():
        want = "1.0" if name == "oracle" else "0.0"
        print(f"{name:>13}: {rate:6.1%} of tasks pass (sound: {want})")
    print(json.dumps({k: summary[k] for k in ("records", "clean", "flags")}))
    return 0 if summary["clean"] == summary["records"] else 1
