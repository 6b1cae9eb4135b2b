"""Advantage estimators: group baselines for outcome rewards, and GAE for per-token rewards.

Group estimators take ``rewards_PG`` (P prompts × G samples each) and ``valid_PG`` (bool). A sample
is invalid when its reward is not a statement about the model (TASK_FAIL, INFRA_FAIL): invalid
samples are left out of every group statistic and get an advantage of exactly 0, so they carry no
gradient. A group is *zero-variance* when its valid rewards are all equal or it has fewer than two
valid samples; it gets advantage exactly 0 (not a tiny number divided by eps), and is flagged in
``metrics["zero_variance_P"]`` so the controller can count or drop it.

Uniform signature: ``fn(rewards_PG, valid_PG, *, lengths_PG=None, eps=1e-6) -> (adv_PG, metrics)``.
``lengths_PG`` (loss tokens per sample) matters to estimators whose statistics run over tokens
(``reinforce_pp``); the others ignore it.

Choices:
* Standard deviations use Bessel's correction (n - 1), as ``torch.std`` and the common GRPO
  implementations do; with two samples [1, 0] GRPO gives ±0.7071, not ±1.
* Zero variance is decided by exact equality (max == min over valid rewards), not by a
  threshold on the std, so rewards 0.3 and 0.3000001 still form a (tiny) learning signal.
* ``reinforce_pp`` whitens over the tokens of the batch passed in: the caller passes the whole
  step's batch (advantages are computed once, at the controller).
"""

from __future__ import annotations

from typing import Callable

import torch


def _check(rewards_PG: torch.Tensor, valid_PG: torch.Tensor) -> None:
    if rewards_PG.dim() != 2:
        raise ValueError(f"rewards_PG must be (P, G), got shape {tuple(rewards_PG.shape)}")
    if valid_PG.shape != rewards_PG.shape:
        raise ValueError(f"valid_PG shape {tuple(valid_PG.shape)} != rewards shape {tuple(rewards_PG.shape)}")


def zero_variance(rewards_PG: torch.Tensor, valid_PG: torch.Tensor) -> torch.Tensor:
    """(P,) bool: the group's valid rewards are all equal, or it has fewer than two valid samples."""
    _check(rewards_PG, valid_PG)
    return _group_stats(rewards_PG, valid_PG)[3]


def _group_stats(rewards_PG: torch.Tensor, valid_PG: torch.Tensor):
    """Per-group count, mean, Bessel std over valid samples, and the zero-variance flag."""
    r_PG = rewards_PG.float()
    v_PG = valid_PG.bool()
    n_P = v_PG.sum(-1)
    n_safe_P = n_P.clamp(min=1).float()
    mean_P = torch.where(v_PG, r_PG, 0.0).sum(-1) / n_safe_P
    sq_P = torch.where(v_PG, (r_PG - mean_P[:, None]) ** 2, 0.0).sum(-1)
    std_P = (sq_P / (n_P - 1).clamp(min=1).float()).sqrt()
    r_max_P = torch.where(v_PG, r_PG, -torch.inf).amax(-1)
    r_min_P = torch.where(v_PG, r_PG, torch.inf).amin(-1)
    zero_var_P = (n_P < 2) | (r_max_P == r_min_P)
    return n_P, mean_P, std_P, zero_var_P


def _finish(adv_PG, valid_PG, zero_var_P):
    keep_PG = valid_PG.bool() & ~zero_var_P[:, None]
    adv_PG = torch.where(keep_PG, adv_PG, torch.zeros_like(adv_PG))
    metrics = {
        "zero_variance_P": zero_var_P,
        "zero_variance_frac": zero_var_P.float().mean(),
        "num_valid_P": valid_PG.bool().sum(-1),
    }
    return adv_PG, metrics


def grpo_advantages(
    rewards_PG: torch.Tensor,
    valid_PG: torch.Tensor,
    *,
    scale_by_std: bool = True,
    lengths_PG: torch.Tensor | None = None,
    eps: float = 1e-6,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Group-relative advantage ``(r - mean_group) / (std_group + eps)``, or without the std.

    GRPO: Shao et al. 2024, "DeepSeekMath" (scale_by_std=True). Dr. GRPO: Liu et al. 2025,
    "Understanding R1-Zero-Like Training" (scale_by_std=False: dividing by the std up-weights
    groups that are nearly all right or all wrong).
    """
    _check(rewards_PG, valid_PG)
    _, mean_P, std_P, zero_var_P = _group_stats(rewards_PG, valid_PG)
    adv_PG = rewards_PG.float() - mean_P[:, None]
    if scale_by_std:
        adv_PG = adv_PG / (std_P[:, None] + eps)
    return _finish(adv_PG, valid_PG, zero_var_P)


def grpo(rewards_PG, valid_PG, *, lengths_PG=None, eps: float = 1e-6):
    """GRPO advantages (mean-centred, std-scaled); Shao et al. 2024."""
    return grpo_advantages(rewards_PG, valid_PG, scale_by_std=True, eps=eps)


def dr_grpo(rewards_PG, valid_PG, *, lengths_PG=None, eps: float = 1e-6):
    """Dr. GRPO advantages (mean-centred, no std); Liu et al. 2025."""
    return grpo_advantages(rewards_PG, valid_PG, scale_by_std=False, eps=eps)


def rloo(rewards_PG, valid_PG, *, lengths_PG=None, eps: float = 1e-6):
    """REINFORCE leave-one-out: ``r_i - mean_{j≠i} r_j`` over valid j.

    Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE Style Optimization for Learning
    from Human Feedback in LLMs". Equals ``n/(n-1) · (r_i - mean)`` for n valid samples.
    """
    _check(rewards_PG, valid_PG)
    n_P, mean_P, _, zero_var_P = _group_stats(rewards_PG, valid_PG)
    n_P = n_P.float()[:, None]
    sum_P = mean_P[:, None] * n_P
    r_PG = rewards_PG.float()
    baseline_PG = (sum_P - r_PG) / (n_P - 1).clamp(min=1)
    return _finish(r_PG - baseline_PG, valid_PG, zero_var_P)


def reinforce_pp(rewards_PG, valid_PG, *, lengths_PG=None, eps: float = 1e-8):
    """REINFORCE++ with a group baseline: subtract the group mean, then whiten over the batch's tokens.

    Hu et al. 2025, "REINFORCE++: A Simple and Efficient Approach for Aligning Large Language
    Models" (and verl's ``reinforce_plus_plus_baseline``): the centred reward ``c_i`` is given to
    every loss token of sample i, and the token values are whitened over all loss tokens of the
    batch, ``(c_i - μ) / sqrt(σ² + eps)`` with μ, σ² the token-weighted mean and (Bessel) variance.
    Since ``c_i`` is constant along a sample, this is a per-sample advantage with the statistics
    weighted by ``lengths_PG`` (loss tokens per sample; ``None`` counts every sample as one token).

    Zero-variance groups contribute their zero tokens to μ and σ² as in the paper, but keep an
    advantage of exactly 0 (the rule of every estimator here): re-centring would give them
    ``-μ/σ``, a push on every token of a group that holds no information about the answer.
    """
    _check(rewards_PG, valid_PG)
    _, mean_P, _, zero_var_P = _group_stats(rewards_PG, valid_PG)
    v_PG = valid_PG.bool()
    w_PG = torch.ones_like(rewards_PG, dtype=torch.float32) if lengths_PG is None else lengths_PG.float()
    w_PG = torch.where(v_PG, w_PG, 0.0)
    centred_PG = torch.where(v_PG, rewards_PG.float() - mean_P[:, None], 0.0)
    n = w_PG.sum()
    mu = (w_PG * centred_PG).sum() / n.clamp(min=1)
    var = (w_PG * (centred_PG - mu) ** 2).sum() / (n - 1).clamp(min=1)
    return _finish((centred_PG - mu) * torch.rsqrt(var + eps), valid_PG, zero_var_P)


ADVANTAGES: dict[str, Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]] = {
    "grpo": grpo,
    "dr_grpo": dr_grpo,
    "rloo": rloo,
    "reinforce_pp": reinforce_pp,
}


def gae(
    rewards_BT: torch.Tensor,
    values_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation; Schulman et al. 2016, "High-Dimensional Continuous
    Control Using Generalized Advantage Estimation".

    ``δ_t = r_t + γ V_{t+1} - V_t``, ``A_t = δ_t + γλ A_{t+1}``, ``R_t = A_t + V_t``.

    Masked positions (mask 0) are transparent: the recursion skips them, so the "next" state of a
    valid token is the next *valid* token (environment/observation tokens inside a multi-turn
    response do not break the chain), and after the last valid token the episode ends
    (V = 0). Rewards at masked positions are ignored; advantages and returns there are 0.

    Args:
        rewards_BT, values_BT: (B, T) per-token rewards and value estimates.
        mask_BT: (B, T) bool or 0/1.
        gamma, lam: discount and GAE λ in [0, 1].

    Returns:
        (adv_BT, returns_BT): fp32, detached from the inputs' graph.
    """
    r_BT, v_BT = rewards_BT.detach().float(), values_BT.detach().float()
    m_BT = mask_BT.bool()
    B, T = r_BT.shape
    adv_BT = torch.zeros_like(r_BT)
    next_value_B = torch.zeros(B, dtype=r_BT.dtype, device=r_BT.device)
    next_adv_B = torch.zeros_like(next_value_B)
    for t in reversed(range(T)):
        delta_B = r_BT[:, t] + gamma * next_value_B - v_BT[:, t]
        adv_t_B = delta_B + gamma * lam * next_adv_B
        m_B = m_BT[:, t]
        adv_BT[:, t] = torch.where(m_B, adv_t_B, 0.0)
        # Carry the state across masked positions unchanged.
        next_value_B = torch.where(m_B, v_BT[:, t], next_value_B)
        next_adv_B = torch.where(m_B, adv_t_B, next_adv_B)
    returns_BT = torch.where(m_BT, adv_BT + v_BT, 0.0)
    return adv_BT, returns_BT
