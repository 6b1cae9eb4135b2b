"""The RL loss, assembled from pure functions in ``posttrain.algos`` by name.

``make_loss_fn(cfg)`` returns ``loss_fn(logp_BT, mb) -> (loss_BT, metrics)``: the policy surrogate
(clipped PPO or plain PG) weighted by the sampler->trainer importance weights, plus the KL-to-
reference term when it is a loss. Aggregation is applied by the trainer with global denominators.
"""

from __future__ import annotations

from posttrain.algos import KL_ESTIMATORS, IS_CORRECTIONS, ppo_clip_loss, pg_loss
from posttrain.rl.batch import RLBatch
from posttrain.rl.config import CorrectionConfig, RLConfig


def make_loss_fn(cfg: RLConfig):
    kl_fn = KL_ESTIMATORS[cfg.kl.estimator]
    kl_in_loss = cfg.kl.coef > 0 and cfg.kl.mode == "loss"

    def policy_term(logp_BT, mb: RLBatch):
        adv_BT = mb.adv_B[:, None].expand_as(logp_BT)
        if cfg.policy_loss == "pg":
            return pg_loss(logp_BT, adv_BT, mb.train_mask_BT, is_weights_BT=mb.is_weights_BT)
        return ppo_clip_loss(logp_BT, mb.old_logp_BT, adv_BT, mb.train_mask_BT,
                             clip_low=cfg.clip_low, clip_high=cfg.clip_high,
                             dual_clip=cfg.dual_clip or None, is_weights_BT=mb.is_weights_BT)

    def loss_fn(logp_BT, mb: RLBatch):
        loss_BT, metrics = policy_term(logp_BT, mb)
        if kl_in_loss:
            kl_BT = kl_fn(logp_BT, mb.ref_logp_BT)
            loss_BT = loss_BT + cfg.kl.coef * kl_BT
        return loss_BT, {f"policy/{k}": v for k, v in metrics.items()}

    return loss_fn


def importance_weights(batch: RLBatch, cfg: CorrectionConfig) -> dict:
    """Set ``batch.is_weights_BT`` from trainer (old) vs sampler log-probs; return the mismatch metrics.

    The mismatch metrics are computed even when the correction is off: they are how a user sees
    that sampler and trainer disagree.
    """
    mask = batch.train_mask_BT
    if cfg.kind == "masked":
        w, metrics = IS_CORRECTIONS["masked"](batch.old_logp_BT, batch.sampler_logp_BT, mask,
                                              low=cfg.low, high=cfg.high, level=cfg.level)
    else:
        w, metrics = IS_CORRECTIONS["truncated"](batch.old_logp_BT, batch.sampler_logp_BT, mask,
                                                 cap=cfg.cap, level=cfg.level)
    batch.is_weights_BT = None if cfg.kind == "none" else w
    return {k: float(v) for k, v in metrics.items()}
