"""Pure tensor functions for post-training: losses, advantages, KL estimators, IS weights,
aggregation.

Every function takes tensors (shapes in the names: ``logp_BT`` is (B, T)) and returns tensors,
plus a ``dict[str, Tensor]`` of detached metrics for losses. No config objects, no ``.item()``,
no distributed calls: denominators are explicit arguments. Policy, value and KL losses are
per token; turn them into a scalar with one of ``AGGREGATIONS``. Trainers choose by name from
the tables ``AGGREGATIONS``, ``ADVANTAGES``, ``POLICY_LOSSES``, ``KL_ESTIMATORS``,
``IS_CORRECTIONS``.
"""

from posttrain.algos.advantages import ADVANTAGES, dr_grpo, gae, grpo, grpo_advantages, reinforce_pp, rloo
from posttrain.algos.aggregate import AGGREGATIONS, seq_mean_token_mean, seq_mean_token_sum_norm, token_mean
from posttrain.algos.correction import (
    IS_CORRECTIONS,
    geo_mean_seq_ratio,
    masked_is,
    mismatch_metrics,
    no_is,
    truncated_is,
)
from posttrain.algos.distill import distill_reward, reverse_kl_full, reverse_kl_sampled
from posttrain.algos.kl import KL_ESTIMATORS, kl_k1, kl_k2, kl_k3
from posttrain.algos.logprobs import entropy_from_logits, token_logprobs
from posttrain.algos.policy import POLICY_LOSSES, cispo_loss, gspo_loss, pg_loss, ppo_clip_loss
from posttrain.algos.preference import bradley_terry_loss, dpo_loss
from posttrain.algos.sft import sft_token_nll
from posttrain.algos.value import explained_variance, value_loss

__all__ = [
    "ADVANTAGES", "AGGREGATIONS", "IS_CORRECTIONS", "KL_ESTIMATORS", "POLICY_LOSSES",
    "bradley_terry_loss", "cispo_loss", "distill_reward", "dpo_loss", "dr_grpo", "entropy_from_logits",
    "explained_variance", "gae", "geo_mean_seq_ratio", "grpo", "gspo_loss", "grpo_advantages", "kl_k1",
    "kl_k2", "kl_k3", "masked_is", "mismatch_metrics", "no_is", "pg_loss", "ppo_clip_loss",
    "reinforce_pp", "reverse_kl_full", "reverse_kl_sampled", "rloo", "seq_mean_token_mean",
    "seq_mean_token_sum_norm", "sft_token_nll", "token_logprobs", "token_mean",
    "truncated_is", "value_loss",
]
