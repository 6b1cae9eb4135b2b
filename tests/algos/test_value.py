import pytest
import torch

from posttrain.algos.value import explained_variance, value_loss


def test_hand_worked_clipped_value_loss():
    values = torch.tensor([[1.0, 0.2, 5.0]], requires_grad=True)
    old = torch.tensor([[0.0, 1.0, 0.0]])
    returns = torch.zeros(1, 3)
    loss, m = value_loss(values, old, returns, torch.tensor([[1, 1, 0]]), clip=0.5)
    # tok0: max(1², 0.5²)/2 = 0.5; tok1: max(0.2², 0.5²)/2 = 0.125 (clipped branch, no gradient)
    torch.testing.assert_close(loss, torch.tensor([[0.5, 0.125, 0.0]]))
    assert m["vf_clip_frac"].item() == pytest.approx(0.5)
    loss.sum().backward()
    torch.testing.assert_close(values.grad, torch.tensor([[1.0, 0.0, 0.0]]))


def test_unclipped_is_half_squared_error():
    values = torch.tensor([[1.0, -2.0]])
    loss, _ = value_loss(values, torch.zeros(1, 2), torch.tensor([[0.0, 1.0]]), torch.ones(1, 2), clip=None)
    torch.testing.assert_close(loss, torch.tensor([[0.5, 4.5]]))
    with pytest.raises(ValueError):
        value_loss(values, values, values, torch.ones(1, 2), clip=0.0)


def test_explained_variance():
    mask = torch.tensor([[1, 1, 0]])
    # R = [0, 2] (var 1), residual [0, 1] (var 0.25)
    ev = explained_variance(torch.tensor([[0.0, 1.0, 9.0]]), torch.tensor([[0.0, 2.0, -9.0]]), mask)
    assert ev.item() == pytest.approx(0.75)
    r = torch.tensor([[0.0, 2.0, 0.0]])
    assert explained_variance(r, r, mask).item() == pytest.approx(1.0)
    assert explained_variance(torch.full((1, 3), 7.0), r, mask).item() == pytest.approx(0.0)
    assert explained_variance(r, torch.ones(1, 3), mask).item() == 0.0
