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
    """A dead engine process (with runtime=ray: a dead replica; with rollout.vllm.launch: a dead vLLM
    server; sync or async) is restarted from the last weights this many times; then the run stops
    cleanly with a checkpoint."""
    decoupled_ppo: bool = False
    """false: clip the ratio directly around the sampler's log-probs (the stale behaviour policy),
    whose value is the importance weight itself. true: decoupled PPO, clip around the trainer's own
    (proximal) log-probs at the current version and correct behaviour->proximal with the truncated
    weight of ``correction``. With one optimizer step per batch (``ppo_epochs=1, mini_batches=1``,
    the default) the proximal ratio is exactly 1 when the gradient is taken, so decoupled PPO's clip
    never binds and nothing bounds how far a stale sample pushes: on the demo's task at K=1 it
    ended 6.7 points of held-out accuracy under sync (3 seeds), clipping around the sampler 0.8
    (5 seeds; docs/async.md). Decoupled PPO pays with several optimizer steps per batch and large K."""
    mismatch_by_version: bool = True
    """Score each stale row under the trainer's weights at the version that sampled it, so
    ``mismatch/*`` is the engine's error alone and ``staleness/drift_*`` the policy's own drift.
    Costs ``max_staleness`` copies of the trainable weights in host memory (never accelerator
    memory) and one forward without autograd per stale version. false: ``mismatch/*`` compares the
    sampler with the trainer now and holds both, and no ``staleness/drift_*`` is logged."""
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
