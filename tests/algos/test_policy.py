import math

import pytest
import torch

from posttrain.algos.advantages import grpo
from posttrain.algos.policy import POLICY_LOSSES, cispo_loss, gspo_loss, pg_loss, ppo_clip_loss


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


# ------------------------------------------------------------------------------------- GSPO


def _seq_logp(log_ratios, old=-1.0):
    """(logp, old_logp) rows with logp - old = log_ratios; logp requires grad."""
    old_BT = torch.full((len(log_ratios), len(log_ratios[0])), old, dtype=torch.float64)
    logp = (old_BT + torch.tensor(log_ratios, dtype=torch.float64)).requires_grad_()
    return logp, old_BT


def test_gspo_hand_worked():
    # Sequence ratios are exp of the mean log-ratio over valid tokens (the masked 5.0 is ignored):
    #  seq 0: mean(1e-3, -4e-4) = 3e-4, s = e^3e-4 = 1.00030005 inside [0.9997, 1.0004];  A = +1
    #         loss -s at each token, gradient -A·s = -1.00030005 at each valid token.
    #  seq 1: mean(2e-3, 0, 1e-3) = 1e-3, s = 1.0010005 > 1.0004;  A = +2
    #         max(-2·1.0010005, -2·1.0004) = -2.0008, clipped: no gradient.
    #  seq 2: mean(-1e-3, -1e-3) = -1e-3, s = 0.9990005 < 0.9997;  A = -1
    #         max(0.9990005, 0.9997) = 0.9997, clipped: no gradient.
    #  seq 3: mean(1e-2, 1e-2) = 1e-2, s = 1.0100502;  A = -1
    #         max(1.0100502, 1.0004) = 1.0100502, not clipped (PPO keeps the pessimistic branch):
    #         gradient -A·s = +1.0100502.
    logp, old = _seq_logp([[1e-3, -4e-4, 5.0], [2e-3, 0.0, 1e-3], [-1e-3, -1e-3, 0.0], [1e-2, 1e-2, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 1, 0], [1, 1, 0]])
    adv = torch.tensor([[1.0], [2.0], [-1.0], [-1.0]], dtype=torch.float64).expand(4, 3)
    loss, m = POLICY_LOSSES["gspo"](logp, old, adv, mask, clip_low=3e-4, clip_high=4e-4)
    s0, s3 = math.exp(3e-4), math.exp(1e-2)
    expected = torch.tensor([[-s0, -s0, 0.0], [-2.0008] * 3, [0.9997, 0.9997, 0.0], [s3, s3, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(loss, expected, rtol=1e-6, atol=1e-7)
    loss.sum().backward()
    grad = torch.tensor([[-s0, -s0, 0.0], [0.0] * 3, [0.0] * 3, [s3, s3, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(logp.grad, grad, rtol=1e-6, atol=1e-7)
    assert m["clip_frac"].item() == pytest.approx(5 / 9)  # seq 1 (3 tokens) and seq 2 (2) of 9 tokens
    assert m["seq_ratio_max"].item() == pytest.approx(s3, rel=1e-6)
    assert m["seq_ratio_mean"].item() == pytest.approx((s0 + math.exp(1e-3) + math.exp(-1e-3) + s3) / 4, rel=1e-6)


def _gspo_reference(logp, old, adv_B, mask, lo, hi):
    """Plain-python float64 GSPO: per-token loss values and d(Σ loss)/d logp, sequence by sequence."""
    loss, grad = [], []
    for lp, od, a, mk in zip(logp, old, adv_B, mask):
        n = sum(mk)
        s = math.exp(sum(x - y for x, y, k in zip(lp, od, mk) if k) / max(n, 1))
        unclipped, clipped = -a * s, -a * min(max(s, 1 - lo), 1 + hi)
        value = max(unclipped, clipped)
        g = -a * s if unclipped >= clipped else 0.0  # the clipped branch is flat in θ
        loss.append([value if k else 0.0 for k in mk])
        grad.append([g if k else 0.0 for k in mk])
    return loss, grad


def test_gspo_matches_a_float64_reference_on_random_inputs():
    gen = torch.Generator().manual_seed(0)
    B, T, lo, hi = 16, 7, 3e-4, 4e-4
    old = -torch.rand(B, T, generator=gen, dtype=torch.float64) * 3
    logp = (old + 1e-3 * torch.randn(B, T, generator=gen, dtype=torch.float64)).requires_grad_()
    mask = torch.rand(B, T, generator=gen) > 0.3
    mask[0] = False  # a sequence without valid tokens contributes nothing
    adv_B = torch.randn(B, generator=gen, dtype=torch.float64)
    loss, m = gspo_loss(logp, old, adv_B[:, None].expand(B, T), mask, clip_low=lo, clip_high=hi)
    loss.sum().backward()
    ref_loss, ref_grad = _gspo_reference(logp.tolist(), old.tolist(), adv_B.tolist(), mask.int().tolist(), lo, hi)
    torch.testing.assert_close(loss, torch.tensor(ref_loss, dtype=torch.float64), rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(logp.grad, torch.tensor(ref_grad, dtype=torch.float64), rtol=1e-6, atol=1e-9)
    assert 0.1 < m["clip_frac"].item() < 0.9  # both branches were exercised


def test_gspo_token_form_has_the_gradient_of_the_sequence_objective():
    """Mean over a sequence's tokens of s_i,t has the gradient of s_i = exp(mean_t log-ratio), so
    seq_mean_token_mean of the per-token loss is the paper's sequence-level objective."""
    from posttrain.algos.aggregate import seq_mean_token_mean

    gen = torch.Generator().manual_seed(1)
    B, T = 6, 5
    old = -torch.rand(B, T, generator=gen, dtype=torch.float64)
    logp = (old + 2e-3 * torch.randn(B, T, generator=gen, dtype=torch.float64)).requires_grad_()
    mask = torch.rand(B, T, generator=gen) > 0.2
    adv_B = torch.randn(B, generator=gen, dtype=torch.float64)
    loss_BT, _ = gspo_loss(logp, old, adv_B[:, None].expand(B, T), mask, clip_low=1e-3, clip_high=1e-3)
    (g_token,) = torch.autograd.grad(seq_mean_token_mean(loss_BT, mask, global_num_seqs=B), logp)
    d = torch.where(mask, logp - old, 0.0)
    s_B = torch.exp(d.sum(1) / mask.sum(1))
    objective = torch.maximum(-adv_B * s_B, -adv_B * s_B.clamp(1 - 1e-3, 1 + 1e-3)).mean()
    (g_seq,) = torch.autograd.grad(objective, logp)
    torch.testing.assert_close(g_token, g_seq)
    assert float(g_seq.abs().sum()) > 0


def test_gspo_on_policy_value_is_the_advantage_and_weights_multiply():
    logp = torch.randn(2, 3, requires_grad=True)
    w = torch.tensor([[0.5, 2.0, 1.0], [1.0, 1.0, 1.0]])
    loss, m = gspo_loss(logp, logp.detach(), torch.tensor([[1.0], [-2.0]]).expand(2, 3), torch.ones(2, 3),
                        is_weights_BT=w)
    torch.testing.assert_close(loss, torch.tensor([[-0.5, -2.0, -1.0], [2.0, 2.0, 2.0]]))
    assert m["clip_frac"].item() == 0.0 and m["seq_ratio_mean"].item() == pytest.approx(1.0)


# ------------------------------------------------------------------------------------- CISPO


def test_cispo_hand_worked():
    # ratios 1.5, 0.5, 1.1; log π = -1, -2, -0.5; A = 1, -1, 2.
    # clip_low=1 (no lower bound), clip_high=0.28: weights 1.28, 0.5, 1.1
    # loss = -w·A·log π = 1.28, -1.0, 1.1; gradient -w·A = -1.28, 0.5, -2.2 (no token loses it)
    logp = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    old = logp.detach() - torch.log(torch.tensor([[1.5, 0.5, 1.1]]))
    adv = torch.tensor([[1.0, -1.0, 2.0]])
    loss, m = cispo_loss(logp, old, adv, torch.ones(1, 3), clip_low=1.0, clip_high=0.28)
    torch.testing.assert_close(loss, torch.tensor([[1.28, -1.0, 1.1]]))
    loss.sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-1.28, 0.5, -2.2]]))
    assert m["clip_frac"].item() == pytest.approx(1 / 3)
    assert m["ratio_max"].item() == pytest.approx(1.5)
    # a lower bound 1 - 0.2 = 0.8 lifts the middle weight: -0.8·(-1)·(-2) = -1.6
    loss, m = cispo_loss(logp, old, adv, torch.ones(1, 3), clip_low=0.2, clip_high=0.28)
    torch.testing.assert_close(loss, torch.tensor([[1.28, -1.6, 1.1]]))
    assert m["clip_frac"].item() == pytest.approx(2 / 3)
    with pytest.raises(ValueError):
        cispo_loss(logp, old, adv, torch.ones(1, 3), clip_low=1.5)


def test_cispo_matches_a_float64_reference_and_keeps_gradient_where_ppo_drops_it():
    gen = torch.Generator().manual_seed(2)
    B, T, lo, hi = 8, 6, 1.0, 0.28
    old = -torch.rand(B, T, generator=gen, dtype=torch.float64) * 3
    logp = (old + 0.4 * torch.randn(B, T, generator=gen, dtype=torch.float64)).requires_grad_()
    mask = torch.rand(B, T, generator=gen) > 0.3
    adv = torch.randn(B, 1, generator=gen, dtype=torch.float64).expand(B, T)
    loss, _ = cispo_loss(logp, old, adv, mask, clip_low=lo, clip_high=hi)
    (g,) = torch.autograd.grad(loss.sum(), logp)
    ref_loss, ref_grad = [], []
    for lp_row, od_row, a_row, mk_row in zip(logp.tolist(), old.tolist(), adv.tolist(), mask.tolist()):
        w_row = [min(max(math.exp(x - y), 1 - lo), 1 + hi) for x, y in zip(lp_row, od_row)]
        ref_loss.append([-w * a * x if k else 0.0 for w, a, x, k in zip(w_row, a_row, lp_row, mk_row)])
        ref_grad.append([-w * a if k else 0.0 for w, a, k in zip(w_row, a_row, mk_row)])
    torch.testing.assert_close(loss, torch.tensor(ref_loss, dtype=torch.float64))
    torch.testing.assert_close(g, torch.tensor(ref_grad, dtype=torch.float64))
    ppo, _ = ppo_clip_loss(logp, old, adv, mask, clip_low=0.2, clip_high=hi)
    (g_ppo,) = torch.autograd.grad(ppo.sum(), logp)
    dropped = mask & (g_ppo == 0) & (adv != 0)
    assert dropped.any() and torch.all(g[dropped] != 0)


def test_cispo_on_policy_is_reinforce():
    logp = torch.randn(3, 4, requires_grad=True)
    adv, mask, w = torch.randn(3, 4), torch.rand(3, 4) > 0.3, torch.rand(3, 4) + 0.5
    loss_c, _ = cispo_loss(logp, logp.detach(), adv, mask, is_weights_BT=w)
    loss_pg, _ = pg_loss(logp, adv, mask, is_weights_BT=w)
    torch.testing.assert_close(loss_c, loss_pg)
