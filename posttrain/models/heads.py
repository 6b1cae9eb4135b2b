"""Scalar heads on a causal LM backbone: the reward model (one score per sequence) and the
critic (one value per token).

Both are plain transformers classes, so checkpoints reload with ``from_pretrained`` and nothing
of ours is needed to use them:

- reward model: ``AutoModelForSequenceClassification`` with ``num_labels=1``. It scores the
  rightmost token that is not the pad token, which is why the model config must carry a
  ``pad_token_id`` (the embedded tiny models do; we set it from the tokenizer otherwise). With the
  embedded tokenizer pad = EOS, so a sequence ending in EOS is scored at the token before it — the
  same for training pairs and for rollouts, since both end the same way.
- critic: ``AutoModelForTokenClassification`` with ``num_labels=1`` and dropout off (dropout on a
  regression target only adds noise). Loading it from a causal LM folder keeps the backbone and
  adds a fresh head; loading it from a reward-model checkpoint also reuses the reward head
  (both heads are named ``score``), the usual way to start a critic.

LoRA: the head is always trained in full (peft's ``modules_to_save``), the backbone gets adapters.
"""

from __future__ import annotations

import torch

from posttrain.errors import UserError
from posttrain.models.hf import DTYPES, ModelConfig, check_model_path, load_errors, model_folder, resolve_device


def _finish(model, cfg: ModelConfig, trainable: bool, task_type: str, pad_token_id: int | None):
    if model.config.pad_token_id is None:
        model.config.pad_token_id = pad_token_id
    model.to(resolve_device(cfg.device))
    if trainable and cfg.lora.enabled:
        from peft import LoraConfig as PeftLoraConfig, get_peft_model

        model = get_peft_model(model, PeftLoraConfig(
            r=cfg.lora.r, lora_alpha=cfg.lora.alpha, lora_dropout=cfg.lora.dropout,
            target_modules=cfg.lora.target_modules, task_type=task_type))
    if not trainable:
        model.eval().requires_grad_(False)
    return model


def load_reward_model(cfg: ModelConfig, *, trainable: bool = True, pad_token_id: int | None = None,
                      key: str = "model.path"):
    """A sequence-classification model with one output (a new head when ``cfg.path`` is a causal LM)."""
    from transformers import AutoModelForSequenceClassification

    check_model_path(cfg.path, key)
    with load_errors(key, cfg.path, "reward model"):
        model = AutoModelForSequenceClassification.from_pretrained(model_folder(cfg.path, key), num_labels=1, dtype=DTYPES[cfg.dtype])
    return _finish(model, cfg, trainable, "SEQ_CLS", pad_token_id)


def load_value_model(cfg: ModelConfig, *, trainable: bool = True, pad_token_id: int | None = None,
                     key: str = "critic.path"):
    """A token-classification model with one output per token and no dropout (the critic)."""
    from transformers import AutoConfig, AutoModelForTokenClassification
    from transformers.models.auto.modeling_auto import MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES

    check_model_path(cfg.path, key)
    with load_errors(key, cfg.path, "critic"):
        config = AutoConfig.from_pretrained(model_folder(cfg.path, key), num_labels=1)
        config.classifier_dropout = 0.0
    if config.model_type not in MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES:
        # e.g. Gemma 3: transformers has no per-token head for it; refused here, before any step
        raise UserError(f"{key}={cfg.path}: transformers has no token-classification (per-token value) model for "
                        f"model type {config.model_type!r}, which PPO's critic needs; use a critic-free algorithm "
                        "(algorithm=grpo, dr_grpo, rloo or reinforce_pp)")
    with load_errors(key, cfg.path, "critic"):
        model = AutoModelForTokenClassification.from_pretrained(model_folder(cfg.path, key), config=config, dtype=DTYPES[cfg.dtype])
    return _finish(model, cfg, trainable, "TOKEN_CLS", pad_token_id)


def sequence_scores(model, input_ids_BT: torch.Tensor, attention_mask_BT: torch.Tensor) -> torch.Tensor:
    """(B,) fp32 reward-model scores of right-padded rows (the model's own pooling)."""
    device = next(model.parameters()).device
    out = model(input_ids=input_ids_BT.to(device), attention_mask=attention_mask_BT.to(device), use_cache=False)
    return out.logits[:, 0].float()


def token_values(model, input_ids_BT: torch.Tensor, attention_mask_BT: torch.Tensor,
                 position_ids_BT: torch.Tensor) -> torch.Tensor:
    """(B, L-1) fp32 values, target-aligned: column t is V(state after token t), before token t+1."""
    device = next(model.parameters()).device
    out = model(input_ids=input_ids_BT.to(device), attention_mask=attention_mask_BT.to(device),
                position_ids=position_ids_BT.to(device), use_cache=False)
    return out.logits[:, :-1, 0].float()
