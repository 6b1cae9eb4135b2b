"""Reward model: a causal LM backbone with a scalar head, fit to preference pairs (Bradley–Terry).

The model is transformers' ``AutoModelForSequenceClassification`` with one output (see
`posttrain.models.heads`): a checkpoint reloads with ``from_pretrained`` and scores a sequence at
its last token. The loss is ``-log σ(s_chosen - s_rejected)`` per pair
(`posttrain.algos.bradley_terry_loss`); chosen and rejected replies go through the model in one
forward (2B rows). Held-out pairwise accuracy (chosen scored above rejected) is the number to
watch: chance is 0.5.

Options: LoRA or full fine-tuning (``model.lora.enabled``; the head is always trained in full),
and ``center_coef``, a small penalty on the squared scores that keeps them near 0 without changing
their order (the auxiliary centering loss of Eisenstein et al. 2023, "Helping or Herding?"), so an
RM's scale stays comparable across runs when it becomes a PPO reward.
"""

from __future__ import annotations

import dataclasses

import torch

from posttrain.algos import bradley_terry_loss
from posttrain.config import ConfigValueError
from posttrain.core.fsdp import shard_model
from posttrain.core.optim import seed_everything
from posttrain.data.preference import PairBatch, load_tokenized_pairs
from posttrain.models.heads import load_reward_model, sequence_scores
from posttrain.models.hf import ModelConfig, check_model_path, load_tokenizer, quiet_transformers
from posttrain.core.fsdp import reshard
from posttrain.train.pairwise import (PairwiseConfig, PairwiseRun, eval_in_batches, pairwise_world,
                                      run_pairwise)


@dataclasses.dataclass(kw_only=True)
class RMConfig(PairwiseConfig):
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    """Backbone: a causal LM folder (a new scalar head is added) or a reward-model checkpoint."""
    center_coef: float = 0.0
    """Weight of the mean squared score penalty (reward centering); 0 = off."""
    out_dir: str = "runs/rm"
    """Run directory: config.yaml, metrics.jsonl, checkpoints/step-N/."""

    def __post_init__(self):
        super().__post_init__()
        if self.center_coef < 0:
            raise ConfigValueError("center_coef", "must be >= 0")


def pair_scores(model, batch: PairBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """(B,) chosen and (B,) rejected scores from one forward over the 2B rows."""
    scores = sequence_scores(model, batch.input_ids_BT, batch.attention_mask_BT).cpu()
    return scores[: batch.num_pairs], scores[batch.num_pairs:]


def make_loss_fn(model, center_coef: float):
    def loss_fn(batch: PairBatch):
        chosen_B, rejected_B = pair_scores(model, batch)
        loss_B, metrics = bradley_terry_loss(chosen_B, rejected_B)
        if center_coef:
            loss_B = loss_B + center_coef * 0.5 * (chosen_B**2 + rejected_B**2)
        return loss_B, metrics

    return loss_fn


def evaluate_pairs(model, pairs, *, batch_pairs: int, pad_id: int, world=None) -> dict:
    """Held-out pairwise accuracy, mean loss and mean score gap (every rank calls it when sharded)."""
    if not pairs:
        return {}
    model.eval()
    parts = eval_in_batches(pairs, batch_pairs, pad_id, lambda b: pair_scores(model, b), world)
    reshard(model)
    chosen_B = torch.cat([c for c, _ in parts])
    rejected_B = torch.cat([r for _, r in parts])
    loss_B, m = bradley_terry_loss(chosen_B, rejected_B)
    return {"eval/accuracy": float(m["accuracy"]), "eval/loss": float(loss_B.mean()),
            "eval/margin": float(m["margin"])}


def run_rm(cfg: RMConfig, printer=print) -> dict:
    """Train (or resume) a reward model; everything is checked before the run directory is made.

    Under torchrun every rank runs this; the model is sharded with FSDP2 (see `posttrain.train.pairwise`).
    """
    quiet_transformers()
    world = pairwise_world(cfg)
    seed_everything(cfg.seed)
    check_model_path(cfg.model.path)
    tokenizer = load_tokenizer(cfg.model.path, chat_template="data.use_chat_template=true (set it to false for "
                               "plain-text prompts)" if cfg.data.use_chat_template else None)
    train = load_tokenized_pairs(cfg.data, tokenizer, cfg.data.path)
    held_out = load_tokenized_pairs(cfg.data, tokenizer, cfg.data.eval_path)[: cfg.data.eval_max_pairs] \
        if cfg.data.eval_path else []
    # Same seed on every rank, so a new head starts identical everywhere before it is sharded.
    model = load_reward_model(dataclasses.replace(cfg.model, device=str(world.device)),
                              pad_token_id=tokenizer.pad_token_id)
    model = shard_model(model, world, activation_checkpointing=cfg.model.activation_checkpointing)
    eval_fn = lambda: evaluate_pairs(model, held_out, batch_pairs=cfg.micro_batch_pairs,  # noqa: E731
                                     pad_id=tokenizer.pad_token_id, world=world)
    run = PairwiseRun(cfg=cfg, model=model, tokenizer=tokenizer, train=train,
                      loss_fn=make_loss_fn(model, cfg.center_coef), eval_fn=eval_fn, name="rm", world=world)
    return run_pairwise(run, printer)
