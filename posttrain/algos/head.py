"""Log-probabilities and entropies straight from hidden states, the output head applied in chunks.

A forward that returns logits holds a (B, T, V) tensor, and its backward another: at T = 8,192
completion tokens and Qwen's V = 151,936 that is 5 GB each in fp32, far more than the model's own
activations. Here the head (``z = h W^T + b``) runs on a chunk of positions at a time, inside a
``torch.autograd.Function`` that saves only the hidden states and the head's weight and
recomputes each chunk's logits in backward (the idea of fused linear cross-entropy). Peak extra
memory is one fp32 chunk of logits (about 64 MiB by default) instead of the whole (B, T, V).

The math is the plain path's: ``log p(x) = z_x/τ - logsumexp(z/τ)``, with
``dL/dz = g (onehot(x) - softmax(z/τ)) / τ``, then ``dL/dh = dL/dz W`` and ``dL/dW = Σ dL/dz^T h``
(accumulated in fp32 over chunks). Only the order of floating-point sums differs.

`head_reverse_kl` does the same for on-policy distillation's exact per-token reverse KL: the
student's and the teacher's logits are made from their hidden states and heads a chunk at a time,
in forward and again in backward, so neither side's (B, T, V) logits exist either.

`hidden_head` makes a causal LM's forward return its final hidden states in place of logits (its
head's forward becomes the identity for the call), so the model runs under its own wrappers
(FSDP hooks, activation checkpointing, peft) unchanged and only the head moves here. Models whose
head cannot move this way — soft-capped logits (Gemma 2), a head that is not a plain linear layer
(a LoRA-wrapped head) — are refused by `movable_head`, and the caller keeps the logits path. A
head sharded by FSDP2 moves too: its weight is read after the forward, gathered (`head_of`).
"""

from __future__ import annotations

import contextlib

import torch

_CHUNK_ELEMENTS = 1 << 24  # fp32 logits per chunk: 64 MiB


def rows_per_chunk(vocab_size: int, chunk_rows: int | None = None) -> int:
    return chunk_rows if chunk_rows else max(1, _CHUNK_ELEMENTS // max(1, vocab_size))


def movable_head(model) -> bool:
    """Whether the model's head can be applied outside its forward (`hidden_head`)."""
    cfg = getattr(model, "config", None)
    if cfg is None or getattr(cfg, "final_logit_softcapping", None):
        return False
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return type(head) is torch.nn.Linear


def head_of(model) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The output head's (weight, bias) as the forward used them. Read it after the forward: FSDP2
    leaves the root unit (embeddings, final norm, head) gathered after a forward until the backward,
    so a sharded model's head is then the whole gathered weight, whose gradient FSDP reduces as it
    does the head's own."""
    head = model.get_output_embeddings()
    if any(type(p).__name__ == "DTensor" for p in head.parameters()):
        raise RuntimeError("the output head is still sharded after the forward; run with chunked_head=false")
    return head.weight, head.bias


@contextlib.contextmanager
def hidden_head(model):
    """Inside the block the model's forward returns its final hidden states as ``.logits``."""
    head = model.get_output_embeddings()
    head.forward = _identity
    try:
        yield
    finally:
        del head.forward  # the class's forward again


def _identity(x: torch.Tensor) -> torch.Tensor:
    # Causal LMs apply the head to a slice, ``hidden[:, -k:]``: a view. Returned from an FSDP2 root,
    # a view makes torch warn that an in-place op on it would drop the pre-backward hook. Nothing
    # here writes into it and the gradients equal one process's (tests/core/test_head_grads_fsdp.py),
    # but a copy (B, T, H, far below the (B, T, V) logits this path avoids) ends the question.
    return x.clone() if x._base is not None else x


def _logits(h_NH: torch.Tensor, weight_VH: torch.Tensor, bias_V: torch.Tensor | None, tau: float) -> torch.Tensor:
    z = torch.nn.functional.linear(h_NH, weight_VH, bias_V).float()
    return z if tau == 1.0 else z / tau


class _HeadTokenLogprob(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden_NH, weight_VH, bias_V, targets_N, temperature, rows, entropy_N):
        # entropy_N: None, or an (N,) buffer filled with each row's entropy from the same logits (a
        # metric: written in place, outside autograd, so the head's matmul runs once for both)
        out_N = torch.empty(hidden_NH.shape[0], dtype=torch.float32, device=hidden_NH.device)
        for s in range(0, hidden_NH.shape[0], rows):
            z = _logits(hidden_NH[s:s + rows], weight_VH, bias_V, temperature)
            lse = torch.logsumexp(z, -1)
            out_N[s:s + rows] = z.gather(-1, targets_N[s:s + rows, None]).squeeze(-1) - lse
            if entropy_N is not None:
                entropy_N[s:s + rows] = _entropy(z, lse)
        ctx.save_for_backward(hidden_NH, weight_VH, bias_V, targets_N)
        ctx.temperature, ctx.rows = temperature, rows
        return out_N

    @staticmethod
    def backward(ctx, grad_N):
        hidden_NH, weight_VH, bias_V, targets_N = ctx.saved_tensors
        tau = ctx.temperature

        def dz(s: int, e: int, h: torch.Tensor) -> torch.Tensor:
            g = -torch.softmax(_logits(h, weight_VH, bias_V, tau), dim=-1)
            g.scatter_add_(-1, targets_N[s:e, None], torch.ones_like(g[:, :1]))
            return g.mul_(grad_N[s:e, None] / tau)

        return (*_head_grads(ctx, hidden_NH, weight_VH, bias_V, dz), None, None, None, None)


def _entropy(z: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """``-Σ p log p = logsumexp(z) - Σ p z`` per row of fp32 logits ``z`` with their ``logsumexp``."""
    return lse - (torch.softmax(z, dim=-1) * z).sum(-1)


def _head_grads(ctx, hidden_NH, weight_VH, bias_V, dz):
    """Gradients of h, W and b from ``dz(start, end, h_chunk)``, the fp32 dL/dz of a chunk of rows
    (recomputed there): ``dL/dh = dL/dz W``, ``dL/dW = Σ dL/dz^T h``, ``dL/db = Σ dL/dz``, the last
    two accumulated in fp32 over the chunks."""
    rows = ctx.rows
    grad_h = torch.empty_like(hidden_NH) if ctx.needs_input_grad[0] else None
    grad_w = torch.zeros(weight_VH.shape, dtype=torch.float32, device=weight_VH.device) \
        if ctx.needs_input_grad[1] else None
    grad_b = torch.zeros(bias_V.shape, dtype=torch.float32, device=bias_V.device) \
        if bias_V is not None and ctx.needs_input_grad[2] else None
    for s in range(0, hidden_NH.shape[0], rows):
        h = hidden_NH[s:s + rows]
        g = dz(s, s + rows, h)
        if grad_h is not None:
            grad_h[s:s + rows] = (g @ weight_VH.float()).to(grad_h.dtype)
        if grad_w is not None:
            grad_w.addmm_(g.T, h.float())
        if grad_b is not None:
            grad_b += g.sum(0)
    return (grad_h, None if grad_w is None else grad_w.to(weight_VH.dtype),
            None if grad_b is None else grad_b.to(bias_V.dtype))


def head_token_logprobs(hidden_BXH: torch.Tensor, weight_VH: torch.Tensor, bias_V: torch.Tensor | None,
                        targets_BX: torch.Tensor, temperature: float = 1.0, *,
                        chunk_rows: int | None = None, with_entropy: bool = False):
    """(B, X) fp32 ``log softmax((h W^T + b) / τ)[target]``, differentiable in h, W and b, without
    (B, X, V) logits (see the module docstring). With ``with_entropy`` it returns ``(logp, entropy)``,
    the entropy of each position's distribution taken from the same chunk of logits (no second
    pass through the head, no gradient: a metric); the log-probs are the same either way."""
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    B, X, H = hidden_BXH.shape
    rows = rows_per_chunk(weight_VH.shape[0], chunk_rows)
    ent = torch.empty(B * X, dtype=torch.float32, device=hidden_BXH.device) if with_entropy else None
    out = _HeadTokenLogprob.apply(hidden_BXH.reshape(B * X, H), weight_VH, bias_V,
                                  targets_BX.reshape(B * X).long(), temperature, rows, ent)
    return (out.view(B, X), ent.view(B, X)) if with_entropy else out.view(B, X)


@torch.no_grad()
def head_entropy(hidden_BXH: torch.Tensor, weight_VH: torch.Tensor, bias_V: torch.Tensor | None,
                 temperature: float = 1.0, *, chunk_rows: int | None = None) -> torch.Tensor:
    """(B, X) fp32 entropy of ``softmax((h W^T + b) / τ)`` (no gradient: a metric), chunked."""
    B, X, H = hidden_BXH.shape
    h_NH = hidden_BXH.reshape(B * X, H)
    out = torch.empty(B * X, dtype=torch.float32, device=hidden_BXH.device)
    rows = rows_per_chunk(weight_VH.shape[0], chunk_rows)
    for s in range(0, B * X, rows):
        z = _logits(h_NH[s:s + rows], weight_VH, bias_V, temperature)
        out[s:s + rows] = _entropy(z, torch.logsumexp(z, -1))
    return out.view(B, X)


def _kl_chunk(h, weight_VH, bias_V, teacher_h, teacher_weight_VH, teacher_bias_V, tau, topk):
    """A chunk's student and teacher log-probs over the compared support (the vocabulary, or the
    teacher's top-k tokens, both renormalised there) and the support's ids (None: all)."""
    z_s = _logits(h, weight_VH, bias_V, tau)
    z_t = _logits(teacher_h, teacher_weight_VH, teacher_bias_V, tau)
    index = None
    if topk:
        z_t, index = z_t.topk(topk, dim=-1)
        z_s = z_s.gather(-1, index)
    return torch.log_softmax(z_s, dim=-1), torch.log_softmax(z_t, dim=-1), index


class _HeadReverseKL(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden_NH, weight_VH, bias_V, teacher_NH, teacher_weight_VH, teacher_bias_V, temperature,
                topk, rows):
        out_N = torch.empty(hidden_NH.shape[0], dtype=torch.float32, device=hidden_NH.device)
        for s in range(0, hidden_NH.shape[0], rows):
            log_p, log_q, _ = _kl_chunk(hidden_NH[s:s + rows], weight_VH, bias_V, teacher_NH[s:s + rows],
                                        teacher_weight_VH, teacher_bias_V, temperature, topk)
            out_N[s:s + rows] = (log_p.exp() * (log_p - log_q)).sum(-1)
        ctx.save_for_backward(hidden_NH, weight_VH, bias_V, teacher_NH, teacher_weight_VH, teacher_bias_V)
        ctx.temperature, ctx.topk, ctx.rows = temperature, topk, rows
        return out_N

    @staticmethod
    def backward(ctx, grad_N):
        hidden_NH, weight_VH, bias_V, teacher_NH, teacher_weight_VH, teacher_bias_V = ctx.saved_tensors
        tau = ctx.temperature

        def dz(s: int, e: int, h: torch.Tensor) -> torch.Tensor:
            log_p, log_q, index = _kl_chunk(h, weight_VH, bias_V, teacher_NH[s:e], teacher_weight_VH,
                                            teacher_bias_V, tau, ctx.topk)
            p = log_p.exp()
            ratio = log_p - log_q
            g = p * (ratio - (p * ratio).sum(-1, keepdim=True)) * (grad_N[s:e, None] / tau)
            if index is None:
                return g
            return torch.zeros(len(g), weight_VH.shape[0], dtype=g.dtype, device=g.device).scatter_(-1, index, g)

        return (*_head_grads(ctx, hidden_NH, weight_VH, bias_V, dz), None, None, None, None, None, None)


def head_reverse_kl(hidden_BXH: torch.Tensor, weight_VH: torch.Tensor, bias_V: torch.Tensor | None,
                    teacher_hidden_BXH: torch.Tensor, teacher_head: tuple[torch.Tensor, torch.Tensor | None],
                    mask_BX: torch.Tensor, temperature: float = 1.0, *, teacher_topk: int | None = None,
                    chunk_rows: int | None = None) -> torch.Tensor:
    """(B, X) fp32 per-position ``KL(π_s‖π_t)``: `posttrain.algos.distill.reverse_kl_full` on the
    logits ``(h W^T + b) / τ`` of the student (``hidden``, ``weight``, ``bias``) and of the teacher
    (``teacher_hidden``, ``teacher_head`` = its (weight, bias)), without (B, X, V) logits of either.

    Same definition: ``KL = Σ_v p (log p - log q)`` with ``p = softmax(z_s)``, ``q = softmax(z_t)``
    at the same temperature; with ``teacher_topk`` over the teacher's k largest logits, both
    renormalised there; 0 at masked positions, which are not computed at all. Differentiable in the
    student's h, W and b; the teacher is constant. Only the masked-in rows' hidden states are saved;
    backward recomputes each chunk's two softmaxes and uses

        dKL/dz_s = p ⊙ ((log p - log q) - KL)

    (from ``d log p_j / dz_i = δ_ij - p_i`` and ``Σ_j p_j (δ_ij - p_i) = 0``), divided by τ for the
    scaled logits and taken through the head as in `head_token_logprobs` (on top-k, scattered back
    to the k ids; the other logits get no gradient). A few fp32 chunks of logits are live at once.
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    teacher_weight, teacher_bias = (None if t is None else t.detach() for t in teacher_head)
    V = weight_VH.shape[0]
    if teacher_weight.shape[0] != V:
        raise ValueError(f"the teacher's head has {teacher_weight.shape[0]} outputs, the student's {V}")
    if teacher_topk is not None and not 1 <= teacher_topk <= V:
        raise ValueError(f"teacher_topk must be in [1, V={V}], got {teacher_topk}")
    B, X, H = hidden_BXH.shape
    keep = mask_BX.reshape(B * X).bool().nonzero().squeeze(1)
    h = hidden_BXH.reshape(B * X, H).index_select(0, keep.to(hidden_BXH.device))
    teacher = teacher_hidden_BXH.detach().reshape(B * X, -1).index_select(0, keep.to(teacher_hidden_BXH.device))
    kl = _HeadReverseKL.apply(h, weight_VH, bias_V, teacher.to(h.device), teacher_weight, teacher_bias,
                              temperature, teacher_topk, rows_per_chunk(V, chunk_rows))
    out = torch.zeros(B * X, dtype=torch.float32, device=h.device)
    return out.index_copy(0, keep.to(h.device), kl).view(B, X)
