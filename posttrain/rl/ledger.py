"""The prompt ledger: where every prompt drawn for training is, so none is lost or trained twice.

Each draw from the prompt source becomes an entry with a serial ``uid`` (a prompt drawn again in a
later epoch is a new entry) and moves through

    pending -> in_flight -> completed -> trained
                         \\-> dropped (with a reason, e.g. zero_variance under dynamic sampling)

``in_flight`` entries go back to ``pending`` when their request is lost (a resume: requests in the
dead process's pipe are gone) or when a completed group would break the staleness bound; pending
entries are dispatched before new draws. The ledger is saved in every checkpoint with the buffered
(completed) rollouts, so a run killed at any point resumes with each entry exactly where it was at
the checkpoint: nothing trained after the checkpoint counts, nothing drawn before it is forgotten.

States are kept as one small list per entry, so a long run's ledger stays cheap to checkpoint.
"""

from __future__ import annotations

import collections

STATES = ("pending", "in_flight", "completed", "trained", "dropped")


class LedgerError(RuntimeError):
    """An entry was asked to make a move its state does not allow: a bookkeeping bug, stop loudly."""


class PromptLedger:
    def __init__(self):
        self.index: list[int] = []        # uid -> dataset index
        self.state: list[str] = []        # uid -> one of STATES
        self.step: list[int] = []         # uid -> step it was trained in (-1 if not trained)
        self.version: list[int] = []      # uid -> policy version of its completed rollouts (-1 if none)
        self.reason: dict[int, str] = {}  # uid -> why it was dropped / last re-queued
        self.requeued: dict[int, int] = {}  # uid -> times sent back to pending

    def __len__(self) -> int:
        return len(self.index)

    def add(self, dataset_indices: list[int]) -> list[int]:
        """New pending entries for freshly drawn prompts; returns their uids."""
        start = len(self.index)
        for i in dataset_indices:
            self.index.append(int(i))
            self.state.append("pending")
            self.step.append(-1)
            self.version.append(-1)
        return list(range(start, len(self.index)))

    def _move(self, uid: int, allowed: tuple[str, ...], to: str) -> None:
        if self.state[uid] not in allowed:
            raise LedgerError(f"prompt uid {uid} (dataset index {self.index[uid]}) is {self.state[uid]}, "
                              f"cannot become {to}")
        self.state[uid] = to

    def pending(self) -> list[int]:
        return [u for u, s in enumerate(self.state) if s == "pending"]

    def dispatch(self, uids: list[int]) -> None:
        for u in uids:
            self._move(u, ("pending",), "in_flight")

    def complete(self, uid: int, version: int) -> None:
        self._move(uid, ("in_flight",), "completed")
        self.version[uid] = version

    def train(self, uid: int, step: int) -> None:
        self._move(uid, ("completed",), "trained")
        self.step[uid] = step

    def drop(self, uid: int, reason: str) -> None:
        self._move(uid, ("in_flight", "completed"), "dropped")
        self.reason[uid] = reason

    def requeue(self, uid: int, reason: str) -> None:
        self._move(uid, ("in_flight", "completed"), "pending")
        self.version[uid] = -1
        self.reason[uid] = reason
        self.requeued[uid] = self.requeued.get(uid, 0) + 1

    def requeue_in_flight(self, reason: str) -> int:
        lost = [u for u, s in enumerate(self.state) if s == "in_flight"]
        for u in lost:
            self.requeue(u, reason)
        return len(lost)

    def counts(self) -> dict[str, int]:
        c = collections.Counter(self.state)
        return {s: c.get(s, 0) for s in STATES}

    def trained_by_step(self) -> dict[int, list[int]]:
        out: dict[int, list[int]] = collections.defaultdict(list)
        for u, s in enumerate(self.step):
            if s >= 0:
                out[s].append(u)
        return dict(out)

    def state_dict(self) -> dict:
        return {"index": list(self.index), "state": list(self.state), "step": list(self.step),
                "version": list(self.version), "reason": dict(self.reason), "requeued": dict(self.requeued)}

    def load_state_dict(self, d: dict) -> None:
        self.index, self.state = list(d["index"]), list(d["state"])
        self.step, self.version = list(d["step"]), list(d["version"])
        self.reason, self.requeued = dict(d["reason"]), dict(d["requeued"])

    def summary(self) -> dict:
        """A JSON-able view for the run directory (ledger.json) and for humans checking a run."""
        return {"counts": self.counts(), "entries": [
            {"uid": u, "index": self.index[u], "state": self.state[u], "step": self.step[u],
             "version": self.version[u], **({"reason": self.reason[u]} if u in self.reason else {}),
             **({"requeued": self.requeued[u]} if u in self.requeued else {})}
            for u in range(len(self.index))]}
