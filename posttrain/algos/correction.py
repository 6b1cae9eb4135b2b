"""Off-policy correction between the sampler's and the trainer's log-probabilities.

The rollout engine (sampler) and the trainer compute log π for the same tokens with different
kernels, precisions, or a stale policy version, so the data is slightly off-policy for the
trainer. Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL
Training", correct with an importance weight ``ρ = π_trainer(x) / π_sampler(x)`` that is
truncated (TIS) or used to mask tokens whose mismatch is too large (MIS; as in IcePop and verl's
rollout-IS "mask" mode).

Uniform signature: ``fn(trainer_logp_BT, sampler_logp_BT, mask_BT, *, level, ...) -> (w_BT,
metrics)``; ``w_BT`` is detached and multiplies the per-token policy loss (``is_weights_BT``).

Levels (where the ratio is formed):
* ``"token"``: ρ_t per token.
* ``"sequence"``: ρ = Π_t ρ_t over the sequence's valid tokens, formed in log space and clamped
  there, so long sequences cannot overflow; every token of the sequence gets the same weight.
* ``"geometric"``: exp(mean_t log ρ_t), the per-token geometric mean (length-independent).

``masked_is`` gives weight 1 inside [low, high] and 0 outside (a rejection mask, not a
reweighting); compose it with ``truncated_is`` by multiplying the two weights if both are wanted.

Metrics: ``is/ratio_mean``, ``is/ratio_max`` (over the level's units: tokens or sequences; the
ratio saturates at e^20), ``is/truncated_frac`` or ``is/masked_frac``, and the mismatch metrics
of ``mismatch_metrics``.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from posttrain.algos._masked import masked_max, masked_mean

_MAX_LOG_RATIO = 20.0
LEVELS = ("token", "sequence", "geometric")


def mismatch_metrics(
    trainer_logp_BT: torch.Tensor, sampler_logp_BT: torch.Tensor, mask_BT: torch.Tensor
) -> dict[str, torch.Tensor]:
    """How far the trainer's log-probs are from the sampler's, over valid tokens.

    ``mismatch/kl`` is the k3 estimate of KL(π_sampler‖π_trainer) from the sampled tokens:
    mean of ``ρ - 1 - log ρ`` with ``ρ = π_trainer/π_sampler``.
    """
    d_BT = (trainer_logp_BT.detach() - sampler_logp_BT.detach()).float()
    d_clamped = d_BT.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    return {
        "mismatch/kl": masked_mean(torch.expm1(d_clamped) - d_clamped, mask_BT),
        "mismatch/logprob_abs_diff_mean": masked_mean(d_BT.abs(), mask_BT),
        "mismatch/logprob_abs_diff_max": masked_max(d_BT.abs(), mask_BT),
    }


def geo_mean_seq_ratio(
    trainer_logp_BT: torch.Tensor, sampler_logp_BT: torch.Tensor, mask_BT: torch.Tensor
) -> torch.Tensor:
    """Per-sequence geometric mean of the token ratios, ``exp(mean_t log ρ_t)``, shape (B,).

    A sequence without valid tokens gets 1.
    """
    return torch.exp(seq_mean_log_ratio(trainer_logp_BT, sampler_logp_BT, mask_BT))


def seq_mean_log_ratio(trainer_logp_BT, sampler_logp_BT, mask_BT) -> torch.Tensor:
    """(B,) mean of ``log ρ_t`` over each sequence's valid tokens, detached and clamped to ±20;
    0 for a sequence without valid tokens (GSPO's length-normalised log-ratio too)."""
    m = mask_BT.bool()
    d_BT = torch.where(m, (trainer_logp_BT.detach() - sampler_logp_BT.detach()).float(), 0.0)
    return (d_BT.sum(-1) / m.sum(-1).clamp(min=1)).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)


def _log_ratio_at_level(trainer_logp_BT, sampler_logp_BT, mask_BT, level):
    """Log-ratio broadcast to (B, T), and the mask of the level's units ((B, T) or (B, 1))."""
    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
    m_BT = mask_BT.bool()
    if level == "token":
        d_BT = (trainer_logp_BT.detach() - sampler_logp_BT.detach()).float()
        return torch.where(m_BT, d_BT, 0.0).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO), m_BT
    if level == "sequence":
        d_BT = torch.where(m_BT, (trainer_logp_BT.detach() - sampler_logp_BT.detach()).float(), 0.0)
        d_B = d_BT.sum(-1).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    else:
        d_B = seq_mean_log_ratio(trainer_logp_BT, sampler_logp_BT, mask_BT)
    return d_B[:, None].expand_as(m_BT), m_BT.any(-1, keepdim=True)


def _ratio_metrics(log_ratio_BT, units_mask):
    """Ratio mean/max over the level's units (per token, or one entry per sequence)."""
    per_unit = log_ratio_BT if units_mask.shape == log_ratio_BT.shape else log_ratio_BT[:, :1]
    ratio = torch.exp(per_unit)
    return {"is/ratio_mean": masked_mean(ratio, units_mask), "is/ratio_max": masked_max(ratio, units_mask)}


def truncated_is(
    trainer_logp_BT: torch.Tensor,
    sampler_logp_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    *,
    cap: float = 2.0,
    level: str = "token",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Truncated importance sampling (TIS): ``w = min(ρ, cap)``, 0 at masked positions."""
    if cap <= 0:
        raise ValueError(f"cap must be > 0, got {cap}")
    log_ratio_BT, units = _log_ratio_at_level(trainer_logp_BT, sampler_logp_BT, mask_BT, level)
    truncated_BT = log_ratio_BT > math.log(cap)
    w_BT = torch.exp(log_ratio_BT.clamp(max=math.log(cap)))
    w_BT = torch.where(mask_BT.bool(), w_BT, 0.0)
    frac_src = truncated_BT if units.shape == truncated_BT.shape else truncated_BT[:, :1]
    metrics = _ratio_metrics(log_ratio_BT, units)
    metrics["is/truncated_frac"] = masked_mean(frac_src.float(), units)
    metrics.update(mismatch_metrics(trainer_logp_BT, sampler_logp_BT, mask_BT))
    return w_BT, metrics


def masked_is(
    trainer_logp_BT: torch.Tensor,
    sampler_logp_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    *,
    low: float = 0.5,
    high: float = 2.0,
    level: str = "token",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Masked importance sampling (MIS): ``w = 1`` if ``low ≤ ρ ≤ high`` else 0."""
    if not 0 < low <= high:
        raise ValueError(f"need 0 < low <= high, got low={low}, high={high}")
    log_ratio_BT, units = _log_ratio_at_level(trainer_logp_BT, sampler_logp_BT, mask_BT, level)
    inside_BT = (log_ratio_BT >= math.log(low)) & (log_ratio_BT <= math.log(high))
    w_BT = (inside_BT & mask_BT.bool()).float()
    frac_src = inside_BT if units.shape == inside_BT.shape else inside_BT[:, :1]
    metrics = _ratio_metrics(log_ratio_BT, units)
    metrics["is/masked_frac"] = masked_mean((~frac_src).float(), units)
    metrics.update(mismatch_metrics(trainer_logp_BT, sampler_logp_BT, mask_BT))
    return w_BT, metrics


def no_is(
    trainer_logp_BT: torch.Tensor,
    sampler_logp_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    *,
    level: str = "token",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """No correction: weights 1 on valid tokens; still reports the ratio and mismatch metrics."""
    log_ratio_BT, units = _log_ratio_at_level(trainer_logp_BT, sampler_logp_BT, mask_BT, level)
    metrics = _ratio_metrics(log_ratio_BT, units)
    metrics.update(mismatch_metrics(trainer_logp_BT, sampler_logp_BT, mask_BT))
    return mask_BT.bool().float(), metrics


IS_CORRECTIONS: dict[str, Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]] = {
    "none": no_is,
    "truncated": truncated_is,
    "masked": masked_is,
}
