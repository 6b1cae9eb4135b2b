import math

import pytest
import torch

from posttrain.algos.advantages import grpo
from posttrain.algos.policy import POLICY_LOSSES, pg_loss, ppo_clip_loss


def _ratio_logp(ratios):
    """(logp, old_logp) with exp(logp - old) = ratios; logp requires grad."""
    old = torch.full((1, len(ratios)), -1.0)
    logp = (old + torch.log(torch.tensor([ratios]))).requires_grad_()
    return logp, old


def test_hand_worked_clipping():
    logp, old = _ratio_logp([1.5, 1.5, 0.5, 0.5])
    adv = torch.tensor([[1.0, -1.0, 1.0, -1.0]])
    loss, m = ppo_clip_loss(logp, old, adv, torch.ones(1, 4))
    # A>0, ρ=1.5: max(-1.5, -1.2); A<0, ρ=1.5: max(1.5, 1.2); A>0, ρ=.5: max(-.5, -.8); A<0, ρ=.5: max(.5, .8)
    torch.testing.assert_close(loss, torch.tensor([[-1.2, 1.5, -0.5, 0.8]]))
    assert m["clip_frac"].item() == pytest.approx(0.5)
    assert m["ratio_mean"].item() == pytest.approx(1.0)
    assert m["ratio_max"].item() == pytest.approx(1.5)
    k3 = lambda r: (r - 1) - math.log(r)
    assert m["approx_kl"].item() == pytest.approx((2 * k3(1.5) + 2 * k3(0.5)) / 4, rel=1e-5)
    # clipped tokens carry no gradient, unclipped ones carry -A·ρ
    loss.sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, 1.5, -0.5, 0.0]]))


def test_clip_low_and_clip_high_bound_their_own_side():
    # clip_low 0.1 (ratio >= 0.9), clip_high 0.3 (ratio <= 1.3). A<0 at ρ=.85: max(.85, .9) = .9;
    # A>0 at ρ=1.25: inside; A>0 at ρ=1.4: max(-1.4, -1.3) = -1.3; A<0 at ρ=.75: max(.75, .9) = .9.
    logp, old = _ratio_logp([0.85, 1.25, 1.4, 0.75])
    adv = torch.tensor([[-1.0, 1.0, 1.0, -1.0]])
    loss, m = ppo_clip_loss(logp, old, adv, torch.ones(1, 4), clip_low=0.1, clip_high=0.3)
    torch.testing.assert_close(loss, torch.tensor([[0.9, -1.25, -1.3, 0.9]]))
    assert m["clip_frac"].item() == pytest.approx(0.75)
    # swapped bounds [0.7, 1.1]: ρ=.85 and ρ=.75 are inside; ρ=1.25 and ρ=1.4 clip at 1.1
    loss, _ = ppo_clip_loss(logp, old, adv, torch.ones(1, 4), clip_low=0.3, clip_high=0.1)
    torch.testing.assert_close(loss, torch.tensor([[0.85, -1.1, -1.1, 0.75]]))


def test_clip_higher_and_dual_clip():
    logp, old = _ratio_logp([1.25, 3.0])
    adv = torch.tensor([[1.0, -2.0]])
    loss, _ = ppo_clip_loss(logp, old, adv, torch.ones(1, 2), clip_high=0.28)
    torch.testing.assert_close(loss, torch.tensor([[-1.25, 6.0]]))
    loss, m = ppo_clip_loss(logp, old, adv, torch.ones(1, 2), clip_high=0.28, dual_clip=2.5)
    # dual clip caps the A<0 token at -A·c = 5
    torch.testing.assert_close(loss, torch.tensor([[-1.25, 5.0]]))
    assert m["dual_clip_frac"].item() == pytest.approx(0.5)
    with pytest.raises(ValueError):
        ppo_clip_loss(logp, old, adv, torch.ones(1, 2), dual_clip=1.0)


def test_ratio_one_matches_pg_gradient():
    torch.manual_seed(0)
    logp = torch.randn(3, 5, requires_grad=True)
    adv = torch.randn(3, 5)
    mask = torch.rand(3, 5) > 0.3
    w = torch.rand(3, 5) + 0.5
    loss_ppo, m = ppo_clip_loss(logp, logp.detach(), adv, mask, is_weights_BT=w)
    loss_pg, _ = pg_loss(logp, adv, mask, is_weights_BT=w)
    # value at ρ=1 is the surrogate -A·w (pg's value is -A·w·logp); gradients are identical
    torch.testing.assert_close(loss_ppo, torch.where(mask, -adv * w, 0.0))
    (g_ppo,) = torch.autograd.grad(loss_ppo.sum(), logp)
    (g_pg,) = torch.autograd.grad(loss_pg.sum(), logp)
    torch.testing.assert_close(g_ppo, g_pg)
    assert m["clip_frac"].item() == 0.0


@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
def test_all_equal_group_gives_zero_gradient(name):
    rewards = torch.tensor([[1.0, 1.0, 1.0, 1.0]])
    adv_PG, _ = grpo(rewards, torch.ones_like(rewards, dtype=torch.bool))
    logp = torch.randn(4, 6, requires_grad=True)
    old = logp.detach() + 0.1 * torch.randn(4, 6)
    loss, _ = POLICY_LOSSES[name](logp, old, adv_PG.view(4, 1).expand(4, 6), torch.ones(4, 6))
    (g,) = torch.autograd.grad(loss.sum(), logp)
    assert torch.all(g == 0)


def test_masked_tokens_zero_and_excluded_from_metrics():
    logp, old = _ratio_logp([1.0, 100.0])
    loss, m = ppo_clip_loss(logp, old, torch.tensor([[1.0, 1.0]]), torch.tensor([[1, 0]]))
    assert loss[0, 1].item() == 0.0
    assert m["ratio_max"].item() == pytest.approx(1.0)


def test_is_weights_multiply_and_are_detached():
    logp, old = _ratio_logp([1.0, 1.0])
    w = torch.tensor([[0.5, 2.0]], requires_grad=True)
    loss, _ = ppo_clip_loss(logp, old, torch.tensor([[1.0, 1.0]]), torch.ones(1, 2), is_weights_BT=w)
    torch.testing.assert_close(loss, torch.tensor([[-0.5, -2.0]]))
    loss.sum().backward()
    assert w.grad is None


def test_pg_hand_worked():
    logp = torch.tensor([[-0.5, -2.0, -1.0]], requires_grad=True)
    loss, m = pg_loss(logp, torch.tensor([[2.0, -1.0, 3.0]]), torch.tensor([[1, 1, 0]]))
    torch.testing.assert_close(loss, torch.tensor([[1.0, -2.0, 0.0]]))
    assert m["logp_mean"].item() == pytest.approx(-1.25)
