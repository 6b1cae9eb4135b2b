"""PPO with a learned critic (RLHF; Ouyang et al. 2022, Stiennon et al. 2020), ``algorithm: ppo``.

Four roles:

- the **policy** (trainable; `posttrain.rl.policy.Policy`, as for the GRPO family);
- the **critic** (trainable): a value per token from a token-classification head
  (`posttrain.models.heads.load_value_model`), either on its own model (``critic.path``: any causal
  LM, or a reward-model checkpoint whose head it reuses) or on a copy of the starting policy
  (``critic.path`` empty). It has its own optimizer (``critic.optim``);
- the **reward model** (frozen, optional): a `posttrain rm` checkpoint scoring each finished
  rollout. It is combined with the verifier by weight:
  ``reward = reward_model.weight · score + reward_model.verifier_weight · verifier``;
- the **reference** (frozen): the `kl` section's reference, loaded by the loop.

Frozen models run under ``no_grad`` with ``requires_grad`` off and own no optimizer state.

One step: sample → verifier (gold) and reward model (proxy) → trainer and reference log-probs →
critic values → token rewards ``r_t = -β·KL_t`` with the sequence reward added at the last token
(``kl.mode=reward``, the classic form; ``kl.mode=loss`` puts the KL in the policy loss instead) →
GAE (`posttrain.algos.gae`) → advantages whitened over the batch's tokens → ``ppo_epochs`` ×
``mini_batches`` updates of both policy (clipped surrogate) and critic (clipped value loss).

Over-optimisation: when a reward model is used, ``reward/proxy`` (its mean score) and
``reward/gold`` (the verifier's mean reward) are logged every step next to ``kl/from_start``, the
mean summed log-ratio of a rollout under the current policy vs the reference — KL from the start
when the reference is the starting policy (``kl.ref_path`` empty), the x axis of Gao et al.
2022's reward-model over-optimisation curves; the report plots gold and proxy against it.
"""

from __future__ import annotations

import dataclasses

import torch

from posttrain.algos import AGGREGATIONS, explained_variance, gae, value_loss
from posttrain.algos._masked import masked_mean
from posttrain.errors import UserError
from posttrain.models.heads import load_reward_model, load_value_model, sequence_scores, token_values
from posttrain.core.dist import World, current_world, gather_rows, mini_batch_rows
from posttrain.core.fsdp import reshard, shard_model
from posttrain.core.trainer import TrainCore, accumulate, mean_over_updates, share_of_step
from posttrain.models.hf import disable_dropout
from posttrain.rl.batch import RLBatch
from posttrain.rl.config import RLConfig
from posttrain.rl.losses import reference_kl
from posttrain.rl.policy import placeholder_rows
from posttrain.rl.state import RLRun
from posttrain.core.optim import build_optimizer, build_scheduler


@dataclasses.dataclass
class PPOTargets:
    """Per-token training targets of one step, all (N, L-1) and 0 off ``train_mask_BT``."""

    adv_BT: torch.Tensor
    returns_BT: torch.Tensor
    old_values_BT: torch.Tensor


class Critic:
    """The value model, its optimizer and schedule; ``values`` is target-aligned like RLBatch."""

    def __init__(self, model, optimizer, scheduler, grad_clip: float, world=None):
        self.core = TrainCore(model, optimizer, scheduler, grad_clip=grad_clip, world=world)
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler

    def forward(self, mb: RLBatch) -> torch.Tensor:
        return token_values(self.model, mb.input_ids_BT, mb.attention_mask_BT, mb.position_ids_BT()).cpu()

    @torch.no_grad()
    def values(self, batch: RLBatch, micro_batch_tokens: int) -> torch.Tensor:
        self.model.eval()
        out = torch.zeros(batch.mask_BT.shape)
        for idx in batch.micro_batches(torch.arange(len(batch)), micro_batch_tokens, self.core.world):
            v = self.forward(batch.select(idx if len(idx) else placeholder_rows(batch)))  # empty: runs in step
            if len(idx):
                out[idx, : v.shape[1]] = v
        reshard(self.model)
        return out * batch.train_mask_BT



@dataclasses.dataclass
class PPOState:
    """What PPO adds to an `RLRun`. The loop's ``learn`` calls ``combine_rewards`` (reward stage),
    ``targets`` (critic values, then GAE) and ``update`` in place of the group advantages and the
    policy's own ``train_step``; everything else (scoring, off-policy correction, sync) is shared."""

    critic: Critic
    reward_model: torch.nn.Module | None

    def combine_rewards(self, run: RLRun, batch: RLBatch) -> dict:
        return combine_rewards(run, batch)

    def targets(self, run: RLRun, batch: RLBatch, timer) -> tuple[PPOTargets, dict]:
        with timer("values"):
            old_values_BT = self.critic.values(batch, run.cfg.micro_batch_tokens)
        with timer("adv"):
            return ppo_targets(run.cfg, batch, old_values_BT, run.world)

    def update(self, run: RLRun, batch: RLBatch, targets: PPOTargets, seed: int) -> dict:
        return ppo_update(run, batch, targets, seed)


def setup_ppo(run: RLRun) -> PPOState:
    """Load the critic and the (frozen) reward model; the policy and reference are the loop's."""
    cfg, pad = run.cfg, run.tokenizer.pad_token_id
    world = run.world
    critic_model_cfg = dataclasses.replace(cfg.model, path=cfg.critic.path or cfg.model.path, device=str(world.device))
    critic_model = load_value_model(critic_model_cfg, pad_token_id=pad)
    disable_dropout(critic_model)  # values before and during the update come from one function
    critic_model = shard_model(critic_model, world, activation_checkpointing=cfg.model.activation_checkpointing)
    optimizer = build_optimizer(critic_model.parameters(), cfg.critic.optim)
    updates = cfg.num_steps * cfg.ppo_epochs * cfg.mini_batches
    critic = Critic(critic_model, optimizer, build_scheduler(optimizer, cfg.critic.optim, updates),
                    cfg.critic.optim.grad_clip, world=world)
    reward_model = None
    if cfg.reward_model.path:  # frozen and small next to the policy: kept whole on every rank
        rm_cfg = dataclasses.replace(cfg.model, path=cfg.reward_model.path, device=str(world.device))
        reward_model = load_reward_model(rm_cfg, trainable=False, pad_token_id=pad, key="reward_model.path")
        if reward_model.config.vocab_size != run.policy.model.config.vocab_size:
            raise UserError(f"reward_model.path={cfg.reward_model.path}: vocabulary size "
                            f"{reward_model.config.vocab_size} differs from the policy's; it must share its tokenizer")
    return PPOState(critic=critic, reward_model=reward_model)


@torch.no_grad()
def reward_model_scores(model, batch: RLBatch, micro_batch_tokens: int) -> torch.Tensor:
    """(N,) scores of every rollout (prompt + completion) by the frozen reward model (whole on every
    rank: no collective, so the micro-batches need not match across ranks)."""
    out = []
    for idx in batch.micro_batches(torch.arange(len(batch)), micro_batch_tokens, World()):
        mb = batch.select(idx)
        out.append(sequence_scores(model, mb.input_ids_BT, mb.attention_mask_BT).cpu())
    return torch.cat(out)


def combine_rewards(run: RLRun, batch: RLBatch) -> dict:
    """Set ``batch.rewards_B`` to the weighted reward; log gold (verifier) and proxy (reward model)."""
    rm, cfg = run.ppo.reward_model, run.cfg.reward_model
    valid = batch.valid_B
    gold_B = batch.rewards_B.clone()
    metrics = {"reward/gold": float(gold_B[valid].mean()) if valid.any() else 0.0}
    if rm is not None:
        proxy_B = reward_model_scores(rm, batch, run.cfg.micro_batch_tokens)
        batch.rewards_B = torch.where(valid, cfg.weight * proxy_B + cfg.verifier_weight * gold_B, 0.0)
        metrics["reward/proxy"] = float(proxy_B[valid].mean()) if valid.any() else 0.0
        metrics["reward/train"] = float(batch.rewards_B[valid].mean()) if valid.any() else 0.0
    return run.world.mean_metrics(metrics, float(valid.sum()))


def token_rewards(cfg: RLConfig, batch: RLBatch, world=None) -> tuple[torch.Tensor, dict]:
    """(N, L-1) rewards: ``-β·KL_t`` per token (kl.mode=reward) plus the sequence reward at the last token."""
    world = world or current_world()
    mask = batch.train_mask_BT
    rewards_BT = torch.zeros(mask.shape)
    metrics = {}
    if batch.ref_logp_BT is not None:
        kl_BT, metrics = reference_kl(cfg, batch, world)
        log_ratio_B = ((batch.old_logp_BT - batch.ref_logp_BT) * mask).sum(1)
        n = world.all_reduce(float(batch.valid_B.sum()))
        metrics["kl/from_start"] = world.all_reduce(float(log_ratio_B[batch.valid_B].sum())) / n if n else 0.0
        if cfg.kl.mode == "reward":
            rewards_BT = rewards_BT - cfg.kl.coef * kl_BT
    last_B = (mask * torch.arange(mask.shape[1])).argmax(1)
    has_tokens = mask.any(1)
    rows = torch.nonzero(has_tokens).flatten()
    rewards_BT[rows, last_B[rows]] += batch.rewards_B[rows]
    return rewards_BT, metrics


def ppo_targets(cfg: RLConfig, batch: RLBatch, old_values_BT: torch.Tensor, world=None) -> tuple[PPOTargets, dict]:
    """GAE advantages and returns from token rewards and the critic's values before the update;
    advantages whitened over the tokens of the whole step (every rank's rows)."""
    world = world or current_world()
    mask = batch.train_mask_BT
    rewards_BT, metrics = token_rewards(cfg, batch, world)
    adv_BT, returns_BT = gae(rewards_BT, old_values_BT, mask, gamma=cfg.critic.gamma, lam=cfg.critic.lam)
    metrics |= world.mean_metrics({"adv/abs_mean": float(masked_mean(adv_BT.abs(), mask))}, float(mask.sum()))
    metrics["critic/explained_variance"] = float(explained_variance(*gather_rows(world, old_values_BT, returns_BT, mask)))
    n = world.all_reduce(float(mask.sum()))
    if cfg.critic.whiten_advantages and n > 1:
        mean = world.all_reduce(float((adv_BT * mask).sum())) / n
        std = (world.all_reduce(float((((adv_BT - mean) ** 2) * mask).sum())) / n) ** 0.5
        adv_BT = torch.where(mask, (adv_BT - mean) / (std + 1e-8), 0.0)
    return PPOTargets(adv_BT, returns_BT, old_values_BT), metrics


def ppo_update(run: RLRun, batch: RLBatch, targets: PPOTargets, seed: int) -> dict:
    """``ppo_epochs`` passes; each shuffles the rows into ``mini_batches`` steps of policy and critic."""
    cfg = run.cfg
    run.policy.model.train()
    run.ppo.critic.model.train()
    gen = torch.Generator().manual_seed(seed)
    sums: dict[str, float] = {}
    n_updates = 0
    for _ in range(cfg.ppo_epochs):
        for rows in mini_batch_rows(len(batch), cfg.mini_batches, gen, run.world):  # one process's at any world size
            accumulate(sums, ppo_minibatch(run, batch, targets, rows))  # means add up, extremes stay extremes
            n_updates += 1
    return mean_over_updates(sums, n_updates)


def ppo_minibatch(run: RLRun, batch: RLBatch, targets: PPOTargets, rows: torch.Tensor) -> dict:
    """One optimizer step of the policy, then one of the critic, on the training core; token
    denominators span the whole mini-batch of every rank."""
    cfg, policy, critic, world = run.cfg, run.policy, run.ppo.critic, run.world
    tokens = max(world.all_reduce(int(batch.train_mask_BT[rows].sum())), 1)
    seqs = max(world.all_reduce(float(batch.episode_share_B()[rows].sum())), 1)
    seq_tokens_B = batch.episode_tokens_B()
    agg = AGGREGATIONS[cfg.aggregation_mode]

    def select(idx):
        live = len(idx) > 0  # else a placeholder that keeps this rank in step with the others
        rows_ = idx if live else placeholder_rows(batch)
        mb = batch.select(rows_)
        width = mb.mask_BT.shape[1]
        mb.token_adv_BT = targets.adv_BT[rows_, :width]  # the loop's loss, with GAE's per-token advantages
        return mb, rows_, width, float(mb.train_mask_BT.sum()) / tokens, live

    def policy_loss(idx):
        mb, rows_, _, share, live = select(idx)
        loss_BT, pm = run.loss_fn(policy._forward_grad(mb)[0], mb)
        loss = agg(loss_BT, mb.train_mask_BT, global_num_tokens=tokens, global_num_seqs=seqs,
                   norm_constant=float(cfg.rollout.max_new_tokens), seq_num_tokens_B=seq_tokens_B[rows_])
        return loss if live else loss * 0.0, {k: share_of_step(k, float(v), share, live) for k, v in pm.items()}

    def critic_loss(idx):
        mb, rows_, width, share, live = select(idx)
        old_BT, returns_BT = targets.old_values_BT[rows_, :width], targets.returns_BT[rows_, :width]
        vloss_BT, vm = value_loss(critic.forward(mb), old_BT, returns_BT, mb.train_mask_BT,
                                  clip=cfg.critic.value_clip or None)
        vloss = AGGREGATIONS["token_mean"](vloss_BT, mb.train_mask_BT, global_num_tokens=tokens)
        return vloss if live else vloss * 0.0, {f"critic/{k}": share_of_step(k, float(v), share, live)
                                                for k, v in vm.items() if k != "explained_variance"}

    plan = policy.micro_batches(batch, rows)
    out = policy.core.step(plan, policy_loss)
    c = critic.core.step(plan, critic_loss)
    return out | {k: v for k, v in c.items() if k.startswith("critic/")} | {
        "critic/loss": c["loss"], "critic/grad_norm": c["grad_norm"]}
