"""`posttrain make-data TASK OUT_DIR ...`: write an embedded task's records to JSONL.

Tasks are looked up by name in `TASKS` (name -> writer function), so a new task plugs in with one
line. Writers are imported lazily: a task whose module is missing fails with a clear message
instead of breaking the others.

Files written for ``arithmetic`` (all JSONL, one record per line):

- ``train.jsonl``, ``eval.jsonl``                 SFT records ``{"prompt", "completion", "answer"}``
- ``prompts_train.jsonl``, ``prompts_eval.jsonl`` RL records ``{"prompt", "answer"}``
- ``pairs_train.jsonl``, ``pairs_eval.jsonl``     preference records ``{"prompt", "chosen", "rejected", "answer"}``

The same problems back the three kinds of file in a split; train and eval never share a problem.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
from pathlib import Path

from posttrain.errors import UserError

# name -> "module:function"; each writer takes (out_dir, *, n_train, n_eval, seed, ...).
TASKS: dict[str, str] = {
    "arithmetic": "posttrain.tasks.arithmetic:write_arithmetic",
    "toy_code": "posttrain.tasks.toy_code:write_toy_code",
}


def _digits(text: str) -> int | tuple[int, int]:
    parts = text.split(",")
    if len(parts) > 2 or not all(p.strip().isdigit() for p in parts):
        raise argparse.ArgumentTypeError(f"expected N or N,M, got {text!r}")
    return int(parts[0]) if len(parts) == 1 else (int(parts[0]), int(parts[1]))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("task", help=f"task name: {', '.join(TASKS)}")
    parser.add_argument("out_dir", help="folder to write the JSONL files into (created if missing)")
    parser.add_argument("--n-train", type=int, default=2000, help="training problems (default 2000)")
    parser.add_argument("--n-eval", type=int, default=200, help="held-out problems (default 200)")
    parser.add_argument("--seed", type=int, default=0, help="which problems are drawn (splits do not depend on it)")
    parser.add_argument("--digits", type=_digits, default=2,
                        help="arithmetic: digits per operand, or first,second (e.g. 2,1; default 2)")
    parser.add_argument("--ops", default="x", help="arithmetic: operations, e.g. x or +,-,x (default x)")
    parser.add_argument("--format", dest="fmt", default="trace", choices=["trace", "direct", "think"],
                        help="arithmetic: completion format (default trace)")


def _resolve(task: str):
    if task not in TASKS:
        raise UserError(f"unknown task {task!r} (choose from {', '.join(TASKS)})")
    module_name, func_name = TASKS[task].split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        raise UserError(f"task {task!r} is not available here ({e})") from None
    return getattr(module, func_name)


def run(args: argparse.Namespace) -> int:
    writer = _resolve(args.task)
    if args.n_train < 0 or args.n_eval < 0:
        raise UserError("--n-train and --n-eval must be >= 0")
    options = {"n_train": args.n_train, "n_eval": args.n_eval, "seed": args.seed,
               "digits": args.digits, "ops": args.ops, "fmt": args.fmt}
    # Pass only the options the writer accepts, so task-specific flags do not leak across tasks.
    accepted = inspect.signature(writer).parameters
    kwargs = {k: v for k, v in options.items() if k in accepted}
    try:
        written = writer(Path(args.out_dir), **kwargs)
    except ValueError as e:
        raise UserError(f"{args.task}: {e}") from None
    for name, path in (written or {}).items():
        print(f"{name}: {path}")
    return 0
