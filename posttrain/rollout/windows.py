"""Which attention window each layer of a Hugging Face decoder uses, read from its config.

Both decoders build their own masks, so both need the same answer, and a model whose attention
they cannot mask exactly must be refused when the engine starts rather than run with the wrong
mask. The rules follow transformers' own mask construction:

* a config with ``layer_types`` names each layer's kind; ``sliding_attention`` layers use
  ``config.sliding_window`` (Gemma 2/3, Qwen2/3 with ``use_sliding_window``, Ministral);
* a config without it (Mistral, Mixtral, Phi-3, Starcoder2) applies ``config.sliding_window`` to
  every layer when it is set, if the model's code builds sliding masks at all (Llama carries the
  attribute without using it), asked of the model's own class under peft's or FSDP2's wrapper;
* a window W lets the token at position p see positions p-W+1 .. p (``sliding_window_overlay``).

Anything else (chunked, linear or recurrent layers, bidirectional attention) is `UnsupportedModel`.
"""

from __future__ import annotations

import sys

from posttrain.errors import UserError

FULL, SLIDING = "full_attention", "sliding_attention"


class UnsupportedModel(UserError):
    """The rollout engine cannot run this model exactly; the message names the model type and why."""


def refuse(model, what: str) -> UnsupportedModel:
    cfg = model.config.get_text_config(decoder=True)
    where = getattr(model.config, "_name_or_path", "") or "model"
    return UnsupportedModel(f"{where}: model type {cfg.model_type!r}: {what}; the rollout engine cannot run it exactly")


def _builds_sliding_masks(model) -> bool:
    """Whether the model's code builds sliding-window masks: its modeling module imports
    transformers' builder exactly when it uses ``config.sliding_window``.

    The model's own class is found under any wrapper: peft holds the transformers model inside its
    own (``get_base_model``), and FSDP2 swaps in a subclass defined in torch, so every class of the
    MRO is asked, not only the outermost one.
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return any(hasattr(sys.modules.get(c.__module__), "create_sliding_window_causal_mask")
               for c in type(base).__mro__)


def attention_windows(model) -> dict[str | None, int | None]:
    """The masks a model's layers need: {layer type: window, None for full attention}.

    The single key ``None`` means one mask serves every layer (passed to the forward as a tensor);
    otherwise the forward takes a dict keyed by layer type.
    """
    cfg = model.config.get_text_config(decoder=True)
    if getattr(cfg, "use_bidirectional_attention", False):
        raise refuse(model, "bidirectional attention (use_bidirectional_attention=true)")
    window = getattr(cfg, "sliding_window", None)
    types = getattr(cfg, "layer_types", None)
    if types is None:
        return {None: int(window) if window and _builds_sliding_masks(model) else None}
    unknown = sorted(set(types) - {FULL, SLIDING})
    if unknown:
        raise refuse(model, f"layer types {unknown} (only {FULL} and {SLIDING} are supported)")
    if SLIDING not in types:
        return {None: None}
    if not window:
        raise refuse(model, f"{SLIDING} layers without a sliding_window")
    return {FULL: None, SLIDING: int(window)}


def layer_windows(model) -> list[int | None]:
    """The window of each decoder layer (None: full attention)."""
    cfg = model.config.get_text_config(decoder=True)
    windows = attention_windows(model)
    if None in windows:
        return [windows[None]] * cfg.num_hidden_layers
    return [windows[t] for t in cfg.layer_types[: cfg.num_hidden_layers]]
