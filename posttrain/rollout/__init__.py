"""Rollout engines: generate completions with sampler log-probs from a copy of the policy weights.

See `posttrain.rollout.engine` for the default engine, `posttrain.rollout.http` for the client of
OpenAI-compatible servers, and `posttrain.rollout.types` for the record and the log-prob convention.
"""

from posttrain.rollout.engine import TorchEngine
from posttrain.rollout.http import HTTPEngine, ServerUnreachable
from posttrain.rollout.protocol import RolloutEngine
from posttrain.rollout.types import (
    FINISH_REASONS,
    LOGPROB_KIND,
    PaddedRollouts,
    Rollouts,
    SamplingParams,
    WeightSyncError,
    weights_checksum,
)

__all__ = [
    "FINISH_REASONS",
    "HTTPEngine",
    "LOGPROB_KIND",
    "PaddedRollouts",
    "RolloutEngine",
    "Rollouts",
    "SamplingParams",
    "ServerUnreachable",
    "TorchEngine",
    "WeightSyncError",
    "weights_checksum",
]
