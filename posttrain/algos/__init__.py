"""Pure tensor functions for post-training: losses, advantages, KL estimators, IS weights,
aggregation.

Every function takes tensors (shapes in the names: ``logp_BT`` is (B, T)) and returns tensors,
plus a ``dict[str, Tensor]`` of detached metrics for losses. No config objects, no ``.item()``,
no distributed calls: denominators are explicit arguments. Policy, value and KL losses are
per token; turn them into a scalar with one of ``AGGREGATIONS``. Trainers choose by name from
the tables ``AGGREGATIONS``, ``ADVANTAGES``, ``POLICY_LOSSES``, ``KL_ESTIMATORS``,
``IS_CORRECTIONS``.
"""

# Names are loaded on first use (PEP 562), so that the torch-free modules (``passk``) can be
# imported by commands that never train (`posttrain report`) without paying torch's import.
_WHERE = {
    "advantages": ["ADVANTAGES", "dr_grpo", "gae", "grpo", "grpo_advantages", "reinforce_pp", "rloo"],
    "aggregate": ["AGGREGATIONS", "seq_mean_token_mean", "seq_mean_token_sum_norm", "token_mean"],
    "correction": ["IS_CORRECTIONS", "geo_mask", "geo_mean_seq_ratio", "icepop", "k3_mask", "masked_is",
                   "mismatch_metrics", "no_is", "rejection_is", "rejection_metrics", "truncated_is"],
    "distill": ["distill_reward", "reverse_kl_full", "reverse_kl_sampled"],
    "kl": ["KL_ESTIMATORS", "kl_k1", "kl_k2", "kl_k3"],
    "logprobs": ["entropy_from_logits", "token_logprobs"],
    "policy": ["POLICY_LOSSES", "cispo_loss", "gspo_loss", "pg_loss", "ppo_clip_loss"],
    "preference": ["bradley_terry_loss", "dpo_loss"],
    "sft": ["sft_token_nll"],
    "value": ["explained_variance", "value_loss"],
}
_MODULE_OF = {name: module for module, names in _WHERE.items() for name in names}
__all__ = sorted(_MODULE_OF)  # noqa: PLE0605 - the table above is the one list of names


def __getattr__(name: str):
    if name not in _MODULE_OF:
        raise AttributeError(f"module 'posttrain.algos' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"posttrain.algos.{_MODULE_OF[name]}"), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
