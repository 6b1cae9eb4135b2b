"""Per-step diagnostics that reveal a failing RL run before the reward does, and loud warnings.

Metric names follow docs/rl.md: ``reward/mean``, ``entropy``, ``response_length/mean``,
``groups/zero_variance_frac``, ``mismatch/kl``, ``mismatch/logprob_abs_diff_max``,
``outcomes/<class>_frac`` and more.

``Watchdog`` prints a warning once per kind when entropy collapses (the policy has become
near-deterministic: exploration is gone), when the sampler/trainer mismatch jumps (a weight-sync
or precision bug, or a stale sampler), or when every group is zero-variance (no gradient at all:
the data is too easy or too hard for the current policy).
"""

from __future__ import annotations

import collections
import statistics

from posttrain.outcome import Outcome, OutcomeClass


def rollout_metrics(rollouts, outcomes: list[Outcome], zero_variance_frac: float) -> dict:
    """Rewards and outcome classes per episode (``outcomes``: one per completion or multi-turn
    episode); ``samples`` counts the rows trained on (an episode split in two is two samples);
    ``response_length/*`` count the tokens the model generated (a multi-turn row's environment
    tokens are ``tokens/env``), per episode for the mean."""
    lengths = rollouts.model_tokens()
    n = len(outcomes)
    rewards = [o.reward for o in outcomes if o.is_reward]
    m = {
        "reward/mean": sum(rewards) / len(rewards) if rewards else 0.0,
        "reward/pass_frac": sum(o.cls is OutcomeClass.PASS for o in outcomes) / n,
        "response_length/mean": sum(lengths) / n,
        "response_length/max": max(lengths),
        "response_length/truncated_frac": sum(r == "length" for r in rollouts.finish_reason) / len(rollouts),
        "groups/zero_variance_frac": zero_variance_frac,
        "samples": len(rollouts),
        "tokens/env": sum(len(c) for c in rollouts.completion_ids) - sum(lengths),
    }
    for cls in OutcomeClass:
        m[f"outcomes/{cls.value}_frac"] = sum(o.cls is cls for o in outcomes) / n
    # why samples failed, masked ones too (a tool that hangs: INFRA_FAIL/env_timeout)
    reasons = collections.Counter(f"outcomes/{o.cls.value}/{o.reason}_frac" for o in outcomes
                                  if o.cls is not OutcomeClass.PASS and o.reason)
    m.update({key: count / n for key, count in reasons.items()})
    return m


class Watchdog:
    def __init__(self, printer=print, entropy_floor: float = 0.05, mismatch_jump: float = 10.0,
                 zero_variance_warning: bool = True):
        # Off where equal rewards in a group still teach: PPO's critic, a teacher's per-token signal.
        self.zero_variance_warning = zero_variance_warning
        self.printer = printer
        self.entropy_floor = entropy_floor
        self.mismatch_jump = mismatch_jump
        self.warned: set[str] = set()
        self.first_entropy: float | None = None
        self.mismatch_history: list[float] = []

    def _warn(self, kind: str, message: str) -> None:
        if kind not in self.warned:
            self.warned.add(kind)
            self.printer(f"WARNING [{kind}] {message}")

    def check(self, step: int, m: dict) -> None:
        ent = m.get("entropy")
        if ent is not None:
            if self.first_entropy is None:
                self.first_entropy = ent
            elif ent < 0.1 * self.first_entropy or ent < self.entropy_floor <= self.first_entropy:
                # the absolute floor only for runs that started above it: an SFT start already that
                # certain (a solved task) is not a collapse, only a tenfold drop from it is
                self._warn("entropy_collapse", f"step {step}: policy entropy {ent:.4f} (started at "
                           f"{self.first_entropy:.4f}); sampling has become near-deterministic")
        kl = m.get("mismatch/kl")
        if kl is not None:
            if len(self.mismatch_history) >= 3:
                base = statistics.median(self.mismatch_history)
                if kl > 1e-3 and kl > self.mismatch_jump * max(base, 1e-6):
                    self._warn("mismatch_jump", f"step {step}: sampler/trainer mismatch KL {kl:.2e} is "
                               f"{kl / max(base, 1e-9):.0f}x its median; check weight sync and dtypes")
            self.mismatch_history.append(kl)
        if self.zero_variance_warning and m.get("groups/zero_variance_frac", 0.0) >= 1.0:
            self._warn("all_zero_variance", f"step {step}: every group has equal rewards, so there is no "
                       "gradient; the prompts are too easy or too hard (try dynamic_sampling.enabled=true)")
