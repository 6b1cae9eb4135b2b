"""The trainer side of RL: a policy model, its optimizer, and the frozen reference.

Thin on purpose (docs/rl.md): ``score`` recomputes log-probs without gradients (old policy,
reference, entropy), ``train_step(batch, loss_fn)`` runs epochs × mini-batches of optimizer steps
on the training core (`posttrain.core.trainer`), micro-batches with denominators summed over every
rank, ``export_weights`` hands merged weights to the rollout engine. The loss itself comes from
``posttrain.algos`` via ``loss_fn``.

Under torchrun every rank holds its own rows of the step (whole groups); the models are sharded
with FSDP2, so every rank runs the same number of forwards (equal row counts per rank).

Log-probs are of the full temperature-scaled distribution, ``log_softmax(logits / T)``, the same
quantity the engine reports, so sampler and trainer compare like with like.

One update per step (``reuse_score_forward``): the "old" log-probs are those of the current weights,
so the forward that ``score`` runs is the very forward the update needs. When the whole batch is one
micro-batch and the model has no active dropout, ``score`` records it with autograd on and
``train_step`` differentiates it instead of running the model again. Nothing else changes (same
weights, same inputs; eval vs train mode only differ through dropout), and the memory held is the
one micro-batch the update would hold anyway.
"""

from __future__ import annotations

from typing import Callable

import torch

from posttrain.algos import AGGREGATIONS, entropy_from_logits, token_logprobs
from posttrain.core.dist import World
from posttrain.core.fsdp import export_state_dict, reshard
from posttrain.core.trainer import TrainCore
from posttrain.rl.batch import RLBatch
from posttrain.rl.shared_prefix import TargetLogits, completion_logits

LossFn = Callable[[torch.Tensor, RLBatch], tuple[torch.Tensor, dict]]


class Policy:
    def __init__(self, model, optimizer, scheduler, *, temperature: float, grad_clip: float,
                 micro_batch_tokens: int, ref_model=None, reuse_score_forward: bool = False,
                 world: World | None = None):
        self.core = TrainCore(model, optimizer, scheduler, grad_clip=grad_clip, world=world)
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.world = self.core.world
        self.ref_model = ref_model
        self.temperature, self.grad_clip = temperature, grad_clip
        self.micro_batch_tokens = micro_batch_tokens
        self.device = next(model.parameters()).device
        self.reuse_score_forward = reuse_score_forward and not has_active_dropout(model)
        self._kept = None  # (batch, core.updates, logp_BT with graph) recorded by score

    def _target_logits(self, model, mb: RLBatch) -> TargetLogits:
        """Logits scoring ``input_ids[:, 1:]`` (the completion targets only, each shared prompt run
        once, when it can)."""
        logits = completion_logits(model, mb, self.device)
        if logits is not None:
            return logits
        out = model(input_ids=mb.input_ids_BT.to(self.device), attention_mask=mb.attention_mask_BT.to(self.device),
                    position_ids=mb.position_ids_BT().to(self.device))
        return TargetLogits.full(out.logits[:, :-1], mb.input_ids_BT[:, 1:].to(self.device))

    def _forward(self, model, mb: RLBatch, with_entropy: bool = False):
        t = self._target_logits(model, mb)
        logp = t.place(token_logprobs(t.logits_BXV, t.targets_BX, temperature=self.temperature)).cpu()
        ent = None
        if with_entropy:
            ent = t.place(entropy_from_logits(t.logits_BXV.detach(), temperature=self.temperature)).cpu()
        return logp, ent

    def micro_batches(self, batch: RLBatch, rows: torch.Tensor) -> list[torch.Tensor]:
        return batch.micro_batches(rows, self.micro_batch_tokens, self.world)

    def score(self, batch: RLBatch, with_ref: bool = True) -> tuple[torch.Tensor, torch.Tensor | None, dict]:
        """``(old_logp_BT, ref_logp_BT, metrics)``: the current policy's and the reference's log-probs
        of the batch's tokens (0 off ``mask_BT``; the reference's is None without one, or when
        ``with_ref`` is off) and the entropy."""
        self.model.eval()
        plan = self.micro_batches(batch, torch.arange(len(batch)))
        keep = self.reuse_score_forward and len(plan) == 1  # one micro-batch: no extra memory
        self._kept = None
        with torch.set_grad_enabled(keep):
            old, ref, metrics, logp = self._score(batch, plan, with_ref and self.ref_model is not None)
        if keep:
            self._kept = (batch, self.core.updates, logp)
        else:
            reshard(self.model)  # a forward without backward leaves a sharded root gathered
        reshard(self.ref_model)
        return old, ref, metrics

    def _score(self, batch: RLBatch, plan: list[torch.Tensor], with_ref: bool):
        old = torch.zeros(batch.mask_BT.shape)
        ref = torch.zeros(batch.mask_BT.shape) if with_ref else None
        ent_sum, ent_count = 0.0, 0
        for idx in plan:
            mb = batch.select(idx)
            logp, ent = self._forward(self.model, mb, with_entropy=True)
            old[idx, : logp.shape[1]] = logp.detach()
            m = mb.mask_BT
            ent_sum += float((ent * m).sum())
            ent_count += int(m.sum())
            if ref is not None:
                with torch.no_grad():
                    ref[idx, : logp.shape[1]] = self._forward(self.ref_model, mb)[0]
        ent_sum, ent_count = self.world.all_reduce(ent_sum), self.world.all_reduce(ent_count)
        ref = ref * batch.mask_BT if ref is not None else None
        return old * batch.mask_BT, ref, {"entropy": ent_sum / max(ent_count, 1)}, logp

    def train_step(self, batch: RLBatch, loss_fn: LossFn, *, aggregation: str, epochs: int = 1,
                   mini_batches: int = 1, norm_constant: float = 1.0, seed: int = 0) -> dict:
        """``epochs`` passes; each pass shuffles the rows into ``mini_batches`` optimizer steps."""
        self.model.train()
        agg = AGGREGATIONS[aggregation]
        sums: dict[str, float] = {}
        gen = torch.Generator().manual_seed(seed)
        n_updates = 0
        for _ in range(epochs):
            order = torch.randperm(len(batch), generator=gen)
            for mini in order.tensor_split(mini_batches):  # split episodes can make the rows uneven
                metrics = self._update(batch, mini, loss_fn, agg, norm_constant)
                for k, v in metrics.items():
                    sums[k] = sums.get(k, 0.0) + v
                n_updates += 1
        return {k: v / n_updates for k, v in sums.items()}

    def _update(self, batch: RLBatch, rows: torch.Tensor, loss_fn: LossFn, agg, norm_constant: float) -> dict:
        """One optimizer step; denominators are over the whole mini-batch of every rank."""
        global_tokens = max(self.world.all_reduce(int(batch.train_mask_BT[rows].sum())), 1)
        global_seqs = max(self.world.all_reduce(float(batch.episode_share_B()[rows].sum())), 1)
        seq_tokens_B = batch.episode_tokens_B()  # over the whole batch: an episode's rows may be apart

        def micro_loss(idx: torch.Tensor):
            mb = batch.select(idx)
            logp = self._kept_forward(batch, idx)
            if logp is None:
                logp, _ = self._forward_grad(mb)
            loss_BT, metrics = loss_fn(logp, mb)
            loss = agg(loss_BT, mb.train_mask_BT, global_num_tokens=global_tokens, global_num_seqs=global_seqs,
                       norm_constant=norm_constant, seq_num_tokens_B=seq_tokens_B[idx])
            weight = float(mb.train_mask_BT.sum()) / global_tokens
            return loss, {k: float(v) * weight for k, v in metrics.items()}

        return self.core.step(self.micro_batches(batch, rows), micro_loss)

    def _kept_forward(self, batch: RLBatch, idx: torch.Tensor) -> torch.Tensor | None:
        """The log-probs ``score`` recorded for ``batch``, in ``idx`` order, if they still hold."""
        if self._kept is None:
            return None
        kept_batch, updates, logp = self._kept
        self._kept = None  # a graph is differentiated once
        if kept_batch is not batch or updates != self.core.updates or len(idx) != len(batch):
            return None
        return logp[idx.to(logp.device)]

    def _forward_grad(self, mb: RLBatch):
        return self._forward(self.model, mb)

    def export_weights(self) -> dict[str, torch.Tensor]:
        """Merged full-model weights (LoRA folded in) for the rollout engine: on rank 0 (others get {});
        every rank must call it when the model is sharded."""
        return export_state_dict(self.model, self.world)


def has_active_dropout(model) -> bool:
    """Whether train mode would randomise the forward (then eval-mode log-probs cannot stand in)."""
    if any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules()):
        return True
    return float(getattr(getattr(model, "config", None), "attention_dropout", 0.0) or 0.0) > 0
