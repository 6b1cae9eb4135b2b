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


def sigmoid(x):
    return 1 / (1 + math.exp(-x))


def test_ipo_hand_worked():
    # Pair 0: chosen ratio −1 − (−2.5) = 1.5, rejected ratio −3 − (−2) = −1, h = 2.5. Pair 1: h = 0.
    # β = 0.25 so 1/(2β) = 2 differs from 1/β, 2β, β/2 and h: each misplaced β gives another number.
    pc = torch.tensor([-1.0, -4.0], requires_grad=True)
    pr = torch.tensor([-3.0, -5.0], requires_grad=True)
    rc = torch.tensor([-2.5, -4.0])
    rr = torch.tensor([-2.0, -5.0])
    loss, m = dpo_loss(pc, pr, rc, rr, beta=0.25, kind="ipo")
    # (2.5 − 2)² = 0.25 (wrong sign: 20.25; 1/β: 2.25; unsquared: 0.5); (0 − 2)² = 4 (per pair, not pooled)
    torch.testing.assert_close(loss, torch.tensor([0.25, 4.0]))
    assert m["rewards/chosen"].item() == pytest.approx(0.25 * 1.5 / 2)  # β·ratio, batch mean
    assert m["rewards/rejected"].item() == pytest.approx(0.25 * -1.0 / 2)
    assert m["rewards/margin"].item() == pytest.approx(0.25 * 2.5 / 2)
    loss.sum().backward()
    # dL/dπ_c = 2(h − 1/(2β)) = 1 and −4; dL/dπ_r the negatives
    torch.testing.assert_close(pc.grad, torch.tensor([1.0, -4.0]))
    torch.testing.assert_close(pr.grad, torch.tensor([-1.0, 4.0]))


def test_conservative_dpo_hand_worked():
    # h = 2.5 as above, β = 0.5: βh = 1.25; ε = 0.2 weighs the flipped label −log σ(−βh).
    pc = torch.tensor([-1.0], requires_grad=True)
    pr = torch.tensor([-3.0], requires_grad=True)
    beta, eps, bh = 0.5, 0.2, 1.25
    loss, _ = dpo_loss(pc, pr, torch.tensor([-2.5]), torch.tensor([-2.0]), beta=beta, label_smoothing=eps)
    want = -(1 - eps) * math.log(sigmoid(bh)) - eps * math.log(sigmoid(-bh))
    assert want == pytest.approx(0.5019, abs=1e-4)  # swapped ε: 1.2519; β dropped (logσ(h)): 0.5789
    assert loss.item() == pytest.approx(want)
    loss.sum().backward()
    # dL/d(βh) = −(1−ε)σ(−βh) + εσ(βh); the chain rule gives ±β of it
    d = -(1 - eps) * sigmoid(-bh) + eps * sigmoid(bh)
    assert pc.grad.item() == pytest.approx(beta * d)
    assert pr.grad.item() == pytest.approx(-beta * d)


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
