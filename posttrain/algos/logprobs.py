"""Per-token log-probabilities and entropies from logits, without a full-vocab fp32 copy.

Design choices:

* ``log p(x) = z_x - logsumexp(z)`` (gather minus logsumexp) instead of ``log_softmax(z)[x]``:
  the latter materialises a (B, T, V) tensor of log-probabilities only to read one entry per row.
* When the logits are not fp32 (bf16/fp16 from a model forward), positions are processed in
  chunks of about ``chunk_rows`` (b, t) positions, sliced from the (B, T, V) tensor without a
  reshape (so a view like ``logits[:, :-1]`` is not copied): each chunk is upcast to fp32,
  reduced, and dropped.
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


def _chunks(B: int, T: int, rows: int):
    """(batch slice, time slice) pairs covering (B, T) with about ``rows`` positions each.

    Slicing the 3-D logits (instead of reshaping to (B·T, V)) never copies, even for
    non-contiguous views such as ``logits[:, :-1]``.
    """
    if rows >= T:
        per = rows // T
        for b0 in range(0, B, per):
            yield slice(b0, b0 + per), slice(0, T)
    else:
        for b in range(B):
            for t0 in range(0, T, rows):
                yield slice(b, b + 1), slice(t0, t0 + rows)


class _ChunkedTokenLogprob(torch.autograd.Function):
    """log softmax(z/τ)[x] for (B, T, V) low-precision logits, fp32 out, chunked both ways."""

    @staticmethod
    def forward(ctx, logits_BTV, targets_BT, temperature, rows):
        B, T, _ = logits_BTV.shape
        out_BT = torch.empty(B, T, dtype=torch.float32, device=logits_BTV.device)
        for idx in _chunks(B, T, rows):
            z = logits_BTV[idx].float() / temperature
            picked = z.gather(-1, targets_BT[idx].unsqueeze(-1)).squeeze(-1)
            out_BT[idx] = picked - torch.logsumexp(z, dim=-1)
        ctx.save_for_backward(logits_BTV, targets_BT)
        ctx.temperature, ctx.rows = temperature, rows
        return out_BT

    @staticmethod
    def backward(ctx, grad_BT):
        logits_BTV, targets_BT = ctx.saved_tensors
        tau, rows = ctx.temperature, ctx.rows
        B, T, _ = logits_BTV.shape
        grad_BTV = torch.empty(logits_BTV.shape, dtype=logits_BTV.dtype, device=logits_BTV.device)
        # d/dz_v [z_x - lse(z)] = 1[v = x] - softmax(z)_v, times 1/τ for z = logits/τ.
        for idx in _chunks(B, T, rows):
            g = -torch.softmax(logits_BTV[idx].float() / tau, dim=-1)
            g.scatter_add_(-1, targets_BT[idx].unsqueeze(-1), torch.ones_like(g[..., :1]))
            grad_BTV[idx] = (g * (grad_BT[idx].unsqueeze(-1) / tau)).to(grad_BTV.dtype)
        return grad_BTV, None, None, None


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
        chunk_rows: (b, t) positions per chunk on the low-precision path;
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
    return _ChunkedTokenLogprob.apply(logits_BTV, targets_BT, temperature, rows)


def _entropy_rows(z_NV: torch.Tensor) -> torch.Tensor:
    """H = logsumexp(z) - Σ_v softmax(z)_v z_v: one softmax, no log-probability tensor."""
    p_NV = torch.softmax(z_NV, dim=-1)
    return torch.logsumexp(z_NV, dim=-1) - (p_NV * z_NV).sum(-1)


class _ChunkedEntropy(torch.autograd.Function):
    """Entropy of softmax(z/τ) for (B, T, V) low-precision logits, fp32 out, chunked."""

    @staticmethod
    def forward(ctx, logits_BTV, temperature, rows):
        B, T, _ = logits_BTV.shape
        out_BT = torch.empty(B, T, dtype=torch.float32, device=logits_BTV.device)
        for idx in _chunks(B, T, rows):
            out_BT[idx] = _entropy_rows(logits_BTV[idx].float() / temperature)
        ctx.save_for_backward(logits_BTV)
        ctx.temperature, ctx.rows = temperature, rows
        return out_BT

    @staticmethod
    def backward(ctx, grad_BT):
        (logits_BTV,) = ctx.saved_tensors
        tau, rows = ctx.temperature, ctx.rows
        B, T, _ = logits_BTV.shape
        grad_BTV = torch.empty(logits_BTV.shape, dtype=logits_BTV.dtype, device=logits_BTV.device)
        # dH/dz_v = -p_v (z_v - Σ_u p_u z_u), times 1/τ for z = logits/τ.
        for idx in _chunks(B, T, rows):
            z = logits_BTV[idx].float() / tau
            p = torch.softmax(z, dim=-1)
            g = -p * (z - (p * z).sum(-1, keepdim=True))
            grad_BTV[idx] = (g * (grad_BT[idx].unsqueeze(-1) / tau)).to(grad_BTV.dtype)
        return grad_BTV, None, None


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
    return _ChunkedEntropy.apply(logits_BTV, temperature, rows)
