"""Per-step diagnostics that reveal a failing RL run before the reward does, and loud warnings.

Metric names follow docs/rl.md: ``reward/mean``, ``entropy``, ``response_length/mean``,
``groups/zero_variance_frac``, ``mismatch/kl``, ``mismatch/logprob_abs_diff_max``,
``outcomes/<class>_frac`` and more.

``Watchdog`` prints a warning once per kind when entropy collapses (the policy has become
near-deterministic: exploration is gone), when the sampler/trainer mismatch jumps (a weight-sync
or precision bug, or a stale sampler), when most samples went ungraded (INFRA_FAIL/TASK_FAIL,
masked: a judge or sandbox that grades nothing), or when every group is zero-variance (no gradient
at all: the data is too easy or too hard for the current policy).

Entropy collapse is judged against the run's own start (the median of its first steps), never an
absolute number: an SFT start on a nearly solved task is already certain, and sharpening it is
not a collapse. Medians over a few steps keep one noisy step from starting or ending a warning.
"""

from __future__ import annotations

import collections
import statistics

from posttrain.outcome import UNGRADED_MARK, Outcome, OutcomeClass


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


def ungraded_share(m: dict) -> tuple[float, str]:
    """The share of samples masked as INFRA_FAIL or TASK_FAIL in one step's metrics, and their
    reasons, largest first ("INFRA_FAIL/judge_unparseable 100%")."""
    share = m.get("outcomes/INFRA_FAIL_frac", 0.0) + m.get("outcomes/TASK_FAIL_frac", 0.0)
    reasons = sorted(((v, k[len("outcomes/"):-len("_frac")]) for k, v in m.items()
                      if k.startswith(("outcomes/INFRA_FAIL/", "outcomes/TASK_FAIL/")) and k.endswith("_frac")),
                     reverse=True)
    return share, ", ".join(f"{name} {v:.0%}" for v, name in reasons) or "no reason recorded"


class Watchdog:
    def __init__(self, printer=print, entropy_drop: float = 0.1, entropy_window: int = 3,
                 mismatch_jump: float = 10.0, ungraded_warn: float = UNGRADED_MARK, zero_variance_warning: bool = True):
        # Off where equal rewards in a group still teach: PPO's critic, a teacher's per-token signal.
        self.zero_variance_warning = zero_variance_warning
        self.printer = printer
        self.entropy_drop = entropy_drop
        self.entropy_window = entropy_window
        self.mismatch_jump = mismatch_jump
        self.ungraded_warn = ungraded_warn
        self.warned: set[str] = set()
        self.entropy_history: list[float] = []
        self.mismatch_history: list[float] = []

    def _warn(self, kind: str, message: str) -> None:
        if kind not in self.warned:
            self.warned.add(kind)
            self.printer(f"WARNING [{kind}] {message}")

    def _check_entropy(self, step: int, ent: float) -> None:
        hist, w = self.entropy_history, self.entropy_window
        hist.append(ent)
        if len(hist) <= w:  # the start is still being measured
            return
        start, now = statistics.median(hist[:w]), statistics.median(hist[-w:])
        if now < self.entropy_drop * start:
            self._warn("entropy_collapse", f"step {step}: policy entropy {now:.4f} (median of the last {w} "
                       f"steps) is under {self.entropy_drop:g}x the run's start ({start:.4f}); sampling has "
                       "become near-deterministic")

    def check(self, step: int, m: dict) -> None:
        ent = m.get("entropy")
        if ent is not None:
            self._check_entropy(step, ent)
        kl = m.get("mismatch/kl")
        if kl is not None:
            if len(self.mismatch_history) >= 3:
                base = statistics.median(self.mismatch_history)
                if kl > 1e-3 and kl > self.mismatch_jump * max(base, 1e-6):
                    self._warn("mismatch_jump", f"step {step}: sampler/trainer mismatch KL {kl:.2e} is "
                               f"{kl / max(base, 1e-9):.0f}x its median; check weight sync and dtypes")
            self.mismatch_history.append(kl)
        share, reasons = ungraded_share(m)
        if share >= self.ungraded_warn:
            self._warn("ungraded", f"step {step}: {share:.0%} of samples were not graded ({reasons}); they are "
                       "masked from the gradient, so the verifier, judge or sandbox is failing, not the model")
        elif self.zero_variance_warning and m.get("groups/zero_variance_frac", 0.0) >= 1.0:
            self._warn("all_zero_variance", f"step {step}: every group has equal rewards, so there is no "
                       "gradient; the prompts are too easy or too hard (try dynamic_sampling.enabled=true)")
        self._check_evals(step, m)

    def _check_evals(self, step: int, m: dict) -> None:
        """A held-out eval whose samples were mostly ungraded: its pass@1 counts them as failed."""
        for key in [k for k in m if k.startswith("eval/") and k.endswith("/ungraded_frac")]:
            head = key[:-len("/ungraded_frac")]
            if m[key] < self.ungraded_warn:
                continue
            prefix = f"{head}/ungraded/"
            reasons = ", ".join(f"{k[len(prefix):-len('_frac')]} {v:.0%}" for k, v in m.items() if k.startswith(prefix))
            self._warn(f"eval_ungraded {head}", f"step {step}: {m[key]:.0%} of the held-out samples were not "
                       f"graded ({reasons}); pass@1 {m.get(head + '/pass@1', 0.0):.3f} counts them as failed, "
                       "so it measures the judge, not the model")
