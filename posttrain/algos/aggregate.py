"""Turning a per-token loss into the scalar that is back-propagated.

Every mode divides by denominators passed in by the caller and computed over the *global* batch
(all micro-batches of the optimiser step, across data-parallel ranks). Summing the scalars of the
micro-batches then gives exactly the loss and gradient of the whole batch, whatever the split:
no micro-batch is averaged with a local count that differs from its neighbours'.

Modes (uniform signature ``fn(loss_BT, mask_BT, *, global_num_tokens, global_num_seqs,
norm_constant, seq_num_tokens_B) -> scalar``; each uses what it needs and raises ValueError when
that is missing):

* ``token_mean``: Σ loss·mask / global_num_tokens. Every token weighs the same (DAPO, Yu et al.
  2025, argue for it in long-chain RL; it is the standard SFT objective).
* ``seq_mean_token_mean``: Σ_seq (token mean within the sequence) / global_num_seqs. The original
  GRPO aggregation (Shao et al. 2024); it weighs tokens of short sequences more.
* ``seq_mean_token_sum_norm``: Σ_seq (token sum / norm_constant) / global_num_seqs, with a constant
  such as the maximum generation length: Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like
  Training") removes the length bias of dividing by each sequence's own length.

A sequence with no valid token contributes 0 to the sequence modes (it still counts in
``global_num_seqs`` if the caller counted it).

A sequence may span several rows (a multi-turn episode split into samples where the chat template
rewrote its history): ``seq_num_tokens_B`` then gives, per row, the valid tokens of the whole
sequence, so ``seq_mean_token_mean`` divides each row's sum by the sequence's count and the rows
of one sequence add up to its token mean; the caller counts the sequence once in
``global_num_seqs``. The other modes need nothing: token sums add up across rows by themselves.
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
    seq_num_tokens_B: torch.Tensor | None = None,
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
    seq_num_tokens_B: torch.Tensor | None = None,
) -> torch.Tensor:
    """Σ_b [Σ_t loss·mask / n_b] / global_num_seqs, n_b = Σ_t mask of row b, or the valid tokens
    of the sequence row b is part of when ``seq_num_tokens_B`` (B,) is given."""
    denom = _require("global_num_seqs", global_num_seqs)
    tokens_B = mask_BT.bool().sum(-1) if seq_num_tokens_B is None else seq_num_tokens_B
    tokens_B = tokens_B.clamp(min=1).to(loss_BT.dtype)
    return (_masked(loss_BT, mask_BT).sum(-1) / tokens_B).sum() / denom


def seq_mean_token_sum_norm(
    loss_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    *,
    global_num_tokens: Number | None = None,
    global_num_seqs: Number | None = None,
    norm_constant: Number | None = None,
    seq_num_tokens_B: torch.Tensor | None = None,
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
