"""The one optimizer step under every trainer: micro-batches → backward → clip → step → schedule.

``TrainCore.step(micro_batches, loss_fn)`` is the tail every trainer used to carry its own copy of.
``loss_fn(mb) -> (loss, metrics)`` returns this micro-batch's share of the step's loss, already
divided by the step's *global* denominator (token or sequence counts summed over every micro-batch
of every rank, see ``World.all_reduce``), and metrics already weighted so that their sum over the
step is the step's value — except extremes (keys ending in ``_max`` / ``_min``), which are the
micro-batch's own extreme, unweighted, and reduce by max / min over micro-batches and ranks
(`share_of_step`). Then gradient accumulation and sharding change nothing: the summed gradient is
the gradient of one big batch, at any world size and any micro-batch size.

Every rank must run the same number of micro-batches (sharded layers all-gather in lock step);
the trainers split their data so that they do, a rank with less data running placeholder
micro-batches whose loss is multiplied by 0 and whose metrics count for nothing.
"""

from __future__ import annotations

from typing import Callable, Iterable

import torch

from posttrain.core.dist import World, current_world, extreme
from posttrain.core.fsdp import backward_scale, clip_gradients

LossFn = Callable[[object], tuple[torch.Tensor, dict]]


NEUTRAL = {"max": float("-inf"), "min": float("inf")}
"""What a micro-batch with no data reports for an extreme: it never wins the reduction."""


def share_of_step(key: str, value: float, weight: float, live: bool = True) -> float:
    """A micro-batch's metric as `TrainCore.step` adds it up: a mean weighted by the micro-batch's
    share of the step; an extreme as it is. A placeholder's (``live`` false: a pass that only keeps
    its rank in step with the others) counts for nothing and never wins an extreme."""
    op = extreme(key)
    if op is None:
        return value * weight if live else 0.0
    return value if live else NEUTRAL[op]


def accumulate(acc: dict[str, float], metrics: dict) -> dict[str, float]:
    """``acc`` with one more micro-batch's ``metrics``: shares add up, extremes keep the extreme."""
    for k, v in metrics.items():
        v, op = float(v), extreme(k)
        if k not in acc:
            acc[k] = v
        elif op is None:
            acc[k] += v
        else:
            acc[k] = max(acc[k], v) if op == "max" else min(acc[k], v)
    return acc


def mean_over_updates(sums: dict[str, float], counts: dict[str, int] | int) -> dict[str, float]:
    """A step's metrics from the `accumulate`-d metrics of its optimizer updates: each mean over the
    updates that reported it (``counts``: per key, or one count for all), each extreme as it is."""
    count = (lambda k: counts[k]) if isinstance(counts, dict) else (lambda k: counts)
    return {k: v if extreme(k) else v / count(k) for k, v in sums.items()}


class TrainCore:
    """A trainable model with its optimizer and schedule; thin on purpose."""

    def __init__(self, model, optimizer, scheduler, *, grad_clip: float, world: World | None = None):
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.grad_clip = grad_clip
        self.world = world or current_world()
        self.updates = 0  # optimizer steps taken by this process

    def backward(self, loss: torch.Tensor) -> None:
        """Backward of a share of a global mean (FSDP averages over ranks; this makes it the sum)."""
        (loss * backward_scale(self.world)).backward()

    def step(self, micro_batches: Iterable, loss_fn: LossFn) -> dict:
        """One optimizer step over this rank's ``micro_batches``; metrics summed over all ranks."""
        self.model.train()
        sums: dict[str, float] = {"loss": 0.0}
        for mb in micro_batches:
            loss, metrics = loss_fn(mb)
            self.backward(loss)
            sums["loss"] += float(loss.detach())
            accumulate(sums, metrics)
        return self.reduce(sums) | self.apply_gradients()

    def apply_gradients(self) -> dict:
        """Clip the accumulated gradients, step the optimizer and the schedule, clear the gradients."""
        grad_norm = clip_gradients(self.model.parameters(), self.grad_clip)
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.updates += 1
        return {"grad_norm": float(grad_norm), "lr": lr}

    def reduce(self, sums: dict[str, float]) -> dict[str, float]:
        """Per-rank sums → sums over ranks, extremes → extremes over ranks (same keys on every rank);
        an extreme no micro-batch had data for is left out."""
        out = dict(sums)
        if self.world.distributed:
            shares = sorted(k for k in sums if extreme(k) is None)
            total = self.world.all_reduce(torch.tensor([sums[k] for k in shares], dtype=torch.float64))
            out.update(zip(shares, total.tolist()))
            out.update(self.world.extremes({k: v for k, v in sums.items() if extreme(k)}))
        return {k: v for k, v in out.items() if extreme(k) is None or abs(v) != float("inf")}
