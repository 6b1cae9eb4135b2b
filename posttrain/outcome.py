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
