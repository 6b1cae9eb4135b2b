"""Load causal LMs and tokenizers with transformers' Auto classes; optional LoRA via peft.

A model is a local folder, a hub id (``org/name``: fetched where the machine reaches the hub, or
found in the local hub cache), or a GGUF file (``*.gguf``: converted once to a float32 folder in a
cache, `posttrain.models.gguf`); anything else is a `UserError` naming the setting that gave it.
Checkpoints are written by `posttrain.core.checkpoint` (plain Hugging Face folders that
`from_pretrained` loads unchanged; LoRA merged, its adapter kept under ``adapter/``).
"""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path

import torch

from posttrain.config import ConfigValueError
from posttrain.errors import UserError
from posttrain.models import gguf

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
    """Local model folder (config.json + weights + tokenizer), a hub id, or a GGUF file (converted
    once to a float32 folder in the cache). Required."""
    dtype: str = "float32"
    """Parameter dtype for training: float32 or bfloat16 (float16 for inference only)."""
    device: str = "cpu"
    """torch device: cpu, cuda, cuda:1, or auto (cuda when available)."""
    lora: LoraConfig = dataclasses.field(default_factory=LoraConfig)
    """LoRA settings."""
    activation_checkpointing: bool = False
    """Recompute each decoder layer's activations in the backward pass instead of keeping them
    (less memory, about a third more compute)."""

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


def looks_like_hub_id(path: str) -> bool:
    """``org/name`` with no such local path: worth asking the hub for. Anything else is a folder."""
    p = Path(path)
    local = p.is_absolute() or path.startswith((".", "~")) or p.exists() or path.count("/") != 1
    return not local


def model_folder(path: str, key: str = "model.path") -> str:
    """What ``from_pretrained`` reads for ``path``: a GGUF file's converted folder, else ``path``."""
    return gguf.cached_folder(path, key) if gguf.is_gguf_path(path) else path


def check_model_path(path: str, key: str = "model.path") -> None:
    """A model is a local folder with a config.json, a GGUF file, or a hub id the hub (or its local
    cache) can provide. Anything else is a user error naming ``key`` and what was tried."""
    if not path:
        raise UserError(f"{key}: no model given (set {key}=FOLDER)")
    if gguf.is_gguf_path(path):
        gguf.check_gguf(path, key)
        return
    p = Path(path)
    if (p / "config.json").is_file():
        return
    if not looks_like_hub_id(path):
        what = "does not exist" if not p.exists() else "has no config.json"
        raise UserError(f"{key}={path}: model folder {what}")
    _check_hub_model(path, key)


def _check_hub_model(path: str, key: str) -> None:
    """One look at the hub (no retries) for ``path``'s config.json; its failure is the user's to fix."""
    import huggingface_hub
    from huggingface_hub import constants, errors

    tried = f"{key}={path}: not a local folder ({Path(path).absolute()} does not exist)"
    try:
        if isinstance(huggingface_hub.try_to_load_from_cache(path, "config.json"), str):
            return
    except errors.HFValidationError:
        raise UserError(f"{tried}, nor a valid hub id") from None
    if constants.HF_HUB_OFFLINE:
        raise UserError(f"{tried}, and as a hub id it is not in the local hub cache (HF_HUB_OFFLINE is set)")
    hub = constants.ENDPOINT
    try:
        huggingface_hub.get_hf_file_metadata(huggingface_hub.hf_hub_url(path, "config.json"))
        return
    except errors.GatedRepoError:
        reason = f"{hub}/{path} is gated (accept its terms there, then log in with `hf auth login`)"
    except errors.RepositoryNotFoundError:
        reason = f"the hub ({hub}) has no model {path} (or it is private and no token is set)"
    except errors.RevisionNotFoundError:
        reason = f"the hub repo {path} has no main revision"
    except errors.EntryNotFoundError:
        reason = f"the hub repo {path} has no config.json (not a transformers model)"
    except Exception as e:  # connection refused, no DNS, timeout, proxy: the hub is out of reach
        reason = f"the hub ({hub}) could not be reached ({_one_line(e)})"
    raise UserError(f"{tried}, and as a hub id: {reason}")


def _one_line(e: BaseException) -> str:
    """The first line of an exception's message (transformers' run to several), or its class name."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return lines[0] if lines else type(e).__name__


@contextlib.contextmanager
def load_errors(key: str, path: str, what: str):
    """Turn what ``from_pretrained`` raises for a folder it cannot use (OSError: missing weights or
    files, a hub that stops answering; ValueError: no tokenizer files, an unknown model type) into a
    one-line `UserError` naming ``key``."""
    try:
        yield
    except (OSError, ValueError) as e:
        raise UserError(f"{key}={path}: could not load the {what}: {_one_line(e)}") from e


def load_tokenizer(path: str, key: str = "model.path", chat_template: str | None = None):
    """The tokenizer of model ``path`` (``key`` names the setting in errors); pad defaults to eos.

    ``chat_template``: what needs the tokenizer's chat template, with the setting that turns the
    need off if there is one (e.g. "data.use_chat_template=true"); a tokenizer without one is then
    a one-line `UserError` here, before anything is written, not a traceback at the first prompt."""
    from transformers import AutoTokenizer

    check_model_path(path, key)
    with load_errors(key, path, "tokenizer"):
        tok = AutoTokenizer.from_pretrained(model_folder(path, key))
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    if chat_template and not getattr(tok, "chat_template", None):
        raise UserError(f"{key}={path}: the tokenizer has no chat template, which {chat_template} needs")
    return tok


def load_model(cfg: ModelConfig, *, trainable: bool = True, dtype: str | None = None, key: str = "model.path"):
    """Load the causal LM of ``cfg``; wrap in LoRA when enabled and trainable. ``key`` names the
    setting that gave ``cfg.path`` in errors."""
    from transformers import AutoModelForCausalLM

    check_model_path(cfg.path, key)
    with load_errors(key, cfg.path, "model"):
        model = AutoModelForCausalLM.from_pretrained(model_folder(cfg.path, key), dtype=DTYPES[dtype or cfg.dtype])
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


def lora_adapter_config(cfg: ModelConfig, base_path: str) -> dict:
    """peft's ``adapter_config.json`` of the adapter `apply_lora` makes, as a JSON-ready dict (what
    a server that loads adapters from disk, such as vLLM, reads next to the tensors)."""
    import json

    from peft import LoraConfig as PeftLoraConfig

    peft_cfg = PeftLoraConfig(r=cfg.lora.r, lora_alpha=cfg.lora.alpha, lora_dropout=cfg.lora.dropout,
                              target_modules=cfg.lora.target_modules, task_type="CAUSAL_LM",
                              base_model_name_or_path=base_path)
    return json.loads(json.dumps(peft_cfg.to_dict(), default=lambda v: sorted(v) if isinstance(v, set) else str(v)))


def is_lora(model) -> bool:
    from peft import PeftModel

    return isinstance(model, PeftModel)
