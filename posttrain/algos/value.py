"""Value-function loss for PPO with a learned critic (Schulman et al. 2017, "Proximal Policy
Optimization Algorithms"; value clipping as in the OpenAI baselines PPO2 implementation).

``0.5 · max((V - R)², (V_clip - R)²)`` with ``V_clip = V_old + clip(V - V_old, -c, c)``: the
pessimistic (larger) of the two errors, so the critic cannot profit from moving far from the
values it had when the data was collected. ``clip=None`` gives ``0.5 · (V - R)²``.
"""

from __future__ import annotations

import torch

from posttrain.algos._masked import masked_mean


def explained_variance(
    values_BT: torch.Tensor, returns_BT: torch.Tensor, mask_BT: torch.Tensor
) -> torch.Tensor:
    """``1 - Var(R - V) / Var(R)`` over valid tokens (1: perfect, 0: no better than a constant).

    Returns 0 when the returns have no variance (the ratio is undefined there) so logs stay finite.
    """
    v, r = values_BT.detach().float(), returns_BT.detach().float()
    mask = mask_BT.bool()
    r_mean = masked_mean(r, mask)
    var_r = masked_mean((r - r_mean) ** 2, mask)
    res = r - v
    var_res = masked_mean((res - masked_mean(res, mask)) ** 2, mask)
    return torch.where(var_r > 0, 1.0 - var_res / var_r.clamp(min=1e-30), torch.zeros_like(var_r))


def value_loss(
    values_BT: torch.Tensor,
    old_values_BT: torch.Tensor,
    returns_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    *,
    clip: float | None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token (clipped) squared error of the critic, 0 at masked positions.

    Args:
        values_BT: (B, T) current value predictions, with gradient.
        old_values_BT: (B, T) predictions when the rollout was scored (constant).
        returns_BT: (B, T) targets, e.g. from ``advantages.gae`` (constant).
        clip: value clip range c (> 0), or None for no clipping.

    Returns:
        loss_BT and metrics ``vf_clip_frac`` (tokens where the clipped error is the larger),
        ``explained_variance``, ``values_mean``, ``returns_mean``.
    """
    if clip is not None and clip <= 0:
        raise ValueError(f"value clip must be > 0 or None, got {clip}")
    returns_BT, old_values_BT = returns_BT.detach(), old_values_BT.detach()
    err_BT = (values_BT - returns_BT) ** 2
    clipped_active_BT = torch.zeros_like(mask_BT, dtype=torch.bool)
    if clip is not None:
        v_clip_BT = old_values_BT + (values_BT - old_values_BT).clamp(-clip, clip)
        err_clip_BT = (v_clip_BT - returns_BT) ** 2
        clipped_active_BT = err_clip_BT > err_BT
        err_BT = torch.maximum(err_BT, err_clip_BT)
    loss_BT = torch.where(mask_BT.bool(), 0.5 * err_BT, torch.zeros_like(err_BT))
    metrics = {
        "vf_clip_frac": masked_mean(clipped_active_BT.float(), mask_BT),
        "explained_variance": explained_variance(values_BT, returns_BT, mask_BT),
        "values_mean": masked_mean(values_BT.detach(), mask_BT),
        "returns_mean": masked_mean(returns_BT, mask_BT),
    }
    return loss_BT, metrics
