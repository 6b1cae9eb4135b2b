"""Per-token estimators of KL(π‖π_ref) from samples x ~ π (Schulman 2020, "Approximating KL
Divergence", http://joschu.net/blog/kl-approx.html). With ``d = log π_ref(x) - log π(x)``:

* ``k1 = -d``: unbiased, high variance, can be negative per token.
* ``k2 = d² / 2``: biased, low variance, ≥ 0.
* ``k3 = e^d - d - 1``: unbiased (E_π[e^d] = 1), ≥ 0, low variance; the "low_var_kl" of
  GRPO (Shao et al. 2024).

Use them either as a per-token reward penalty (``r_t -= β · kl.detach()``, PPO-RLHF style,
Ouyang et al. 2022) or as a loss term added to the policy loss (GRPO style). The functions do not
detach: the caller decides. k3 clamps ``d`` to [-20, 20] before the exponential so a single
token with a near-zero probability cannot produce inf/NaN gradients.
"""

from __future__ import annotations

from typing import Callable

import torch

_MAX_LOG_RATIO = 20.0


def kl_k1(logp_BT: torch.Tensor, ref_logp_BT: torch.Tensor) -> torch.Tensor:
    """k1 = log π(x) - log π_ref(x), per token, shape (B, T)."""
    return logp_BT - ref_logp_BT


def kl_k2(logp_BT: torch.Tensor, ref_logp_BT: torch.Tensor) -> torch.Tensor:
    """k2 = ½ (log π(x) - log π_ref(x))², per token, shape (B, T)."""
    return 0.5 * (logp_BT - ref_logp_BT) ** 2


def kl_k3(logp_BT: torch.Tensor, ref_logp_BT: torch.Tensor) -> torch.Tensor:
    """k3 = exp(ref - logp) - (ref - logp) - 1, per token, shape (B, T); always ≥ 0."""
    d_BT = (ref_logp_BT - logp_BT).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    # expm1 keeps precision near d = 0, where e^d - 1 - d is a difference of close numbers.
    return torch.expm1(d_BT) - d_BT


KL_ESTIMATORS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "k1": kl_k1,
    "k2": kl_k2,
    "k3": kl_k3,
}
