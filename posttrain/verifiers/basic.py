"""Plain verifiers: ``(completion: str, example: dict) -> Outcome``.

- `arithmetic`: the last ``Answer: N`` line must equal ``example["answer"]`` exactly (the task's
  strict checker, `posttrain.tasks.arithmetic.extract_answer`).
- `math`: symbolic equivalence with the `math-verify` library (``\\frac{1}{2}`` equals ``0.5``).
  math-verify bounds its work with ``signal.alarm``, which only works on the main thread; off the
  main thread (a thread pool scoring rollouts) the timeouts are disabled — pass ``None`` — rather
  than crash, and the caller's own wall-clock limit applies.
- `format`: a closed ``<think>…</think>`` block at the start, followed by an ``Answer:`` line or a
  fenced code block. Used as a small bonus next to a correctness verifier (see `combine`).

Classes (`posttrain.outcome`): no answer in the completion -> MODEL_FAIL "format"; a wrong one ->
MODEL_FAIL "wrong_answer"; an example without a usable reference answer -> TASK_FAIL, because
that is the task's fault, not the model's.
"""

from __future__ import annotations

import re
import threading

from posttrain.outcome import Outcome
from posttrain.tasks.arithmetic import extract_answer

MATH_TIMEOUT_S = 5
"""Per-parse and per-comparison limit inside math-verify (main thread only)."""

_THINK_RE = re.compile(r"\A\s*<think>(?P<think>.*?)</think>(?P<rest>.*)\Z", re.DOTALL)
_ANSWER_LINE_RE = re.compile(r"^Answer:[ \t]*\S.*$", re.MULTILINE)
_CODE_BLOCK_RE = re.compile(r"```[^\n`]*\n.*?\n?```", re.DOTALL)


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
    m = _THINK_RE.match(completion)
    if m is None:
        return Outcome.model_fail("format", detail="no closed <think>...</think> at the start")
    if "<think>" in m["think"] or "<think>" in m["rest"] or "</think>" in m["rest"]:
        return Outcome.model_fail("format", detail="more than one think block")
    if not m["think"].strip():
        return Outcome.model_fail("format", detail="empty think block")
    if _ANSWER_LINE_RE.search(m["rest"]) or _CODE_BLOCK_RE.search(m["rest"]):
        return Outcome.passed()
    return Outcome.model_fail("format", detail="no 'Answer:' line or code block after </think>")
