import math

import pytest
import torch

from posttrain.algos.logprobs import entropy_from_logits, token_logprobs


def _ref_logp(logits_BTV, targets_BT, temperature=1.0):
    logp = torch.log_softmax(logits_BTV.double() / temperature, dim=-1)
    return logp.gather(-1, targets_BT[..., None]).squeeze(-1)


def _ref_entropy(logits_BTV, temperature=1.0):
    logp = torch.log_softmax(logits_BTV.double() / temperature, dim=-1)
    return -(logp.exp() * logp).sum(-1)


def test_hand_worked_two_token_vocab():
    # softmax([0, ln 3]) = [1/4, 3/4]
    logits = torch.tensor([[[0.0, math.log(3.0)], [0.0, math.log(3.0)]]])
    logp = token_logprobs(logits, torch.tensor([[1, 0]]))
    torch.testing.assert_close(logp, torch.tensor([[math.log(0.75), math.log(0.25)]]))
    # temperature 0.5 squares the odds: softmax([0, 2 ln 3]) = [1/10, 9/10]
    logp_t = token_logprobs(logits, torch.tensor([[1, 0]]), temperature=0.5)
    torch.testing.assert_close(logp_t, torch.tensor([[math.log(0.9), math.log(0.1)]]))


def test_fp32_path_matches_log_softmax_value_and_grad():
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 11, requires_grad=True)
    targets = torch.randint(0, 11, (3, 5))
    logp = token_logprobs(logits, targets, temperature=0.7)
    assert logp.dtype == torch.float32
    torch.testing.assert_close(logp.double(), _ref_logp(logits.detach(), targets, 0.7))
    w = torch.randn(3, 5)
    (g,) = torch.autograd.grad((logp * w).sum(), logits)
    ref_logits = logits.detach().double().requires_grad_()
    (g_ref,) = torch.autograd.grad((_ref_logp(ref_logits, targets, 0.7) * w.double()).sum(), ref_logits)
    torch.testing.assert_close(g.double(), g_ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("chunk_rows", [1, 4, None])
def test_chunked_low_precision_matches_reference(dtype, chunk_rows):
    torch.manual_seed(1)
    logits = (3 * torch.randn(2, 7, 13)).to(dtype).requires_grad_()
    targets = torch.randint(0, 13, (2, 7))
    logp = token_logprobs(logits, targets, temperature=0.8, chunk_rows=chunk_rows)
    assert logp.dtype == torch.float32
    # Same bf16 inputs upcast: the fp32 computation must agree to fp32 precision.
    torch.testing.assert_close(logp.double(), _ref_logp(logits.detach(), targets, 0.8), rtol=1e-5, atol=1e-5)
    w = torch.randn(2, 7)
    (g,) = torch.autograd.grad((logp * w).sum(), logits)
    assert g.dtype == dtype
    ref_logits = logits.detach().double().requires_grad_()
    (g_ref,) = torch.autograd.grad((_ref_logp(ref_logits, targets, 0.8) * w.double()).sum(), ref_logits)
    # The gradient is rounded once to the logits' dtype.
    torch.testing.assert_close(g.double(), g_ref, rtol=1e-2, atol=1e-2)


def test_chunked_grad_is_exact_before_rounding():
    """In float16 the only error is the final cast: compare against the rounded reference."""
    torch.manual_seed(2)
    logits = torch.randn(1, 4, 6).half().requires_grad_()
    targets = torch.tensor([[0, 5, 2, 2]])
    (g,) = torch.autograd.grad(token_logprobs(logits, targets, chunk_rows=3).sum(), logits)
    ref_logits = logits.detach().double().requires_grad_()
    (g_ref,) = torch.autograd.grad(_ref_logp(ref_logits, targets).sum(), ref_logits)
    torch.testing.assert_close(g, g_ref.half(), rtol=0, atol=1e-3)


def test_shape_and_temperature_errors():
    with pytest.raises(ValueError):
        token_logprobs(torch.zeros(1, 2, 3), torch.zeros(1, 3, dtype=torch.long))
    with pytest.raises(ValueError):
        token_logprobs(torch.zeros(1, 2, 3), torch.zeros(1, 2, dtype=torch.long), temperature=0.0)


def test_entropy_hand_worked():
    # uniform over 8 tokens → ln 8; [1/4, 3/4] → -(¼ ln ¼ + ¾ ln ¾)
    logits = torch.tensor([[[0.0] * 8, [0.0, math.log(3.0)] + [-1e4] * 6]])
    ent = entropy_from_logits(logits)
    h2 = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    torch.testing.assert_close(ent, torch.tensor([[math.log(8.0), h2]]))


@pytest.mark.parametrize("dtype,chunk_rows", [(torch.float32, None), (torch.bfloat16, 2), (torch.float16, None)])
def test_entropy_matches_reference_value_and_grad(dtype, chunk_rows):
    torch.manual_seed(3)
    logits = (2 * torch.randn(3, 4, 9)).to(dtype).requires_grad_()
    ent = entropy_from_logits(logits, temperature=1.3, chunk_rows=chunk_rows)
    assert ent.dtype == torch.float32
    torch.testing.assert_close(ent.double(), _ref_entropy(logits.detach(), 1.3), rtol=1e-5, atol=1e-5)
    w = torch.randn(3, 4)
    (g,) = torch.autograd.grad((ent * w).sum(), logits)
    ref_logits = logits.detach().double().requires_grad_()
    (g_ref,) = torch.autograd.grad((_ref_entropy(ref_logits, 1.3) * w.double()).sum(), ref_logits)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(g.double(), g_ref, rtol=tol, atol=tol)


@pytest.mark.parametrize("chunk_rows", [3, 10, 15])
def test_chunked_non_contiguous_view_matches_fp32_path(chunk_rows):
    """A shifted view logits[:, :-1] (as trainers pass it) with chunks spanning several rows."""
    torch.manual_seed(4)
    full = torch.randn(3, 8, 5).bfloat16().requires_grad_()
    view = full[:, :-1]
    assert not view.is_contiguous()
    targets = torch.randint(0, 5, (3, 7))
    logp = token_logprobs(view, targets, chunk_rows=chunk_rows)
    ent = entropy_from_logits(view, chunk_rows=chunk_rows)
    torch.testing.assert_close(logp, token_logprobs(view.detach().float(), targets))
    torch.testing.assert_close(ent, entropy_from_logits(view.detach().float()))
    (g,) = torch.autograd.grad(logp.sum() + ent.sum(), full)
    assert torch.all(g[:, -1] == 0) and torch.all(g[:, :-1].abs().sum(-1) > 0)
