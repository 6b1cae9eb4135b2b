"""Generic decoder over any Hugging Face causal LM forward, with a preallocated `StaticCache`.

Used for architectures `fast_llama` does not cover. Design choices:

* the cache is transformers' `StaticCache` sized to prompt + max_new_tokens, so each step writes one
  column in place (no per-step concatenation as with `DynamicCache`);
* we pass a ready 4-D additive attention mask (B, 1, Q, T_max) and explicit position ids, which
  the model uses as-is: left padding is handled without transformers rebuilding masks from a 2-D
  padding mask at each step. The per-row padding bias is built once at prefill;
* `keep(rows)` compacts the batch by index-selecting the rows of every cache layer's keys/values,
  so finished samples stop costing compute;
* only the last position's logits are computed (``logits_to_keep=1``).

Limitation: the mask we pass is a full causal one, so models with sliding-window or other
non-full attention layers are refused rather than silently run with the wrong mask.
"""

from __future__ import annotations

import inspect

import torch
from transformers import StaticCache


class HFDecoder:
    """Prefill + step decoder through ``model.forward`` (see module docstring)."""

    def __init__(self, model):
        self.model = model
        cfg = model.config.get_text_config(decoder=True)
        layer_types = getattr(cfg, "layer_types", None)
        if layer_types is not None and any(t != "full_attention" for t in layer_types):
            raise NotImplementedError(f"{cfg.model_type}: layers {set(layer_types)} need masks this decoder does not build")
        params = inspect.signature(model.forward).parameters
        self.cache_arg = "cache" if "cache" in params else "past_key_values"
        self.dtype = next(model.parameters()).dtype
        self.rows_seen: list[int] = []

    def refresh(self) -> None:
        """Nothing to re-read: the forward uses the model's parameters directly."""

    def _forward(self, ids, mask, pos) -> torch.Tensor:
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True,
                         logits_to_keep=1, **{self.cache_arg: self.cache})
        self.rows_seen.append(ids.shape[0])
        return out.logits[:, -1].float()

    @torch.inference_mode()
    def prefill(self, ids_UP: torch.Tensor, pad_U: torch.Tensor, expand_b: torch.Tensor, total_len: int) -> torch.Tensor:
        U, P = ids_UP.shape
        self.cache = StaticCache(config=self.model.config, max_cache_len=total_len)
        dev = ids_UP.device
        cols = torch.arange(total_len, device=dev)
        real_UT = cols[None, :] >= pad_U[:, None]
        neg = torch.finfo(self.dtype).min
        causal_PT = cols[None, :] <= cols[:P, None]
        allowed = (real_UT[:, None, :] & causal_PT) | (cols[None, None, :] == cols[None, :P, None])
        mask = torch.zeros(U, 1, P, total_len, dtype=self.dtype, device=dev).masked_fill_(~allowed[:, None], neg)
        pos_UP = (cols[None, :P] - pad_U[:, None]).clamp_(min=0)
        logits = self._forward(ids_UP, mask, pos_UP)
        self._select(expand_b)
        self.col = P
        self.pos_b = pos_UP[expand_b, -1] + 1
        self.bias_bT = torch.zeros(len(expand_b), total_len, dtype=self.dtype, device=dev).masked_fill_(~real_UT[expand_b], neg)
        self.cols = cols
        return logits[expand_b]

    @torch.inference_mode()
    def step(self, token_b: torch.Tensor) -> torch.Tensor:
        c = self.col
        mask = self.bias_bT.masked_fill(self.cols[None, :] > c, torch.finfo(self.dtype).min)[:, None, None, :]
        logits = self._forward(token_b[:, None], mask, self.pos_b[:, None])
        self.col += 1
        self.pos_b += 1
        return logits

    def _select(self, rows: torch.Tensor) -> None:
        for layer in self.cache.layers:
            layer.keys = layer.keys.index_select(0, rows)
            layer.values = layer.values.index_select(0, rows)
            layer.batch_size = len(rows)

    @torch.inference_mode()
    def keep(self, rows: torch.Tensor) -> None:
        self._select(rows)
        self.pos_b = self.pos_b[rows]
        self.bias_bT = self.bias_bT[rows]
