"""Rollout precision that rises with the sampler/trainer gap (``rollout.precision_fallback``).

A 16-bit engine samples faster, but its log-probs drift from the float32 trainer's; the
corrections absorb a small gap, not a large one. When a step's ``mismatch/kl`` passes
``kl_threshold`` the engine takes the next version in float32, so the following steps are sampled
from the trainer's own numbers; after ``quiet_steps`` float32 steps at or under the threshold it
goes back to ``rollout.engine_dtype``.

The switch rides on the next weight sync: an engine cast up from 16 bits holds 16-bit values in
float32 storage, so the precision is only real once the new version's float32 weights are copied
in. Every sync hands the engine ``current`` as the ``dtype`` of `RolloutEngine.load_version`, one
request every engine kind honours its own way (the in-process engine, the engine process, Ray
replicas, our servers); vLLM and SGLang cannot change dtype at run time and the config refuses
them. `PrecisionFallback` is the decision alone (testable by hand, saved with a checkpoint so a
resumed run keeps its precision and its count of quiet steps); `follow_the_gap` takes a step's
decision and logs it.
"""

from __future__ import annotations

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

    def state_dict(self) -> dict:
        return {"current": self.current, "quiet": self.quiet}

    def load_state_dict(self, state: dict) -> None:
        """Take a checkpoint's precision; one saved by a run with another ``engine_dtype`` (or from
        before the fallback was on) starts from this run's 16-bit dtype."""
        if state.get("current") in (HIGH, self.low):
            self.current, self.quiet = state["current"], int(state.get("quiet", 0))


def follow_the_gap(run: RLRun, step: int, mismatch_kl: float | None, printer=print) -> dict:
    """Take ``run.precision``'s decision on this step's mismatch before the sync that loads the next
    version (every rank decides alike: the metric is the whole step's); return ``rollout/precision``
    (bits of the dtype the engine held for this step) and, on a switch, ``rollout/precision_switch``
    (bits from the next version on). A step without a mismatch figure (async: no sample was fresh)
    decides nothing."""
    fb = run.precision
    metrics = {"rollout/precision": BITS[fb.current]}
    target = fb.observe(mismatch_kl) if mismatch_kl is not None else None
    if target is None:
        return metrics
    if run.world.main:
        why = (f"mismatch KL {mismatch_kl:.2e} > {fb.cfg.kl_threshold:.2e}" if target == HIGH
               else f"{fb.cfg.quiet_steps} quiet steps")
        printer(f"step {step}: {why}: the engine samples in {target} from the next step")
    return metrics | {"rollout/precision_switch": BITS[target]}
