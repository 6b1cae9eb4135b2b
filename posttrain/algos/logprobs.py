"""Per-token log-probabilities and entropies from logits, without a full-vocab fp32 copy.

Design choices:

* ``log p(x) = z_x - logsumexp(z)`` (gather minus logsumexp) instead of ``log_softmax(z)[x]``:
  the latter materialises a (B, T, V) tensor of log-probabilities only to read one entry per row.
* When the logits are not fp32 (bf16/fp16 from a model forward), the rows of the flattened
  (B·T, V) logits are processed in chunks: each chunk is upcast to fp32, reduced, and dropped.
  A plain chunked loop under autograd would still keep every fp32 chunk alive for the backward
  pass, so the chunked path is a ``torch.autograd.Function`` that saves only the original
  (low-precision) logits and recomputes the softmax chunk by chunk in ``backward``. Peak extra
  memory is then one fp32 chunk, not a (B, T, V) fp32 tensor.
* fp32 logits take the direct path (autograd through ``logsumexp``): there is no copy to avoid.
* Results are always fp32, whatever the logits' dtype.
* Temperature divides the logits before the softmax, as samplers do, so the log-probabilities
  match those a sampler reports at the same temperature.
"""

from __future__ import annotations

import torch

# Rows per chunk are chosen so one fp32 chunk holds about this many elements (64 MiB).
_CHUNK_ELEMENTS = 1 << 24


def _rows_per_chunk(vocab_size: int, chunk_rows: int | None) -> int:
    if chunk_rows is not None:
        if chunk_rows < 1:
            raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
        return chunk_rows
    return max(1, _CHUNK_ELEMENTS // max(1, vocab_size))


def _check_temperature(temperature: float) -> None:
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")


class _ChunkedTokenLogprob(torch.autograd.Function):
    """log softmax(z/τ)[x] over rows of (N, V) low-precision logits, fp32 out, chunked both ways."""

    @staticmethod
    def forward(ctx, logits_NV, targets_N, temperature, rows):
        out_N = torch.empty(logits_NV.shape[0], dtype=torch.float32, device=logits_NV.device)
        for start in range(0, logits_NV.shape[0], rows):
            z = logits_NV[start : start + rows].float() / temperature
            picked = z.gather(-1, targets_N[start : start + rows, None]).squeeze(-1)
            out_N[start : start + rows] = picked - torch.logsumexp(z, dim=-1)
        ctx.save_for_backward(logits_NV, targets_N)
        ctx.temperature, ctx.rows = temperature, rows
        return out_N

    @staticmethod
    def backward(ctx, grad_N):
        logits_NV, targets_N = ctx.saved_tensors
        tau, rows = ctx.temperature, ctx.rows
        grad_NV = torch.empty_like(logits_NV)
        # d/dz_v [z_x - lse(z)] = 1[v = x] - softmax(z)_v, times 1/τ for z = logits/τ.
        for start in range(0, logits_NV.shape[0], rows):
            sl = slice(start, start + rows)
            g = -torch.softmax(logits_NV[sl].float() / tau, dim=-1)
            g.scatter_add_(-1, targets_N[sl, None], torch.ones_like(g[:, :1]))
            grad_NV[sl] = (g * (grad_N[sl, None] / tau)).to(grad_NV.dtype)
        return grad_NV, None, None, None


def token_logprobs(
    logits_BTV: torch.Tensor,
    targets_BT: torch.Tensor,
    temperature: float = 1.0,
    *,
    chunk_rows: int | None = None,
) -> torch.Tensor:
    """Log-probability of each target token: ``log softmax(logits/temperature)[target]``.

    Args:
        logits_BTV: (B, T, V) logits, any float dtype; position t scores ``targets_BT[:, t]``.
        targets_BT: (B, T) int64 token ids in [0, V). Callers mask ignored positions themselves
            (replace ignore ids such as -100 by 0 before calling).
        temperature: sampling temperature (> 0).
        chunk_rows: rows of the flattened (B·T, V) logits per chunk on the low-precision path;
            default keeps one fp32 chunk near 64 MiB.

    Returns:
        logp_BT: (B, T) fp32, differentiable with respect to ``logits_BTV``.
    """
    _check_temperature(temperature)
    B, T, V = logits_BTV.shape
    if targets_BT.shape != (B, T):
        raise ValueError(f"targets_BT shape {tuple(targets_BT.shape)} != {(B, T)}")
    targets_BT = targets_BT.long()
    if logits_BTV.dtype == torch.float32 or logits_BTV.dtype == torch.float64:
        z_BTV = logits_BTV if temperature == 1.0 else logits_BTV / temperature
        picked_BT = z_BTV.gather(-1, targets_BT.unsqueeze(-1)).squeeze(-1)
        return (picked_BT - torch.logsumexp(z_BTV, dim=-1)).float()
    rows = _rows_per_chunk(V, chunk_rows)
    logits_NV = logits_BTV.reshape(B * T, V)
    logp_N = _ChunkedTokenLogprob.apply(logits_NV, targets_BT.reshape(B * T), temperature, rows)
    return logp_N.view(B, T)


def _entropy_rows(z_NV: torch.Tensor) -> torch.Tensor:
    """H = logsumexp(z) - Σ_v softmax(z)_v z_v: one softmax, no log-probability tensor."""
    p_NV = torch.softmax(z_NV, dim=-1)
    return torch.logsumexp(z_NV, dim=-1) - (p_NV * z_NV).sum(-1)


class _ChunkedEntropy(torch.autograd.Function):
    """Entropy of softmax(z/τ) over rows of (N, V) low-precision logits, fp32 out, chunked."""

    @staticmethod
    def forward(ctx, logits_NV, temperature, rows):
        out_N = torch.empty(logits_NV.shape[0], dtype=torch.float32, device=logits_NV.device)
        for start in range(0, logits_NV.shape[0], rows):
            out_N[start : start + rows] = _entropy_rows(logits_NV[start : start + rows].float() / temperature)
        ctx.save_for_backward(logits_NV)
        ctx.temperature, ctx.rows = temperature, rows
        return out_N

    @staticmethod
    def backward(ctx, grad_N):
        (logits_NV,) = ctx.saved_tensors
        tau, rows = ctx.temperature, ctx.rows
        grad_NV = torch.empty_like(logits_NV)
        # dH/dz_v = -p_v (z_v - Σ_u p_u z_u), times 1/τ for z = logits/τ.
        for start in range(0, logits_NV.shape[0], rows):
            sl = slice(start, start + rows)
            z = logits_NV[sl].float() / tau
            p = torch.softmax(z, dim=-1)
            g = -p * (z - (p * z).sum(-1, keepdim=True))
            grad_NV[sl] = (g * (grad_N[sl, None] / tau)).to(grad_NV.dtype)
        return grad_NV, None, None


def entropy_from_logits(
    logits_BTV: torch.Tensor,
    temperature: float = 1.0,
    *,
    chunk_rows: int | None = None,
) -> torch.Tensor:
    """Entropy (nats) of ``softmax(logits/temperature)`` at every position.

    Args:
        logits_BTV: (B, T, V) logits, any float dtype.
        temperature: sampling temperature (> 0).
        chunk_rows: rows per chunk on the low-precision path (see ``token_logprobs``).

    Returns:
        ent_BT: (B, T) fp32, differentiable (usable as an entropy bonus).
    """
    _check_temperature(temperature)
    B, T, V = logits_BTV.shape
    if logits_BTV.dtype == torch.float32 or logits_BTV.dtype == torch.float64:
        z_BTV = logits_BTV if temperature == 1.0 else logits_BTV / temperature
        return _entropy_rows(z_BTV).float()
    rows = _rows_per_chunk(V, chunk_rows)
    ent_N = _ChunkedEntropy.apply(logits_BTV.reshape(B * T, V), temperature, rows)
    return ent_N.view(B, T)
