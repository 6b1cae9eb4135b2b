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

The caller can go further, at any number of micro-batches (``score(defer=True)``, then
``train_step(correct=...)``): the rows that train are not scored at all, and each micro-batch's
forward in the update gives their old log-probs (its own log-probs, detached: the weights have not
moved yet), their entropy and, through ``correct``, their importance weights, all of which depend
on the row alone. ``batch.old_logp_BT`` is complete once the update returns, for the step's
whole-batch metrics. One forward a row instead of two, as TRL does with one iteration a generation.

Rows that cannot change the update are not differentiated (``train_rows``): in the GRPO family a
zero-variance group's advantage is exactly 0, so when the loss has no term that is non-zero at
advantage 0 its rows add exactly nothing to the loss or its gradient. ``score`` runs them without
autograd, for the entropy, mismatch and KL metrics only (all of them, or a sample that
``RLBatch.score_weight_B`` weighs; `posttrain.rl.loop.score_weights`), and ``train_step``
differentiates only the other rows, with every denominator still that of the whole mini-batch:
the loss and the gradient are exactly those of differentiating every row. Under torchrun a rank
with fewer (or no) such rows runs placeholder micro-batches whose loss is multiplied by 0, so
every rank still runs the same number of forwards and backwards.
"""

from __future__ import annotations

from typing import Callable

import torch

from posttrain.algos import AGGREGATIONS, entropy_from_logits, token_logprobs
from posttrain.algos.head import head_of, head_token_logprobs, hidden_head, movable_head
from posttrain.core.dist import World, mini_batch_rows
from posttrain.core.fsdp import export_buckets, export_state_dict, reshard
from posttrain.core.trainer import TrainCore, accumulate, mean_over_updates, share_of_step
from posttrain.rl.batch import RLBatch
from posttrain.rl.packed import install as install_packing, packed_logits, packed_tokens, packs
from posttrain.rl.shared_prefix import TargetLogits, completion_logits

LossFn = Callable[[torch.Tensor, RLBatch], tuple[torch.Tensor, dict]]
Correct = Callable[[RLBatch], tuple[torch.Tensor, torch.Tensor | None]]


class Policy:
    def __init__(self, model, optimizer, scheduler, *, temperature: float, grad_clip: float,
                 micro_batch_tokens: int, ref_model=None, reuse_score_forward: bool = False,
                 world: World | None = None, chunked_head: bool = True, pack_rows: bool = True):
        self.core = TrainCore(model, optimizer, scheduler, grad_clip=grad_clip, world=world)
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.world = self.core.world
        self.ref_model = ref_model
        self.temperature, self.grad_clip = temperature, grad_clip
        self.micro_batch_tokens, self.chunked_head, self.pack_rows = micro_batch_tokens, chunked_head, pack_rows
        for m in (model, ref_model) if pack_rows else ():
            if m is not None:
                install_packing(m)  # their own attention, which also packs rows when a call asks
        self.device = next(model.parameters()).device
        self.reuse_score_forward = reuse_score_forward and not has_active_dropout(model)
        self._kept = None  # (batch, core.updates, logp_BT with graph) recorded by score
        self._deferred = None  # (batch, [entropy sum, token count]) of rows score left to the update

    def _target_logits(self, model, mb: RLBatch) -> TargetLogits:
        """Logits scoring ``input_ids[:, 1:]`` (the completion targets only, each shared prompt run
        once, when it can)."""
        packed = packed_tokens(mb) if self.pack_rows and packs(model) else None
        logits = completion_logits(model, mb, self.device, agree=self.world.all_agree,
                                   budget=packed if packed else float("inf"))
        if logits is not None:
            return logits
        if packed:
            return packed_logits(model, mb, self.device)
        # no cache: a checkpointed layer run again in backward would append its keys to it twice
        out = model(input_ids=mb.input_ids_BT.to(self.device), attention_mask=mb.attention_mask_BT.to(self.device),
                    position_ids=mb.position_ids_BT().to(self.device), use_cache=False)
        return TargetLogits.full(out.logits[:, :-1], mb.input_ids_BT[:, 1:].to(self.device))

    def _forward(self, model, mb: RLBatch, with_entropy: bool = False):
        """Per-token log-probs (and entropies) of ``mb``'s targets. With ``chunked_head`` the model
        returns hidden states and the head runs chunk by chunk (`posttrain.algos.head`): no
        (B, T, V) logits, the same numbers."""
        if not (self.chunked_head and movable_head(model)):
            t = self._target_logits(model, mb)
            logp = token_logprobs(t.logits_BXV, t.targets_BX, temperature=self.temperature)
            ent = entropy_from_logits(t.logits_BXV.detach(), temperature=self.temperature) if with_entropy else None
        else:
            with hidden_head(model):
                t = self._target_logits(model, mb)  # .logits_BXV holds the final hidden states
            head = head_of(model)
            # the entropy comes from the log-probs' own pass through the head, not a second one
            out = head_token_logprobs(t.logits_BXV, *head, t.targets_BX, temperature=self.temperature,
                                      with_entropy=with_entropy)
            logp, ent = out if with_entropy else (out, None)
        return t.place(logp).cpu(), None if ent is None else t.place(ent).cpu()

    def micro_batches(self, batch: RLBatch, rows: torch.Tensor) -> list[torch.Tensor]:
        return batch.micro_batches(rows, self.micro_batch_tokens, self.world)

    def plan(self, batch: RLBatch, rows: torch.Tensor) -> list[torch.Tensor]:
        """``rows`` in micro-batches, the same number on every rank; none when no rank has a row. A
        micro-batch may be empty (a rank with fewer rows than its peers): a placeholder to run in step."""
        if self.world.all_reduce(len(rows)) == 0:
            return []
        return self.micro_batches(batch, rows)

    def score(self, batch: RLBatch, with_ref: bool = True, train_rows: torch.Tensor | None = None,
              defer: bool = False) -> tuple[torch.Tensor, torch.Tensor | None, dict]:
        """``(old_logp_BT, ref_logp_BT, metrics)``: the current policy's and the reference's log-probs
        of the batch's tokens (0 off ``mask_BT``; the reference's is None without one, or when
        ``with_ref`` is off) and the entropy. ``train_rows`` (N,) bool: the rows the update will
        differentiate (None: all); only those can be the kept forward, the others run without autograd.

        ``batch.score_weight_B`` (None: every row, weight 1) picks the rows to score: a row of weight
        0 is not run, and its old log-probs are the behaviour policy's (importance weight 1; it must
        not train); the entropy weighs each scored row's tokens by its weight.

        ``defer``: the rows that train are left to the update's forwards (their old log-probs are 0
        until ``train_step`` fills them in, and the entropy comes with its metrics); only without the
        reference forward and with one update a step."""
        self.model.eval()
        rows = torch.arange(len(batch))
        weight_B = batch.score_weight_B
        scored = rows if weight_B is None else rows[weight_B > 0]
        if weight_B is not None and len(scored) < len(batch) and with_ref and self.ref_model is not None:
            raise ValueError("the reference forward scores every row: score_weight_B must be None with it")
        trained = rows if train_rows is None else rows[train_rows]
        if weight_B is not None and bool((weight_B[trained] == 0).any()):
            raise ValueError("every row that trains must be scored (score_weight_B > 0)")
        frozen = scored[:0] if train_rows is None else scored[~train_rows[scored]]
        if defer and (not self.reuse_score_forward or with_ref and self.ref_model is not None):
            raise ValueError("defer needs one update a step, no dropout and no reference forward")
        trained_plan = [] if defer else self.plan(batch, trained)
        keep = self.reuse_score_forward and len(trained_plan) == 1  # one micro-batch: no extra memory
        self._kept = None
        steps = [(idx, False) for idx in self.plan(batch, frozen)] + [(idx, keep) for idx in trained_plan]
        old, ref, entropy, logp = self._score(batch, steps, with_ref and self.ref_model is not None)
        self._deferred = (batch, entropy) if defer else None
        metrics = {} if defer else {"entropy": self.mean_entropy(entropy)}
        if keep:
            self._kept = (batch, self.core.updates, logp, trained_plan[0])
        else:
            reshard(self.model)  # a forward without backward leaves a sharded root gathered
        reshard(self.ref_model)
        return old, ref, metrics

    def _score(self, batch: RLBatch, steps: list[tuple[torch.Tensor, bool]], with_ref: bool):
        """Runs each ``(rows, with_grad)`` micro-batch; returns the last one's log-probs too."""
        weight_B = torch.ones(len(batch)) if batch.score_weight_B is None else batch.score_weight_B
        old = torch.where((weight_B > 0)[:, None], 0.0, batch.behaviour_logp_BT)
        ref = torch.zeros(batch.mask_BT.shape) if with_ref else None
        ent_sum, ent_count, logp = 0.0, 0.0, None
        for idx, grad in steps:
            mb = batch.select(idx if len(idx) else placeholder_rows(batch))  # an empty one still runs in step
            with torch.set_grad_enabled(grad):
                logp, ent = self._forward(self.model, mb, with_entropy=True)
            ref_logp = None
            if ref is not None:
                with torch.no_grad():
                    ref_logp = self._forward(self.ref_model, mb)[0]
            if not len(idx):
                continue
            old[idx, : logp.shape[1]] = logp.detach()
            m = mb.mask_BT * weight_B[idx, None]
            ent_sum += float((ent * m).sum())
            ent_count += float(m.sum())
            if ref is not None:
                ref[idx, : logp.shape[1]] = ref_logp
        ref = ref * batch.mask_BT if ref is not None else None
        return old * batch.mask_BT, ref, [ent_sum, ent_count], logp

    def mean_entropy(self, entropy: list[float]) -> float:
        """The step's entropy from this rank's ``[sum, count]``: a collective under torchrun."""
        ent_sum, ent_count = self.world.all_reduce(entropy[0]), self.world.all_reduce(entropy[1])
        return ent_sum / max(ent_count, 1.0)

    def train_step(self, batch: RLBatch, loss_fn: LossFn, *, aggregation: str, epochs: int = 1,
                   mini_batches: int = 1, norm_constant: float = 1.0, seed: int = 0,
                   train_rows: torch.Tensor | None = None, correct: Correct | None = None) -> dict:
        """``epochs`` passes; each pass shuffles the rows into ``mini_batches`` optimizer steps.

        After ``score(defer=True)``: ``correct(mb)`` gives ``(old_logp_BT, is_weights_BT)`` for the
        loss from a micro-batch whose ``old_logp_BT`` was just set to its own detached log-probs (the
        off-policy correction, row by row); the metrics then carry the step's entropy.

        ``train_rows`` (N,) bool: the rows to differentiate (None: all). The others must have
        advantage exactly 0 (a loss with no term that is non-zero at advantage 0 is the caller's
        to check); the loss metrics are then over the rows that train."""
        if train_rows is not None and (batch.token_adv_BT is not None or bool(batch.adv_B[~train_rows].any())):
            raise ValueError("rows left out of the backward must have a per-sample advantage of exactly 0")
        deferred, self._deferred = self._deferred, None
        if (deferred is not None) != (correct is not None) or deferred and deferred[0] is not batch:
            raise ValueError("correct= goes with score(defer=True) of the same batch")
        if deferred and epochs * mini_batches != 1:
            raise ValueError("deferred old log-probs need one update a step: the second would see moved weights")
        self.model.train()
        agg = AGGREGATIONS[aggregation]
        sums: dict[str, float] = {}
        counts: dict[str, int] = {}  # a mini-batch where no row trains has no loss metrics
        gen = torch.Generator().manual_seed(seed)
        for _ in range(epochs):
            # one process's mini-batches at any world size (split episodes can make them uneven)
            for mini in mini_batch_rows(len(batch), mini_batches, gen, self.world):
                fused = None if deferred is None else (correct, deferred[1])
                metrics = self._update(batch, mini, loss_fn, agg, norm_constant, train_rows, fused)
                accumulate(sums, metrics)  # means add up here, extremes stay extremes over all updates
                for k in metrics:
                    counts[k] = counts.get(k, 0) + 1
        out = mean_over_updates(sums, counts)
        return out if deferred is None else out | {"entropy": self.mean_entropy(deferred[1])}

    def _update(self, batch: RLBatch, rows: torch.Tensor, loss_fn: LossFn, agg, norm_constant: float,
                train_rows: torch.Tensor | None = None, fused=None) -> dict:
        """One optimizer step; denominators are over the whole mini-batch of every rank, whichever
        of its rows are differentiated."""
        global_tokens = max(self.world.all_reduce(int(batch.train_mask_BT[rows].sum())), 1)
        global_seqs = max(self.world.all_reduce(float(batch.episode_share_B()[rows].sum())), 1)
        seq_tokens_B = batch.episode_tokens_B()  # over the whole batch: an episode's rows may be apart
        trained = rows if train_rows is None else rows[train_rows[rows]]
        plan = self.plan(batch, trained)
        if not plan:  # no rank trains a row: the step a loss of exactly 0 takes (Adam's moments still move)
            zero_gradients(self.model)
        metric_tokens = global_tokens if train_rows is None else \
            max(self.world.all_reduce(int(batch.train_mask_BT[trained].sum())), 1)

        def micro_loss(idx: torch.Tensor):
            live = len(idx) > 0  # else a placeholder that keeps this rank in step with the others
            rows_ = idx if live else placeholder_rows(batch)
            mb = batch.select(rows_)
            logp = self._kept_forward(batch, idx)
            if fused is not None:
                logp = self._old_from_forward(batch, idx, mb, *fused)
            elif logp is None:
                logp, _ = self._forward_grad(mb)
            loss_BT, metrics = loss_fn(logp, mb)
            loss = agg(loss_BT, mb.train_mask_BT, global_num_tokens=global_tokens, global_num_seqs=global_seqs,
                       norm_constant=norm_constant, seq_num_tokens_B=seq_tokens_B[rows_])
            weight = float(mb.train_mask_BT.sum()) / metric_tokens if live else 0.0
            return loss if live else loss * 0.0, {k: share_of_step(k, float(v), weight, live) for k, v in metrics.items()}

        return self.core.step(plan, micro_loss)

    def _kept_forward(self, batch: RLBatch, idx: torch.Tensor) -> torch.Tensor | None:
        """The log-probs ``score`` recorded for ``batch``, in ``idx`` order, if they still hold (the
        same rows, in any order, under the same weights)."""
        if self._kept is None:
            return None
        kept_batch, updates, logp, kept_rows = self._kept
        self._kept = None  # a graph is differentiated once
        if kept_batch is not batch or updates != self.core.updates or len(idx) != len(kept_rows):
            return None
        if not len(idx):
            return logp  # both placeholders
        position = torch.full((len(batch),), -1, dtype=torch.long)
        position[kept_rows] = torch.arange(len(kept_rows))
        where = position[idx]
        if bool((where < 0).any()):
            return None
        return logp[where.to(logp.device)]

    def _old_from_forward(self, batch: RLBatch, idx: torch.Tensor, mb: RLBatch, correct: Correct,
                          entropy: list[float]) -> torch.Tensor:
        """The update's forward of ``mb`` (rows ``idx`` of ``batch``; none for a placeholder), which
        also gives what ``score`` left to it: the rows' old log-probs, entropy and correction."""
        logp, ent = self._forward(self.model, mb, with_entropy=True)
        mb.old_logp_BT = logp.detach() * mb.mask_BT  # what score would have recorded
        if len(idx):
            batch.old_logp_BT[idx, : logp.shape[1]] = mb.old_logp_BT
            weight = 1.0 if batch.score_weight_B is None else batch.score_weight_B[idx, None]
            entropy[0] += float((ent * mb.mask_BT * weight).sum())
            entropy[1] += float((mb.mask_BT * weight).sum())
        mb.old_logp_BT, mb.is_weights_BT = correct(mb)
        return logp

    def _forward_grad(self, mb: RLBatch):
        return self._forward(self.model, mb)

    def export_weights(self) -> dict[str, torch.Tensor]:
        """Merged full-model weights (LoRA folded in) for the rollout engine: on rank 0 (others get {});
        every rank must call it when the model is sharded."""
        return export_state_dict(self.model, self.world)

    def export_buckets(self, bucket_mb: float, *, adapter: bool = False):
        """`export_weights` (or, with ``adapter``, the LoRA adapter alone under peft's names) in parts of
        about ``bucket_mb`` MiB, gathered from
        the shards as they are consumed: every rank must iterate it to the end (`export_buckets`)."""
        return export_buckets(self.model, self.world, bucket_mb, adapter=adapter)

    @torch.no_grad()
    def probe_logprobs(self, ids: list[int]) -> list[float]:
        """log p(ids[t] | ids[:t]) at temperature 1 for t >= 1: what a server holding these weights
        must report for the same sequence. Every rank calls it when the model is sharded."""
        x = torch.tensor([ids], device=self.world.device)
        logits = self.model(input_ids=x).logits[0, :-1].float()
        reshard(self.model)
        return logits.log_softmax(-1).gather(-1, x[0, 1:, None]).squeeze(-1).tolist()


def has_active_dropout(model) -> bool:
    """Whether train mode would randomise the forward (then eval-mode log-probs cannot stand in)."""
    if any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules()):
        return True
    return float(getattr(getattr(model, "config", None), "attention_dropout", 0.0) or 0.0) > 0


def placeholder_rows(batch: RLBatch) -> torch.Tensor:
    """Rows a rank with nothing to run forwards instead, to stay in step with its peers: two samples
    of one prompt, so that it can make the same model calls as theirs (each shared prompt once,
    then the completions; `posttrain.rl.shared_prefix`, whose path the ranks choose together)."""
    return torch.nonzero(batch.prompt_idx_B == batch.prompt_idx_B[0]).flatten()[:2]


def zero_gradients(model) -> None:
    """Gradients of exactly 0 on every trainable parameter: what the backward of a zero loss leaves."""
    for p in model.parameters():
        if p.requires_grad:
            p.grad = torch.zeros_like(p)
