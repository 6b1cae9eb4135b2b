"""The trainer's forward with a micro-batch's rows packed into one sequence, no padding.

A padded forward runs every row to the longest row's length: a micro-batch of a 2,000-token
reasoning trace and seven 50-token answers computes 16,000 positions for 2,350 real ones. Here the
rows are laid end to end in one sequence of Σ lengths, position ids restart at 0 for each row, and
attention stays inside each row: causal scaled-dot-product attention one row at a time, with each
layer's sliding window where the model has one — a block-diagonal mask is never built, and a row
costs its own length squared. The mathematics is the padded forward's: a token attends to exactly
the earlier tokens of its own row, at the same positions; only the order of floating-point sums
differs.

`install` gives the policy model an attention implementation that does this when the call
carries ``packed_rows`` (the rows' lengths) and is otherwise the model's own (sdpa, flash
attention; its masks built as before). The row lengths travel with the call's keyword
arguments, so a decoder layer recomputed in backward (activation checkpointing) packs the same
way. A packed call passes a 1x1x1x1 placeholder mask, which transformers hands through unchanged
instead of building one.

A row's last token predicts nothing and is left out. ``packed_logits`` returns a `TargetLogits`
over the packed positions whose ``place`` puts per-token values back in the (N, L-1)
target-aligned layout. Rows whose real tokens are not one contiguous span, and models whose
attention the row-wise function cannot reproduce (soft-capped attention logits, Gemma 2; an
attention implementation transformers has no shared function for, eager), keep the padded
forward.
"""

from __future__ import annotations

import torch

from posttrain.rl.batch import RLBatch
from posttrain.rl.shared_prefix import TargetLogits

PREFIX = "posttrain_packed_"


def install(model) -> bool:
    """Give ``model`` the packing attention (see the module docstring); False when it cannot pack."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    from posttrain.rollout.windows import UnsupportedModel, layer_windows

    config = getattr(model, "config", None)
    if not hasattr(config, "get_text_config"):  # not a transformers model
        return False
    configs = list({id(c): c for c in (config, config.get_text_config(decoder=True))}.values())
    original = configs[-1]._attn_implementation or ""
    if original.startswith(PREFIX):
        return True
    if getattr(configs[-1], "attn_logit_softcapping", None) or original not in AttentionInterface._global_mapping:
        return False
    try:
        layer_windows(model)
    except UnsupportedModel:
        return False
    name = PREFIX + original
    if name not in AttentionInterface._global_mapping:
        AttentionInterface.register(name, _dispatcher(AttentionInterface._global_mapping[original]))
        ALL_MASK_ATTENTION_FUNCTIONS.register(name, ALL_MASK_ATTENTION_FUNCTIONS[original])
    for c in configs:
        c._attn_implementation = name
    return True


def packs(model) -> bool:
    config = getattr(model, "config", None)
    return hasattr(config, "get_text_config") and \
        str(config.get_text_config(decoder=True)._attn_implementation).startswith(PREFIX)


def _dispatcher(own):
    def attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
        rows, windows = kwargs.pop("packed_rows", None), kwargs.pop("packed_windows", None)
        if rows is None:
            return own(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
        if dropout and module.training:
            raise ValueError("packed attention runs without dropout")
        return rows_attention(query, key, value, rows, windows[module.layer_idx], scaling)
    return attention


def rows_attention(query, key, value, rows: list[int], window: int | None, scaling) -> torch.Tensor:
    """Causal attention within each row (their lengths ``rows``), a token seeing the ``window``
    latest positions of its row when set. query (1, H, L, D), key and value (1, H_kv, L, D);
    returns (1, L, H, D), as transformers' attention functions do."""
    groups = query.shape[1] // key.shape[1]
    if groups > 1:
        key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
    out = []
    for q, k, v in zip(query.split(rows, 2), key.split(rows, 2), value.split(rows, 2)):
        n = q.shape[2]
        if window is not None and n > window:
            i = torch.arange(n, device=q.device)
            allowed = (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - window)
            out.append(torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=scaling))
        else:
            out.append(torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scaling))
    return torch.cat(out, 2).transpose(1, 2).contiguous(), None


def packed_tokens(mb: RLBatch) -> int | None:
    """Positions the packed forward runs for ``mb`` (None when its rows are not contiguous spans)."""
    mask = mb.attention_mask_BT.bool()
    lengths = mask.sum(1)
    start = mask.int().argmax(1)
    cols = torch.arange(mask.shape[1])[None, :]
    if not torch.equal(mask, (cols >= start[:, None]) & (cols < (start + lengths)[:, None])):
        return None
    return int((lengths - 1).clamp(min=0).sum())


def packed_logits(model, mb: RLBatch, device) -> TargetLogits:
    """The targets' logits from one packed forward of a model given `install` (see the module
    docstring); ``mb``'s rows must be contiguous spans (`packed_tokens` is not None)."""
    mask = mb.attention_mask_BT.bool()
    n, width = mask.shape
    start = mask.int().argmax(1)
    run_B = (mask.sum(1) - 1).clamp(min=0)  # a row's last token predicts nothing: not run
    cols = torch.arange(width)[None, :]
    runs_BT = (cols >= start[:, None]) & (cols < (start + run_B)[:, None])
    rows, at = runs_BT.nonzero(as_tuple=True)  # row-major: each row's positions together, in order
    from posttrain.rollout.windows import layer_windows

    ids = mb.input_ids_BT
    placeholder = torch.ones(1, 1, 1, 1, dtype=torch.bool, device=device)  # passed through, never built
    out = model(input_ids=ids[rows, at][None].to(device), position_ids=(at - start[rows])[None].to(device),
                attention_mask=placeholder, use_cache=False, packed_rows=[int(x) for x in run_B if x > 0],
                packed_windows=layer_windows(model))
    return TargetLogits(out.logits, ids[rows, at + 1][None].to(device), rows.to(device), at.to(device),
                        torch.arange(len(rows), device=device), width - 1, packed=n)
