"""RLBatch: target alignment of the sampler log-probs and masks, row selection."""

import torch

from posttrain.rl.batch import build_batch
from posttrain.rollout import SamplingParams, Rollouts


def _rollouts():
    return Rollouts(prompt_idx=[0, 0], prompt_ids=[[5, 6, 7], [5, 6, 7]],
                    completion_ids=[[8, 9], [10, 11, 12, 0]],
                    logprobs=[[-0.1, -0.2], [-1.0, -2.0, -3.0, -4.0]],
                    finish_reason=["length", "eos"], policy_version=[3, 3], sampling=SamplingParams())


def test_targets_are_aligned_with_the_tokens_they_score():
    b = build_batch(_rollouts(), [1.0, 0.0], [True, True], pad_id=0)
    assert b.input_ids_BT.tolist() == [[5, 6, 7, 8, 9, 0, 0], [5, 6, 7, 10, 11, 12, 0]]
    assert b.attention_mask_BT.tolist() == [[1, 1, 1, 1, 1, 0, 0], [1] * 7]
    # column t scores token t+1: the first completion token (position 3) is column 2
    assert b.mask_BT.tolist() == [[False, False, True, True, False, False],
                                  [False, False, True, True, True, True]]
    assert torch.allclose(b.sampler_logp_BT[0], torch.tensor([0, 0, -0.1, -0.2, 0, 0]))
    assert torch.allclose(b.sampler_logp_BT[1], torch.tensor([0, 0, -1.0, -2.0, -3.0, -4.0]))
    for row in range(2):
        cols = torch.nonzero(b.mask_BT[row]).flatten()
        assert b.input_ids_BT[row, cols + 1].tolist() == _rollouts().completion_ids[row]
    assert b.policy_version_B.tolist() == [3, 3]


def test_invalid_rows_leave_the_train_mask():
    b = build_batch(_rollouts(), [1.0, 0.0], [True, False], pad_id=0)
    assert b.train_mask_BT[1].sum() == 0 and b.train_mask_BT[0].sum() == 2


def test_select_trims_to_the_longest_selected_row():
    b = build_batch(_rollouts(), [1.0, 0.0], [True, True], pad_id=0)
    one = b.select([0])
    assert one.input_ids_BT.shape == (1, 5) and one.mask_BT.shape == (1, 4)
    assert torch.allclose(one.sampler_logp_BT[0], torch.tensor([0, 0, -0.1, -0.2]))
    assert one.rewards_B.tolist() == [1.0]


def _batch_of_lengths(lengths):
    ro = Rollouts(prompt_idx=list(range(len(lengths))), prompt_ids=[[1]] * len(lengths),
                  completion_ids=[[2] * (n - 1) for n in lengths], logprobs=[[-1.0] * (n - 1) for n in lengths],
                  finish_reason=["length"] * len(lengths), policy_version=[0] * len(lengths), sampling=SamplingParams())
    return build_batch(ro, [0.0] * len(lengths), [True] * len(lengths), pad_id=0)


def test_micro_batches_keep_order_and_the_padded_token_budget():
    b = _batch_of_lengths([4, 6, 5, 10, 2, 3, 9])
    plan = b.micro_batches(torch.arange(7), token_budget=20)
    # 4,6,5 -> 3 x 6 = 18; adding 10 -> 4 x 10 > 20; 10 alone, +2 -> 2 x 10 = 20; +3 -> 30 > 20; 3, 9 -> 18
    assert [p.tolist() for p in plan] == [[0, 1, 2], [3, 4], [5, 6]]
    assert [p.tolist() for p in b.micro_batches(torch.tensor([6, 0]), token_budget=100)] == [[6, 0]]
    assert [p.tolist() for p in b.micro_batches(torch.arange(2), token_budget=1)] == [[0], [1]]  # a row alone


class _WorldNeedingFour:
    """A rank whose peers need 4 micro-batches: it must run 4 too (sharded forwards are collective)."""

    def all_reduce(self, x, op="sum"):
        return max(x, 4) if op == "max" else x


def test_every_rank_runs_as_many_micro_batches_as_the_busiest():
    b = _batch_of_lengths([4, 4, 4, 4, 4, 4])
    plan = b.micro_batches(torch.arange(6), token_budget=1000, world=_WorldNeedingFour())
    assert len(plan) == 4 and torch.cat(plan).tolist() == list(range(6))
