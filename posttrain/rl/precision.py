"""Rollout precision that rises with the sampler/trainer gap (``rollout.precision_fallback``).

A 16-bit engine samples faster, but its log-probs drift from the float32 trainer's; the
corrections absorb a small gap, not a large one. When a step's ``mismatch/kl`` passes
``kl_threshold`` the engine takes the next version in float32, so the following steps are sampled
from the trainer's own numbers; after ``quiet_steps`` float32 steps at or under the threshold it
goes back to ``rollout.engine_dtype``.

The switch happens between the update and the weight sync: an engine cast up from 16 bits holds
16-bit values in float32 storage, so the precision is only real once the new version's float32
weights are copied in, which the sync does right after. `PrecisionFallback` is the decision alone
(testable by hand); `follow_the_gap` applies it to the run's engine.
"""

from __future__ import annotations

import torch

from posttrain.rl.config import PrecisionFallbackConfig
from posttrain.rl.state import RLRun

HIGH = "float32"
BITS = {"float32": 32, "bfloat16": 16, "float16": 16}


class PrecisionFallback:
    """The dtype the engine samples in, step by step (see module docstring)."""

    def __init__(self, cfg: PrecisionFallbackConfig, engine_dtype: str):
        self.cfg = cfg
        self.low = engine_dtype
        self.current = engine_dtype
        self.quiet = 0  # float32 steps in a row at or under the threshold

    @property
    def enabled(self) -> bool:
        return self.cfg.kl_threshold > 0 and self.low != HIGH

    def observe(self, mismatch_kl: float) -> str | None:
        """Take a step's mismatch, measured on rollouts sampled in ``current``; return the dtype to
        switch to for the next version, or None to stay."""
        if not self.enabled:
            return None
        loud = mismatch_kl > self.cfg.kl_threshold
        if self.current != HIGH:
            return self._switch(HIGH) if loud else None
        self.quiet = 0 if loud else self.quiet + 1
        return self._switch(self.low) if self.quiet >= self.cfg.quiet_steps else None

    def _switch(self, dtype: str) -> str:
        self.current, self.quiet = dtype, 0
        return dtype


def follow_the_gap(run: RLRun, step: int, mismatch_kl: float, printer=print) -> dict:
    """Apply ``run.precision``'s decision on this step's mismatch to the run's engine (every rank
    holding one: the metric is the whole step's, so colocated ranks agree), before the sync that
    loads the next version; return ``rollout/precision`` (bits of this step's rollouts) and, on a
    switch, ``rollout/precision_switch`` (bits from the next step on)."""
    fb = run.precision
    metrics = {"rollout/precision": BITS[fb.current]}
    target = fb.observe(mismatch_kl)
    if target is None:
        return metrics
    if run.engine is not None:
        run.engine.set_dtype(getattr(torch, target))
    if run.world.main:
        why = (f"mismatch KL {mismatch_kl:.2e} > {fb.cfg.kl_threshold:.2e}" if target == HIGH
               else f"{fb.cfg.quiet_steps} quiet steps")
        printer(f"step {step}: {why}: the engine samples in {target} from the next step")
    return metrics | {"rollout/precision_switch": BITS[target]}
