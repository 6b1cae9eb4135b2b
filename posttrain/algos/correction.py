"""Off-policy correction between the sampler's and the trainer's log-probabilities.

The rollout engine (sampler) and the trainer compute log π for the same tokens with different
kernels, precisions, or a stale policy version, so the data is slightly off-policy for the
trainer. Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL
Training", correct with an importance weight ``ρ = π_trainer(x) / π_sampler(x)`` that is
truncated (TIS), kept only where it is small enough (MIS), or replaced by a rejection mask.

Uniform signature: ``fn(trainer_logp_BT, sampler_logp_BT, mask_BT, *, level, ...) -> (w_BT,
metrics)``; ``w_BT`` is detached and multiplies the per-token policy loss (``is_weights_BT``).

Levels (where the ratio is formed):
* ``"token"``: ρ_t per token.
* ``"sequence"``: ρ = Π_t ρ_t over the sequence's valid tokens, formed in log space and clamped
  there, so long sequences cannot overflow; every token of the sequence gets the same weight.
* ``"geometric"``: exp(mean_t log ρ_t), the per-token geometric mean (length-independent).

Each is named for what it computes, per unit (token, or sequence):

* TIS, ``truncated_is``: ``min(ρ, C)``;
* MIS as published, ``masked_is``: ``ρ · 1{ρ ≤ C}`` (the ratio, or 0 above C);
* pure rejection, ``rejection_is``: ``1{low ≤ ρ ≤ high}`` (weight 1 on what is kept: verl's
  rollout rejection; multiply by ``truncated_is``'s weight if both are wanted);
* ``icepop``: per token, ``ρ · 1{low ≤ ρ ≤ high}``;
* ``geo_mask``: a sequence kept (weight 1) iff its geometric-mean ratio is inside [low, high]
  (``rejection_is`` at level ``geometric``);
* ``k3_mask``: a sequence kept iff its mean per-token k3, ``ρ - 1 - log ρ``, is at most ``max_kl``.

Metrics: ``is/ratio_mean``, ``is/ratio_max`` (over the level's units: tokens or sequences; the
ratio saturates at e^20), ``is/truncated_frac`` or ``is/masked_frac`` (of the level's units), for
every rejection ``is/masked_token_frac`` (valid tokens given weight 0) and ``is/masked_seq_frac``
(sequences with at least one such token), ``is/above_frac`` / ``is/below_frac`` (units past the
upper / lower bound), and the mismatch metrics of ``mismatch_metrics``.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from posttrain.algos._masked import masked_max, masked_mean

_MAX_LOG_RATIO = 20.0
LEVELS = ("token", "sequence", "geometric")


def _log_ratio(trainer_logp_BT: torch.Tensor, sampler_logp_BT: torch.Tensor) -> torch.Tensor:
    """``log ρ`` detached, in float32 at least (float64 inputs stay float64: reference checks)."""
    d_BT = trainer_logp_BT.detach() - sampler_logp_BT.detach()
    return d_BT.to(torch.promote_types(d_BT.dtype, torch.float32))


def mismatch_metrics(
    trainer_logp_BT: torch.Tensor, sampler_logp_BT: torch.Tensor, mask_BT: torch.Tensor
) -> dict[str, torch.Tensor]:
    """How far the trainer's log-probs are from the sampler's, over valid tokens.

    ``mismatch/kl`` is the k3 estimate of KL(π_sampler‖π_trainer) from the sampled tokens:
    mean of ``ρ - 1 - log ρ`` with ``ρ = π_trainer/π_sampler``. ``mismatch/ratio_outside_2x_frac``
    is the fraction of tokens whose ratio is outside [1/2, 2], the default bounds of the
    corrections: how much of the step a rejection at those bounds would drop, whichever is on.
    """
    d_BT = _log_ratio(trainer_logp_BT, sampler_logp_BT)
    d_clamped = d_BT.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    return {
        "mismatch/kl": masked_mean(torch.expm1(d_clamped) - d_clamped, mask_BT),
        "mismatch/logprob_abs_diff_mean": masked_mean(d_BT.abs(), mask_BT),
        "mismatch/logprob_abs_diff_max": masked_max(d_BT.abs(), mask_BT),
        "mismatch/ratio_outside_2x_frac": masked_mean((d_BT.abs() > math.log(2.0)).float(), mask_BT),
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
    d_BT = torch.where(m, _log_ratio(trainer_logp_BT, sampler_logp_BT), 0.0)
    return (d_BT.sum(-1) / m.sum(-1).clamp(min=1)).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)


def _log_ratio_at_level(trainer_logp_BT, sampler_logp_BT, mask_BT, level):
    """Log-ratio broadcast to (B, T), and the mask of the level's units ((B, T) or (B, 1))."""
    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
    m_BT = mask_BT.bool()
    if level == "token":
        d_BT = _log_ratio(trainer_logp_BT, sampler_logp_BT)
        return torch.where(m_BT, d_BT, 0.0).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO), m_BT
    if level == "sequence":
        d_BT = torch.where(m_BT, _log_ratio(trainer_logp_BT, sampler_logp_BT), 0.0)
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
    """Truncated importance sampling (TIS): ``w = min(ρ, cap)``, 0 at masked positions.

    Token TIS caps each ρ_t (Yao et al. 2025; verl ``rollout_is: token``); sequence TIS caps the
    product ratio and gives it to every token of the sequence (verl ``rollout_is: sequence``).
    """
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


def rejection_is(
    trainer_logp_BT: torch.Tensor,
    sampler_logp_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    *,
    low: float = 0.5,
    high: float = 2.0,
    level: str = "token",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Pure rejection: ``w = 1`` if ``low ≤ ρ ≤ high`` else 0 (the ratio itself is not a weight).

    Per token it drops single tokens; per sequence a whole sequence whose product ratio leaves the
    bounds. Source: verl's rollout rejection sampling (``rollout_rs: token`` / ``sequence``, weight 1
    on what is kept). This is not the published MIS, which keeps the ratio as weight (`masked_is`).
    """
    if not 0 < low <= high:
        raise ValueError(f"need 0 < low <= high, got low={low}, high={high}")
    log_ratio_BT, units = _log_ratio_at_level(trainer_logp_BT, sampler_logp_BT, mask_BT, level)
    above_BT, below_BT = log_ratio_BT > math.log(high), log_ratio_BT < math.log(low)
    inside_BT = ~(above_BT | below_BT)
    w_BT = (inside_BT & mask_BT.bool()).to(log_ratio_BT.dtype)
    metrics = _ratio_metrics(log_ratio_BT, units)
    metrics["is/masked_frac"] = masked_mean(_per_unit(~inside_BT, units).float(), units)
    metrics |= _bound_metrics(_per_unit(above_BT, units), _per_unit(below_BT, units), units)
    metrics |= rejection_metrics(inside_BT, mask_BT)
    metrics.update(mismatch_metrics(trainer_logp_BT, sampler_logp_BT, mask_BT))
    return w_BT, metrics


def masked_is(
    trainer_logp_BT: torch.Tensor,
    sampler_logp_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    *,
    cap: float = 2.0,
    level: str = "token",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Masked importance sampling (MIS) as published: ``w = ρ · 1{ρ ≤ cap}``: the ratio is the
    weight where it is at most C, and a unit above C is dropped instead of truncated (TIS keeps it
    at weight C).

    Source: Liu, Li et al. 2025, "When Speed Kills Stability: Demystifying RL Collapse from the
    Training-Inference Mismatch", token-level and sequence-level MIS (``ρ`` per token, or the
    product over the sequence given to each of its tokens).
    """
    if cap <= 0:
        raise ValueError(f"cap must be > 0, got {cap}")
    log_ratio_BT, units = _log_ratio_at_level(trainer_logp_BT, sampler_logp_BT, mask_BT, level)
    above_BT = log_ratio_BT > math.log(cap)
    keep_BT = ~above_BT & mask_BT.bool()
    w_BT = torch.where(keep_BT, torch.exp(log_ratio_BT), 0.0)
    metrics = _ratio_metrics(log_ratio_BT, units)
    above_frac = masked_mean(_per_unit(above_BT, units).float(), units)
    metrics |= {"is/masked_frac": above_frac, "is/above_frac": above_frac}
    metrics |= rejection_metrics(keep_BT, mask_BT)
    metrics.update(mismatch_metrics(trainer_logp_BT, sampler_logp_BT, mask_BT))
    return w_BT, metrics


def _per_unit(x_BT: torch.Tensor, units: torch.Tensor) -> torch.Tensor:
    """``x_BT`` at the level's units: itself per token, its first column per sequence."""
    return x_BT if units.shape == x_BT.shape else x_BT[:, :1]


def _bound_metrics(above, below, units) -> dict[str, torch.Tensor]:
    return {"is/above_frac": masked_mean(above.float(), units), "is/below_frac": masked_mean(below.float(), units)}


def rejection_metrics(keep_BT: torch.Tensor, mask_BT: torch.Tensor) -> dict[str, torch.Tensor]:
    """How much a rejection drops: ``is/masked_token_frac``, the valid tokens not kept, and
    ``is/masked_seq_frac``, the sequences (with a valid token) that lost at least one (verl's
    ``rollout_rs_seq_masked_fraction``)."""
    m_BT = mask_BT.bool()
    dropped_BT = m_BT & ~keep_BT.bool()
    return {"is/masked_token_frac": masked_mean(dropped_BT.float(), m_BT),
            "is/masked_seq_frac": masked_mean(dropped_BT.any(-1).float(), m_BT.any(-1))}


def icepop(
    trainer_logp_BT: torch.Tensor,
    sampler_logp_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    *,
    low: float = 0.5,
    high: float = 2.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """IcePop: per token, ``w_t = ρ_t`` if ``low ≤ ρ_t ≤ high`` else 0: the ratio corrects where the
    two engines roughly agree, and a token where they disagree badly is dropped instead of
    weighted, so neither a huge weight nor a vanishing one reaches the gradient.

    Source: Ling Team (inclusionAI) 2025, "Every Step Evolves: Scaling Reinforcement Learning for
    Trillion-Scale Thinking Model" (Ring-1T), and its blog "Small Leak Can Sink a Great Ship —
    Boost RL Training on MoE with IcePop": the mask ``M(k) = k`` on ``[α, β]``, 0 outside, with
    ``k = π_train/π_infer``; the paper's [α, β] = [0.5, 5] is ``low=0.5, high=5``.
    """
    if not 0 < low <= 1.0 <= high:
        raise ValueError(f"need 0 < low <= 1 <= high, got low={low}, high={high}")
    log_ratio_BT, units = _log_ratio_at_level(trainer_logp_BT, sampler_logp_BT, mask_BT, "token")
    above_BT, below_BT = log_ratio_BT > math.log(high), log_ratio_BT < math.log(low)
    keep_BT = ~(above_BT | below_BT) & mask_BT.bool()
    w_BT = torch.where(keep_BT, torch.exp(log_ratio_BT), 0.0)
    metrics = _ratio_metrics(log_ratio_BT, units) | _bound_metrics(above_BT, below_BT, units)
    metrics |= rejection_metrics(keep_BT, mask_BT)
    metrics.update(mismatch_metrics(trainer_logp_BT, sampler_logp_BT, mask_BT))
    return w_BT, metrics


def geo_mask(
    trainer_logp_BT: torch.Tensor,
    sampler_logp_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    *,
    low: float = 0.99,
    high: float = 1.01,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Geometric-mean sequence rejection: a sequence keeps weight 1 iff ``low ≤ exp(mean_t log ρ_t)
    ≤ high``, else all its tokens get 0. The per-token mean does not grow with length, so one
    bound serves short and long answers alike, where the product ratio of sequence MIS rejects
    every long one.

    Source: Liu, Li et al. 2025, "When Speed Kills Stability: Demystifying RL Collapse from the
    Training-Inference Mismatch", part 3 (geometric-level rejection); verl ``rollout_rs:
    seq_mean_k1`` (its ``decoupled_geo_rs`` preset, bounds 0.999/1.001); SkyRL
    ``off_policy_correction.sequence_mask_metric: geometric`` (``geo_mask_low/high``, 0.99/1.01 in
    its examples, the defaults here).
    """
    return rejection_is(trainer_logp_BT, sampler_logp_BT, mask_BT, low=low, high=high, level="geometric")


def k3_mask(
    trainer_logp_BT: torch.Tensor,
    sampler_logp_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    *,
    max_kl: float = 0.01,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """K3 sequence rejection: a sequence keeps weight 1 iff the mean over its tokens of
    ``k3_t = ρ_t - 1 - log ρ_t`` is at most ``max_kl``, else all its tokens get 0.

    k3 ≥ 0 is the low-variance estimate of KL(π_sampler‖π_trainer) from the sampled token (the
    one ``mismatch/kl`` uses), so the statistic is the sequence's own mismatch KL: it rejects
    disagreement in either direction, where a geometric mean can hide a ratio far above 1 behind
    one far below it.

    Source: verl rollout correction, ``rollout_rs: seq_mean_k3`` (presets ``decoupled_k3_rs``,
    ``bypass_ppo_clip_k3_rs``; threshold 0.01 there and here).
    """
    if max_kl <= 0:
        raise ValueError(f"max_kl must be > 0, got {max_kl}")
    log_ratio_BT, units = _log_ratio_at_level(trainer_logp_BT, sampler_logp_BT, mask_BT, "token")
    m_BT = mask_BT.bool()
    k3_BT = torch.where(m_BT, torch.expm1(log_ratio_BT) - log_ratio_BT, 0.0)
    k3_B = k3_BT.sum(-1) / m_BT.sum(-1).clamp(min=1)
    keep_B = k3_B <= max_kl
    w_BT = (keep_B[:, None] & m_BT).float()
    seqs = m_BT.any(-1)
    metrics = _ratio_metrics(log_ratio_BT, units)
    metrics |= {"is/k3_seq_mean": masked_mean(k3_B, seqs), "is/k3_seq_max": masked_max(k3_B, seqs),
                "is/masked_frac": masked_mean((~keep_B).float(), seqs),
                "is/above_frac": masked_mean((~keep_B).float(), seqs)}
    metrics |= rejection_metrics(keep_B[:, None].expand_as(m_BT), mask_BT)
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
    "mis": masked_is,
    "rejection": rejection_is,
    "icepop": icepop,
    "geo_mask": geo_mask,
    "k3_mask": k3_mask,
}
LEVELLED = ("none", "truncated", "mis", "rejection")
"""The corrections that take ``level``; the others fix their own (icepop per token, geo_mask and
k3_mask per sequence)."""
