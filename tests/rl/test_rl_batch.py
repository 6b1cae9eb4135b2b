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
