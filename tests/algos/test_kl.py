import math

import pytest
import torch

from posttrain.algos.kl import KL_ESTIMATORS, kl_k1, kl_k2, kl_k3


def test_hand_worked():
    logp, ref = torch.tensor([[math.log(0.5)]]), torch.tensor([[math.log(0.25)]])
    # d = ref - logp = -ln 2
    assert kl_k1(logp, ref).item() == pytest.approx(math.log(2))
    assert kl_k2(logp, ref).item() == pytest.approx(0.5 * math.log(2) ** 2)
    assert kl_k3(logp, ref).item() == pytest.approx(0.5 - 1 + math.log(2))


@pytest.mark.parametrize("name", sorted(KL_ESTIMATORS))
def test_zero_at_identical_distributions(name):
    logp = torch.randn(3, 4).log_softmax(-1)
    assert torch.all(KL_ESTIMATORS[name](logp, logp) == 0)


def test_k3_nonnegative_and_finite_everywhere():
    d = torch.cat([torch.linspace(-60, 60, 2001), torch.tensor([1e-8, -1e-8, 1e-4, -1e-4])])
    logp = torch.zeros_like(d, requires_grad=True)
    kl = kl_k3(logp, d)
    assert torch.all(kl >= 0)
    kl.sum().backward()
    assert torch.all(torch.isfinite(kl)) and torch.all(torch.isfinite(logp.grad))


def test_k1_k3_unbiased_k2_biased_by_monte_carlo():
    p = torch.tensor([0.5, 0.3, 0.15, 0.05])
    q = torch.tensor([0.25, 0.25, 0.25, 0.25])
    true_kl = (p * (p / q).log()).sum().item()
    gen = torch.Generator().manual_seed(0)
    x = torch.multinomial(p, 200_000, replacement=True, generator=gen)
    logp, ref = p.log()[x], q.log()[x]
    k1, k2, k3 = (f(logp, ref).mean().item() for f in (kl_k1, kl_k2, kl_k3))
    assert k1 == pytest.approx(true_kl, abs=0.005)
    assert k3 == pytest.approx(true_kl, abs=0.005)
    # k2 estimates ½E[(log p/q)²], here measurably different from the KL
    assert abs(k2 - true_kl) > 0.02
