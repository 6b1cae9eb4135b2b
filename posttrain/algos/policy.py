"""Policy-gradient losses, per token (aggregate them with ``aggregate.AGGREGATIONS``).

* ``ppo_clip_loss``: the clipped surrogate of PPO (Schulman et al. 2017, "Proximal Policy
  Optimization Algorithms") with separate lower/upper clip ranges (DAPO "clip-higher", Yu et al.
  2025) and the optional dual clip for negative advantages (Ye et al. 2020, "Mastering Complex
  Control in MOBA Games with Deep Reinforcement Learning"): when A < 0 the loss is capped at
  ``-A · dual_clip`` so a huge ratio on a bad token cannot blow the update up.
* ``pg_loss``: vanilla REINFORCE, ``-A · log π``. Its value is not the PPO surrogate's value at
  ratio 1 (that is ``-A``), but its gradient is the same.
* ``gspo_loss``: GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization", arXiv:2507.18071).
  One importance ratio per sequence, length-normalised, ``s_i = exp(mean_t (log π_θ − log π_old))``
  over the sequence's loss tokens, clipped PPO-style at the sequence level (the paper's ranges are
  tiny, 3e-4 / 4e-4, because a mean of log-ratios moves far less than a single token's). The
  gradient flows through the token form ``s_i,t = sg(s_i) · π_θ(y_t) / sg(π_θ(y_t))`` (their
  GSPO-token, which also admits per-token advantages): its value is ``s_i`` at every token, and
  its sequence mean has the gradient of ``s_i`` itself. Aggregate with ``seq_mean_token_mean`` to
  get the paper's objective, a mean over sequences.
* ``cispo_loss``: CISPO (MiniMax 2025, "MiniMax-M1: Scaling Test-Time Compute Efficiently with
  Lightning Attention", arXiv:2506.13585). REINFORCE weighted by a clipped, detached ratio:
  ``-sg(clip(ρ_t, 1−ε_low, 1+ε_high)) · A · log π_θ``. Unlike PPO's clip, no token ever loses its
  gradient (rare "fork" tokens with large ratios keep contributing, capped); MiniMax set no lower
  bound (``clip_low=1``: the weight is only floored at 0) and tuned the upper one.

Importance weights ``is_weights_BT`` (sampler-vs-trainer correction, see ``correction.py``)
multiply the per-token loss and are detached. Metrics are detached masked means over the tokens
passed in. Losses are exactly 0 at masked positions.
"""

from __future__ import annotations

from typing import Callable

import torch

from posttrain.algos._masked import masked_max, masked_mean
from posttrain.algos.correction import seq_mean_log_ratio

# Log-ratios beyond this are clamped before exp(): e^20 ≈ 5e8 is already far outside any clip.
_MAX_LOG_RATIO = 20.0


def _apply_weights_and_mask(loss_BT, mask_BT, is_weights_BT):
    if is_weights_BT is not None:
        loss_BT = loss_BT * is_weights_BT.detach()
    return torch.where(mask_BT.bool(), loss_BT, torch.zeros_like(loss_BT))


def ppo_clip_loss(
    logp_BT: torch.Tensor,
    old_logp_BT: torch.Tensor,
    adv_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    is_weights_BT: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token clipped surrogate ``max(-A·ρ, -A·clip(ρ, 1-clip_low, 1+clip_high))``.

    Args:
        logp_BT: (B, T) current log π_θ(x_t), with gradient.
        old_logp_BT: (B, T) log-probs of the policy that produced the data (treated as constant).
        adv_BT: (B, T) advantages (constant; a (B, 1) outcome advantage broadcasts).
        mask_BT: (B, T) valid tokens.
        dual_clip: if set (> 1), for A < 0 the loss is ``min(loss, -A·dual_clip)``.
        is_weights_BT: optional (B, T) importance weights, detached, multiplying the loss.

    Returns:
        loss_BT and metrics ``clip_frac`` (tokens where the clipped branch is active),
        ``dual_clip_frac``, ``approx_kl`` (k3 estimate of KL(π_old‖π_θ)), ``ratio_mean``,
        ``ratio_max``.
    """
    if clip_low < 0 or clip_high < 0:
        raise ValueError(f"clip ranges must be >= 0, got low={clip_low}, high={clip_high}")
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
    adv_BT = adv_BT.detach()
    log_ratio_BT = (logp_BT - old_logp_BT.detach()).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    ratio_BT = torch.exp(log_ratio_BT)
    unclipped_BT = -adv_BT * ratio_BT
    clipped_BT = -adv_BT * ratio_BT.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss_BT = torch.maximum(unclipped_BT, clipped_BT)
    dual_active_BT = torch.zeros_like(mask_BT, dtype=torch.bool)
    if dual_clip is not None:
        cap_BT = -adv_BT * dual_clip
        dual_active_BT = (adv_BT < 0) & (loss_BT > cap_BT)
        loss_BT = torch.where(dual_active_BT, cap_BT, loss_BT)
    loss_BT = _apply_weights_and_mask(loss_BT, mask_BT, is_weights_BT)
    with torch.no_grad():
        lr = log_ratio_BT.detach()
        metrics = {
            "clip_frac": masked_mean((clipped_BT > unclipped_BT).float(), mask_BT),
            "dual_clip_frac": masked_mean(dual_active_BT.float(), mask_BT),
            "approx_kl": masked_mean(torch.expm1(lr) - lr, mask_BT),
            "ratio_mean": masked_mean(ratio_BT.detach(), mask_BT),
            "ratio_max": masked_max(ratio_BT.detach(), mask_BT),
        }
    return loss_BT, metrics


def pg_loss(
    logp_BT: torch.Tensor,
    adv_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    is_weights_BT: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token REINFORCE loss ``-A · log π_θ(x_t)`` (Williams 1992).

    Returns loss_BT and metric ``logp_mean`` (masked mean of log π over valid tokens).
    """
    loss_BT = _apply_weights_and_mask(-adv_BT.detach() * logp_BT, mask_BT, is_weights_BT)
    metrics = {"logp_mean": masked_mean(logp_BT.detach(), mask_BT)}
    return loss_BT, metrics


def gspo_loss(
    logp_BT: torch.Tensor,
    old_logp_BT: torch.Tensor,
    adv_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    *,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
    is_weights_BT: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token GSPO-token loss ``max(-A·s_i,t, -A·clip(s_i,t, 1-clip_low, 1+clip_high))``.

    ``s_i,t = exp(sg(log s_i) + log π_θ(y_t) − sg(log π_θ(y_t)))`` with ``log s_i`` the mean
    log-ratio of sequence i over its valid tokens (module docstring). The clip acts on the value
    ``s_i``, so a sequence is clipped as a whole: every one of its tokens, or none.

    Returns loss_BT and metrics ``clip_frac`` (tokens of clipped sequences), ``seq_ratio_mean``,
    ``seq_ratio_max`` (over sequences with a valid token), ``approx_kl`` (token k3 of π_old‖π_θ),
    ``ratio_mean`` and ``ratio_max`` (of the token ratios, for comparison with PPO).
    """
    if clip_low < 0 or clip_high < 0:
        raise ValueError(f"clip ranges must be >= 0, got low={clip_low}, high={clip_high}")
    adv_BT = adv_BT.detach()
    seq_log_ratio_B = seq_mean_log_ratio(logp_BT, old_logp_BT, mask_BT)
    s_BT = torch.exp(seq_log_ratio_B[:, None] + logp_BT - logp_BT.detach())
    unclipped_BT = -adv_BT * s_BT
    clipped_BT = -adv_BT * s_BT.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss_BT = _apply_weights_and_mask(torch.maximum(unclipped_BT, clipped_BT), mask_BT, is_weights_BT)
    with torch.no_grad():
        has_tokens_B = mask_BT.bool().any(-1)
        seq_ratio_B = torch.exp(seq_log_ratio_B)
        lr = (logp_BT.detach() - old_logp_BT.detach()).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
        metrics = {
            "clip_frac": masked_mean((clipped_BT > unclipped_BT).float(), mask_BT),
            "seq_ratio_mean": masked_mean(seq_ratio_B, has_tokens_B),
            "seq_ratio_max": masked_max(seq_ratio_B, has_tokens_B),
            "approx_kl": masked_mean(torch.expm1(lr) - lr, mask_BT),
            "ratio_mean": masked_mean(torch.exp(lr), mask_BT),
            "ratio_max": masked_max(torch.exp(lr), mask_BT),
        }
    return loss_BT, metrics


def cispo_loss(
    logp_BT: torch.Tensor,
    old_logp_BT: torch.Tensor,
    adv_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    *,
    clip_low: float = 1.0,
    clip_high: float = 0.28,
    is_weights_BT: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token CISPO loss ``-sg(clip(ρ_t, 1-clip_low, 1+clip_high)) · A · log π_θ(x_t)``,
    ``ρ_t = π_θ / π_old``. ``clip_low = 1`` leaves the weight unbounded below (MiniMax-M1).

    Returns loss_BT and metrics ``clip_frac`` (tokens whose weight was clipped, either side),
    ``ratio_mean``, ``ratio_max``, ``approx_kl`` (k3 of π_old‖π_θ), ``logp_mean``.
    """
    if not 0 <= clip_low <= 1 or clip_high < 0:
        raise ValueError(f"need 0 <= clip_low <= 1 and clip_high >= 0, got low={clip_low}, high={clip_high}")
    lr = (logp_BT.detach() - old_logp_BT.detach()).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    ratio_BT = torch.exp(lr)
    weight_BT = ratio_BT.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss_BT = _apply_weights_and_mask(-weight_BT * adv_BT.detach() * logp_BT, mask_BT, is_weights_BT)
    with torch.no_grad():
        metrics = {
            "clip_frac": masked_mean((weight_BT != ratio_BT).float(), mask_BT),
            "ratio_mean": masked_mean(ratio_BT, mask_BT),
            "ratio_max": masked_max(ratio_BT, mask_BT),
            "approx_kl": masked_mean(torch.expm1(lr) - lr, mask_BT),
            "logp_mean": masked_mean(logp_BT.detach(), mask_BT),
        }
    return loss_BT, metrics


def _pg_loss_uniform(logp_BT, old_logp_BT, adv_BT, mask_BT, *, is_weights_BT=None, **_unused):
    """``pg_loss`` behind the same call shape as ``ppo_clip_loss`` (old log-probs unused)."""
    return pg_loss(logp_BT, adv_BT, mask_BT, is_weights_BT)


# Every entry takes (logp_BT, old_logp_BT, adv_BT, mask_BT, *, is_weights_BT=None, ...), so a
# trainer calls whichever it picked the same way; "pg" ignores old_logp_BT and the clip knobs.
POLICY_LOSSES: dict[str, Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]] = {
    "ppo_clip": ppo_clip_loss,
    "pg": _pg_loss_uniform,
    "gspo": gspo_loss,
    "cispo": cispo_loss,
}
