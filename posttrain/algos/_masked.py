"""Masked reductions used for metrics (local to the tensors passed in)."""

from __future__ import annotations

import torch


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``x`` over positions where ``mask`` is true; 0 when the mask is empty."""
    m = mask.bool()
    return torch.where(m, x, torch.zeros_like(x)).sum() / m.sum().clamp(min=1)


def masked_max(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Max of ``x`` over positions where ``mask`` is true; 0 when the mask is empty."""
    m = mask.bool()
    # No host sync (no `if m.any()`): pick 0 on device when the mask is empty.
    top = torch.where(m, x, torch.full_like(x, -torch.inf)).max()
    return torch.where(m.any(), top, torch.zeros_like(top))
