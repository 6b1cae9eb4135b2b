"""Prompt order for RL: a seeded shuffle per epoch, resumable from a position.

The order is a pure function of (seed, epoch), so a resumed run continues with exactly the
prompts an uninterrupted run would have seen next.
"""

from __future__ import annotations

import torch


class PromptSource:
    def __init__(self, examples: list[dict], seed: int = 0):
        if not examples:
            raise ValueError("no prompts")
        self.examples = examples
        self.seed = seed
        self.position = 0  # prompts handed out so far, across epochs

    def _order(self, epoch: int) -> list[int]:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(len(self.examples), generator=gen).tolist()

    def next(self, k: int) -> list[tuple[int, dict]]:
        """The next ``k`` prompts as (dataset index, record)."""
        out = []
        n = len(self.examples)
        for _ in range(k):
            epoch, offset = divmod(self.position, n)
            if offset == 0 or not hasattr(self, "_cached") or self._cached[0] != epoch:
                self._cached = (epoch, self._order(epoch))
            i = self._cached[1][offset]
            out.append((i, self.examples[i]))
            self.position += 1
        return out

    def state_dict(self) -> dict:
        return {"position": self.position, "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        self.position, self.seed = state["position"], state["seed"]
