"""Direct preference optimisation against a frozen reference (Rafailov et al. 2023).

The loss is `posttrain.algos.dpo_loss` on reply log-probabilities: ``sigmoid`` (DPO), ``sigmoid``
with ``label_smoothing`` > 0 (conservative DPO) or ``ipo``. ``logp_mean`` picks the per-token mean
or the sum of each reply's log-probs; by default (``auto``) IPO averages, as in its paper and TRL,
because its target margin 1/(2β) is a fixed number and a summed log-ratio grows with the reply's
length; sigmoid DPO sums, as in its paper.

The reference never changes, so its log-probabilities of every training and held-out pair are
computed **once**, before the first step, in one pass without gradients, and kept as a (N, 2)
tensor; training then runs only the policy. When ``ref_path`` is empty the reference is the
starting policy itself (read before any update: a LoRA policy equals its base at init), so no
second model is ever held in memory; otherwise the reference is loaded, scored and freed.
A resumed run recomputes them from the reference (the policy's weights are restored afterwards).
Under torchrun the policy and the reference are sharded (FSDP2); the reference's batches are split
over the ranks and its log-probs gathered, so every rank holds the whole (N, 2) table.

Metrics per step: ``loss``, ``rewards/chosen``, ``rewards/rejected``, ``rewards/margin``,
``rewards/accuracy`` (implicit rewards β·(log π − log π_ref)), ``logps/chosen``,
``logps/rejected``; the same under ``eval/`` on held-out pairs. At step 0 the policy is the
reference, so every implicit reward is 0 and the loss is exactly log 2 (sigmoid, no smoothing).
"""

from __future__ import annotations

import dataclasses

import torch

from posttrain.algos import dpo_loss, token_logprobs
from posttrain.algos.head import head_of, head_token_logprobs, hidden_head, movable_head
from posttrain.config import ConfigValueError
from posttrain.core.fsdp import shard_model
from posttrain.core.optim import OptimConfig, seed_everything
from posttrain.data.preference import PairBatch, load_tokenized_pairs
from posttrain.models.hf import (ModelConfig, check_model_path, disable_dropout, load_model, load_tokenizer,
                                 quiet_transformers)
from posttrain.core.fsdp import reshard
from posttrain.train.pairwise import (PairwiseConfig, PairwiseRun, eval_in_batches, pairwise_world,
                                      run_pairwise)

DPO_LOSSES = ("sigmoid", "ipo")


@dataclasses.dataclass(kw_only=True)
class DPOConfig(PairwiseConfig):
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    """The policy to train (LoRA or full); usually an SFT checkpoint."""
    optim: OptimConfig = dataclasses.field(default_factory=lambda: OptimConfig(lr=5e-5, warmup_steps=5))
    """Optimizer and schedule."""
    beta: float = 0.1
    """Strength of the tie to the reference (higher = stay closer)."""
    loss: str = "sigmoid"
    """sigmoid (DPO; with label_smoothing > 0: conservative DPO) or ipo."""
    label_smoothing: float = 0.0
    """Assumed probability that a label is flipped, in [0, 0.5) (sigmoid only)."""
    logp_mean: bool | str = "auto"
    """Score each reply by the per-token mean of its log-probs (true) or their sum (false). auto =
    mean for ipo (its fixed target margin 1/(2β) would otherwise meet a log-ratio that grows with the
    reply's length; the IPO paper and TRL average), sum for sigmoid (as in the DPO paper)."""
    ref_path: str = ""
    """Reference model folder; empty = the starting policy (model.path)."""
    chunked_head: bool = True
    """The output head and the log-softmax over chunks of positions, recomputed in backward, so no
    (B, T, V) logits exist, for the policy and the reference (docs/rl.md, "Memory"); same numbers.
    false, or a head that cannot move out of the forward (a LoRA head): the model's own logits."""
    out_dir: str = "runs/dpo"
    """Run directory: config.yaml, metrics.jsonl, checkpoints/step-N/."""

    def __post_init__(self):
        super().__post_init__()
        if self.beta <= 0:
            raise ConfigValueError("beta", "must be > 0")
        if self.loss not in DPO_LOSSES:
            raise ConfigValueError("loss", f"must be one of {', '.join(DPO_LOSSES)}")
        if not 0.0 <= self.label_smoothing < 0.5:
            raise ConfigValueError("label_smoothing", "must be in [0, 0.5)")
        if self.loss == "ipo" and self.label_smoothing:
            raise ConfigValueError("label_smoothing", "applies to loss=sigmoid only")
        if self.logp_mean not in (True, False, "auto"):
            raise ConfigValueError("logp_mean", "must be true, false or auto")

    @property
    def mean_logps(self) -> bool:
        """``logp_mean`` with ``auto`` resolved for this loss."""
        return self.loss == "ipo" if self.logp_mean == "auto" else bool(self.logp_mean)


def sequence_logps(model, batch: PairBatch, *, mean: bool = False, chunked: bool = True) -> torch.Tensor:
    """(2B,) log-probability of each row's reply (sum over reply tokens, or their mean)."""
    logp_BT = next_token_logps(model, batch, chunked=chunked).cpu()
    mask = batch.mask_BT.float()
    total = (logp_BT * mask).sum(1)
    return total / mask.sum(1).clamp_min(1) if mean else total


def next_token_logps(model, batch: PairBatch, *, chunked: bool = True) -> torch.Tensor:
    """(2B, T-1) log-prob of every next token; with ``chunked`` (and a head that can move) the
    forward returns hidden states and the head runs a chunk of positions at a time
    (`posttrain.algos.head`), so no (2B, T, V) logits exist."""
    device = next(model.parameters()).device
    ids = batch.input_ids_BT.to(device)
    inputs = dict(input_ids=ids, attention_mask=batch.attention_mask_BT.to(device), use_cache=False)
    if not (chunked and movable_head(model)):
        return token_logprobs(model(**inputs).logits[:, :-1], ids[:, 1:])
    with hidden_head(model):
        hidden = model(**inputs).logits  # the final hidden states
    return head_token_logprobs(hidden[:, :-1], *head_of(model), ids[:, 1:])


def reference_logps(model, pairs, *, batch_pairs: int, pad_id: int, mean: bool, world=None,
                    chunked: bool = True) -> torch.Tensor:
    """(N, 2) reference log-probs [chosen, rejected] of every pair, in one pass without gradients
    (every rank calls it when sharded, and every rank gets the whole table)."""
    if not pairs:
        return torch.zeros(0, 2)
    model.eval()
    parts = eval_in_batches(pairs, batch_pairs, pad_id,
                            lambda b: sequence_logps(model, b, mean=mean, chunked=chunked).view(2, -1).T, world)
    reshard(model)
    return torch.cat(parts)


def pair_loss(cfg: DPOConfig, model, batch: PairBatch, ref_N2: torch.Tensor):
    """Per-pair DPO loss and metrics of one batch (``ref_N2`` is indexed by the batch's pair ids)."""
    logps = sequence_logps(model, batch, mean=cfg.mean_logps, chunked=cfg.chunked_head)
    chosen_B, rejected_B = logps[: batch.num_pairs], logps[batch.num_pairs:]
    ref_B2 = ref_N2[batch.pair_idx_B]
    loss_B, metrics = dpo_loss(chosen_B, rejected_B, ref_B2[:, 0], ref_B2[:, 1], beta=cfg.beta,
                               label_smoothing=cfg.label_smoothing, kind=cfg.loss)
    metrics |= {"logps/chosen": chosen_B.detach().mean(), "logps/rejected": rejected_B.detach().mean()}
    return loss_B, metrics


def evaluate_dpo(cfg: DPOConfig, model, pairs, ref_N2: torch.Tensor, pad_id: int, world=None) -> dict:
    """Held-out loss, implicit-reward accuracy and margin, and mean log-probs (pair-weighted; every
    rank calls it when sharded)."""
    if not pairs:
        return {}
    model.eval()
    parts = eval_in_batches(pairs, cfg.micro_batch_pairs, pad_id,
                            lambda b: (b.num_pairs, *pair_loss(cfg, model, b, ref_N2)), world)
    reshard(model)
    n = sum(k for k, _, _ in parts)
    out = {"eval/loss": sum(float(loss_B.sum()) for _, loss_B, _ in parts) / n}
    for key in parts[0][2]:
        out[f"eval/{key}"] = sum(float(m[key]) * k for k, _, m in parts) / n
    return out


def run_dpo(cfg: DPOConfig, printer=print) -> dict:
    """Train (or resume) DPO; everything is checked before the run directory is made.

    Under torchrun every rank runs this; the policy and the reference are sharded with FSDP2.
    """
    quiet_transformers()
    world = pairwise_world(cfg)
    seed_everything(cfg.seed)
    check_model_path(cfg.model.path)
    if cfg.ref_path:
        check_model_path(cfg.ref_path, "ref_path")
    tokenizer = load_tokenizer(cfg.model.path, chat_template="data.use_chat_template=true (set it to false for "
                               "plain-text prompts)" if cfg.data.use_chat_template else None)
    pad = tokenizer.pad_token_id
    train = load_tokenized_pairs(cfg.data, tokenizer, cfg.data.path)
    held_out = load_tokenized_pairs(cfg.data, tokenizer, cfg.data.eval_path)[: cfg.data.eval_max_pairs] \
        if cfg.data.eval_path else []
    model_cfg = dataclasses.replace(cfg.model, device=str(world.device))
    model = load_model(model_cfg)
    # The reference is scored in eval mode and the policy trained in train mode: any dropout (the
    # model's or LoRA's) would make them differ at step 0, where the loss must be exactly log 2.
    disable_dropout(model)
    model = shard_model(model, world, activation_checkpointing=cfg.model.activation_checkpointing)
    if cfg.ref_path:
        ref = load_model(dataclasses.replace(model_cfg, path=cfg.ref_path), trainable=False)
        disable_dropout(ref)
        ref = shard_model(ref, world)  # frozen: forwards only, the same ones on every rank
    else:
        ref = model
    score = dict(batch_pairs=cfg.micro_batch_pairs, pad_id=pad, mean=cfg.mean_logps, world=world,
                 chunked=cfg.chunked_head)
    ref_train, ref_eval = reference_logps(ref, train, **score), reference_logps(ref, held_out, **score)
    del ref  # the reference is not needed again
    run = PairwiseRun(cfg=cfg, model=model, tokenizer=tokenizer, train=train,
                      loss_fn=lambda b: pair_loss(cfg, model, b, ref_train),
                      eval_fn=lambda: evaluate_dpo(cfg, model, held_out, ref_eval, pad, world), name="dpo",
                      world=world)
    return run_pairwise(run, printer)
