import pytest
import torch

from posttrain.algos.aggregate import AGGREGATIONS

LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 99.0]])
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])


def test_hand_worked_values():
    kw = dict(global_num_tokens=5, global_num_seqs=2, norm_constant=4)
    # (1+2+3+4+5)/5
    assert AGGREGATIONS["token_mean"](LOSS, MASK, **kw).item() == pytest.approx(3.0)
    # (6/3 + 9/2)/2
    assert AGGREGATIONS["seq_mean_token_mean"](LOSS, MASK, **kw).item() == pytest.approx(3.25)
    # (6/4 + 9/4)/2
    assert AGGREGATIONS["seq_mean_token_sum_norm"](LOSS, MASK, **kw).item() == pytest.approx(1.875)


def test_nan_at_masked_position_does_not_leak():
    loss = LOSS.clone()
    loss[1, 2] = float("nan")
    kw = dict(global_num_tokens=5, global_num_seqs=2, norm_constant=4)
    for fn in AGGREGATIONS.values():
        assert torch.isfinite(fn(loss, MASK, **kw))


def test_missing_denominator_raises():
    with pytest.raises(ValueError, match="global_num_tokens"):
        AGGREGATIONS["token_mean"](LOSS, MASK, global_num_seqs=2)
    with pytest.raises(ValueError, match="norm_constant"):
        AGGREGATIONS["seq_mean_token_sum_norm"](LOSS, MASK, global_num_seqs=2)


@pytest.mark.parametrize("mode", sorted(AGGREGATIONS))
def test_micro_batches_with_global_counts_equal_whole_batch(mode):
    torch.manual_seed(0)
    B, T = 6, 5
    lengths = torch.tensor([5, 1, 3, 4, 2, 5])
    mask = torch.arange(T)[None, :] < lengths[:, None]
    x = torch.randn(B, T)
    w = torch.randn(T, requires_grad=True)
    kw = dict(global_num_tokens=mask.sum(), global_num_seqs=B, norm_constant=T)
    fn = AGGREGATIONS[mode]

    whole = fn((x * w) ** 2, mask, **kw)
    (g_whole,) = torch.autograd.grad(whole, w)

    total, g_sum = torch.zeros(()), torch.zeros(T)
    for idx in ([0, 1], [2], [3, 4, 5]):
        part = fn((x[idx] * w) ** 2, mask[idx], **kw)
        (g,) = torch.autograd.grad(part, w)
        total, g_sum = total + part.detach(), g_sum + g
    torch.testing.assert_close(total, whole.detach())
    torch.testing.assert_close(g_sum, g_whole)
    # A local denominator would have broken this: check the test can fail.
    if mode == "token_mean":
        local = sum(fn((x[i] * w) ** 2, mask[i], global_num_tokens=mask[i].sum()) for i in ([0, 1], [2], [3, 4, 5])) / 3
        assert not torch.allclose(local, whole)


@pytest.mark.parametrize("mode", sorted(AGGREGATIONS))
def test_a_sequence_split_over_rows_counts_once(mode):
    """Rows 0 and 1 are one sequence cut in two: with its whole token count per row and the
    sequence counted once, every mode equals the unsplit row [1, 2, 3, 4, 5] next to row [6, 7].
    Hand-worked: token_mean (28/7) = 4; seq_mean_token_mean (15/5 + 13/2)/2 = 4.75;
    seq_mean_token_sum_norm (15/4 + 13/4)/2 = 3.5."""
    split_loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 0.0], [6.0, 7.0, 0.0]])
    split_mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 0]])
    whole_loss = torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0], [6.0, 7.0, 0.0, 0.0, 0.0]])
    whole_mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]])
    kw = dict(global_num_tokens=7, global_num_seqs=2, norm_constant=4)
    fn = AGGREGATIONS[mode]
    split = fn(split_loss, split_mask, seq_num_tokens_B=torch.tensor([5, 5, 2]), **kw)
    whole = fn(whole_loss, whole_mask, **kw)
    expected = {"token_mean": 4.0, "seq_mean_token_mean": 4.75, "seq_mean_token_sum_norm": 3.5}[mode]
    assert split.item() == pytest.approx(expected) and whole.item() == pytest.approx(expected)
