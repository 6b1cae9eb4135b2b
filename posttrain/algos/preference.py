"""Preference losses on sequence-level scores, per pair (shape (B,)).

* ``dpo_loss`` — Direct Preference Optimization (Rafailov et al. 2023). Inputs are sequence
  log-probabilities (summed or per-token means) of each completion under the policy and the frozen
  reference. With
  ``h = (π_c - ref_c) - (π_r - ref_r)``:
  - ``kind="sigmoid"``: ``-(1-ε) log σ(βh) - ε log σ(-βh)``; ε > 0 is conservative DPO (cDPO,
    Mitchell 2023), which assumes labels are flipped with probability ε.
  - ``kind="ipo"``: ``(h - 1/(2β))²`` (Azar et al. 2023, "A General Theoretical Paradigm to
    Understand Learning from Human Preferences"); the IPO paper uses length-averaged log-probs,
    which the caller chooses by what it passes in (`posttrain dpo` averages for IPO by default).
  Implicit rewards ``β(π - ref)`` are reported as metrics.
* ``bradley_terry_loss`` — reward-model loss ``-log σ(s_c - s_r - m)`` (Bradley & Terry 1952;
  the optional margin m is the Llama 2 preference-strength margin, Touvron et al. 2023).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

DPO_KINDS = ("sigmoid", "ipo")


def dpo_loss(
    pol_chosen_B: torch.Tensor,
    pol_rejected_B: torch.Tensor,
    ref_chosen_B: torch.Tensor,
    ref_rejected_B: torch.Tensor,
    *,
    beta: float = 0.1,
    label_smoothing: float = 0.0,
    kind: str = "sigmoid",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-pair DPO / cDPO / IPO loss.

    Args:
        pol_chosen_B, pol_rejected_B: (B,) sequence log-probs under the policy (with gradient).
        ref_chosen_B, ref_rejected_B: (B,) the same under the reference (detached here).
        beta: strength of the KL tie to the reference (> 0).
        label_smoothing: ε in [0, 0.5) for cDPO; only with kind="sigmoid".
        kind: "sigmoid" or "ipo".

    Returns:
        loss_B and metrics ``rewards/chosen``, ``rewards/rejected``, ``rewards/margin`` (batch
        means of the implicit rewards) and ``rewards/accuracy`` (fraction with chosen > rejected).
    """
    if kind not in DPO_KINDS:
        raise ValueError(f"kind must be one of {DPO_KINDS}, got {kind!r}")
    if beta <= 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    if not 0.0 <= label_smoothing < 0.5:
        raise ValueError(f"label_smoothing must be in [0, 0.5), got {label_smoothing}")
    if kind == "ipo" and label_smoothing:
        raise ValueError("label_smoothing applies to kind='sigmoid' only")
    chosen_ratio_B = pol_chosen_B - ref_chosen_B.detach()
    rejected_ratio_B = pol_rejected_B - ref_rejected_B.detach()
    h_B = chosen_ratio_B - rejected_ratio_B
    if kind == "sigmoid":
        loss_B = -(1 - label_smoothing) * F.logsigmoid(beta * h_B) - label_smoothing * F.logsigmoid(-beta * h_B)
    else:
        loss_B = (h_B - 1.0 / (2.0 * beta)) ** 2
    with torch.no_grad():
        r_c, r_r = beta * chosen_ratio_B, beta * rejected_ratio_B
        metrics = {
            "rewards/chosen": r_c.mean(),
            "rewards/rejected": r_r.mean(),
            "rewards/margin": (r_c - r_r).mean(),
            "rewards/accuracy": (r_c > r_r).float().mean(),
        }
    return loss_B, metrics


def bradley_terry_loss(
    chosen_B: torch.Tensor,
    rejected_B: torch.Tensor,
    *,
    margin_B: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-pair ``-log σ(chosen - rejected - margin)`` for scalar reward-model scores.

    Returns loss_B and metrics ``accuracy`` (chosen > rejected), ``margin`` (mean score gap),
    ``chosen_mean``, ``rejected_mean``.
    """
    gap_B = chosen_B - rejected_B
    loss_B = -F.logsigmoid(gap_B if margin_B is None else gap_B - margin_B)
    with torch.no_grad():
        metrics = {
            "accuracy": (gap_B > 0).float().mean(),
            "margin": gap_B.mean(),
            "chosen_mean": chosen_B.mean(),
            "rejected_mean": rejected_B.mean(),
        }
    return loss_B, metrics
