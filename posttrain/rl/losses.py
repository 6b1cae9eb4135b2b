"""The RL loss, assembled from pure functions in ``posttrain.algos`` by name.

``make_loss_fn(cfg)`` returns ``loss_fn(logp_BT, mb) -> (loss_BT, metrics)``: the policy surrogate
(``policy_loss``: clipped PPO, plain PG, GSPO or CISPO, by name from ``algos.POLICY_LOSSES``)
weighted by the sampler->trainer importance weights, plus the KL-to-reference term when it is a
loss. The same function serves the GRPO family (one advantage per sample, ``adv_B``) and PPO
(per-token GAE advantages, ``token_adv_BT``). Aggregation is applied by the trainer with global
denominators.
"""

from __future__ import annotations

import torch

from posttrain.algos import IS_CORRECTIONS, KL_ESTIMATORS, POLICY_LOSSES, mismatch_metrics
from posttrain.core.dist import World, current_world
from posttrain.rl.batch import RLBatch
from posttrain.rl.config import CorrectionConfig, RLConfig


def policy_loss_options(cfg: RLConfig) -> dict:
    """The clip knobs of ``cfg.policy_loss``, as keyword arguments of its `POLICY_LOSSES` entry."""
    return {"ppo_clip": dict(clip_low=cfg.clip_low, clip_high=cfg.clip_high, dual_clip=cfg.dual_clip or None),
            "pg": {},
            "gspo": dict(clip_low=cfg.gspo_clip_low, clip_high=cfg.gspo_clip_high),
            "cispo": dict(clip_low=cfg.cispo_clip_low, clip_high=cfg.cispo_clip_high)}[cfg.policy_loss]


def make_loss_fn(cfg: RLConfig):
    kl_fn = KL_ESTIMATORS[cfg.kl.estimator]
    kl_in_loss = cfg.kl.coef > 0 and cfg.kl.mode == "loss"
    surrogate, options = POLICY_LOSSES[cfg.policy_loss], policy_loss_options(cfg)

    def policy_term(logp_BT, mb: RLBatch):
        adv_BT = mb.adv_B[:, None].expand_as(logp_BT) if mb.token_adv_BT is None else mb.token_adv_BT
        return surrogate(logp_BT, mb.old_logp_BT, adv_BT, mb.train_mask_BT, is_weights_BT=mb.is_weights_BT, **options)

    def loss_fn(logp_BT, mb: RLBatch):
        loss_BT, metrics = policy_term(logp_BT, mb)
        if kl_in_loss:
            kl_BT = kl_fn(logp_BT, mb.ref_logp_BT)
            loss_BT = loss_BT + cfg.kl.coef * kl_BT
        return loss_BT, {f"policy/{k}": v for k, v in metrics.items()}

    return loss_fn


def reference_kl(cfg: RLConfig, batch: RLBatch, world: World | None = None) -> tuple[torch.Tensor, dict]:
    """Per-token KL to the reference, ``kl.estimator`` of the sampled tokens, 0 off the train mask;
    the metrics are over the whole step (every rank's rows)."""
    world = world or current_world()
    mask, valid = batch.train_mask_BT, batch.valid_B
    kl_BT = KL_ESTIMATORS[cfg.kl.estimator](batch.old_logp_BT, batch.ref_logp_BT) * mask
    kl_sum, tokens = world.all_reduce(float(kl_BT.sum())), world.all_reduce(float(mask.sum()))
    seq_sum, seqs = world.all_reduce(float(kl_BT.sum(1)[valid].sum())), world.all_reduce(float(valid.sum()))
    return kl_BT, {"kl/ref": kl_sum / max(tokens, 1.0), "kl/ref_seq_mean": seq_sum / seqs if seqs else 0.0}


def importance_weights(batch: RLBatch, cfg: CorrectionConfig) -> tuple[torch.Tensor | None, dict]:
    """``(is_weights_BT, metrics)``: trainer (old) vs behaviour importance weights (None when the
    correction is off) and the ratio and mismatch metrics.

    The behaviour log-probs are those of the distribution the tokens were drawn from: the top-k /
    top-p truncated one when sampling truncates (``batch.behaviour_logp_BT``), since that is the
    proposal the importance ratio corrects for. The mismatch metrics always compare the two full
    distributions, sampler and trainer, and are computed even when the correction is off: they are
    how a user sees that the two sides' numerics or weights disagree. Both are over the rows the
    trainer scored (``RLBatch.scored_mask_BT``): every row that trains, and a sample of the others.
    """
    mask = batch.scored_mask_BT
    w, metrics = IS_CORRECTIONS[cfg.kind](batch.old_logp_BT, batch.behaviour_logp_BT, mask, **cfg.options())
    metrics |= mismatch_metrics(batch.old_logp_BT, batch.sampler_logp_BT, mask)
    return None if cfg.kind == "none" else w, {k: float(v) for k, v in metrics.items()}


def off_policy_correction(batch: RLBatch, cfg: RLConfig) -> tuple[torch.Tensor, torch.Tensor | None, dict]:
    """``(old_logp_BT, is_weights_BT, metrics)`` for the loss: the PPO ratio's anchor and the
    behaviour -> trainer importance weights. In async mode without decoupled PPO the ratio is anchored
    on the behaviour policy itself (no separate weight): its value is the importance weight, and its
    clip bounds how far a stale sample pushes. The same rule for every algorithm; ``pg`` has no ratio,
    so it keeps the weight. The rule is `RLConfig.importance_weighted`, which the config's checks of
    ``correction.*`` read too."""
    weights, metrics = importance_weights(batch, cfg.correction)
    if not cfg.importance_weighted:
        return batch.behaviour_logp_BT, None, metrics
    return batch.old_logp_BT, weights, metrics
