import math

import torch

from posttrain.algos.sft import sft_token_nll


def test_hand_worked_nll_and_ignore_ids():
    # softmax([0, ln 3]) = [1/4, 3/4]
    logits = torch.tensor([[[0.0, math.log(3.0)]] * 3])
    targets = torch.tensor([[1, 0, -100]])
    mask = torch.tensor([[1, 1, 0]])
    nll = sft_token_nll(logits, targets, mask)
    torch.testing.assert_close(nll, torch.tensor([[-math.log(0.75), -math.log(0.25), 0.0]]))


def test_masked_positions_get_no_gradient():
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 5, requires_grad=True)
    targets = torch.randint(0, 5, (2, 3))
    mask = torch.tensor([[True, False, True], [False, False, True]])
    sft_token_nll(logits, targets, mask).sum().backward()
    assert torch.all(logits.grad[~mask] == 0)
    assert torch.all(logits.grad[mask].abs().sum(-1) > 0)


def test_matches_cross_entropy():
    torch.manual_seed(1)
    logits = torch.randn(2, 4, 7)
    targets = torch.randint(0, 7, (2, 4))
    mask = torch.ones(2, 4)
    ce = torch.nn.functional.cross_entropy(logits.view(-1, 7), targets.view(-1), reduction="none").view(2, 4)
    torch.testing.assert_close(sft_token_nll(logits, targets, mask), ce)
