"""Finding, combining and safely running verifiers.

A verifier is any function ``(completion: str, example: dict) -> Outcome``. Recipes name one by a
registry name (`VERIFIERS`) or by an import path ``package.module:function`` (`resolve_verifier`),
so user-written rewards need no registration.

`safe_verify` is how every caller should run a verifier: an exception, or a NaN or infinite reward
(`posttrain.outcome.checked`), becomes INFRA_FAIL ("verifier_error"), which the RL loop masks from
the gradient — a crashing verifier must never read as "the model was wrong" (reward 0).

A verifier may carry a ``batch`` attribute, ``(completions, examples) -> list[Outcome]``, that
`score_batch` uses to judge a whole batch at once (the code verifier runs it on parallel
sandboxes). An exception with ``stops_run = True`` (the sandbox's circuit breaker) is re-raised:
a broken host must stop the run rather than mask every sample.

`combine` adds rewards (correctness 1.0 + format 0.05 in the seed recipes) but keeps the
correctness verifier's class, so a small format bonus cannot turn a wrong answer into a PASS.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from posttrain.errors import UserError
from posttrain.outcome import Outcome, OutcomeClass, checked
from posttrain.verifiers import basic

Verifier = Callable[[str, dict], Outcome]

# Function names tried, in order, in posttrain.verifiers.code (written separately, imported lazily
# because it pulls in the sandbox).
_CODE_FUNCTION_NAMES = ("verify", "verify_code", "code")


def code(completion: str, example: dict) -> Outcome:
    """The code-tests verifier from `posttrain.verifiers.code`, imported on first use."""
    module = importlib.import_module("posttrain.verifiers.code")
    for name in _CODE_FUNCTION_NAMES:
        fn = getattr(module, name, None)
        if callable(fn):
            return fn(completion, example)
    raise RuntimeError(f"posttrain.verifiers.code defines none of {', '.join(_CODE_FUNCTION_NAMES)}")


def _code_batch(completions: list[str], examples: list[dict]) -> list[Outcome]:
    return importlib.import_module("posttrain.verifiers.code").verify_batch(completions, examples)


code.batch = _code_batch  # score_batch judges a whole batch in parallel sandboxes

VERIFIERS: dict[str, Verifier] = {
    "arithmetic": basic.arithmetic,
    "math": basic.math,
    "format": basic.format_reward,
    "code_format": basic.code_format,
    "code": code,
}


def resolve_verifier(spec: str) -> Verifier:
    """A registered name (`VERIFIERS`) or ``package.module:function``; UserError naming ``spec`` otherwise."""
    if spec in VERIFIERS:
        return VERIFIERS[spec]
    if ":" not in spec:
        raise UserError(f"verifier {spec!r}: not a registered name ({', '.join(VERIFIERS)}) "
                        "nor an import path package.module:function")
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # ImportError, or the module itself failing to import
        raise UserError(f"verifier {spec!r}: cannot import module {module_name!r} ({e})") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise UserError(f"verifier {spec!r}: module {module_name!r} has no function {attr!r}")
    return fn


def safe_verify(fn: Verifier, completion: str, example: dict) -> Outcome:
    """Run ``fn``; an exception, a non-Outcome result or a non-finite reward becomes INFRA_FAIL
    ("verifier_error")."""
    try:
        outcome = fn(completion, example)
    except Exception as e:
        if getattr(e, "stops_run", False):  # e.g. the sandbox's circuit breaker: the host is broken
            raise
        return Outcome.infra_fail("verifier_error", f"{type(e).__name__}: {e}")
    if not isinstance(outcome, Outcome):
        return Outcome.infra_fail("verifier_error", f"verifier returned {type(outcome).__name__}, not Outcome")
    return checked(outcome)


def score_batch(fn: Verifier, completions: list[str], examples: list[dict]) -> list[Outcome]:
    """`safe_verify` over aligned lists of completions and examples."""
    if len(completions) != len(examples):
        raise ValueError(f"{len(completions)} completions but {len(examples)} examples")
    batch = getattr(fn, "batch", None)
    if batch is not None:
        return _safe_batch(batch, completions, examples)
    return [safe_verify(fn, c, e) for c, e in zip(completions, examples)]


def _safe_batch(batch, completions: list[str], examples: list[dict]) -> list[Outcome]:
    """`safe_verify` for a verifier's batch form: a failure of the whole batch is INFRA_FAIL for each."""
    try:
        outcomes = batch(completions, examples)
    except Exception as e:
        if getattr(e, "stops_run", False):
            raise
        return [Outcome.infra_fail("verifier_error", f"{type(e).__name__}: {e}")] * len(completions)
    if len(outcomes) != len(completions) or not all(isinstance(o, Outcome) for o in outcomes):
        return [Outcome.infra_fail("verifier_error", "batch verifier returned a malformed list")] * len(completions)
    return [checked(o) for o in outcomes]


def combine(verifiers_with_weights: list[tuple[Verifier, float]]) -> Verifier:
    """A verifier whose reward is ``sum(w_i * reward_i)`` and whose class is the first verifier's.

    The first entry is the correctness verifier. INFRA_FAIL (then TASK_FAIL) from any entry
    dominates: if any part could not judge, the sum is meaningless and is masked. Its ``batch``
    judges a whole batch with each part's own batch form (a judge grades in parallel), and its
    ``metrics`` are its parts'.
    """
    if not verifiers_with_weights:
        raise ValueError("combine needs at least one (verifier, weight)")
    weights = [w for _, w in verifiers_with_weights]

    def combined(completion: str, example: dict) -> Outcome:
        return _merge([safe_verify(fn, completion, example) for fn, _ in verifiers_with_weights], weights)

    def batch(completions: list[str], examples: list[dict]) -> list[Outcome]:
        parts = [score_batch(fn, completions, examples) for fn, _ in verifiers_with_weights]
        return [_merge(list(outcomes), weights) for outcomes in zip(*parts)]

    def metrics() -> dict:
        return {k: v for fn, _ in verifiers_with_weights for k, v in verifier_metrics(fn).items()}

    combined.__name__ = "+".join(getattr(fn, "__name__", "verifier") for fn, _ in verifiers_with_weights)
    combined.batch, combined.metrics = batch, metrics
    return combined


def _merge(outcomes: list[Outcome], weights: list[float]) -> Outcome:
    for bad in (OutcomeClass.INFRA_FAIL, OutcomeClass.TASK_FAIL):
        failed = next((o for o in outcomes if o.cls is bad), None)
        if failed is not None:
            return failed
    main = outcomes[0]
    reward = sum(w * o.reward for w, o in zip(weights, outcomes))
    detail = "; ".join(o.detail for o in outcomes if o.detail)
    return Outcome(main.cls, reward, main.reason, detail)


def verifier_metrics(fn: Verifier) -> dict:
    """What a verifier counts of itself (a judge's cache hit rate, ...), or nothing."""
    metrics = getattr(fn, "metrics", None)
    return metrics() if callable(metrics) else {}


def build_reward(spec: str, format_weight: float = 0.0, judge: Verifier | None = None,
                 format_spec: str = "format") -> Verifier:
    """The verifier named by ``spec`` (``judge``: the ``judge`` alone), plus the judge's weighted
    grade when one is given with another verifier, plus ``format_weight`` × the format reward
    named by ``format_spec`` (a verifier name or import path)."""
    if spec == "judge":
        if judge is None:
            raise UserError("verifier=judge: set judge.urls to the judge model's servers")
        fn = judge
    else:
        fn = resolve_verifier(spec)
    parts = [(fn, 1.0)]
    if judge is not None and spec != "judge":
        parts.append((judge, judge.cfg.weight))
    if format_weight != 0:
        parts.append((resolve_verifier(format_spec), format_weight))
    return fn if len(parts) == 1 else combine(parts)
