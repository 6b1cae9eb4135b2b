"""Runs several `posttrain` command lines one after another in ONE torchrun launch: ``torchrun ...
tests/torchrun_each.py CASES.json`` (the `torchrun_each` fixture in tests/conftest.py). Why: a launch
costs each rank its torch, transformers and model imports (~5 s of CPU), far more than a test's few
steps; the process group is joined once and every command reuses it, as `init_world` allows.

CASES.json is ``[[name, argv], ...]``. Process 0 marks each command's output on stdout with
``@@case NAME`` before it and ``@@code NAME CODE`` after it. A command that fails stops the launch
(the ranks could be out of step after it) with that command's exit code."""

import json
import os
import sys

from posttrain.cli import main


def run(cases: list) -> int:
    first = os.environ.get("RANK", "0") == "0"
    for name, argv in cases:
        if first:
            print(f"\n@@case {name}", flush=True)
        code = main(argv)
        if first:
            print(f"\n@@code {name} {code}", flush=True)
        if code:
            return code
    return 0


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        code = run(json.load(f))
    from posttrain.core.dist import exit_rank, launched_by_torchrun

    if launched_by_torchrun():
        exit_rank(code)
    sys.exit(code)
