"""The typed batch that flows from the rollout engine to the trainer.

Shapes: N sequences, each prompt + completion, right-padded to length L. Every ``*_BT`` tensor
is *target-aligned*: column t scores token ``input_ids_BT[:, t + 1]``, so its width is L - 1, and
``mask_BT`` is 1 exactly on completion tokens the policy chose. A multi-turn episode
(`posttrain.envs`) is one row whose completion interleaves model turns and environment replies:
``Rollouts.loss_mask`` marks the model's tokens, so the environment's are 0 in ``mask_BT`` (no
loss, no KL, no entropy, no importance weight) and their sampler log-probs are 0.

An episode split where the chat template rewrote its history is several rows (its samples), one
*episode* all the same: ``episode_B`` says which episode each row is part of. Advantages are
computed per episode (G episodes a group) and broadcast to its rows, and the loss counts each
episode once as a sequence (``episode_tokens_B``, ``episode_share_B``): the rows of a split
episode weigh what the unsplit episode would.
"""

from __future__ import annotations

import dataclasses

import torch

from posttrain.algos.advantages import zero_variance
from posttrain.core.dist import World, current_world
from posttrain.outcome import Outcome
from posttrain.rollout.types import Rollouts


@dataclasses.dataclass
class RLBatch:
    input_ids_BT: torch.Tensor        # (N, L) long, right-padded with pad_id
    attention_mask_BT: torch.Tensor   # (N, L) long
    mask_BT: torch.Tensor             # (N, L-1) bool: completion targets the policy sampled
    sampler_logp_BT: torch.Tensor     # (N, L-1) fp32: the engine's log-probs (0 off the mask)
    prompt_idx_B: torch.Tensor        # (N,) long: which prompt of the step (group id)
    rewards_B: torch.Tensor           # (N,) fp32: scalar reward (0 where not valid)
    valid_B: torch.Tensor             # (N,) bool: outcome is a reward (PASS / MODEL_FAIL)
    policy_version_B: torch.Tensor    # (N,) long: weights version that sampled each row
    adv_B: torch.Tensor | None = None             # (N,) advantages
    token_adv_BT: torch.Tensor | None = None      # (N, L-1) per-token advantages (PPO's GAE); wins over adv_B
    old_logp_BT: torch.Tensor | None = None       # (N, L-1) trainer log-probs before the update
    ref_logp_BT: torch.Tensor | None = None       # (N, L-1) reference log-probs
    is_weights_BT: torch.Tensor | None = None     # (N, L-1) sampler->trainer importance weights
    truncated_logp_BT: torch.Tensor | None = None  # (N, L-1) log-probs under the top-k/top-p
    #                                                distribution sampled; None without truncation
    episode_B: torch.Tensor | None = None         # (N,) long: the episode (0..E-1) each row is a sample
    #                                                of, episodes of group i at i*G..; None: row r is episode r
    group_size: int = 1                           # G: the episodes of prompt i are i*G .. i*G+G-1
    score_weight_B: torch.Tensor | None = None    # (N,) fp32: how many rows each row's scoring diagnostics
    #                                                stand for; 0: not scored (see `Policy.score`); None: all 1

    @property
    def behaviour_logp_BT(self) -> torch.Tensor:
        """Log-probs under the distribution the tokens were actually drawn from (IS denominators)."""
        return self.sampler_logp_BT if self.truncated_logp_BT is None else self.truncated_logp_BT

    def __len__(self) -> int:
        return self.input_ids_BT.shape[0]

    def episode_ids(self) -> torch.Tensor:
        """(N,) the episode of each row (``arange(N)`` when every row is its own)."""
        return torch.arange(len(self)) if self.episode_B is None else self.episode_B

    def episode_tokens_B(self) -> torch.Tensor:
        """(N,) training tokens of the whole episode each row is part of, over the batch's rows: the
        per-row denominator that makes a sequence mean an episode mean."""
        ep = self.episode_ids()
        tokens_B = self.train_mask_BT.sum(1)
        return torch.zeros(int(ep.max()) + 1, dtype=tokens_B.dtype).index_add(0, ep, tokens_B)[ep]

    def episode_share_B(self) -> torch.Tensor:
        """(N,) what each row adds to the count of sequences: 1 / (rows of its episode) when its
        outcome is a reward, else 0, so the rows of an episode count it once."""
        ep = self.episode_ids()
        return self.valid_B.float() / torch.bincount(ep)[ep]

    @property
    def train_mask_BT(self) -> torch.Tensor:
        """Completion tokens of sequences whose outcome is a reward (INFRA/TASK fails masked)."""
        return self.mask_BT & self.valid_B[:, None]

    @property
    def scored_mask_BT(self) -> torch.Tensor:
        """``train_mask_BT`` over the rows the trainer scored: what the sampler/trainer metrics average over."""
        if self.score_weight_B is None:
            return self.train_mask_BT
        return self.train_mask_BT & (self.score_weight_B > 0)[:, None]

    def select(self, idx: torch.Tensor | list[int]) -> "RLBatch":
        """Rows ``idx``, trimmed to their longest sequence so micro-batches do not pay for padding."""
        idx = torch.as_tensor(idx, dtype=torch.long)
        length = int(self.attention_mask_BT[idx].sum(1).max())
        out = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if v is None or not isinstance(v, torch.Tensor):
                out[f.name] = v
            elif v.dim() == 1:
                out[f.name] = v[idx]
            else:
                width = length if v.shape[1] == self.input_ids_BT.shape[1] else length - 1
                out[f.name] = v[idx, :width]
        return RLBatch(**out)

    def micro_batches(self, rows: torch.Tensor, token_budget: int, world: World | None = None) -> list[torch.Tensor]:
        """``rows`` split, in order, into micro-batches of at most ``token_budget`` padded tokens
        (rows × the longest row) — a memory knob that never changes the math (denominators are
        global). Under torchrun every rank gets the same number of micro-batches, the most any rank
        needs, because sharded forwards run in lock step."""
        lengths = self.attention_mask_BT.sum(1)[rows].tolist()
        plan, start, longest = [], 0, 0
        for i, length in enumerate(lengths):
            if i > start and (i - start + 1) * max(longest, length) > token_budget:
                plan.append(rows[start:i])
                start, longest = i, 0
            longest = max(longest, length)
        plan.append(rows[start:])
        count = (world or current_world()).all_reduce(len(plan), "max")
        return plan if count == len(plan) else list(torch.tensor_split(rows, count))

    def position_ids_BT(self) -> torch.Tensor:
        return (self.attention_mask_BT.cumsum(1) - 1).clamp_min(0)


def outcome_batch(rollouts, outcomes: list[Outcome], pad_id: int, group_size: int = 1) -> RLBatch:
    """`build_batch` with each sample's reward and validity taken from its outcome."""
    batch = build_batch(rollouts, [o.reward if o.is_reward else 0.0 for o in outcomes],
                        [o.is_reward for o in outcomes], pad_id)
    batch.group_size = group_size
    return batch


def group_outcomes(outcomes: list[Outcome], group_size: int):
    """(rewards_PG, valid_PG, zero_variance_P) of a step's samples, prompt i's group at rows i*G..

    The one place every caller (sync, async, dynamic sampling, PPO, distillation) turns outcomes
    into group rewards: a sample whose outcome is not a reward (TASK_FAIL, INFRA_FAIL) is invalid
    with reward 0, and a group is zero-variance when its valid task rewards are all equal.
    """
    rewards_PG = torch.tensor([o.reward if o.is_reward else 0.0 for o in outcomes]).view(-1, group_size)
    valid_PG = torch.tensor([o.is_reward for o in outcomes]).view(-1, group_size)
    return rewards_PG, valid_PG, zero_variance(rewards_PG, valid_PG)


def build_batch(rollouts, rewards: list[float], valid: list[bool], pad_id: int) -> RLBatch:
    """Right-pad prompt+completion rows and shift the sampler log-probs onto the targets.

    `Rollouts.to_padded` stores token t's sampler log-prob at input position t; the trainer's
    column t scores token t + 1, hence the ``[:, 1:]``. Truncated log-probs are kept only when the
    sampling was truncated (top-k or top-p): otherwise both distributions are the same.
    """
    padded = rollouts.to_padded(pad_id)
    s = rollouts.sampling
    truncated = padded.truncated_logp_BT is not None and (s.top_k > 0 or s.top_p < 1.0)
    return RLBatch(
        input_ids_BT=padded.input_ids_BT, attention_mask_BT=padded.attention_mask_BT,
        mask_BT=padded.completion_mask_BT[:, 1:].bool(), sampler_logp_BT=padded.sampler_logp_BT[:, 1:],
        prompt_idx_B=torch.tensor(list(rollouts.prompt_idx), dtype=torch.long),
        rewards_B=torch.tensor(rewards, dtype=torch.float32),
        valid_B=torch.tensor(valid, dtype=torch.bool),
        policy_version_B=torch.tensor(list(rollouts.policy_version), dtype=torch.long),
        truncated_logp_BT=padded.truncated_logp_BT[:, 1:] if truncated else None,
    )


def select_groups(ro: Rollouts, outcomes: list[Outcome], episode_of_row: list[int], groups: list[int],
                  group_size: int) -> tuple[Rollouts, list[Outcome], list[int]]:
    """The rows, outcomes and episode numbers of ``groups`` (renumbered 0, 1, ... in that order)."""
    G, rows, new_group, new_episode = group_size, [], [], []
    for i, p in enumerate(groups):
        mine = [r for r, e in enumerate(episode_of_row) if e // G == p]
        rows += mine
        new_group += [i] * len(mine)
        new_episode += [episode_of_row[r] - (p - i) * G for r in mine]
    return ro.select(rows, new_group), [outcomes[p * G + j] for p in groups for j in range(G)], new_episode


def concat_groups(parts: list[tuple[Rollouts, list[Outcome], list[int]]], group_size: int):
    """``(rollouts, outcomes, episode_of_row)`` of whole groups, one after the other (group i of the
    result is ``parts``' i-th group)."""
    ros, outcomes, episodes, groups = [], [], [], 0
    for ro, outs, eps in parts:
        ros.append(dataclasses.replace(ro, prompt_idx=[groups + e // group_size for e in eps]))
        episodes += [groups * group_size + e for e in eps]
        outcomes += outs
        groups += len(outs) // group_size
    return Rollouts.concat(ros), outcomes, episodes
