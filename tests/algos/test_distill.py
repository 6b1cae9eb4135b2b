import math

import pytest
import torch

from posttrain.algos.distill import distill_reward, reverse_kl_full, reverse_kl_sampled
from posttrain.algos.logprobs import token_logprobs


def test_hand_worked_full_kl():
    # student [1/2, 1/2], teacher [1/4, 3/4]: ½ ln 2 + ½ ln(2/3)
    s = torch.log(torch.tensor([[[0.5, 0.5]]]))
    t = torch.log(torch.tensor([[[0.25, 0.75]]]))
    kl = reverse_kl_full(s, t, torch.ones(1, 1))
    assert kl.item() == pytest.approx(0.5 * math.log(2) + 0.5 * math.log(2 / 3))


def test_student_equal_teacher_gives_zero_kl_and_gradient():
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 7)
    student = logits.clone().requires_grad_()
    for k in (None, 3):
        kl = reverse_kl_full(student, logits, torch.ones(2, 3), teacher_topk=k)
        torch.testing.assert_close(kl, torch.zeros(2, 3), atol=1e-6, rtol=0)
        (g,) = torch.autograd.grad(kl.sum(), student)
        torch.testing.assert_close(g, torch.zeros_like(g), atol=1e-6, rtol=0)
    assert torch.all(reverse_kl_sampled(torch.randn(2, 3), torch.zeros(2, 3)) != 0)


def test_topk_renormalises_both_on_teacher_support():
    # teacher top-2 = tokens {0, 1} with renormalised [1/4, 3/4]; student on {0, 1}: [1/2, 1/2]
    t = torch.log(torch.tensor([[[0.2, 0.6, 0.1, 0.1]]]))
    s = torch.log(torch.tensor([[[0.1, 0.1, 0.4, 0.4]]]))
    kl = reverse_kl_full(s, t, torch.ones(1, 1), teacher_topk=2)
    assert kl.item() == pytest.approx(0.5 * math.log(2) + 0.5 * math.log(2 / 3), rel=1e-5)
    # documented blind spot: the student's 80% outside the support is not penalised
    assert kl.item() < reverse_kl_full(s, t, torch.ones(1, 1)).item()


def test_full_kl_matches_reference_and_masks():
    torch.manual_seed(1)
    s, t = torch.randn(2, 4, 9), torch.randn(2, 4, 9)
    mask = torch.tensor([[1, 1, 0, 1], [0, 1, 1, 1]])
    p_s, p_t = s.softmax(-1), t.softmax(-1)
    ref = (p_s * (p_s.log() - p_t.log())).sum(-1) * mask
    torch.testing.assert_close(reverse_kl_full(s, t, mask), ref)
    # the sampled estimator averages to the full KL under the student
    x = torch.multinomial(p_s[0, 0], 100_000, replacement=True, generator=torch.Generator().manual_seed(0))
    est = reverse_kl_sampled(p_s[0, 0].log()[x], p_t[0, 0].log()[x]).mean()
    assert est.item() == pytest.approx(ref[0, 0].item(), abs=0.01)


def test_sgd_on_full_kl_moves_student_to_teacher():
    teacher = torch.tensor([[[2.0, 0.5, -1.0, 0.0]]])
    student = torch.zeros(1, 1, 4, requires_grad=True)
    opt = torch.optim.SGD([student], lr=1.0)
    kls = []
    for _ in range(30):
        kl = reverse_kl_full(student, teacher, torch.ones(1, 1)).sum()
        kls.append(kl.item())
        opt.zero_grad()
        kl.backward()
        opt.step()
    assert kls[-1] < 0.05 * kls[0]
    assert student.softmax(-1).argmax().item() == 0


def test_policy_gradient_on_sampled_reward_moves_student_to_teacher():
    """On-policy distillation: sample from the student, reward −(log p_s − log p_t), REINFORCE."""
    gen = torch.Generator().manual_seed(0)
    teacher = torch.tensor([[[2.0, 0.5, -1.0, 0.0]]])
    student = torch.zeros(1, 1, 4, requires_grad=True)
    opt = torch.optim.SGD([student], lr=0.5)
    kl0 = reverse_kl_full(student, teacher, torch.ones(1, 1)).item()
    for _ in range(60):
        probs = student.detach().softmax(-1)[0, 0]
        x = torch.multinomial(probs, 64, replacement=True, generator=gen)[None]  # 64 samples as (1, 64)
        logits_s, logits_t = student.expand(1, 64, 4), teacher.expand(1, 64, 4)
        logp_s, logp_t = token_logprobs(logits_s, x), token_logprobs(logits_t, x)
        reward = distill_reward(logp_s, logp_t, torch.ones(1, 64))
        assert not reward.requires_grad
        loss = -(reward * logp_s).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    kl1 = reverse_kl_full(student, teacher, torch.ones(1, 1)).item()
    assert kl1 < 0.2 * kl0
