"""The environment interface: ``reset(example) -> messages``, ``step(text) -> StepResult``.

An environment is a small stateful object, one per episode (a factory makes a fresh one for each
of the G episodes of an example). The runner (`posttrain.envs.runner`) owns everything about
tokens: it renders the messages with the tokenizer's chat template, samples the model's turn,
hands the *text* of the turn to ``step`` and appends the ids of the environment's reply verbatim.
An environment therefore never sees or produces token ids, and cannot mis-align a trajectory.

Who is at fault, and the outcome class (`posttrain.outcome`):

- the model wrote something wrong (a malformed tool call, a wrong final answer, too many turns):
  the environment says so with ``Outcome.model_fail(reason)`` — a reward, usually 0;
- the example is broken here (no reference answer, tests that cannot run): raise `EnvTaskError`
  (or return ``Outcome.task_fail``) — TASK_FAIL, masked from the gradient and counted;
- the machinery failed (a service is down, a sandbox died): raise `EnvInfraError` — INFRA_FAIL.
  Any *other* exception escaping ``reset`` or ``step``, and a ``step`` that overruns its time
  limit, is also INFRA_FAIL: a crashing environment must never read as "the model was wrong".

The run goes on in every case: only that episode ends.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from posttrain.outcome import Outcome


class EnvTaskError(Exception):
    """The example cannot be run here (TASK_FAIL): raise from ``reset`` or ``step``; ``reason``
    names the outcome's reason (default ``env_task_error``)."""

    def __init__(self, message: str = "", reason: str = ""):
        super().__init__(message)
        self.reason = reason


class EnvInfraError(Exception):
    """The environment's machinery failed (INFRA_FAIL): raise from ``reset``, ``step`` or a tool;
    ``reason`` names the outcome's reason (default ``env_infra_error``)."""

    def __init__(self, message: str = "", reason: str = ""):
        super().__init__(message)
        self.reason = reason


@dataclasses.dataclass
class StepResult:
    """What the environment answers to one model turn."""

    observation: list[dict] | str = dataclasses.field(default_factory=list)
    """Messages appended to the conversation before the model's next turn (a string is one user
    message); ignored when ``done``."""
    reward: float = 0.0
    """This turn's reward (logged per turn; the episode's reward is its outcome's)."""
    done: bool = False
    """The episode is over."""
    outcome: Outcome | None = None
    """The episode's verdict when ``done``; None = PASS with ``reward`` when reward >= 1, else
    MODEL_FAIL("wrong_answer") with ``reward``."""
    history: list[dict] | None = None
    """The whole conversation the next model turn continues, when the environment rewrote it
    (a program that dropped or summarised turns) instead of adding to it: the runner starts a new
    sample from its rendering (a prefix break; ``observation`` is then ignored)."""
    info: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Counters the runner sums over the episode: ``tool_calls``, ``tool_errors`` (ints)."""


class Environment:
    """Base class of a multi-turn environment (see the module docstring).

    Subclasses implement `reset` and `step`; ``stop`` adds stop strings to the model's turns
    (e.g. ``</tool_call>``), ``max_turns`` caps the episode's model turns (the runner's limit
    applies too; the smaller wins).
    """

    stop: list[str] = []
    max_turns: int | None = None

    def reset(self, example: dict) -> list[dict]:
        """The opening messages of an episode on ``example`` (system, user, ...)."""
        raise NotImplementedError

    def step(self, text: str) -> StepResult:
        """React to the model's turn ``text`` (special tokens removed)."""
        raise NotImplementedError

    def on_limit(self, why: str) -> Outcome:
        """The verdict when the runner ends the episode at a limit (``why``: max_turns or
        max_tokens) before the environment said done. Default: MODEL_FAIL with that reason."""
        return Outcome.model_fail(why)

    def close(self) -> None:
        """Release what the episode holds (called once, whatever happened)."""


def default_outcome(reward: float) -> Outcome:
    """The verdict of a finished step that named none: PASS at reward >= 1, else MODEL_FAIL."""
    return Outcome.passed(reward) if reward >= 1.0 else Outcome.model_fail("wrong_answer", reward=reward)
