"""Episodes as token-exact trajectories, and their conversion to `Rollouts` for the trainer.

A `Segment` is one training sample: ``prompt_ids`` then ``completion_ids``, where the completion
interleaves the model's sampled turns and the environment's replies, ids appended verbatim.
``loss_mask`` is 1 exactly on the model's tokens; ``logprobs`` holds the sampler's log-prob at
those tokens and 0.0 at environment tokens (which nobody sampled).

An `Episode` is usually one segment. When the chat template renders the history differently from
the concatenation the model saw (a template that drops earlier ``<think>`` blocks breaks the
prefix property), the runner closes the segment and opens a new one whose prompt is the
template's rendering: each segment is then exactly what the model conditioned on, and none is
mis-aligned. All segments of an episode share its outcome and reward.
"""

from __future__ import annotations

import dataclasses

from posttrain.outcome import Outcome, OutcomeClass
from posttrain.rollout.types import Rollouts, SamplingParams


@dataclasses.dataclass
class Segment:
    prompt_ids: list[int]
    completion_ids: list[int] = dataclasses.field(default_factory=list)
    loss_mask: list[int] = dataclasses.field(default_factory=list)
    """1 on tokens the model sampled, 0 on environment tokens."""
    logprobs: list[float] = dataclasses.field(default_factory=list)
    """Sampler log-prob (full temperature-scaled) per completion token; 0.0 at environment tokens."""
    truncated_logprobs: list[float] = dataclasses.field(default_factory=list)

    def add(self, ids: list[int], *, model: bool, logprobs: list[float] | None = None,
            truncated: list[float] | None = None) -> None:
        self.completion_ids += ids
        self.loss_mask += [int(model)] * len(ids)
        self.logprobs += logprobs if model else [0.0] * len(ids)
        self.truncated_logprobs += truncated if model else [0.0] * len(ids)

    def __len__(self) -> int:
        return len(self.prompt_ids) + len(self.completion_ids)


@dataclasses.dataclass
class Episode:
    """One episode of one example (see the module docstring)."""

    example_idx: int
    segments: list[Segment]
    messages: list[dict] = dataclasses.field(default_factory=list)
    """The conversation as messages (opening messages, model turns, observations)."""
    turn_texts: list[str] = dataclasses.field(default_factory=list)
    """The model's turns as text (end-of-turn token removed)."""
    turn_rewards: list[float] = dataclasses.field(default_factory=list)
    outcome: Outcome | None = None
    finish_reason: str = "eos"
    """The last model turn's finish reason ("length" when a token limit cut the episode)."""
    tool_calls: int = 0
    tool_errors: int = 0
    prefix_breaks: int = 0
    policy_version: int = 0
    reset_s: float = 0.0
    """Seconds to make the episode's environment and reset it (its start-up overhead)."""
    proxied: bool = False
    """The model's turns were a program's calls through the endpoint (`posttrain.envs.proxy`): the
    episode counts in the ``agent/*`` metrics."""
    scores: dict[str, float] = dataclasses.field(default_factory=dict)
    """Numbers the environment reported with its last step (``info["scores"]``), e.g. a SWE task's
    ``fail_to_pass`` and ``pass_to_pass`` fractions."""

    @property
    def turns(self) -> int:
        return len(self.turn_texts)

    @property
    def reward(self) -> float:
        return self.outcome.reward if self.outcome is not None and self.outcome.is_reward else 0.0

    @property
    def model_tokens(self) -> int:
        return sum(sum(s.loss_mask) for s in self.segments)

    @property
    def env_tokens(self) -> int:
        return sum(len(s.loss_mask) - sum(s.loss_mask) for s in self.segments)


def episodes_to_rollouts(episodes: list[Episode], sampling: SamplingParams, *,
                         segments: str = "all", tokenizer=None) -> tuple[Rollouts, list[int]]:
    """``(rollouts, episode_of_row)``: one row per segment (``segments="all"``) or per episode's
    last segment (``"last"``), ``prompt_idx`` = the episode's example, ``loss_mask`` set."""
    if segments not in ("all", "last"):
        raise ValueError(f"segments must be 'all' or 'last', got {segments!r}")
    rows: list[tuple[int, Episode, Segment]] = []
    for e, ep in enumerate(episodes):
        for seg in (ep.segments if segments == "all" else ep.segments[-1:]):
            rows.append((e, ep, seg))
    texts = None
    if tokenizer is not None:
        texts = tokenizer.batch_decode([s.completion_ids for _, _, s in rows], skip_special_tokens=True)
    ro = Rollouts(prompt_idx=[ep.example_idx for _, ep, _ in rows],
                  prompt_ids=[list(s.prompt_ids) for _, _, s in rows],
                  completion_ids=[list(s.completion_ids) for _, _, s in rows],
                  logprobs=[list(s.logprobs) for _, _, s in rows],
                  finish_reason=[ep.finish_reason for _, ep, _ in rows],
                  policy_version=[ep.policy_version for _, ep, _ in rows], sampling=sampling,
                  truncated_logprobs=[list(s.truncated_logprobs) for _, _, s in rows], texts=texts,
                  loss_mask=[list(s.loss_mask) for _, _, s in rows])
    return ro, [e for e, _, _ in rows]


def episode_metrics(episodes: list[Episode], prefix: str = "env") -> dict:
    """Per-step (or per-evaluation) means: turns, tool calls and the tool-error fraction, tokens;
    and ``time/env_reset_ms_mean``, an episode's start-up (making and resetting its environment:
    1000 / it is the resets per second one thread makes)."""
    n = max(len(episodes), 1)
    calls = sum(e.tool_calls for e in episodes)
    return {
        f"{prefix}/turns_mean": sum(e.turns for e in episodes) / n,
        f"{prefix}/tool_calls_mean": calls / n,
        f"{prefix}/tool_error_frac": sum(e.tool_errors for e in episodes) / calls if calls else 0.0,
        f"{prefix}/model_tokens_mean": sum(e.model_tokens for e in episodes) / n,
        f"{prefix}/env_tokens_mean": sum(e.env_tokens for e in episodes) / n,
        f"{prefix}/prefix_break_frac": sum(e.prefix_breaks > 0 for e in episodes) / n,
        f"{prefix}/segments_mean": sum(len(e.segments) for e in episodes) / n,
        f"{prefix}/pass_frac": sum(e.outcome is not None and e.outcome.cls is OutcomeClass.PASS
                                   for e in episodes) / n,
        "time/env_reset_ms_mean": 1000 * sum(e.reset_s for e in episodes) / n,
        **score_means(episodes, prefix),
        **agent_metrics([e for e in episodes if e.proxied]),
    }


def agent_metrics(episodes: list[Episode]) -> dict:
    """Per proxied episode (means): ``agent/calls`` (model calls answered), ``agent/rows`` (samples),
    ``agent/tokens`` (prompt and completion tokens over its rows); ``agent/rerender_breaks``: the
    new rows started because a call did not extend the previous one (in all, not a mean)."""
    if not episodes:
        return {}
    n = len(episodes)
    return {"agent/calls": sum(e.turns for e in episodes) / n,
            "agent/rows": sum(len(e.segments) for e in episodes) / n,
            "agent/tokens": sum(len(s) for e in episodes for s in e.segments) / n,
            "agent/rerender_breaks": sum(e.prefix_breaks for e in episodes)}


def score_means(episodes, prefix: str = "env") -> dict[str, float]:
    """``{prefix}/{key}_mean`` of each score, over the episodes that reported it."""
    keys = sorted({k for e in episodes for k in e.scores})
    return {f"{prefix}/{k}_mean": sum(e.scores[k] for e in episodes if k in e.scores)
            / sum(k in e.scores for e in episodes) for k in keys}
