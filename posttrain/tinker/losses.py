"""The Tinker SDK's loss names, each mapped onto a per-token loss of `posttrain.algos`.

The SDK's contract (its ``loss_fn_inputs`` per datum, all shaped like the input tokens; position t
scores ``target_tokens[t]`` given tokens ``0..t``) and the loss it defines, summed over every token
of every datum (Tinker sums; it never normalises by a count, so the client's weights and
advantages carry any normalisation):

* ``cross_entropy``: inputs ``target_tokens``, ``weights``; ``-w_t · log p_t`` = `pg_loss` with the
  weights as advantages.
* ``importance_sampling``: ``target_tokens``, ``logprobs`` (the sampler's), ``advantages``;
  ``-A_t · exp(log p_t − log q_t)``: the PPO surrogate with no clip (`ppo_clip_loss`, clip ranges
  that never bind).
* ``ppo``: as above with the ratio clipped to ``[clip_low_threshold, clip_high_threshold]``
  (``loss_fn_config``, default 0.8 and 1.2): `ppo_clip_loss`.
* ``cispo``: ``-sg(clip(ρ_t)) · A_t · log p_t``, the same thresholds: `cispo_loss`.
* ``gspo``: one length-normalised ratio per sequence over its tokens with a non-zero advantage (or
  ``sequence_ratio_mask``), clipped to the thresholds (default 1 − 3e-4, 1 + 4e-4): `gspo_loss`.

Every datum gets back ``logprobs`` (the trainer's log p_t) and ``elementwise_loss`` (its per-token
loss). ``dro``, ``stable_reinforce`` and ``custom`` are refused by name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from posttrain.algos.policy import cispo_loss, gspo_loss, pg_loss, ppo_clip_loss


class LossInputError(ValueError):
    """A request whose loss name, inputs or config do not fit the loss (a 400)."""


@dataclass(frozen=True)
class Loss:
    inputs: tuple[str, ...]
    """The ``loss_fn_inputs`` it needs besides ``target_tokens``."""
    config: dict[str, float]
    """``loss_fn_config`` keys it reads, with their defaults."""
    fn: Callable[..., tuple[torch.Tensor, dict]]
    """(logp_BT, inputs as (B, T) tensors, mask_BT, config) -> (loss_BT, metrics)."""
    optional: tuple[str, ...] = ()


def _cross_entropy(logp, x, mask, cfg):
    return pg_loss(logp, x["weights"], mask)


def _importance_sampling(logp, x, mask, cfg):
    return ppo_clip_loss(logp, x["logprobs"], x["advantages"], mask, clip_low=1.0, clip_high=math.inf)


def _ranges(cfg) -> tuple[float, float]:
    low, high = cfg["clip_low_threshold"], cfg["clip_high_threshold"]
    if not 0.0 <= low <= 1.0 <= high:
        raise LossInputError(f"loss_fn_config: need 0 <= clip_low_threshold <= 1 <= clip_high_threshold, "
                             f"got {low} and {high}")
    return 1.0 - low, high - 1.0


def _ppo(logp, x, mask, cfg):
    low, high = _ranges(cfg)
    return ppo_clip_loss(logp, x["logprobs"], x["advantages"], mask, clip_low=low, clip_high=high)


def _cispo(logp, x, mask, cfg):
    low, high = _ranges(cfg)
    return cispo_loss(logp, x["logprobs"], x["advantages"], mask, clip_low=low, clip_high=high)


def _gspo(logp, x, mask, cfg):
    low, high = _ranges(cfg)
    seq_mask = x["sequence_ratio_mask"] != 0 if "sequence_ratio_mask" in x else x["advantages"] != 0
    loss, metrics = gspo_loss(logp, x["logprobs"], x["advantages"], seq_mask & mask, clip_low=low, clip_high=high)
    return loss, metrics


_CLIP = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}
LOSSES: dict[str, Loss] = {
    "cross_entropy": Loss(("weights",), {}, _cross_entropy),
    "importance_sampling": Loss(("logprobs", "advantages"), {}, _importance_sampling),
    "ppo": Loss(("logprobs", "advantages"), _CLIP, _ppo),
    "cispo": Loss(("logprobs", "advantages"), _CLIP, _cispo),
    "gspo": Loss(("logprobs", "advantages"), {"clip_low_threshold": 1 - 3e-4, "clip_high_threshold": 1 + 4e-4},
                 _gspo, optional=("sequence_ratio_mask",)),
}


def check_request(loss_fn: str, config: dict) -> dict[str, float]:
    """The loss's config with defaults filled in; `LossInputError` for an unknown name or key."""
    loss = LOSSES.get(loss_fn)
    if loss is None:
        raise LossInputError(f"loss_fn {loss_fn!r} is not supported here; supported: {', '.join(LOSSES)}")
    unknown = sorted(set(config) - set(loss.config))
    if unknown:
        raise LossInputError(f"loss_fn_config: {', '.join(unknown)} not understood by {loss_fn} "
                             f"(it reads: {', '.join(loss.config) or 'nothing'})")
    out = dict(loss.config)
    for key, value in config.items():
        if not isinstance(value, float) or not math.isfinite(value):
            raise LossInputError(f"loss_fn_config.{key}: must be a finite number, got {value!r}")
        out[key] = value
    return out


def check_datum(loss_fn: str, index: int, tokens: list[int], inputs: dict) -> None:
    """Every input the loss needs, present, 1-d and as long as the tokens; nothing it does not read."""
    loss = LOSSES[loss_fn]
    wanted = ("target_tokens", *loss.inputs)
    allowed = set(wanted) | set(loss.optional)
    for name in wanted:
        if name not in inputs:
            raise LossInputError(f"data[{index}].loss_fn_inputs: {loss_fn} needs {name!r}")
    for name, arr in inputs.items():
        if name not in allowed:
            raise LossInputError(f"data[{index}].loss_fn_inputs.{name}: not read by {loss_fn} "
                                 f"(it reads {', '.join(sorted(allowed))})")
        if arr.ndim != 1 or arr.shape[0] != len(tokens):
            raise LossInputError(f"data[{index}].loss_fn_inputs.{name}: shape {list(arr.shape)}, "
                                 f"expected [{len(tokens)}] (one value per input token)")


def per_token_loss(loss_fn: str, logp_BT: torch.Tensor, inputs_BT: dict[str, torch.Tensor], mask_BT: torch.Tensor,
                   config: dict[str, float]) -> tuple[torch.Tensor, dict]:
    """(B, T) loss, zero at padding; summed, it is the SDK's loss.

    Only positions with a non-zero weight (cross entropy) or advantage count: the loss there is 0
    either way, and the metrics (ratios, clip fractions) are then over the trained tokens, not the
    prompt's, whose sampler log-probs the SDK's datums fill with zeros."""
    weight = inputs_BT["weights" if loss_fn == "cross_entropy" else "advantages"]
    return LOSSES[loss_fn].fn(logp_BT, inputs_BT, mask_BT.bool() & (weight != 0), config)
