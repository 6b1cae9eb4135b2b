"""The trainer's forward with each group's prompt run once.

The G samples of a prompt share its tokens, so a forward over the ``prompt + completion`` rows of a
step computes every prompt G times (a third of the positions for a 17-token prompt and 32 new
tokens). Here the distinct prompts of a micro-batch run once, left-padded, filling a KV cache; the
cache rows are gathered to the samples (an index-select, differentiable, so the gradient of every
sample flows back into the one prompt pass) and the completions run on top of it. The mathematics
is that of the full forward: a completion token attends to exactly its prompt's tokens and the
completion tokens before it, at the same positions; only the order of floating-point sums changes.

Only the completion targets come out, compactly: ``TargetLogits`` holds (N, C, V) logits for the
C completion positions of the longest row, the tokens they score, and where each lands among the
(N, L-1) target-aligned columns. The log-softmax, the entropy and their backward then run over
completion positions only (prompt columns are a third of a row here), and ``place`` puts the
per-token results where ``mask_BT`` expects them, zero elsewhere. A row's last completion token
scores nothing (nothing follows it) and is never run. When no prompt is shared, or a row is not
laid out as prompt then completion, ``completion_logits`` returns None and the caller runs the
plain forward (`TargetLogits.full` wraps its logits the same way).
"""

from __future__ import annotations

import copy
import dataclasses
import inspect

import torch
from transformers import DynamicCache

from posttrain.rl.batch import RLBatch


class PrefixCache(DynamicCache):
    """The prompts' KV cache, which a layer run again finds as it was the first time.

    Activation checkpointing runs each decoder layer a second time in backward, with the cache
    object it was given. A cache that stores what every call adds would by then hold the
    completion's keys already (the recompute appends them twice). So the prompt pass stores each
    layer's keys once (a second call, the recompute, has no past and gets its own keys back), and
    the completion pass gets a `gathered` copy, one row per sample, that returns the prefix followed
    by the call's own keys and stores nothing. The gather is differentiable: every completion's
    gradient reaches the one prompt pass.
    """

    frozen = False

    def gathered(self, rows: torch.Tensor) -> "PrefixCache":
        """A frozen copy holding the prefix of prompt ``rows[i]`` at row i (this cache unchanged)."""
        out = copy.copy(self)
        out.layers = [copy.copy(layer) for layer in self.layers]
        for layer in out.layers:
            if layer.is_initialized:
                layer.keys, layer.values = layer.keys[rows], layer.values[rows]
        out.frozen = True
        return out

    def update(self, key_states, value_states, layer_idx: int, *args, **kwargs):
        if self.frozen:
            layer = self.layers[layer_idx]
            return torch.cat([layer.keys, key_states], -2), torch.cat([layer.values, value_states], -2)
        if len(self.layers) > layer_idx and self.layers[layer_idx].is_initialized:
            return key_states, value_states  # the prompt pass run again: the prompt has no past
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)


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


@dataclasses.dataclass
class TargetLogits:
    """Logits of some target-aligned positions: ``logits_BXV`` scores ``targets_BX``; ``place`` maps
    any (N, X) per-position values to the (N, L-1) target-aligned columns, zero where none lands."""

    logits_BXV: torch.Tensor
    targets_BX: torch.Tensor
    rows: torch.Tensor | None = None  # with cols and js: (rows, cols) of the output take (rows, js); None = identity
    cols: torch.Tensor | None = None
    js: torch.Tensor | None = None
    width: int = 0
    packed: int = 0  # > 0: the values are one packed row (`posttrain.rl.packed`) for this many rows

    @classmethod
    def full(cls, logits_BTV: torch.Tensor, targets_BT: torch.Tensor) -> "TargetLogits":
        return cls(logits_BTV, targets_BT)

    def place(self, values_BX: torch.Tensor) -> torch.Tensor:
        """(N, L-1) values at their target columns (differentiable), zero elsewhere."""
        if self.rows is None:
            return values_BX
        if self.packed:
            out = values_BX.new_zeros(self.packed, self.width)
            return out.index_put((self.rows, self.cols), values_BX[0, self.js])
        out = values_BX.new_zeros(values_BX.shape[0], self.width)
        return out.index_put((self.rows, self.cols), values_BX[self.rows, self.js])


def completion_logits(model, mb: RLBatch, device, agree=bool, budget: float = float("inf")) -> TargetLogits | None:
    """The completion targets' logits (see the module docstring); None to fall back, also when it
    would run more positions than ``budget`` (what the alternative forward runs).

    ``agree(usable) -> bool`` decides with the peers: sharded ranks run their forwards in lock step,
    and this path makes two model calls where the plain forward makes one, so either every rank
    takes it or none does (a micro-batch with one row per prompt on one rank is enough to differ)."""
    mask, ids = mb.mask_BT, mb.input_ids_BT
    n, width = mask.shape
    lengths_B = mask.sum(1)
    start_B = mask.int().argmax(1) + 1  # position of the first completion token
    span_BC = torch.arange(int(lengths_B.max()))[None, :] < lengths_B[:, None]
    contiguous = bool((lengths_B > 0).all()) and torch.equal(
        mask.gather(1, (start_B[:, None] - 1 + torch.arange(span_BC.shape[1])).clamp(max=width - 1)) & span_BC, span_BC)
    unique, expand_B = torch.unique(mb.prompt_idx_B, return_inverse=True)
    usable = contiguous and len(unique) < n
    if usable:
        prompts_BP, real_BP = _left_padded_prompts(ids, start_B)
        first_U = torch.zeros(len(unique), dtype=torch.long).scatter_reduce(
            0, expand_B, torch.arange(n), reduce="amin", include_self=False)
        # rows that claim one prompt must carry the same tokens
        usable = torch.equal(prompts_BP, prompts_BP[first_U][expand_B]) and torch.equal(real_BP, real_BP[first_U][expand_B])
        usable = usable and len(unique) * prompts_BP.shape[1] + n * max(span_BC.shape[1] - 1, 1) <= budget
    if not agree(usable):
        return None
    real_UP, cache, key = real_BP[first_U], PrefixCache(config=model.config), _cache_kwarg(model)
    out = model(input_ids=prompts_BP[first_U].to(device), attention_mask=real_UP.to(device),
                position_ids=(real_UP.cumsum(1) - 1).clamp(min=0).to(device), use_cache=True, logits_to_keep=1,
                **{key: cache})
    pos_BC = start_B[:, None] + torch.arange(span_BC.shape[1])
    comp_BC = torch.where(span_BC, ids.gather(1, pos_BC.clamp(max=ids.shape[1] - 1)), 0)
    # Completion token 0 is predicted by the prompt's last position, token j by completion position
    # j-1; the last position predicts nothing and is not run. With one-token completions one position
    # still runs, so that every call makes two forwards (sharded ranks run them in lock step).
    C = span_BC.shape[1]
    run = max(C - 1, 1)
    comp = model(input_ids=comp_BC[:, :run].to(device), attention_mask=torch.cat([real_BP, span_BC[:, :run].long()], 1)
                 .to(device), position_ids=pos_BC[:, :run].to(device), use_cache=True,
                 **{key: cache.gathered(expand_B.to(device))})
    logits_BCV = torch.cat([out.logits[:, -1:][expand_B.to(device)], comp.logits[:, : C - 1]], 1)
    rows, js = span_BC.nonzero(as_tuple=True)
    return TargetLogits(logits_BCV, comp_BC.to(device), rows.to(device), (start_B[rows] - 1 + js).to(device),
                        js.to(device), width)
