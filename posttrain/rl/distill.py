"""On-policy distillation: the student samples, a frozen teacher grades every token it chose.

Who generates the trajectory: the student, with the rollout engine, exactly as in RL. Where the
signal comes from: the teacher's distribution at every state the student visited, compared by
the per-token reverse KL ``KL(π_s‖π_t)`` (``posttrain.algos.distill``). This is RL with a dense
teacher signal instead of a sparse verifier reward, so the run *is* an RL run: ``setup`` builds
the same `RLRun` as ``posttrain rl`` (policy, engine, prompts, verifier, checkpoint/resume,
weight sync after each update) and adds a teacher.

One step, top to bottom:

    prompts ─▶ engine.generate(n=G) ─▶ verifier (logged; optional reward term)
            ─▶ student log-probs (no grad) ─▶ teacher scores the student's exact tokens (no grad)
            ─▶ loss = reverse KL per token [+ reward_coef · GRPO policy gradient] ─▶ one update
            ─▶ engine.load_version(buckets, version+1, digest)

Design choices:
- Two estimators, chosen by name (``LOSSES``): ``full`` is the exact KL over the vocabulary (needs
  the teacher's logits and the student's; lowest variance); ``sampled`` is the one-sample estimate
  ``log p_s(x) - log p_t(x)`` used as a detached per-token reward with a policy-gradient loss
  (needs only the teacher's log-prob of each sampled token: the cheapest signal to ship).
- ``teacher.top_k`` keeps only the teacher's k largest logits per position (values and ids), so the
  teacher signal held between the teacher stage and the update is (N, T, k), not (N, T, V); the KL
  is then taken over those k tokens, both distributions renormalised there (see algos).
- The teacher is loaded frozen (``requires_grad_(False)``), runs under ``no_grad`` on its own device
  (``teacher.device``) and only its outputs travel back to the student's device.
- The teacher's signal never depends on the verifier, so the KL covers every sample's tokens, even
  those whose outcome is TASK_FAIL or INFRA_FAIL; only the optional reward term is masked there.
- Teacher and student must share one tokenizer: per-token distributions are compared id by id, so
  a different vocabulary is refused before anything is written.
- ``chunked_head`` (default): the student's and the teacher's forwards return final hidden states
  and the heads run a chunk of positions at a time (`posttrain.algos.head`), for the log-probs and
  the full KL alike, so no (B, T, V) logits of either exist; the teacher's hidden states are held
  between the stages instead of its logits, and its head is applied again in the update. Same
  numbers. When either head cannot move out of the forward, both keep full logits.
- ``max_tokens`` stops the run once the student has generated that many completion tokens (the
  budget the study uses to compare methods fairly); `drive` serves RL runs too.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch

from posttrain.algos import (ADVANTAGES, AGGREGATIONS, distill_reward, pg_loss, reverse_kl_full,
                             reverse_kl_sampled, token_logprobs)
from posttrain.algos.head import head_of, head_reverse_kl, head_token_logprobs, hidden_head, movable_head
from posttrain.config import ConfigValueError
from posttrain.errors import UserError
from posttrain.models.hf import DTYPES, ModelConfig, check_model_path, load_model, load_tokenizer
from posttrain.rl.batch import RLBatch, group_outcomes, outcome_batch
from posttrain.rl.config import CorrectionConfig, RLConfig, RLDataConfig, RolloutConfig
from posttrain.rl.diagnostics import rollout_metrics
from posttrain.rl.loop import drive_rl, generate_groups, own_rows, share_step, sync_weights
from posttrain.rl.state import RLRun
from posttrain.rl.loop import setup as rl_setup
from posttrain.rl.losses import importance_weights
from posttrain.tracking import LoggingConfig, StageTimer
from posttrain.core.dist import gather_rows
from posttrain.core.fsdp import is_sharded, reshard, shard_model
from posttrain.core.optim import OptimConfig


@dataclasses.dataclass(kw_only=True)
class TeacherConfig:
    path: str = ""
    """Teacher model folder (any causal LM with the student's tokenizer). Required."""
    device: str = "cpu"
    """Device of the teacher (e.g. cuda:1 while the student trains on cuda:0)."""
    dtype: str = "float32"
    """Teacher dtype: float32, bfloat16 or float16 (it only runs forward passes)."""
    top_k: int = 0
    """Keep only the teacher's top-k logits per position (bounds memory to N x T x k; with chunked_head
    the teacher's hidden states are held instead and the top-k is taken in the update); 0 = all."""

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ConfigValueError("dtype", f"must be one of {', '.join(DTYPES)}")
        if self.top_k < 0:
            raise ConfigValueError("top_k", "must be >= 0 (0 = the whole vocabulary)")


@dataclasses.dataclass(kw_only=True)
class DistillConfig:
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    """The student (trained; LoRA or full)."""
    teacher: TeacherConfig = dataclasses.field(default_factory=TeacherConfig)
    """The frozen teacher."""
    data: RLDataConfig = dataclasses.field(default_factory=RLDataConfig)
    """Prompts (records {"prompt", "answer"}; the answer feeds the logged verifier reward)."""
    rollout: RolloutConfig = dataclasses.field(default_factory=lambda: RolloutConfig(group_size=4))
    """Student sampling (group_size samples per prompt)."""
    optim: OptimConfig = dataclasses.field(default_factory=lambda: OptimConfig(lr=1e-4, warmup_steps=0,
                                                                               schedule="constant"))
    """Optimizer of the student."""
    logging: LoggingConfig = dataclasses.field(default_factory=LoggingConfig)
    """Mirrors of metrics.jsonl."""
    loss: str = "full"
    """Reverse-KL estimator: full (exact over the vocabulary or the teacher's top-k) or sampled
    (one-sample estimate as a per-token reward with a policy-gradient loss)."""
    reward_coef: float = 0.0
    """Weight of a GRPO policy-gradient term on the verifier reward mixed into the loss; 0 = pure distillation."""
    verifier: str = "arithmetic"
    """Verifier scoring the student's samples (always logged as reward/mean; trained on when reward_coef > 0)."""
    prompts_per_step: int = 8
    """Prompts per step (each sampled rollout.group_size times)."""
    num_steps: int = 50
    """Steps (one generation round, one update, one weight sync each)."""
    max_tokens: int = 0
    """Stop once the student has generated this many completion tokens in total; 0 = no budget."""
    micro_batch_tokens: int = 4096
    """Padded tokens per forward/backward (memory knob; does not change the math). Smaller than
    RL's default: with loss=full and chunked_head=false the teacher's logits of a micro-batch are held
    until the update."""
    chunked_head: bool = True
    """Apply the student's and the teacher's output heads a chunk of positions at a time, recomputed
    in backward, for the log-probs and the full KL, so no (B, T, V) logits exist; the teacher's final
    hidden states are held until the update instead of its logits (docs/rl.md, "Memory"). Same
    numbers. When either head cannot move out of the forward (a LoRA head, soft-capped logits),
    both keep full logits."""
    eval_every: int = 10
    """Held-out greedy pass@1 every N steps (and at start and end); 0 = start and end only."""
    save_every: int = 25
    """Checkpoint every N steps (and at the end); 0 = end only."""
    keep_last: int = 2
    """Checkpoints to keep (0 = all)."""
    seed: int = 0
    """Seed for prompt order, sampling and init."""
    out_dir: str = "runs/distill"
    """Run directory."""
    resume: bool = True
    """Continue from the last checkpoint in out_dir when there is one."""

    def __post_init__(self):
        if self.loss not in LOSSES:
            raise ConfigValueError("loss", f"must be one of {', '.join(LOSSES)}")
        if self.reward_coef < 0:
            raise ConfigValueError("reward_coef", "must be >= 0")
        if self.max_tokens < 0:
            raise ConfigValueError("max_tokens", "must be >= 0 (0 = no budget)")
        for key in ("prompts_per_step", "num_steps", "micro_batch_tokens"):
            if getattr(self, key) < 1:
                raise ConfigValueError(key, "must be >= 1")

    def rl_config(self) -> RLConfig:
        """The RL run this distillation rides on (no reference model, one update per step; under
        torchrun rank 0 generates, as `distill_step` expects)."""
        return RLConfig(model=self.model, data=self.data, rollout=dataclasses.replace(self.rollout, colocate=False),
                        optim=self.optim,
                        logging=self.logging, verifier=self.verifier, prompts_per_step=self.prompts_per_step,
                        num_steps=self.num_steps, micro_batch_tokens=self.micro_batch_tokens,
                        chunked_head=self.chunked_head,
                        eval_every=self.eval_every, save_every=self.save_every, keep_last=self.keep_last,
                        seed=self.seed, out_dir=self.out_dir, resume=self.resume)


@dataclasses.dataclass
class TeacherChunk:
    """The teacher's signal on one micro-batch of rows (widths as ``RLBatch.select`` trims them)."""

    logp_BT: torch.Tensor                # (b, w-1) teacher log-prob of each student token
    logits_BTK: torch.Tensor | None      # (b, w-1, K) teacher logits: all V, or the top-k values
    index_BTK: torch.Tensor | None       # (b, w-1, K) vocabulary ids of the top-k; None when K = V
    rows: torch.Tensor                   # (b,) rows of the step's batch
    hidden_BTH: torch.Tensor | None = None  # (b, w-1, H) teacher final hidden states, in place of logits
    head: tuple | None = None            # the teacher's head (weight, bias) on the student's device
    top_k: int = 0                       # with hidden states: the teacher's top-k the KL keeps (0 = all)


@dataclasses.dataclass
class StudentChunk:
    """The student's forward on one micro-batch: its log-prob of each token, and either its logits
    (scaled by the temperature) or its final hidden states and head, whose logits the KL makes."""

    logp_BT: torch.Tensor                # (b, w-1) with gradient
    logits_BTV: torch.Tensor | None = None
    hidden_BTH: torch.Tensor | None = None
    head: tuple | None = None
    temperature: float = 1.0


@dataclasses.dataclass
class DistillRun:
    rl: RLRun
    cfg: DistillConfig
    teacher: torch.nn.Module


# ------------------------------------------------------------------------------------ losses

def _full_kl(s: StudentChunk, mb: RLBatch, t: TeacherChunk):
    """Exact reverse KL per token; with top-k, over the teacher's k tokens (renormalised)."""
    if (s.hidden_BTH is None) != (t.hidden_BTH is None):
        raise ValueError("the student and the teacher must both give logits or both hidden states")
    if s.hidden_BTH is not None:
        kl_BT = head_reverse_kl(s.hidden_BTH, *s.head, t.hidden_BTH, t.head, mb.mask_BT, s.temperature,
                                teacher_topk=t.top_k or None).cpu()
        return kl_BT, kl_BT
    student = s.logits_BTV if t.index_BTK is None else s.logits_BTV.gather(-1, t.index_BTK)
    kl_BT = reverse_kl_full(student, t.logits_BTK, mb.mask_BT)
    return kl_BT, kl_BT


def _sampled_kl(s: StudentChunk, mb: RLBatch, t: TeacherChunk):
    """Score-function form: reward -(log p_s - log p_t) per token, gradient -r · ∇log p_s."""
    mask = mb.mask_BT
    loss_BT, _ = pg_loss(s.logp_BT, distill_reward(mb.old_logp_BT, t.logp_BT, mask), mask)
    return loss_BT, reverse_kl_sampled(s.logp_BT.detach(), t.logp_BT) * mask


# name -> fn(student chunk, micro-batch, teacher chunk) -> (loss_BT, reverse KL per token for the logs)
LOSSES: dict[str, Callable] = {"full": _full_kl, "sampled": _sampled_kl}


# ------------------------------------------------------------------------------------- setup

def check_same_vocabulary(student_path: str, teacher_path: str) -> None:
    """Refuse a teacher whose token ids mean something else than the student's."""
    s_vocab, t_vocab = load_tokenizer(student_path).get_vocab(), load_tokenizer(teacher_path).get_vocab()
    if s_vocab == t_vocab:
        return
    diff = sorted(set(s_vocab.items()) ^ set(t_vocab.items()))[:1]
    example = ""
    if diff:
        tok = diff[0][0]
        example = f"; e.g. {tok!r} is id {s_vocab.get(tok)} for the student and {t_vocab.get(tok)} for the teacher"
    raise UserError(f"teacher.path={teacher_path}: the teacher's vocabulary differs from the student's "
                    f"({len(t_vocab)} vs {len(s_vocab)} tokens{example}); distillation compares "
                    "distributions token id by token id, so both must share one tokenizer")


def _output_size(model) -> int:
    return model.get_output_embeddings().weight.shape[0]


def setup(cfg: DistillConfig) -> DistillRun:
    """Check and load everything before the run directory is touched (bad input writes nothing)."""
    check_model_path(cfg.model.path)
    check_model_path(cfg.teacher.path, "teacher.path")
    check_same_vocabulary(cfg.model.path, cfg.teacher.path)
    rl = rl_setup(cfg.rl_config())
    t = cfg.teacher
    device = str(rl.world.device) if rl.world.distributed else t.device  # under torchrun: sharded like the student
    teacher = shard_model(load_model(ModelConfig(path=t.path, device=device, dtype=t.dtype), trainable=False,
                                     key="teacher.path"), rl.world)
    if _output_size(teacher) != _output_size(rl.policy.model):
        raise UserError(f"teacher.path={t.path}: the teacher has {_output_size(teacher)} output logits, "
                        f"the student {_output_size(rl.policy.model)}; they must match to compare distributions")
    if t.top_k > _output_size(teacher):
        raise UserError(f"teacher.top_k={t.top_k}: larger than the vocabulary ({_output_size(teacher)})")
    return DistillRun(rl=rl, cfg=cfg, teacher=teacher)


# ------------------------------------------------------------------------------- one step

def _outputs(model, mb: RLBatch) -> torch.Tensor:
    """The forward's ``.logits`` at the targets' positions (the final hidden states under `hidden_head`)."""
    dev = next(model.parameters()).device
    out = model(input_ids=mb.input_ids_BT.to(dev), attention_mask=mb.attention_mask_BT.to(dev),
                position_ids=mb.position_ids_BT().to(dev))
    return out.logits[:, :-1]


def _logits(model, mb: RLBatch, temperature: float) -> torch.Tensor:
    """(b, w-1, V) fp32 logits at the targets' positions, scaled by the sampling temperature."""
    return _outputs(model, mb).float() / temperature


def _hidden(model, mb: RLBatch) -> torch.Tensor:
    """(b, w-1, H) final hidden states at the targets' positions; the head is applied later, in chunks."""
    with hidden_head(model):
        return _outputs(model, mb)


def heads_move(run: DistillRun) -> bool:
    """Whether the student and the teacher run with their heads in chunks (``chunked_head``): both
    or neither, since the full KL meets one's logits with the other's."""
    return run.cfg.chunked_head and movable_head(run.rl.policy.model) and movable_head(run.teacher)


@torch.no_grad()
def score_teacher(teacher, batch: RLBatch, chunks: list[torch.Tensor], *, temperature: float,
                  top_k: int, keep_logits: bool, head_device: torch.device | None = None) -> list[TeacherChunk]:
    """The teacher's log-prob of every student token, plus its logits (all, or top-k) when needed.
    With ``head_device`` (the student's device) the teacher's head runs in chunks and its final
    hidden states and head are kept in place of logits (`_teacher_hidden`)."""
    if head_device is not None:
        return _teacher_hidden(teacher, batch, chunks, temperature=temperature, top_k=top_k,
                               keep=keep_logits, device=head_device)
    out = []
    for rows in chunks:
        mb = batch.select(rows)
        logits = _logits(teacher, mb, temperature)
        logp = token_logprobs(logits, mb.input_ids_BT[:, 1:].to(logits.device)).cpu()
        values = index = None
        if keep_logits and top_k:
            values, index = (x.cpu() for x in logits.topk(top_k, dim=-1))
        elif keep_logits:
            values = logits.cpu()
        out.append(TeacherChunk(logp_BT=logp, logits_BTK=values, index_BTK=index, rows=rows))
    reshard(teacher)
    return out


def _teacher_hidden(teacher, batch: RLBatch, chunks: list[torch.Tensor], *, temperature: float, top_k: int,
                    keep: bool, device: torch.device) -> list[TeacherChunk]:
    """`score_teacher` with the head in chunks: with ``keep``, each chunk holds the teacher's hidden
    states (on the CPU, as logits would be) and its head on ``device``, where the update applies it
    (the top-k, if any, is taken there)."""
    copy, head, out = is_sharded(teacher), None, []  # a sharded head's gathered weight is freed by reshard
    for rows in chunks:
        mb = batch.select(rows)
        hidden = _hidden(teacher, mb)
        if keep and head is None:  # read after a forward: a sharded head is gathered then
            head = tuple(None if w is None else w.detach().to(device, copy=copy) for w in head_of(teacher))
        logp = head_token_logprobs(hidden, *head_of(teacher), mb.input_ids_BT[:, 1:].to(hidden.device),
                                   temperature).cpu()
        out.append(TeacherChunk(logp_BT=logp, logits_BTK=None, index_BTK=None, rows=rows,
                                hidden_BTH=hidden.cpu() if keep else None, head=head, top_k=top_k))
    reshard(teacher)
    return out


def _student(model, mb: RLBatch, temperature: float, chunked: bool) -> StudentChunk:
    """The student's forward on ``mb``, with gradient: full logits, or hidden states and its head."""
    targets_BT = mb.input_ids_BT[:, 1:]
    if not chunked:
        logits = _logits(model, mb, temperature).cpu()
        return StudentChunk(logp_BT=token_logprobs(logits, targets_BT), logits_BTV=logits)
    hidden = _hidden(model, mb)
    head = head_of(model)
    logp = head_token_logprobs(hidden, *head, targets_BT.to(hidden.device), temperature)
    return StudentChunk(logp_BT=logp.cpu(), hidden_BTH=hidden, head=head, temperature=temperature)


def update(run: DistillRun, batch: RLBatch, teacher: list[TeacherChunk]) -> tuple[dict, torch.Tensor]:
    """One optimizer step on the token-mean loss over the whole step (every rank's tokens); returns
    metrics and this rank's KL per token."""
    policy, cfg = run.rl.policy, run.cfg
    total_tokens = max(policy.world.all_reduce(int(batch.mask_BT.sum())), 1)
    kl_BT = torch.zeros_like(batch.mask_BT, dtype=torch.float32)
    chunked = heads_move(run)

    def loss_fn(t: TeacherChunk):
        mb = batch.select(t.rows)
        s = _student(policy.model, mb, cfg.rollout.temperature, chunked)
        loss_BT, kl_mb = LOSSES[cfg.loss](s, mb, t)
        if cfg.reward_coef:
            adv_BT = mb.adv_B[:, None].expand_as(s.logp_BT)
            loss_BT = loss_BT + cfg.reward_coef * pg_loss(s.logp_BT, adv_BT, mb.train_mask_BT)[0]
        kl_BT[t.rows, : kl_mb.shape[1]] = kl_mb.detach()
        return AGGREGATIONS["token_mean"](loss_BT, mb.mask_BT, global_num_tokens=total_tokens), {}

    return policy.core.step(teacher, loss_fn), kl_BT


def position_profile(kl_BT: torch.Tensor, mask_BT: torch.Tensor) -> dict[str, float]:
    """Mean reverse KL by completion position, in buckets 0, 1, 2-3, 4-7, 8-15, ..."""
    pos_BT = mask_BT.long().cumsum(1) - 1
    out, lo = {}, 0
    last = int(pos_BT[mask_BT].max()) if mask_BT.any() else -1
    while lo <= last:
        hi = max(lo, 2 * lo - 1)
        sel = mask_BT & (pos_BT >= lo) & (pos_BT <= hi)
        out[f"distill/kl_pos/{lo}" if lo == hi else f"distill/kl_pos/{lo}-{hi}"] = float(kl_BT[sel].mean())
        lo = hi + 1
    return out


def _masked_mean(x_BT: torch.Tensor, mask_BT: torch.Tensor) -> float:
    return float((x_BT * mask_BT).sum() / mask_BT.sum().clamp_min(1))


def teacher_metrics(batch: RLBatch, teacher: list[TeacherChunk]) -> dict:
    t_logp = torch.zeros_like(batch.old_logp_BT)
    for t in teacher:
        t_logp[t.rows, : t.logp_BT.shape[1]] = t.logp_BT
    mask = batch.mask_BT
    return {"distill/teacher_logp": _masked_mean(t_logp, mask),
            "distill/reverse_kl_sampled": _masked_mean(batch.old_logp_BT - t_logp, mask)}


def distill_step(run: DistillRun, step: int, timer: StageTimer) -> dict:
    cfg, rl = run.cfg, run.rl
    G, world = cfg.rollout.group_size, rl.world
    with timer("rollout"):
        ro, outcomes = share_step(rl, lambda: generate_groups(rl, step, 0, cfg.prompts_per_step)[:2])
    with timer("reward"):
        rows = own_rows(len(ro), G, world)
        mine = ro.select(rows, [i // G for i in range(len(rows))])
        batch = outcome_batch(mine, [outcomes[r] for r in rows], rl.tokenizer.pad_token_id, G)
        rewards_PG, valid_PG, zero_var_P = group_outcomes(outcomes, G)
        batch.adv_B = ADVANTAGES["grpo"](rewards_PG, valid_PG)[0].flatten().float()[rows]
    with timer("logprobs"):
        batch.old_logp_BT, batch.ref_logp_BT, metrics = rl.policy.score(batch)
        metrics |= importance_weights(batch, CorrectionConfig(kind="none"))[1]
    with timer("teacher"):
        chunks = batch.micro_batches(torch.arange(len(batch)), cfg.micro_batch_tokens, world)
        teacher = score_teacher(run.teacher, batch, chunks, temperature=cfg.rollout.temperature,
                                top_k=cfg.teacher.top_k, keep_logits=cfg.loss == "full",
                                head_device=rl.policy.device if heads_move(run) else None)
    with timer("update"):
        upd, kl_BT = update(run, batch, teacher)
    with timer("sync"):
        sync_weights(rl)
    tokens = float(batch.mask_BT.sum())
    local = metrics | teacher_metrics(batch, teacher) | {"distill/reverse_kl": _masked_mean(kl_BT, batch.mask_BT)}
    metrics = upd | world.mean_metrics(local, tokens) | rollout_metrics(ro, outcomes, float(zero_var_P.float().mean()))
    if not cfg.reward_coef:  # equal rewards only starve the gradient when the reward is trained on
        metrics.pop("groups/zero_variance_frac")
    metrics |= position_profile(*gather_rows(world, kl_BT, batch.mask_BT))  # over the whole step
    metrics["tokens/generated"] = sum(ro.model_tokens())
    return metrics


def run_distill(cfg: DistillConfig, printer=print) -> dict:
    """Run (or resume) on-policy distillation; returns the last step's metrics."""
    run = setup(cfg)
    return drive_rl(run.rl, lambda rl, step, timer: distill_step(run, step, timer), config=cfg,
                    max_tokens=cfg.max_tokens, name="distill", printer=printer)
