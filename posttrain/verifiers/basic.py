"""Plain verifiers: ``(completion: str, example: dict) -> Outcome``.

- `arithmetic`: the last ``Answer: N`` line must equal ``example["answer"]`` exactly (the task's
  strict checker, `posttrain.tasks.arithmetic.extract_answer`).
- `math`: symbolic equivalence with the `math-verify` library (``\\frac{1}{2}`` equals ``0.5``).
  math-verify bounds its work with ``signal.alarm``, which only works on the main thread; off the
  main thread (a thread pool scoring rollouts) the timeouts are disabled — pass ``None`` — rather
  than crash, and the caller's own wall-clock limit applies.
- `format`: a closed ``<think>…</think>`` block at the start, followed by an ``Answer:`` line or a
  fenced code block. Used as a small bonus next to a correctness verifier (see `combine`).
- `code_format`: a closed ``<think>…</think>`` block at the start, followed by a program that is
  syntactically valid Python (the last fenced block after it, or all of it without a fence;
  parsed, never run): the format reward of the seed's reasoning recipe (examples/seed_reasoning.yaml).

Classes (`posttrain.outcome`): no answer in the completion -> MODEL_FAIL "format"; a wrong one ->
MODEL_FAIL "wrong_answer"; an example without a usable reference answer -> TASK_FAIL, because
that is the task's fault, not the model's.
"""

from __future__ import annotations

import ast
import re
import threading
import warnings

from posttrain.outcome import Outcome
from posttrain.tasks.arithmetic import extract_answer
from posttrain.verifiers.sanitize import longest_valid_code, sanitize

MATH_TIMEOUT_S = 5
"""Per-parse and per-comparison limit inside math-verify (main thread only)."""

_THINK_RE = re.compile(r"\A\s*<think>(?P<think>.*?)</think>(?P<rest>.*)\Z", re.DOTALL)
_ANSWER_LINE_RE = re.compile(r"^Answer:[ \t]*\S.*$", re.MULTILINE)
_CODE_BLOCK_RE = re.compile(r"```[^\n`]*\n.*?\n?```", re.DOTALL)
_FENCE_RE = re.compile(r"^[ \t]*```[ \t]*[\w+-]*[ \t]*\n(.*?)(?:^[ \t]*```|\Z)", re.DOTALL | re.MULTILINE)
_THINK_CLOSE = "</think>"


def _reference(example: dict) -> str | None:
    answer = example.get("answer")  # a data record, not a config: a missing answer is a task failure
    if answer is None:
        return None
    answer = str(answer).strip()
    return answer or None


def arithmetic(completion: str, example: dict) -> Outcome:
    """Exact integer answer on the last ``Answer: N`` line."""
    reference = _reference(example)
    if reference is None:
        return Outcome.task_fail("no_answer", "the example has no 'answer'")
    got = extract_answer(completion)
    if got is None:
        return Outcome.model_fail("format", detail="no line 'Answer: <integer>'")
    if got != reference:
        return Outcome.model_fail("wrong_answer", detail=f"got {got}, expected {reference}")
    return Outcome.passed()


def _math_timeout() -> int | None:
    return MATH_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


def math(completion: str, example: dict) -> Outcome:
    """Mathematical equivalence of the completion's final answer and ``example["answer"]`` (math-verify)."""
    from math_verify import parse, verify

    reference = _reference(example)
    if reference is None:
        return Outcome.task_fail("no_answer", "the example has no 'answer'")
    timeout = _math_timeout()
    # A bare reference such as "x+1" is only found by math-verify inside a LaTeX environment.
    gold_text = reference if ("$" in reference or "\\boxed" in reference) else f"\\boxed{{{reference}}}"
    gold = parse(gold_text, parsing_timeout=timeout)
    if not gold:
        return Outcome.task_fail("unparsable_answer", f"math-verify cannot parse the reference {reference!r}")
    pred = parse(completion, parsing_timeout=timeout)
    if not pred:
        return Outcome.model_fail("format", detail="no mathematical answer found")
    if verify(gold, pred, timeout_seconds=timeout):
        return Outcome.passed()
    return Outcome.model_fail("wrong_answer", detail=f"got {pred[-1]!s}, expected {reference}")


def format_reward(completion: str, example: dict) -> Outcome:
    """PASS for ``<think>…</think>`` followed by an ``Answer:`` line or a fenced code block."""
    rest, reason = _think_block(completion)
    if rest is None:
        return Outcome.model_fail("format", detail=reason)
    if _ANSWER_LINE_RE.search(rest) or _CODE_BLOCK_RE.search(rest):
        return Outcome.passed()
    return Outcome.model_fail("format", detail="no 'Answer:' line or code block after </think>")


def extract_code(completion: str, entry_point: str | None = None, *, whole: bool = False) -> str:
    """The program in a completion, as evalplus' ``sanitize`` finds it (`posttrain.verifiers.sanitize`):
    the longest syntactically valid code, then its imports and the definitions ``entry_point``
    needs (all definitions without one), so prose, stray fences and top-level example calls are
    left out. ``whole``: the longest valid code as it is, top-level statements included (a stdin
    program, a module a test suite imports). Read past a closed reasoning trace (the text after the
    last ``</think>``) when there is one: a draft in the trace is never the answer, so a trace never
    closed (cut at the length limit) leaves no program."""
    answer = after_trace(completion)
    return longest_valid_code(answer) if whole else sanitize(answer, entry_point)


def after_trace(completion: str) -> str:
    """The answer past a closed reasoning trace (the text after the last ``</think>``), the whole
    completion when it has no trace, "" when a trace is never closed."""
    _, closed, answer = completion.rpartition(_THINK_CLOSE)
    return "" if not closed and "<think>" in completion else answer


def _fenced_or_whole(answer: str) -> str:
    """The last fenced block's body, or the text itself when it has no fence: what a well-formatted
    answer shows as its program (the format reward's reading, stricter than `extract_code`)."""
    blocks = _FENCE_RE.findall(answer)
    return blocks[-1] if blocks else answer


def _think_block(completion: str) -> tuple[str | None, str]:
    """(the answer after one closed, non-empty ``<think>`` block at the start, the reason when there is none)."""
    m = _THINK_RE.match(completion)
    if m is None:
        return None, "no closed <think>...</think> at the start"
    if "<think>" in m["think"] or "<think>" in m["rest"] or "</think>" in m["rest"]:
        return None, "more than one think block"
    if not m["think"].strip():
        return None, "empty think block"
    return m["rest"], ""


def code_format(completion: str, example: dict) -> Outcome:
    """PASS for ``<think>…</think>`` followed by a program that parses as Python (its last fenced
    block, or all of it without a fence; stricter than `extract_code`, which finds code in prose)."""
    rest, reason = _think_block(completion)
    if rest is None:
        return Outcome.model_fail("format", detail=reason)
    program = _fenced_or_whole(rest)
    if not program.strip():
        return Outcome.model_fail("format", detail="no code after </think>")
    try:
        with warnings.catch_warnings():  # an invalid escape in the program is its business, not the log's
            warnings.simplefilter("ignore")
            ast.parse(program)
    except (SyntaxError, ValueError) as e:  # ValueError: a NUL byte in the source
        return Outcome.model_fail("format", detail=f"not valid Python after </think>: {e}")
    return Outcome.passed()
