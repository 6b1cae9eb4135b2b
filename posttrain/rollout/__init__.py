"""Rollout engines: generate completions with sampler log-probs from a copy of the policy weights.

See `posttrain.rollout.engine` for the default engine and `posttrain.rollout.types` for the record
and the log-prob convention.
"""

from posttrain.rollout.engine import TorchEngine
from posttrain.rollout.types import (
    LOGPROB_KIND,
    PaddedRollouts,
    RolloutEngine,
    Rollouts,
    SamplingParams,
    WeightSyncError,
    weights_checksum,
)

__all__ = [
    "LOGPROB_KIND",
    "PaddedRollouts",
    "RolloutEngine",
    "Rollouts",
    "SamplingParams",
    "TorchEngine",
    "WeightSyncError",
    "weights_checksum",
]
