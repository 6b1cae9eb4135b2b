"""Generic decoder over any Hugging Face causal LM forward, with a preallocated static cache.

Used for architectures `fast_llama` does not cover (Gemma 2/3, Phi-3, ...). Design choices:

* the cache holds every column of the sequence for every layer (transformers' `StaticLayer`
  sized to prompt + max_new_tokens), so each step writes one column in place (no per-step
  concatenation as with `DynamicCache`). Sliding-window layers keep their old columns too and
  mask them, rather than evicting them into a rolling buffer: every layer then shares one column
  coordinate, so one mask per window describes all of them and `keep(rows)` stays an index-select.
  The price is memory for sliding layers when sequences are much longer than their window;
* we pass ready 4-D additive masks (B, 1, Q, T_max) and explicit position ids, which the model uses
  as-is: left padding is handled without transformers rebuilding masks from a 2-D padding mask at
  each step. Which columns of a row are real is read once at prefill. A model whose layers differ (Gemma 2's
  alternating sliding windows, Gemma 3's local/global layers) gets a dict of masks keyed by layer
  type, the mapping its forward accepts; a model whose config window covers every layer (Mistral,
  Phi-3) gets one sliding mask (`windows.attention_windows` reads which). Columns and positions
  differ by a row's padding, the same for query and key, so a window over positions is the same
  window over columns. A model loaded with a flash or flex kernel is switched to sdpa (or eager) in
  the engine's copy: those kernels take no additive 4-D mask;
* everything else (soft-capping of attention and final logits, per-layer-type RoPE, q/k norms) is the
  model's own forward, so it is reproduced by construction;
* `keep(rows)` compacts the batch by index-selecting the rows of every cache layer's keys/values,
  so finished samples stop costing compute;
* only the last position's logits are computed (``logits_to_keep=1``).

What cannot be reproduced exactly is refused when the decoder is built (`windows.UnsupportedModel`):
layer types other than full and sliding attention (chunked, linear, recurrent), bidirectional
attention, a sliding layer without a window; and a short probe (two left-padded rows, a prefill and
a step, against a plain forward) refuses models whose forward does not take the cache, masks and
positions this way, instead of failing or drifting in the middle of a run.
"""

from __future__ import annotations

import inspect

import torch
from transformers.cache_utils import Cache, StaticLayer

from posttrain.rollout.windows import attention_windows, refuse

PROBE_TOLERANCE = 1e-4
"""Largest probe logit difference allowed in float32, relative to 1 + the largest logit (cached
decoding and a plain forward differ only by summation order there; a wrong mask moves logits by far more)."""


class HFDecoder:
    """Prefill + step decoder through ``model.forward`` (see module docstring)."""

    def __init__(self, model):
        self.model = model
        self.windows = attention_windows(model)
        impl = getattr(model.config, "_attn_implementation", None)
        if impl not in (None, "eager", "sdpa"):  # flash/flex kernels take no additive 4-D mask
            model.set_attn_implementation("sdpa" if getattr(model, "_supports_sdpa", False) else "eager")
        params = inspect.signature(model.forward).parameters
        self.cache_arg = "cache" if "cache" in params else "past_key_values"
        self.n_layers = model.config.get_text_config(decoder=True).num_hidden_layers
        self.dtype = next(model.parameters()).dtype
        self.rows_seen: list[int] = []
        self._probe()

    def refresh(self) -> None:
        """Nothing to re-read: the forward uses the model's parameters directly."""

    def _masks(self, allowed_BQT: torch.Tensor, q_cols: torch.Tensor):
        """Additive (B, 1, Q, T) masks from the padding/causal pattern, one per window."""
        neg = torch.finfo(self.dtype).min
        masks = {}
        for key, window in self.windows.items():
            allowed = allowed_BQT
            if window is not None:
                allowed = allowed & (self.cols[None, None, :] > q_cols[None, :, None] - window)
            masks[key] = torch.zeros(allowed.shape, dtype=self.dtype, device=allowed.device).masked_fill_(~allowed, neg)[:, None]
        return masks[None] if None in masks else masks

    def _forward(self, ids, mask, pos) -> torch.Tensor:
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True,
                         logits_to_keep=1, **{self.cache_arg: self.cache})
        self.rows_seen.append(ids.shape[0])
        return out.logits[:, -1].float()

    @torch.inference_mode()
    def prefill(self, ids_UP: torch.Tensor, pad_U: torch.Tensor, expand_b: torch.Tensor, total_len: int) -> torch.Tensor:
        U, P = ids_UP.shape
        self.cache = Cache(layers=[StaticLayer(max_cache_len=total_len) for _ in range(self.n_layers)])
        dev = ids_UP.device
        self.cols = cols = torch.arange(total_len, device=dev)
        self.real_bT = (cols[None, :] >= pad_U[:, None])[expand_b]
        real_UT = cols[None, :] >= pad_U[:, None]
        causal_PT = cols[None, :] <= cols[:P, None]
        # Pad queries may see themselves so that no softmax row is empty; real queries never see pads.
        allowed = (real_UT[:, None, :] & causal_PT) | (cols[None, None, :] == cols[None, :P, None])
        pos_UP = (cols[None, :P] - pad_U[:, None]).clamp_(min=0)
        logits = self._forward(ids_UP, self._masks(allowed, cols[:P]), pos_UP)
        self._select(expand_b)
        self.col = P
        self.pos_b = pos_UP[expand_b, -1] + 1
        return logits[expand_b]

    @torch.inference_mode()
    def step(self, token_b: torch.Tensor) -> torch.Tensor:
        c = self.col
        allowed = (self.real_bT & (self.cols[None, :] <= c))[:, None, :]
        mask = self._masks(allowed, self.cols[c: c + 1])
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
        self.real_bT = self.real_bT[rows]

    @torch.inference_mode()
    def _probe(self) -> None:
        """Two left-padded rows through prefill and one step, against a plain forward of each row."""
        vocab = self.model.get_output_embeddings().weight.shape[0]
        dev = next(self.model.parameters()).device
        rows = [[3, 5, 7, 11], [13, 17]]
        rows = [[t % vocab for t in r] for r in rows]
        ids = torch.tensor([rows[0], [0, 0] + rows[1]], device=dev)
        try:
            first = self.prefill(ids, torch.tensor([0, 2], device=dev), torch.arange(2, device=dev), 5)
            nxt = torch.tensor([19 % vocab, 23 % vocab], device=dev)
            second = self.step(nxt)
            ref = [self.model(input_ids=torch.tensor([r + [int(t)]], device=dev)).logits[0, -2:].float()
                   for r, t in zip(rows, nxt)]
        except Exception as e:  # any failure here would otherwise surface in the middle of a run
            raise refuse(self.model, f"its forward fails with the rollout cache and masks ({type(e).__name__}: "
                                      f"{str(e).splitlines()[0] if str(e) else ''})") from e
        finally:
            self.rows_seen.clear()
            self.cache = None
        got = torch.stack([torch.stack([first[i], second[i]]) for i in range(2)])
        want = torch.stack(ref)
        if not torch.isfinite(got).all():
            raise refuse(self.model, "non-finite logits from its forward with the rollout cache and masks")
        if self.dtype == torch.float32:  # 16-bit rounding differs between the two paths by more than a tolerance can tell
            gap = float((got - want).abs().max())
            if gap > PROBE_TOLERANCE * (1 + float(want.abs().max())):
                raise refuse(self.model, f"its forward with the rollout cache and masks differs from a plain forward "
                                          f"(logits differ by {gap:.2e})")
