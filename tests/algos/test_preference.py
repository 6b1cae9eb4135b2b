import math

import pytest
import torch

from posttrain.algos.preference import bradley_terry_loss, dpo_loss


def test_policy_equal_reference_gives_log2():
    torch.manual_seed(0)
    c, r = torch.randn(4), torch.randn(4)
    for eps in (0.0, 0.2):
        loss, m = dpo_loss(c, r, c.clone(), r.clone(), beta=0.3, label_smoothing=eps)
        torch.testing.assert_close(loss, torch.full((4,), math.log(2)))
        assert m["rewards/margin"].item() == 0.0
        assert m["rewards/accuracy"].item() == 0.0
    loss, _ = dpo_loss(c, r, c.clone(), r.clone(), beta=0.1, kind="ipo")
    torch.testing.assert_close(loss, torch.full((4,), 25.0))  # (0 - 1/(2·0.1))²


def test_dpo_hand_worked():
    pc = torch.tensor([-1.0], requires_grad=True)
    pr = torch.tensor([-3.0], requires_grad=True)
    rc = torch.tensor([-2.0], requires_grad=True)
    rr = torch.tensor([-2.0])
    # h = (−1+2) − (−3+2) = 2; β h = 1
    loss, m = dpo_loss(pc, pr, rc, rr, beta=0.5)
    assert loss.item() == pytest.approx(math.log1p(math.exp(-1)))
    assert m["rewards/chosen"].item() == pytest.approx(0.5)
    assert m["rewards/rejected"].item() == pytest.approx(-0.5)
    assert m["rewards/margin"].item() == pytest.approx(1.0)
    assert m["rewards/accuracy"].item() == 1.0
    loss.sum().backward()
    s = 1 / (1 + math.e)  # dL/d(βh) = −σ(−βh)
    assert pc.grad.item() == pytest.approx(-0.5 * s)
    assert pr.grad.item() == pytest.approx(0.5 * s)
    assert rc.grad is None  # the reference is constant
    smoothed, _ = dpo_loss(pc, pr, rc, rr, beta=0.5, label_smoothing=0.1)
    assert smoothed.item() == pytest.approx(0.9 * math.log1p(math.exp(-1)) + 0.1 * math.log1p(math.e))
    ipo, _ = dpo_loss(pc, pr, rc, rr, beta=0.5, kind="ipo")
    assert ipo.item() == pytest.approx(1.0)  # (2 − 1)²


def test_dpo_bad_arguments():
    x = torch.zeros(1)
    with pytest.raises(ValueError):
        dpo_loss(x, x, x, x, kind="hinge")
    with pytest.raises(ValueError):
        dpo_loss(x, x, x, x, beta=0.0)
    with pytest.raises(ValueError):
        dpo_loss(x, x, x, x, kind="ipo", label_smoothing=0.1)


def test_bradley_terry_hand_worked():
    loss, m = bradley_terry_loss(torch.tensor([2.0, 0.0]), torch.tensor([1.0, 1.0]))
    torch.testing.assert_close(loss, torch.tensor([math.log1p(math.exp(-1)), math.log1p(math.e)]))
    assert m["accuracy"].item() == 0.5
    assert m["margin"].item() == pytest.approx(0.0)
    loss, _ = bradley_terry_loss(torch.tensor([2.0]), torch.tensor([1.0]), margin_B=torch.tensor([1.0]))
    assert loss.item() == pytest.approx(math.log(2))
