"""Reward functions ``(completion: str, example: dict) -> Outcome``: arithmetic, math, format, code.

See `posttrain.verifiers.basic` for the plain verifiers and `posttrain.verifiers.registry` for
lookup by name or import path, combining, and exception-safe scoring.
"""

from posttrain.verifiers.registry import (
    VERIFIERS,
    Verifier,
    build_reward,
    combine,
    resolve_verifier,
    safe_verify,
    score_batch,
)

__all__ = ["VERIFIERS", "Verifier", "build_reward", "combine", "resolve_verifier", "safe_verify", "score_batch"]
