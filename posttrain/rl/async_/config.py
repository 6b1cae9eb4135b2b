"""Knobs of asynchronous RL that are not the two headline ones (``mode``, ``max_staleness``)."""

from __future__ import annotations

import dataclasses

from posttrain.config import ConfigValueError


@dataclasses.dataclass(kw_only=True)
class AsyncConfig:
    engine_threads: int = 0
    """Torch threads of the rollout-engine process; 0 = half the cores (at least 1)."""
    trainer_threads: int = 0
    """Torch threads of the trainer in async mode; 0 = the cores the engine does not use (at least 1)."""
    timeout_s: float = 600.0
    """Longest wait on the engine process (start, a generate request, a weight-sync answer) before
    the run stops with an error naming what hung."""
    max_engine_restarts: int = 2
    """A dead engine process (with runtime=ray: a dead replica, sync or async) is restarted from the
    last weights this many times; then the run stops cleanly with a checkpoint."""
    decoupled_ppo: bool = True
    """Decoupled PPO: clip the ratio around the trainer's own (proximal) log-probs at the current
    version and correct behaviour->proximal with the importance weights of ``correction``. false =
    clip directly around the sampler's log-probs (the stale behaviour policy), no separate weight."""
    self_test: bool = True
    """At start-up, check that a weight sync reaches the engine and that sampler and trainer agree."""
    self_test_max_kl: float = 1e-3
    """Largest sampler-vs-trainer mismatch KL the self-test accepts (raise it for a bf16 engine)."""

    def __post_init__(self):
        for key in ("engine_threads", "trainer_threads", "max_engine_restarts"):
            if getattr(self, key) < 0:
                raise ConfigValueError(key, "must be >= 0")
        if self.timeout_s <= 0:
            raise ConfigValueError("timeout_s", "must be > 0")
        if self.self_test_max_kl <= 0:
            raise ConfigValueError("self_test_max_kl", "must be > 0")
