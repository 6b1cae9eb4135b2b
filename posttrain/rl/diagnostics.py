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

`write_samples` appends a few rollouts of each step to ``samples.jsonl`` as text, since a number
(a reward stuck at 0.06) does not say why: truncated completions, the wrong format, an
explanation before the code. It picks the best and the worst sample of the first groups, as
TRL's completion table and verl's rollout dumps show text beside the score, but a few lines a
step instead of every rollout, so the file stays small enough to read over a long run.
"""

from __future__ import annotations

import collections
import json
import statistics
from pathlib import Path

from posttrain.outcome import UNGRADED_MARK, Outcome, OutcomeClass
from posttrain.tracking import SAMPLES_FILE

DETAIL_CHARS = 1000  # a verdict's detail can hold a program's whole output; its head says why


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


def picked_episodes(outcomes: list[Outcome], group_size: int, n: int) -> list[int]:
    """The ``n`` episodes of a step that `write_samples` writes: group by group, each group's best
    then its worst; past two a group (more lines than twice the groups), each group's second best
    and second worst, and so on. Best is the highest reward (a masked outcome, INFRA_FAIL or
    TASK_FAIL, ranks below every reward); ties go to the earlier sample."""
    order = []
    for g in range(len(outcomes) // group_size):
        ranked = sorted(range(g * group_size, (g + 1) * group_size),
                        key=lambda e: (not outcomes[e].is_reward, -outcomes[e].reward, e))
        ends = [ranked[i // 2] if i % 2 == 0 else ranked[-1 - i // 2] for i in range(group_size)]
        order += [(i // 2, g, i % 2, e) for i, e in enumerate(ends)]
    return [e for *_, e in sorted(order)[:n]]


def write_samples(run_dir: Path, step: int, rollouts, outcomes: list[Outcome], episode_of_row: list[int], *,
                  tokenizer, group_size: int, n: int) -> None:
    """Append ``n`` of the step's episodes (`picked_episodes`) to ``run_dir/samples.jsonl``, one
    JSON object each. An episode of several rows (a multi-turn episode split where the chat
    template drops earlier turns) is written as its last row, whose prompt holds the earlier turns."""
    if n <= 0:
        return
    lines = []
    for e in picked_episodes(outcomes, group_size, n):
        rows = [r for r, ep in enumerate(episode_of_row) if ep == e]
        if not rows:  # an episode that ended before the model wrote anything has no text to show
            continue
        line = {"step": step, "group": e // group_size, "sample": e % group_size}
        lines.append(json.dumps(line | sample_line(rollouts, rows, outcomes[e], tokenizer), ensure_ascii=False))
    Path(run_dir).mkdir(parents=True, exist_ok=True)  # a step run on its own, outside `drive_rl`, has no run yet
    with (Path(run_dir) / SAMPLES_FILE).open("a") as f:
        f.write("".join(line + "\n" for line in lines))


def sample_line(rollouts, rows: list[int], outcome: Outcome, tokenizer) -> dict:
    """One episode (its ``rows`` of ``rollouts``) as text: the prompt as the model saw it (special
    tokens and chat template kept), the completion as the verifier judged it."""
    r = rows[-1]
    completion = rollouts.texts[r] if rollouts.texts is not None else \
        tokenizer.decode(rollouts.completion_ids[r], skip_special_tokens=True)
    lengths = rollouts.model_tokens()
    return {"policy_version": rollouts.policy_version[r], "reward": outcome.reward, "outcome": outcome.cls.value,
            "reason": outcome.reason, "detail": outcome.detail[:DETAIL_CHARS],
            "finish_reason": rollouts.finish_reason[r], "completion_tokens": sum(lengths[i] for i in rows),
            "prompt": tokenizer.decode(rollouts.prompt_ids[r], skip_special_tokens=False), "completion": completion}


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
