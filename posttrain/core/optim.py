"""AdamW with linear warmup and cosine decay, and the seed helper every trainer uses."""

from __future__ import annotations

import dataclasses
import math
import random

import numpy as np
import torch

from posttrain.config import ConfigValueError


@dataclasses.dataclass(kw_only=True)
class OptimConfig:
    lr: float = 3e-4
    """Peak learning rate (reached after warmup)."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay."""
    beta1: float = 0.9
    """AdamW beta1."""
    beta2: float = 0.95
    """AdamW beta2."""
    eps: float = 1e-8
    """AdamW epsilon."""
    warmup_steps: int = 10
    """Linear warmup from 0 to lr over this many optimizer steps."""
    schedule: str = "cosine"
    """After warmup: cosine (decay to min_lr_ratio·lr at the last step) or constant."""
    min_lr_ratio: float = 0.1
    """Final learning rate as a fraction of lr (cosine schedule)."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value; 0 disables clipping."""

    def __post_init__(self):
        if self.lr < 0:
            raise ConfigValueError("lr", "must be >= 0")
        if self.schedule not in ("cosine", "constant"):
            raise ConfigValueError("schedule", "must be cosine or constant")
        if self.warmup_steps < 0:
            raise ConfigValueError("warmup_steps", "must be >= 0")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ConfigValueError("min_lr_ratio", "must be in [0, 1]")


def build_optimizer(params, cfg: OptimConfig) -> torch.optim.Optimizer:
    params = [p for p in params if p.requires_grad]
    # torch's fused kernel updates every tensor in one pass; its default on a CPU is a Python loop
    # over the tensors, 4-5x slower (SmolLM2-135M: 2.3 s a step against 0.45 s, one thread)
    fused = bool(params) and all(p.device.type in ("cpu", "cuda") for p in params) or None
    return torch.optim.AdamW(params, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps,
                             weight_decay=cfg.weight_decay, fused=fused)


def lr_factor(step: int, cfg: OptimConfig, total_steps: int) -> float:
    """Multiplier of cfg.lr at optimizer step ``step`` (0-based)."""
    if step < cfg.warmup_steps:
        return (step + 1) / (cfg.warmup_steps + 1)
    if cfg.schedule == "constant":
        return 1.0
    span = max(1, total_steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def build_scheduler(optimizer, cfg: OptimConfig, total_steps: int):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, cfg, total_steps))


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
