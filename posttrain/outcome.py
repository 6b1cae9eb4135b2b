"""The verdict of anything that judges a completion: a verifier, the code sandbox, a reward model.

Four classes (docs/rl.md, "Outcomes"):

- ``PASS``        the completion is right; reward is the verifier's score (1.0 for binary checks).
- ``MODEL_FAIL``  the completion is wrong; ``reason`` says how: wrong_answer, runtime_error,
                  timeout, memory, output_limit, no_verdict, forbidden, format.
- ``TASK_FAIL``   the task itself is broken here (its reference does not pass, no answer given).
- ``INFRA_FAIL``  the machinery failed (a verifier raised, a sandbox worker died).

Only PASS and MODEL_FAIL are rewards. TASK_FAIL and INFRA_FAIL carry no learning signal: the RL
loop masks them from the gradient and counts them, so a dead sandbox is never scored as a wrong
answer.

`checked` is the one gate every reward passes where it enters (verifiers, environments): a NaN or
infinite reward is INFRA_FAIL, since one would turn its whole group's advantages into NaN.
"""

from __future__ import annotations

import dataclasses
import enum
import math


class OutcomeClass(str, enum.Enum):
    PASS = "PASS"
    MODEL_FAIL = "MODEL_FAIL"
    TASK_FAIL = "TASK_FAIL"
    INFRA_FAIL = "INFRA_FAIL"


MODEL_FAIL_REASONS = (
    "wrong_answer",
    "runtime_error",
    "timeout",
    "memory",
    "output_limit",
    "no_verdict",
    "forbidden",
    "format",
)


@dataclasses.dataclass(frozen=True)
class Outcome:
    """One judged completion.

    ``reward`` is meaningful only when ``is_reward`` (PASS or MODEL_FAIL); for the other classes
    it is 0.0 and must not reach the gradient.
    """

    cls: OutcomeClass
    reward: float = 0.0
    reason: str = ""
    detail: str = ""

    @property
    def is_reward(self) -> bool:
        return self.cls in (OutcomeClass.PASS, OutcomeClass.MODEL_FAIL)

    @staticmethod
    def passed(reward: float = 1.0, detail: str = "") -> "Outcome":
        return Outcome(OutcomeClass.PASS, reward, "", detail)

    @staticmethod
    def model_fail(reason: str = "wrong_answer", reward: float = 0.0, detail: str = "") -> "Outcome":
        return Outcome(OutcomeClass.MODEL_FAIL, reward, reason, detail)

    @staticmethod
    def task_fail(reason: str, detail: str = "") -> "Outcome":
        return Outcome(OutcomeClass.TASK_FAIL, 0.0, reason, detail)

    @staticmethod
    def infra_fail(reason: str, detail: str = "") -> "Outcome":
        return Outcome(OutcomeClass.INFRA_FAIL, 0.0, reason, detail)


def checked(outcome: Outcome) -> Outcome:
    """``outcome``, or INFRA_FAIL (``verifier_error``) when it is a reward that is not a finite number:
    whatever produced it failed, and a NaN would spread to every advantage of its group."""
    if not outcome.is_reward:
        return outcome
    try:
        finite = math.isfinite(outcome.reward)
    except TypeError:
        finite = False
    if finite:
        return outcome
    return Outcome.infra_fail("verifier_error", f"{outcome.cls.value} with reward {outcome.reward!r}, "
                                                "not a finite number")


UNGRADED_MARK = 0.5
"""An evaluation or step with at least this share of masked samples (TASK_FAIL, INFRA_FAIL) is
marked as mostly ungraded: its pass rate then says more about the judge than the model."""


def ungraded_fracs(outcomes: list[Outcome]) -> dict[str, float]:
    """The share of masked samples per ``CLASS/reason`` ("INFRA_FAIL/judge_unparseable"), largest first."""
    counts: dict[str, int] = {}
    for o in outcomes:
        if not o.is_reward:
            key = f"{o.cls.value}/{o.reason or 'unspecified'}"
            counts[key] = counts.get(key, 0) + 1
    return {k: v / len(outcomes) for k, v in sorted(counts.items(), key=lambda kv: -kv[1])}


def ungraded_metrics(fracs: dict[str, float], head: str) -> dict[str, float]:
    """``<head>/ungraded_frac`` and, per reason, ``<head>/ungraded/<CLASS>/<reason>_frac``: an eval
    whose samples were mostly not graded is told apart from one the model failed (the RL watchdog
    warns on it)."""
    return {f"{head}/ungraded_frac": sum(fracs.values()),
            **{f"{head}/ungraded/{key}_frac": v for key, v in fracs.items()}}
