"""The trainer's forward with each group's prompt run once.

The G samples of a prompt share its tokens, so a forward over the ``prompt + completion`` rows of a
step computes every prompt G times (a third of the positions for a 17-token prompt and 32 new
tokens). Here the distinct prompts of a micro-batch run once, left-padded, filling a KV cache; the
cache rows are gathered to the samples (an index-select, differentiable, so the gradient of every
sample flows back into the one prompt pass) and the completions run on top of it. The mathematics
is that of the full forward: a completion token attends to exactly its prompt's tokens and the
completion tokens before it, at the same positions; only the order of floating-point sums changes.

Only the completion targets come out: the returned target-aligned logits are zero on prompt and
padding columns, which every consumer masks with ``mask_BT``. When no prompt is shared, or a row
is not laid out as prompt then completion, ``completion_logits`` returns None and the caller runs
the plain forward.
"""

from __future__ import annotations

import inspect

import torch
from transformers import DynamicCache

from posttrain.rl.batch import RLBatch


def _cache_kwarg(model) -> str:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # a peft wrapper passes it on
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


def _left_padded_prompts(ids_BL: torch.Tensor, start_B: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's prompt (the tokens before ``start_B``) left-padded to the longest: (B, P) ids and mask."""
    width = int(start_B.max())
    col_BP = torch.arange(width)[None, :] - (width - start_B[:, None])
    real_BP = col_BP >= 0
    prompts = torch.where(real_BP, ids_BL.gather(1, col_BP.clamp(min=0)), 0)
    return prompts, real_BP.long()


def completion_logits(model, mb: RLBatch, device) -> torch.Tensor | None:
    """(N, L-1, V) target-aligned logits, real where ``mb.mask_BT`` is set; None to fall back."""
    mask, ids = mb.mask_BT, mb.input_ids_BT
    n, width = mask.shape
    lengths_B = mask.sum(1)
    start_B = mask.int().argmax(1) + 1  # position of the first completion token
    span_BC = torch.arange(int(lengths_B.max()))[None, :] < lengths_B[:, None]
    contiguous = bool((lengths_B > 0).all()) and torch.equal(
        mask.gather(1, (start_B[:, None] - 1 + torch.arange(span_BC.shape[1])).clamp(max=width - 1)) & span_BC, span_BC)
    unique, expand_B = torch.unique(mb.prompt_idx_B, return_inverse=True)
    if not contiguous or len(unique) == n:
        return None
    prompts_BP, real_BP = _left_padded_prompts(ids, start_B)
    first_U = torch.zeros(len(unique), dtype=torch.long).scatter_reduce(
        0, expand_B, torch.arange(n), reduce="amin", include_self=False)
    if not (torch.equal(prompts_BP, prompts_BP[first_U][expand_B]) and torch.equal(real_BP, real_BP[first_U][expand_B])):
        return None  # rows that claim one prompt carry different tokens
    real_UP, cache, key = real_BP[first_U], DynamicCache(config=model.config), _cache_kwarg(model)
    out = model(input_ids=prompts_BP[first_U].to(device), attention_mask=real_UP.to(device),
                position_ids=(real_UP.cumsum(1) - 1).clamp(min=0).to(device), use_cache=True, logits_to_keep=1,
                **{key: cache})
    cache.batch_select_indices(expand_B.to(device))
    pos_BC = start_B[:, None] + torch.arange(span_BC.shape[1])
    comp_BC = torch.where(span_BC, ids.gather(1, pos_BC.clamp(max=ids.shape[1] - 1)), 0)
    comp = model(input_ids=comp_BC.to(device), attention_mask=torch.cat([real_BP, span_BC.long()], 1).to(device),
                 position_ids=pos_BC.to(device), use_cache=True, **{key: cache})
    # completion token 0 is predicted by the prompt's last position, token j by completion position j-1
    logits_BCV = torch.cat([out.logits[:, -1:][expand_B.to(device)], comp.logits[:, :-1]], 1)
    rows, js = span_BC.nonzero(as_tuple=True)
    full = logits_BCV.new_zeros(n, width, logits_BCV.shape[-1])
    cols = (start_B[rows] - 1 + js).to(device)
    return full.index_put((rows.to(device), cols), logits_BCV[rows.to(device), js.to(device)])
