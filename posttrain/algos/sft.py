"""Supervised fine-tuning loss: per-token negative log-likelihood of the targets.

The loss is returned per token (0 where the mask is 0) so the trainer picks the aggregation
explicitly (``aggregate.AGGREGATIONS``): a token mean over the global number of target tokens is
the usual SFT objective; a per-sequence mean weights short and long examples equally.
"""

from __future__ import annotations

import torch

from posttrain.algos.logprobs import token_logprobs


def sft_token_nll(
    logits_BTV: torch.Tensor, targets_BT: torch.Tensor, mask_BT: torch.Tensor
) -> torch.Tensor:
    """Per-token negative log-likelihood ``-log softmax(logits)[target]``.

    Args:
        logits_BTV: (B, T, V) logits; position t predicts ``targets_BT[:, t]`` (already shifted).
        targets_BT: (B, T) token ids; entries under mask 0 may hold anything, e.g. -100.
        mask_BT: (B, T) bool or 0/1; 1 marks tokens that are trained on.

    Returns:
        nll_BT: (B, T) fp32, exactly 0 where the mask is 0.
    """
    mask_BT = mask_BT.bool()
    # Ignore ids (-100) cannot be gathered; any valid id works since the result is masked out.
    safe_targets_BT = targets_BT.masked_fill(~mask_BT, 0)
    logp_BT = token_logprobs(logits_BTV, safe_targets_BT)
    return torch.where(mask_BT, -logp_BT, torch.zeros_like(logp_BT))
