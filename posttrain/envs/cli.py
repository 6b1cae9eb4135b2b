"""`posttrain make-env-data ENV OUT_DIR ...`: prompts and SFT warm-start traces for an embedded environment.

Files written (JSONL):

- ``prompts_train.jsonl``, ``prompts_eval.jsonl``: the examples episodes start from (RL's
  ``data.path`` / ``data.eval_path`` with ``env.name=ENV``);
- ``sft_train.jsonl``: the conversations a good episode holds, as ``{"messages": [...]}`` for
  `posttrain sft` — calculator: the tool call, the tool's result and the answer; code_repair: a
  direct solution, or a wrong first version, the sandbox's feedback and the fix; repo: run the
  tests, read the module, replace the buggy line, submit.

For ``repo`` the prompts are whole tasks (the project's files, hidden tests, the reference fix):
`posttrain env-audit` checks them.

``swe`` makes SWE-bench-format tasks from a real project and its own test suite
(``--from`` a source distribution or a folder, once per project; `posttrain.envs.swe_tasks`):
``tasks_train.jsonl``, ``tasks_eval.jsonl`` and ``repos/NAME`` (the git repository the tasks point
at), for ``env.name=swe``. With several projects whole projects are held out; with one, files.

Train and eval never share a problem (the tasks' hash splits).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from posttrain.errors import UserError

ENVS = ("calculator", "code_repair", "repo", "swe")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("env", choices=ENVS, help="embedded environment")
    parser.add_argument("out_dir", help="folder to write the JSONL files into (created if missing)")
    parser.add_argument("--n-train", type=int, default=2000, help="training examples (default 2000)")
    parser.add_argument("--n-eval", type=int, default=200, help="held-out examples (default 200)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the examples drawn (default 0)")
    parser.add_argument("--digits", default="3,3", help="calculator: digits of the two operands (default 3,3)")
    parser.add_argument("--tools-style", default="compact", choices=["json", "compact", "none"],
                        help="calculator, repo: how the traces offer the tools, as env.tools_style offers it in rl and "
                             "eval (default compact, the environment's default; none keeps a tiny model's prompts short)")
    parser.add_argument("--direct-frac", type=float, default=0.0,
                        help="calculator: share of traces that answer at once, without the tool (default 0)")
    parser.add_argument("--retry-frac", type=float, default=0.0,
                        help="repo: share of traces whose first replace misses (shown, not trained on) and is "
                             "retried (default 0)")
    parser.add_argument("--give-up-frac", type=float, default=0.0,
                        help="repo: share of traces that submit right after running the tests, unfixed (default 0)")
    parser.add_argument("--from", dest="sources", action="append", default=[], metavar="SDIST|FOLDER",
                        help="swe: a project, a source distribution (.tar.gz, .zip) or a folder, with its tests; "
                             "give it more than once to split by project (whole projects held out)")
    parser.add_argument("--max-tasks", type=int, default=50, help="swe: most tasks to keep per project (default 50)")
    parser.add_argument("--per-function", type=int, default=2, help="swe: most tasks per function (default 2)")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="swe: seconds for one run of the project's suite in the sandbox (default 120)")
    parser.add_argument("--repair-frac", type=float, default=0.5,
                        help="code_repair: share of traces that fix a wrong first version (default 0.5)")


def run(args: argparse.Namespace) -> int:
    if args.n_train < 0 or args.n_eval < 0:
        raise UserError("--n-train and --n-eval must be >= 0")
    if args.env == "swe":
        return _make_swe(args)
    if args.env == "calculator":
        from posttrain.envs.calculator import write_calculator_data

        try:
            a, _, b = args.digits.partition(",")
            digits = (int(a), int(b or a))
            written = write_calculator_data(Path(args.out_dir), n_train=args.n_train, n_eval=args.n_eval,
                                            seed=args.seed, digits=digits, tools_style=args.tools_style,
                                            direct_frac=args.direct_frac)
        except ValueError as e:
            raise UserError(f"calculator: {e}") from None
    elif args.env == "repo":
        from posttrain.envs.repo_tasks import write_repo_data

        try:
            written = write_repo_data(Path(args.out_dir), n_train=args.n_train, n_eval=args.n_eval, seed=args.seed,
                                      tools_style=args.tools_style, retry_frac=args.retry_frac,
                                      give_up_frac=args.give_up_frac)
        except ValueError as e:
            raise UserError(f"repo: {e}") from None
    else:
        from posttrain.envs.code_repair import write_code_repair_data

        written = write_code_repair_data(Path(args.out_dir), n_train=args.n_train, n_eval=args.n_eval,
                                         seed=args.seed, repair_frac=args.repair_frac)
    for name, path in written.items():
        print(f"{name}: {path}")
    return 0


def _make_swe(args: argparse.Namespace) -> int:
    import json

    from posttrain.envs.swe_tasks import make_tasks
    from posttrain.sandbox.pool import SandboxPool, SandboxUnavailable
    from posttrain.sandbox.worker import SandboxConfig

    if not args.sources:
        raise UserError("swe: --from SDIST|FOLDER is required (the project to make tasks from)")
    if args.max_tasks < 1 or args.per_function < 1 or args.timeout <= 0:
        raise UserError("swe: --max-tasks and --per-function must be >= 1, --timeout > 0")
    try:
        pool = SandboxPool(SandboxConfig(workers=1, timeout_s=args.timeout, cpu_s=int(args.timeout) + 1, tmpfs_mb=64))
    except SandboxUnavailable as e:
        raise UserError(f"swe: the project's tests cannot run here: {e}") from None
    with pool:
        summary = make_tasks(args.sources, Path(args.out_dir), pool, max_tasks=args.max_tasks,
                             per_function=args.per_function, timeout_s=args.timeout)
    print(json.dumps(summary))
    return 0
