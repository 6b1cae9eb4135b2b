"""The embedded toy code task: write ``f`` from three input/output examples, judged by hidden tests.

A problem is a small integer function ``f(x) = x * k + c`` or ``x * k - c`` (k in 1..9, c in
0..9). The prompt shows ``f(0)``, ``f(1)`` and ``f(2)``; the expected completion is one line of
Python in the shape the embedded tokenizer was trained on::

    Write f: f(0) = 3, f(1) = 7, f(2) = 11
    def f(x):
        return x * 4 + 3

Reading ``c`` off ``f(0)`` and ``k`` off the step between outputs is within reach of the tiny
model, and the hidden tests (``check(candidate)`` on six other inputs, negative ones included)
reward only the right function — printing the shown outputs back does not pass.

Design choices, as in the arithmetic task: a problem's split is a pure function of the
function itself (a hash of ``(k, sign, c)``), so held-out functions are never seen in training
whatever the seed; the seed only picks which problems are drawn. Records carry ``tests`` and
``entry_point`` next to the prompt, which is what the ``code`` verifier and the sandbox read.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
from pathlib import Path

from posttrain.data.records import write_jsonl

EVAL_FRACTION = 0.2
"""Share of the functions reserved for held-out evaluation (by hash)."""
SHOWN = (0, 1, 2)
HIDDEN = (3, 5, 8, 13, -1, -6)
_SALT = "posttrain-toy-code-v1"


@dataclasses.dataclass(frozen=True)
class Function:
    """``f(x) = x * k + sign * c``."""

    k: int
    c: int
    sign: int = 1

    def __call__(self, x: int) -> int:
        return x * self.k + self.sign * self.c

    @property
    def source(self) -> str:
        return f"def f(x):\n    return x * {self.k} {'+' if self.sign > 0 else '-'} {self.c}"

    @property
    def prompt(self) -> str:
        return "Write f: " + ", ".join(f"f({x}) = {self(x)}" for x in SHOWN)

    @property
    def tests(self) -> str:
        lines = [f"    assert candidate({x}) == {self(x)}" for x in HIDDEN]
        return "def check(candidate):\n" + "\n".join(lines) + "\n"


def all_functions() -> list[Function]:
    """Every function of the task (c = 0 only with +, so no two share a definition)."""
    return [Function(k, c, s) for k in range(1, 10) for c in range(10) for s in (1, -1) if c or s > 0]


def split_of(fn: Function) -> str:
    digest = hashlib.sha256(f"{_SALT}:{fn.k}:{fn.sign}:{fn.c}".encode()).digest()
    return "eval" if int.from_bytes(digest[:8], "big") / 2 ** 64 < EVAL_FRACTION else "train"


def sample_functions(n: int, *, split: str, seed: int) -> list[Function]:
    """``n`` functions of ``split``: every function once per round, rounds shuffled with ``seed``."""
    pool = [f for f in all_functions() if split_of(f) == split]
    rng = random.Random(f"{seed}:{split}")
    out: list[Function] = []
    while len(out) < n:
        rng.shuffle(pool)
        out.extend(pool[: n - len(out)])
    return out


def prompt_record(fn: Function) -> dict:
    return {"prompt": fn.prompt, "tests": fn.tests, "entry_point": "f"}


def sft_record(fn: Function) -> dict:
    return {**prompt_record(fn), "completion": fn.source}


def write_toy_code(out_dir: str | Path, *, n_train: int = 2000, n_eval: int = 200, seed: int = 0) -> dict[str, Path]:
    """Write ``train.jsonl``/``eval.jsonl`` (SFT) and ``prompts_train.jsonl``/``prompts_eval.jsonl``
    (RL and eval: prompt, tests, entry_point); returns name -> path."""
    out = Path(out_dir)
    written = {}
    for split, n in (("train", n_train), ("eval", n_eval)):
        fns = sample_functions(n, split=split, seed=seed)
        written[split] = write_jsonl(out / f"{split}.jsonl", [sft_record(f) for f in fns])
        written[f"prompts_{split}"] = write_jsonl(out / f"prompts_{split}.jsonl", [prompt_record(f) for f in fns])
    return written
