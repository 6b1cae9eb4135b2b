"""The output head in chunks: log-probs, entropies, distillation's reverse KL and the gradients of
hidden states, weight and bias equal the plain path's (full logits, log_softmax, reverse_kl_full) for
any chunk size, temperature and dtype."""

import math

import pytest
import torch

from posttrain.algos.head import (head_entropy, head_of, head_reverse_kl, head_token_logprobs, hidden_head,
                                  movable_head)


def _plain(h, w, b, x, tau):
    z = torch.nn.functional.linear(h, w, b).float() / tau
    return z.log_softmax(-1).gather(-1, x[..., None]).squeeze(-1), z


def _case(dtype=torch.float32, bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(3, 7, 16, generator=g).to(dtype).requires_grad_()
    w = (torch.randn(50, 16, generator=g) / 4).to(dtype).requires_grad_()
    b = (torch.randn(50, generator=g) / 4).to(dtype).requires_grad_() if bias else None
    x = torch.randint(0, 50, (3, 7), generator=g)
    weights = torch.randn(3, 7, generator=g)  # a loss that weighs each position differently
    return h, w, b, x, weights


def _grads(fn, h, w, b, weights):
    for t in (h, w, b):
        if t is not None:
            t.grad = None
    out = fn()
    (out * weights).sum().backward()
    return out.detach(), [t.grad.clone() for t in (h, w, b) if t is not None]


@pytest.mark.parametrize("rows", [1, 4, 21, 1000])
@pytest.mark.parametrize("tau", [1.0, 0.7])
@pytest.mark.parametrize("bias", [True, False])
def test_chunked_head_equals_full_logits_with_their_gradients(rows, tau, bias):
    h, w, b, x, weights = _case(bias=bias)
    want, want_grads = _grads(lambda: _plain(h, w, b, x, tau)[0], h, w, b, weights)
    got, got_grads = _grads(lambda: head_token_logprobs(h, w, b, x, tau, chunk_rows=rows), h, w, b, weights)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    for g, e in zip(got_grads, want_grads):
        torch.testing.assert_close(g, e, atol=1e-6, rtol=1e-5)
    z = _plain(h, w, b, x, tau)[1]
    want_ent = -(z.softmax(-1) * z.log_softmax(-1)).sum(-1)
    torch.testing.assert_close(head_entropy(h, w, b, tau, chunk_rows=rows), want_ent.detach(), atol=1e-5, rtol=1e-5)
    # the entropy out of the log-probs' own pass: their values and gradients unchanged, bit for bit
    both, both_grads = _grads(lambda: head_token_logprobs(h, w, b, x, tau, chunk_rows=rows, with_entropy=True)[0],
                              h, w, b, weights)
    assert torch.equal(both, got) and all(torch.equal(g, e) for g, e in zip(both_grads, got_grads))
    ent = head_token_logprobs(h, w, b, x, tau, chunk_rows=rows, with_entropy=True)[1]
    assert not ent.requires_grad
    torch.testing.assert_close(ent, want_ent.detach(), atol=1e-5, rtol=1e-5)


def test_hand_worked_entropy_from_the_log_prob_pass():
    """Logits log(1, 2, 1) on a 3-token vocabulary: p = (1/4, 1/2, 1/4), entropy 1.5 ln 2, and the
    log-prob of token 1 is ln(1/2); against float64, within 1e-6."""
    h = torch.tensor([[[0.0, math.log(2.0), 0.0]]], dtype=torch.float64)
    logp, ent = head_token_logprobs(h, torch.eye(3, dtype=torch.float64), None, torch.tensor([[1]]),
                                    with_entropy=True)
    assert abs(ent.item() - 1.5 * math.log(2.0)) < 1e-6
    assert abs(logp.item() - math.log(0.5)) < 1e-6


def test_the_entropy_costs_no_second_pass_through_the_head(monkeypatch):
    """One head matmul per chunk with the entropy as without it."""
    from posttrain.algos import head as head_module
    h, w, b, x, _ = _case()
    calls = []
    logits = head_module._logits
    monkeypatch.setattr(head_module, "_logits", lambda *a: calls.append(1) or logits(*a))
    head_token_logprobs(h, w, b, x, chunk_rows=4)
    without = len(calls)
    head_token_logprobs(h, w, b, x, chunk_rows=4, with_entropy=True)
    assert without == 6 and len(calls) == 2 * without  # 21 rows in chunks of 4


def test_bf16_inputs_give_fp32_results_close_to_the_fp32_path():
    h, w, b, x, weights = _case(torch.bfloat16)
    got, got_grads = _grads(lambda: head_token_logprobs(h, w, b, x, chunk_rows=5), h, w, b, weights)
    assert got.dtype == torch.float32 and all(g.dtype == torch.bfloat16 for g in got_grads)
    want, want_grads = _grads(lambda: _plain(h, w, b, x, 1.0)[0], h, w, b, weights)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)  # the same fp32 math on bf16 inputs
    for g, e in zip(got_grads, want_grads):
        torch.testing.assert_close(g.float(), e.float(), atol=2e-2, rtol=2e-2)


def test_the_model_returns_its_final_hidden_states_inside_hidden_head(nano_model_dir):
    from posttrain.models.hf import ModelConfig, load_model

    model = load_model(ModelConfig(path=str(nano_model_dir)))
    ids = torch.randint(5, 200, (2, 9))
    logits = model(input_ids=ids).logits
    with hidden_head(model):
        hidden = model(input_ids=ids).logits
    assert hidden.shape == (2, 9, model.config.hidden_size)
    w, b = head_of(model)
    torch.testing.assert_close(torch.nn.functional.linear(hidden, w, b), logits, atol=1e-5, rtol=1e-5)
    assert model(input_ids=ids).logits.shape[-1] == model.config.vocab_size  # the head is back


def test_heads_that_cannot_move_out_of_the_forward_keep_full_logits(nano_model_dir):
    from peft import LoraConfig, get_peft_model
    from posttrain.models.hf import ModelConfig, load_model

    model = load_model(ModelConfig(path=str(nano_model_dir)))
    assert movable_head(model)
    model.config.final_logit_softcapping = 30.0  # Gemma 2's soft cap: applied after the head
    assert not movable_head(model)
    model.config.final_logit_softcapping = None
    lora_head = get_peft_model(model, LoraConfig(r=2, target_modules=["lm_head"]))
    assert not movable_head(lora_head)


def _kl_case(bias=True, seed=0):
    """Student (hidden 16) and teacher (hidden 12, its own head) over V = 50; 21 positions, 16 kept."""
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(3, 7, 16, generator=g).requires_grad_()
    w = (torch.randn(50, 16, generator=g) / 2).requires_grad_()
    b = (torch.randn(50, generator=g) / 2).requires_grad_() if bias else None
    teacher = (torch.randn(3, 7, 12, generator=g).requires_grad_(), torch.randn(50, 12, generator=g) / 2,
               torch.randn(50, generator=g) / 2 if bias else None)
    mask = torch.ones(3, 7, dtype=torch.bool)
    mask[0, :2] = mask[1, 5:] = mask[2, 0] = False
    return h, w, b, teacher, mask, torch.randn(3, 7, generator=g)


@pytest.mark.parametrize("rows", [1, 3, 1000])  # 3: six chunks of the 16 kept positions, the last of one
@pytest.mark.parametrize("tau", [1.0, 0.7])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("topk", [None, 5])
def test_chunked_reverse_kl_equals_reverse_kl_full_with_its_gradients(rows, tau, bias, topk):
    from posttrain.algos.distill import reverse_kl_full

    h, w, b, (th, tw, tb), mask, weights = _kl_case(bias)
    linear = torch.nn.functional.linear
    want, want_grads = _grads(lambda: reverse_kl_full(linear(h, w, b) / tau, linear(th, tw, tb) / tau, mask,
                                                      teacher_topk=topk), h, w, b, weights)
    got, got_grads = _grads(lambda: head_reverse_kl(h, w, b, th, (tw, tb), mask, tau, teacher_topk=topk,
                                                    chunk_rows=rows), h, w, b, weights)
    assert bool((got[mask] > 0).all()) and bool((got[~mask] == 0).all())
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    for g, e in zip(got_grads, want_grads):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=0)
    assert bool((got_grads[0][~mask] == 0).all())  # a masked position's hidden state gets no gradient
    assert th.grad is None  # the teacher is a constant


def test_hand_worked_chunked_reverse_kl_and_its_gradient():
    # Identity head at τ = 2, so z = h / 2. Student p = (1/2, 1/2), teacher q = (1/4, 3/4):
    # KL(p‖q) = ½ ln 2 + ½ ln(2/3) = ½ ln(4/3) (the other direction, KL(q‖p), is ¾ ln(3/2) - ¼ ln 2).
    # dKL/dz = p ⊙ ((ln p - ln q) - KL) = (¼ ln 3, -¼ ln 3); dKL/dh = dKL/db = dKL/dz / τ = ±⅛ ln 3.
    tau, eye = 2.0, torch.eye(2)
    h = (tau * torch.tensor([[[0.5, 0.5], [0.9, 0.1]]]).log()).requires_grad_()  # the second position is masked
    b = torch.zeros(2, requires_grad=True)
    teacher = tau * torch.tensor([[[0.25, 0.75], [0.1, 0.9]]]).log()
    kl = head_reverse_kl(h, eye, b, teacher, (eye, None), torch.tensor([[True, False]]), tau, chunk_rows=1)
    torch.testing.assert_close(kl, torch.tensor([[0.5 * math.log(4 / 3), 0.0]]))
    kl.sum().backward()
    torch.testing.assert_close(h.grad, torch.tensor([[[math.log(3) / 8, -math.log(3) / 8], [0.0, 0.0]]]))
    torch.testing.assert_close(b.grad, torch.tensor([math.log(3) / 8, -math.log(3) / 8]))


def test_chunked_reverse_kl_refuses_a_bad_temperature_top_k_or_vocabulary():
    h, w, b, (th, tw, tb), mask, _ = _kl_case()
    with pytest.raises(ValueError, match="temperature"):
        head_reverse_kl(h, w, b, th, (tw, tb), mask, 0.0)
    with pytest.raises(ValueError, match="teacher_topk"):
        head_reverse_kl(h, w, b, th, (tw, tb), mask, teacher_topk=51)
    with pytest.raises(ValueError, match="outputs"):
        head_reverse_kl(h, w, b, th, (tw[:40], None), mask)
