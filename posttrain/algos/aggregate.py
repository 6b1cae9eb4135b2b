"""Turning a per-token loss into the scalar that is back-propagated.

Every mode divides by denominators passed in by the caller and computed over the *global* batch
(all micro-batches of the optimiser step, across data-parallel ranks). Summing the scalars of the
micro-batches then gives exactly the loss and gradient of the whole batch, whatever the split:
no micro-batch is averaged with a local count that differs from its neighbours'.

Modes (uniform signature ``fn(loss_BT, mask_BT, *, global_num_tokens, global_num_seqs,
norm_constant) -> scalar``; each uses what it needs and raises ValueError when that is missing):

* ``token_mean``: Σ loss·mask / global_num_tokens. Every token weighs the same (DAPO, Yu et al.
  2025, argue for it in long-chain RL; it is the standard SFT objective).
* ``seq_mean_token_mean``: Σ_seq (token mean within the sequence) / global_num_seqs. The original
  GRPO aggregation (Shao et al. 2024); it weighs tokens of short sequences more.
* ``seq_mean_token_sum_norm``: Σ_seq (token sum / norm_constant) / global_num_seqs, with a constant
  such as the maximum generation length: Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like
  Training") removes the length bias of dividing by each sequence's own length.

A sequence with no valid token contributes 0 to the sequence modes (it still counts in
``global_num_seqs`` if the caller counted it).
"""

from __future__ import annotations

from typing import Callable

import torch

Number = int | float | torch.Tensor


def _require(name: str, value: Number | None) -> Number:
    if value is None:
        raise ValueError(f"this aggregation needs {name}")
    return value


def _masked(loss_BT: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    # where(), not multiply: a NaN/inf loss at a padded position must not leak into the sum.
    return torch.where(mask_BT.bool(), loss_BT, torch.zeros_like(loss_BT))


def token_mean(
    loss_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    *,
    global_num_tokens: Number | None = None,
    global_num_seqs: Number | None = None,
    norm_constant: Number | None = None,
) -> torch.Tensor:
    """Σ_{b,t} loss·mask / global_num_tokens."""
    denom = _require("global_num_tokens", global_num_tokens)
    return _masked(loss_BT, mask_BT).sum() / denom


def seq_mean_token_mean(
    loss_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    *,
    global_num_tokens: Number | None = None,
    global_num_seqs: Number | None = None,
    norm_constant: Number | None = None,
) -> torch.Tensor:
    """Σ_b [Σ_t loss·mask / Σ_t mask] / global_num_seqs."""
    denom = _require("global_num_seqs", global_num_seqs)
    tokens_B = mask_BT.bool().sum(-1).clamp(min=1).to(loss_BT.dtype)
    return (_masked(loss_BT, mask_BT).sum(-1) / tokens_B).sum() / denom


def seq_mean_token_sum_norm(
    loss_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    *,
    global_num_tokens: Number | None = None,
    global_num_seqs: Number | None = None,
    norm_constant: Number | None = None,
) -> torch.Tensor:
    """Σ_b [Σ_t loss·mask / norm_constant] / global_num_seqs (Dr. GRPO)."""
    denom = _require("global_num_seqs", global_num_seqs)
    norm = _require("norm_constant", norm_constant)
    return (_masked(loss_BT, mask_BT).sum(-1) / norm).sum() / denom


AGGREGATIONS: dict[str, Callable[..., torch.Tensor]] = {
    "token_mean": token_mean,
    "seq_mean_token_mean": seq_mean_token_mean,
    "seq_mean_token_sum_norm": seq_mean_token_sum_norm,
}
