"""The typed batch that flows from the rollout engine to the trainer.

Shapes: N sequences, each prompt + completion, right-padded to length L. Every ``*_BT`` tensor
is *target-aligned*: column t scores token ``input_ids_BT[:, t + 1]``, so its width is L - 1, and
``mask_BT`` is 1 exactly on completion tokens (the tokens the policy chose).
"""

from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass
class RLBatch:
    input_ids_BT: torch.Tensor        # (N, L) long, right-padded with pad_id
    attention_mask_BT: torch.Tensor   # (N, L) long
    mask_BT: torch.Tensor             # (N, L-1) bool: completion targets
    sampler_logp_BT: torch.Tensor     # (N, L-1) fp32: the engine's log-probs (0 off the mask)
    prompt_idx_B: torch.Tensor        # (N,) long: which prompt of the step (group id)
    rewards_B: torch.Tensor           # (N,) fp32: scalar reward (0 where not valid)
    valid_B: torch.Tensor             # (N,) bool: outcome is a reward (PASS / MODEL_FAIL)
    policy_version_B: torch.Tensor    # (N,) long: weights version that sampled each row
    adv_B: torch.Tensor | None = None             # (N,) advantages
    old_logp_BT: torch.Tensor | None = None       # (N, L-1) trainer log-probs before the update
    ref_logp_BT: torch.Tensor | None = None       # (N, L-1) reference log-probs
    is_weights_BT: torch.Tensor | None = None     # (N, L-1) sampler->trainer importance weights

    def __len__(self) -> int:
        return self.input_ids_BT.shape[0]

    @property
    def train_mask_BT(self) -> torch.Tensor:
        """Completion tokens of sequences whose outcome is a reward (INFRA/TASK fails masked)."""
        return self.mask_BT & self.valid_B[:, None]

    def select(self, idx: torch.Tensor | list[int]) -> "RLBatch":
        """Rows ``idx``, trimmed to their longest sequence so micro-batches do not pay for padding."""
        idx = torch.as_tensor(idx, dtype=torch.long)
        length = int(self.attention_mask_BT[idx].sum(1).max())
        out = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if v is None:
                out[f.name] = None
            elif v.dim() == 1:
                out[f.name] = v[idx]
            else:
                width = length if v.shape[1] == self.input_ids_BT.shape[1] else length - 1
                out[f.name] = v[idx, :width]
        return RLBatch(**out)

    def position_ids_BT(self) -> torch.Tensor:
        return (self.attention_mask_BT.cumsum(1) - 1).clamp_min(0)


def build_batch(rollouts, rewards: list[float], valid: list[bool], pad_id: int) -> RLBatch:
    """Right-pad prompt+completion rows and align the sampler log-probs with the targets."""
    rows = [list(p) + list(c) for p, c in zip(rollouts.prompt_ids, rollouts.completion_ids)]
    n, length = len(rows), max(len(r) for r in rows)
    ids = torch.full((n, length), pad_id, dtype=torch.long)
    attn = torch.zeros((n, length), dtype=torch.long)
    mask = torch.zeros((n, length - 1), dtype=torch.bool)
    sampler = torch.zeros((n, length - 1), dtype=torch.float32)
    for i, (p, c, lp) in enumerate(zip(rollouts.prompt_ids, rollouts.completion_ids, rollouts.logprobs)):
        ids[i, : len(p) + len(c)] = torch.tensor(list(p) + list(c), dtype=torch.long)
        attn[i, : len(p) + len(c)] = 1
        # Completion token j sits at input position len(p)+j and is scored by column len(p)+j-1.
        mask[i, len(p) - 1: len(p) - 1 + len(c)] = True
        sampler[i, len(p) - 1: len(p) - 1 + len(c)] = torch.tensor(list(lp), dtype=torch.float32)
    return RLBatch(
        input_ids_BT=ids, attention_mask_BT=attn, mask_BT=mask, sampler_logp_BT=sampler,
        prompt_idx_B=torch.tensor(list(rollouts.prompt_idx), dtype=torch.long),
        rewards_B=torch.tensor(rewards, dtype=torch.float32),
        valid_B=torch.tensor(valid, dtype=torch.bool),
        policy_version_B=torch.tensor(list(rollouts.policy_version), dtype=torch.long),
    )
