"""Load causal LMs and tokenizers with transformers' Auto classes; optional LoRA via peft; save.

A model is a local folder (or a hub id where the machine has internet). Checkpoints are written as
plain Hugging Face folders (safetensors + tokenizer) that `AutoModelForCausalLM.from_pretrained`
loads unchanged; a LoRA model is merged into its base before such a save, and its adapter is also
saved on its own under ``adapter/`` so it can be reused with peft.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from posttrain.config import ConfigValueError
from posttrain.errors import UserError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclasses.dataclass(kw_only=True)
class LoraConfig:
    enabled: bool = False
    """Train low-rank adapters instead of all weights."""
    r: int = 8
    """Adapter rank."""
    alpha: int = 16
    """Adapter scaling numerator (scale = alpha / r)."""
    dropout: float = 0.0
    """Dropout on the adapter input."""
    target_modules: list[str] = dataclasses.field(default_factory=lambda: [
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    """Names of the linear layers that get adapters."""

    def __post_init__(self):
        if self.r <= 0:
            raise ConfigValueError("r", "must be a positive integer")


@dataclasses.dataclass(kw_only=True)
class ModelConfig:
    path: str = ""
    """Local model folder (config.json + weights + tokenizer) or a hub id. Required."""
    dtype: str = "float32"
    """Parameter dtype for training: float32 or bfloat16 (float16 for inference only)."""
    device: str = "cpu"
    """torch device: cpu, cuda, cuda:1, or auto (cuda when available)."""
    lora: LoraConfig = dataclasses.field(default_factory=LoraConfig)
    """LoRA settings."""

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ConfigValueError("dtype", f"must be one of {', '.join(DTYPES)}")


def quiet_transformers() -> None:
    """Silence transformers' per-file progress bars and advisory warnings; ours are enough."""
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def check_model_path(path: str, key: str = "model.path") -> None:
    """A missing local folder is a user error; a string that is not a path may be a hub id."""
    if not path:
        raise UserError(f"{key}: no model given (set {key}=FOLDER)")
    p = Path(path)
    looks_local = p.is_absolute() or path.startswith((".", "~")) or p.exists() or path.count("/") != 1
    if looks_local and not (p / "config.json").is_file():
        what = "does not exist" if not p.exists() else "has no config.json"
        raise UserError(f"{key}={path}: model folder {what}")


def load_tokenizer(path: str):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def load_model(cfg: ModelConfig, *, trainable: bool = True, dtype: str | None = None):
    """Load the causal LM of ``cfg``; wrap in LoRA when enabled and trainable."""
    from transformers import AutoModelForCausalLM

    check_model_path(cfg.path)
    model = AutoModelForCausalLM.from_pretrained(cfg.path, dtype=DTYPES[dtype or cfg.dtype])
    model.to(resolve_device(cfg.device))
    if trainable and cfg.lora.enabled:
        model = apply_lora(model, cfg.lora)
    if not trainable:
        model.eval().requires_grad_(False)
    return model


def disable_dropout(model) -> None:
    """Turn off every dropout of ``model`` (LoRA's included), in train mode too.

    RL and DPO compare log-probs of one policy computed in two forwards (old vs new, policy vs
    reference); any dropout makes the on-policy ratio differ from 1 and DPO's first loss from
    log 2. TRL's trainers do the same (``disable_dropout_in_model``). Attention dropout in
    transformers is a float attribute of each attention module, not an ``nn.Dropout``.
    """
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        if isinstance(getattr(module, "attention_dropout", None), float):
            module.attention_dropout = 0.0
    config = getattr(model, "config", None)
    for name in ("attention_dropout", "hidden_dropout", "dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop"):
        if isinstance(getattr(config, name, None), float):
            setattr(config, name, 0.0)


def apply_lora(model, cfg: LoraConfig):
    from peft import LoraConfig as PeftLoraConfig, get_peft_model

    peft_cfg = PeftLoraConfig(r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout,
                              target_modules=cfg.target_modules, task_type="CAUSAL_LM")
    return get_peft_model(model, peft_cfg)


def is_lora(model) -> bool:
    from peft import PeftModel

    return isinstance(model, PeftModel)


def merged_state_dict(model) -> dict[str, torch.Tensor]:
    """Full-model weights (LoRA merged, without touching the trained adapter) under HF names."""
    if not is_lora(model):
        return {k: v.detach() for k, v in model.state_dict().items()}
    import copy

    merged = copy.deepcopy(model).merge_and_unload()
    return {k: v.detach() for k, v in merged.state_dict().items()}


def save_pretrained(model, tokenizer, out_dir: str | Path) -> Path:
    """Save a plain HF folder; a LoRA model is merged (adapter kept under ``adapter/``)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if is_lora(model):
        model.save_pretrained(out / "adapter")
        import copy

        copy.deepcopy(model).merge_and_unload().save_pretrained(out)
    else:
        model.save_pretrained(out)
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
    return out
