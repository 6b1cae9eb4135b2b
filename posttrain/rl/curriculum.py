"""Pass-rate store and curriculum: draw the prompts that still teach something.

A group whose G samples all pass (or all fail) has zero group-relative advantage: it costs a
generation and gives no gradient. The `PassRateStore` keeps, per dataset prompt, its attempts and
passes over its last ``window`` judged samples (INFRA/TASK failures are not attempts). The
`CurriculumSource` draws prompts with weights from that pass rate p:

* unseen, or fewer than ``min_attempts`` attempts: 1 (explore);
* 0 < p < 1 (informative): max(4 p (1 - p), 0.25), highest at p = 1/2;
* p = 1 (solved by every recent sample): ``solved_weight`` (0 = retired);
* p = 0 (solved by none): ``unsolved_weight``.

Every ``recheck_every`` draws, one draw goes to the retired or unsolved prompt seen longest ago, so
a prompt the policy has since forgotten (or learnt) comes back. Draws are seeded
(``torch.multinomial`` with a checkpointed generator), so a resumed run draws what the
uninterrupted one would have. With the curriculum off, prompts come from the plain seeded shuffle
(`posttrain.rl.prompts.PromptSource`) exactly as before, and the store still records pass rates for
the logs (``curriculum/*``): solve-all / solve-none fractions use the same
`posttrain.algos.passk.solve_fractions` as the evaluator.
"""

from __future__ import annotations

import dataclasses

import torch

from posttrain.config import ConfigValueError
from posttrain.outcome import OutcomeClass
from posttrain.rl.prompts import PromptSource


@dataclasses.dataclass(kw_only=True)
class CurriculumConfig:
    enabled: bool = False
    """Draw prompts by pass rate (informative ones more often, solved ones retired); false = plain shuffle."""
    window: int = 32
    """A prompt's pass rate is over its last `window` judged samples, so a re-check can change it."""
    min_attempts: int = 4
    """Judged samples before a prompt's pass rate steers its weight (before that: weight 1)."""
    solved_weight: float = 0.0
    """Weight of a prompt that every recent sample solved; 0 = retired (until a re-check)."""
    unsolved_weight: float = 0.1
    """Weight of a prompt that no recent sample solved."""
    recheck_every: int = 64
    """Every N draws, one goes to the retired/unsolved prompt seen longest ago; 0 = never."""

    def __post_init__(self):
        if self.window < 1 or self.min_attempts < 1:
            raise ConfigValueError("window" if self.window < 1 else "min_attempts", "must be >= 1")
        if self.min_attempts > self.window:
            raise ConfigValueError("min_attempts", "must be <= window")
        for key in ("solved_weight", "unsolved_weight"):
            if not 0.0 <= getattr(self, key) <= 1.0:
                raise ConfigValueError(key, "must be in [0, 1]")
        if self.recheck_every < 0:
            raise ConfigValueError("recheck_every", "must be >= 0")


class PassRateStore:
    """Per-prompt recent pass/fail bits (last ``window``), lifetime totals, and when each was last seen."""

    def __init__(self, num_prompts: int, window: int):
        self.window = window
        self.recent: list[list[int]] = [[] for _ in range(num_prompts)]
        self.attempts = [0] * num_prompts
        self.passes = [0] * num_prompts
        self.last_seen = [-1] * num_prompts  # draw counter when last observed

    def observe(self, index: int, passed: list[bool], clock: int) -> None:
        bits = self.recent[index] + [int(p) for p in passed]
        self.recent[index] = bits[-self.window:]
        self.attempts[index] += len(passed)
        self.passes[index] += sum(passed)
        self.last_seen[index] = clock

    def rate(self, index: int) -> tuple[int, float]:
        bits = self.recent[index]
        return len(bits), (sum(bits) / len(bits) if bits else 0.0)

    def state_dict(self) -> dict:
        return {"recent": [list(b) for b in self.recent], "attempts": list(self.attempts),
                "passes": list(self.passes), "last_seen": list(self.last_seen)}

    def load_state_dict(self, d: dict) -> None:
        self.recent, self.attempts = [list(b) for b in d["recent"]], list(d["attempts"])
        self.passes, self.last_seen = list(d["passes"]), list(d["last_seen"])


class CurriculumSource:
    """Prompt source (``next(k)`` -> [(dataset index, record)]) steered by a `PassRateStore`."""

    def __init__(self, examples: list[dict], seed: int, cfg: CurriculumConfig):
        self.plain = PromptSource(examples, seed)
        self.examples, self.cfg = examples, cfg
        self.store = PassRateStore(len(examples), cfg.window)
        self.gen = torch.Generator().manual_seed(seed * 7_919 + 17)
        self.draws = 0
        self.rechecks = 0

    def weight(self, index: int) -> float:
        n, p = self.store.rate(index)
        if n < self.cfg.min_attempts:
            return 1.0
        if p >= 1.0:
            return self.cfg.solved_weight
        if p <= 0.0:
            return self.cfg.unsolved_weight
        return max(4.0 * p * (1.0 - p), 0.25)

    def weights(self) -> torch.Tensor:
        return torch.tensor([self.weight(i) for i in range(len(self.examples))], dtype=torch.float64)

    def next(self, k: int) -> list[tuple[int, dict]]:
        if not self.cfg.enabled:
            return self.plain.next(k)
        w = self.weights()
        picked = self._recheck(w, k)
        live = w.clone()
        live[picked] = 0.0
        rest = k - len(picked)
        if rest:
            if int((live > 0).sum()) < rest:  # everything retired: fall back to uniform over the rest
                live = torch.ones_like(w)
                live[picked] = 0.0
            picked += torch.multinomial(live, rest, replacement=False, generator=self.gen).tolist()
        self.draws += k
        return [(i, self.examples[i]) for i in picked]

    def _recheck(self, w: torch.Tensor, k: int) -> list[int]:
        every = self.cfg.recheck_every
        if not every or (self.draws + k) // every == self.draws // every:
            return []
        low = [i for i in range(len(w)) if w[i] < 0.25 and self.store.recent[i]]
        if not low:
            return []
        self.rechecks += 1
        return [min(low, key=lambda i: self.store.last_seen[i])]

    def observe(self, indices: list[int], outcomes: list, group_size: int) -> None:
        """Record each prompt's group: PASS counts as solved, MODEL_FAIL as not; other classes are skipped."""
        for j, index in enumerate(indices):
            group = outcomes[j * group_size: (j + 1) * group_size]
            self.store.observe(index, [o.cls is OutcomeClass.PASS for o in group if o.is_reward], self.draws)

    def metrics(self) -> dict:
        from posttrain.algos.passk import solve_fractions

        seen = [i for i, b in enumerate(self.store.recent) if len(b) >= self.cfg.min_attempts]
        out = {"curriculum/seen_frac": sum(1 for b in self.store.recent if b) / len(self.examples),
               "curriculum/rechecks": self.rechecks}
        if seen:
            all_, none = solve_fractions([len(self.store.recent[i]) for i in seen],
                                         [sum(self.store.recent[i]) for i in seen])
            out |= {"curriculum/solve_all_frac": all_, "curriculum/solve_none_frac": none,
                    "curriculum/informative_frac": 1.0 - all_ - none}
        if self.cfg.enabled:
            out["curriculum/retired"] = sum(1 for i in seen if self.weight(i) == 0.0)
        return out

    def state_dict(self) -> dict:
        return {**self.plain.state_dict(), "store": self.store.state_dict(), "gen": self.gen.get_state(),
                "draws": self.draws, "rechecks": self.rechecks}

    def load_state_dict(self, state: dict) -> None:
        self.plain.load_state_dict(state)
        if "store" in state:  # checkpoints from before the store only hold the shuffle position
            self.store.load_state_dict(state["store"])
            self.gen.set_state(state["gen"])
            self.draws, self.rechecks = state["draws"], state["rechecks"]
