"""Supervised fine-tuning and mid-training (continued pretraining).

Two data modes share one trainer:

- ``sft``: prompt/completion or chat-message records; the loss covers only completion tokens
  (plus the end-of-turn token, so the model learns to stop).
- ``raw``: plain documents (``text`` field); the loss covers every token, documents are joined
  with EOS and packed into ``max_len`` chunks; attention never crosses a document boundary.

The trainer is thin: ``train_step(micro_batches)`` runs forward/backward on each micro-batch with
the token-mean taken over the *whole step's* loss tokens (so gradient accumulation gives the same
gradient as one big batch), clips, steps AdamW and the warmup+cosine schedule.

Resume restores weights, optimizer, scheduler, RNG and the data position: the batch plan is a
pure function of (seed, epoch), so step N of a resumed run sees exactly the micro-batches that
step N of an uninterrupted run would have seen.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from pathlib import Path

import torch

from posttrain.algos import AGGREGATIONS, sft_token_nll
from posttrain.algos.head import head_of, head_token_logprobs, hidden_head, movable_head
from posttrain.config import ConfigValueError
from posttrain.errors import UserError
from posttrain.models.hf import ModelConfig, load_model, load_tokenizer, quiet_transformers
from posttrain.core.checkpoint import load_checkpoint, save_checkpoint
from posttrain.core.dist import init_world
from posttrain.core.fsdp import export_state_dict, reshard, shard_model
from posttrain.core.loop import Plan, drive, open_run
from posttrain.core.optim import OptimConfig, build_optimizer, build_scheduler, seed_everything
from posttrain.core.trainer import TrainCore
from posttrain.tracking import LoggingConfig, latest_checkpoint


@dataclasses.dataclass(kw_only=True)
class SFTDataConfig:
    path: str = ""
    """Training data: JSONL / Parquet / HF dataset folder of {prompt, completion} or {messages} records
    (sft mode) or {text} documents (raw mode). Required."""
    eval_path: str = ""
    """Held-out data in the same format; empty = no eval loss."""
    mode: str = "sft"
    """sft (loss on completions only) or raw (mid-training: loss on all tokens, documents packed)."""
    text_field: str = "text"
    """Field holding the document in raw mode."""
    use_chat_template: bool = True
    """Render prompt/completion with the tokenizer's chat template (plain concatenation otherwise)."""
    max_len: int = 256
    """Longest example in tokens (sft; longer ones are dropped and counted) or chunk length (raw)."""
    pack: bool = True
    """Pack several examples per row (attention kept within each example) instead of padding."""
    tokens_per_batch: int = 2048
    """Token budget of one micro-batch (rows x row length)."""
    eval_max_examples: int = 512
    """Use at most this many held-out examples for the eval loss."""

    def __post_init__(self):
        if self.mode not in ("sft", "raw"):
            raise ConfigValueError("mode", "must be sft or raw")
        if self.tokens_per_batch < self.max_len:
            raise ConfigValueError("tokens_per_batch", f"must be >= max_len ({self.max_len})")


@dataclasses.dataclass(kw_only=True)
class SFTConfig:
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    """The model to fine-tune."""
    data: SFTDataConfig = dataclasses.field(default_factory=SFTDataConfig)
    """Training and held-out data."""
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
    """Optimizer and schedule."""
    logging: LoggingConfig = dataclasses.field(default_factory=LoggingConfig)
    """Where metrics go besides metrics.jsonl."""
    num_steps: int = 200
    """Optimizer steps."""
    grad_accum: int = 1
    """Micro-batches per optimizer step, over all ranks (under torchrun each rank runs whole ones when
    the number of processes divides it, else its share of every one's examples)."""
    precision: str = "fp32"
    """fp32, or bf16 (autocast; master weights stay in the model dtype)."""
    chunked_head: bool = True
    """The output head and the log-softmax over chunks of positions, recomputed in backward, so no
    (B, T, V) logits exist (docs/rl.md, "Memory"); same numbers. false: the model's own logits."""
    seed: int = 0
    """Seed for weights init of new parts, data order and sampling."""
    eval_every: int = 50
    """Eval loss every N steps (and at the end); 0 = only at the end."""
    eval_generate: int = 0
    """At each eval, also greedy-decode this many held-out prompts and log `eval/heldout/greedy/pass@1` as judged by
    `eval_verifier` (records need `prompt` and what the verifier reads, e.g. `answer`)."""
    eval_verifier: str = "arithmetic"
    """Verifier for eval_generate: a registered name (arithmetic, math, ...) or module:function."""
    save_every: int = 100
    """Checkpoint every N steps (and at the end); 0 = only at the end."""
    keep_last: int = 2
    """Keep this many most recent checkpoints."""
    out_dir: str = "runs/sft"
    """Run directory: config.yaml, metrics.jsonl, checkpoints/step-N/."""
    resume: bool = True
    """Continue from the last checkpoint in out_dir when there is one."""

    def __post_init__(self):
        if self.num_steps <= 0:
            raise ConfigValueError("num_steps", "must be > 0")
        if self.grad_accum <= 0:
            raise ConfigValueError("grad_accum", "must be > 0")
        if self.precision not in ("fp32", "bf16"):
            raise ConfigValueError("precision", "must be fp32 or bf16")


def autocast(precision: str, device: torch.device):
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


class SFTTrainer:
    """Thin: the next-token loss of a step's micro-batches on the training core; eval loss without gradients."""

    def __init__(self, model, optimizer, scheduler, *, grad_clip: float, precision: str = "fp32", world=None,
                 chunked_head: bool = True):
        self.core = TrainCore(model, optimizer, scheduler, grad_clip=grad_clip, world=world)
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.precision, self.world, self.chunked_head = precision, self.core.world, chunked_head
        self.device = next(model.parameters()).device

    def _batch_nll(self, batch):
        b = batch.to(self.device) if hasattr(batch, "to") else batch
        mask_BT = b.labels_BT != -100
        if not (self.chunked_head and movable_head(self.model)):
            with autocast(self.precision, self.device):
                out = self.model(**b.model_inputs())
            return sft_token_nll(out.logits.float(), b.labels_BT, mask_BT), mask_BT
        with autocast(self.precision, self.device), hidden_head(self.model):
            hidden = self.model(**b.model_inputs()).logits  # the final hidden states
        logp_BT = head_token_logprobs(hidden, *head_of(self.model), b.labels_BT.masked_fill(~mask_BT, 0))
        return torch.where(mask_BT, -logp_BT, torch.zeros_like(logp_BT)), mask_BT

    def train_step(self, micro_batches) -> dict:
        """One optimizer step; ``micro_batches`` are this rank's share of the step's global batch."""
        total_tokens = self.world.all_reduce(sum(b.num_loss_tokens for b in micro_batches))

        def loss_fn(b):
            nll_BT, mask_BT = self._batch_nll(b)
            return AGGREGATIONS["token_mean"](nll_BT, mask_BT, global_num_tokens=total_tokens), {}

        return self.core.step(micro_batches, loss_fn)

    @torch.no_grad()
    def eval_loss(self, batches) -> float:
        """Token-mean loss over ``batches`` (every rank runs them all: a sharded forward is collective)."""
        self.model.eval()
        nll_sum, count = 0.0, 0
        for b in batches:
            nll_BT, mask_BT = self._batch_nll(b)
            nll_sum += float(nll_BT.sum())
            count += int(mask_BT.sum())
        reshard(self.model)
        return nll_sum / max(count, 1)


class BatchStream:
    """Micro-batch ``i`` of the run, across epochs, as a pure function of (seed, i)."""

    def __init__(self, examples, *, pack: bool, tokens_per_batch: int, seq_len: int, seed: int, pad_id: int):
        from posttrain.data.packing import plan_batches

        self.examples, self.pack, self.seq_len, self.seed = examples, pack, seq_len, seed
        self.pad_id = pad_id
        self.tokens_per_batch = tokens_per_batch
        self._plan = lambda epoch: plan_batches([len(e) for e in examples], tokens_per_batch=tokens_per_batch,
                                                pack=pack, seed=seed, epoch=epoch)
        self._epochs: dict[int, list[list[int]]] = {}

    def _epoch(self, epoch: int) -> list[list[int]]:
        if epoch not in self._epochs:
            self._epochs = {epoch: self._plan(epoch)}  # keep one epoch's plan in memory
        return self._epochs[epoch]

    def micro_batch(self, i: int, share: tuple[int, int] | None = None):
        """Micro-batch ``i``; with ``share = (rank, ranks)`` only that rank's share of its examples
        (every ranks-th). A rank whose share is empty gets a stand-in that weighs nothing: one of the
        batch's examples with no target (it keeps the sharded forwards in lock step)."""
        from posttrain.data.packing import IGNORE_INDEX, collate

        epoch = 0
        while i >= len(self._epoch(epoch)):
            i -= len(self._epoch(epoch))
            epoch += 1
        idx = self._epoch(epoch)[i]
        mine = idx if share is None else idx[share[0]::share[1]]
        batch = collate(self.examples, mine or idx[:1], pack=self.pack, seq_len=self.seq_len, pad_id=self.pad_id)
        if mine:
            return batch
        return dataclasses.replace(batch, labels_BT=torch.full_like(batch.labels_BT, IGNORE_INDEX), num_loss_tokens=0,
                                   num_real_tokens=0)

    def all_batches(self):
        from posttrain.data.packing import collate

        return [collate(self.examples, idx, pack=self.pack, seq_len=self.seq_len, pad_id=self.pad_id)
                for idx in self._epoch(0)]


def load_sft_data(cfg: SFTDataConfig, tokenizer, path: str):
    """Tokenized examples of ``path`` for the configured mode; bad rows raise UserError naming file:line."""
    from posttrain.data.records import load_records_with_location, load_sft_examples
    from posttrain.data.sft import tokenize_raw_text, tokenize_sft
    from posttrain.errors import UserError

    if cfg.mode == "raw":
        texts = []
        for where, rec in load_records_with_location(path):
            if not isinstance(rec.get(cfg.text_field), str):
                raise UserError(f"{where}: missing text field {cfg.text_field!r} (raw mode)")
            texts.append(rec[cfg.text_field])
        return tokenize_raw_text(texts, tokenizer, seq_len=cfg.max_len)
    examples = load_sft_examples(path)
    tokenized = tokenize_sft(examples, tokenizer, max_len=cfg.max_len, use_chat_template=cfg.use_chat_template)
    if not tokenized:
        raise UserError(f"{path}: no example fits data.max_len={cfg.max_len}")
    return tokenized


def run_sft(cfg: SFTConfig, printer=print) -> dict:
    """Train (or resume) SFT; returns a summary with the final losses and checkpoint path.

    Under torchrun each rank takes every world_size-th micro-batch of a step (``grad_accum`` of them
    in all) when the world size divides ``grad_accum``, else a share of every micro-batch's examples;
    either way the global batch, and with global denominators the update, is the same at any world
    size; the model is sharded with FSDP2.
    """
    from posttrain.models.hf import check_model_path

    quiet_transformers()
    world = init_world(cfg.model.device)
    seed_everything(cfg.seed)
    check_model_path(cfg.model.path)
    tokenizer = load_tokenizer(cfg.model.path, chat_template="data.use_chat_template=true (set it to false for "
                               "plain-text prompts)" if cfg.data.use_chat_template else None)
    train = load_sft_data(cfg.data, tokenizer, cfg.data.path)
    held_out = load_sft_data(cfg.data, tokenizer, cfg.data.eval_path)[: cfg.data.eval_max_examples] \
        if cfg.data.eval_path else []
    model = shard_model(load_model(dataclasses.replace(cfg.model, device=str(world.device))), world,
                        activation_checkpointing=cfg.model.activation_checkpointing)
    optimizer = build_optimizer(model.parameters(), cfg.optim)
    trainer = SFTTrainer(model, optimizer, build_scheduler(optimizer, cfg.optim, cfg.num_steps),
                         grad_clip=cfg.optim.grad_clip, precision=cfg.precision, world=world,
                         chunked_head=cfg.chunked_head)
    seq_len = cfg.data.max_len
    stream = BatchStream(train, pack=cfg.data.pack, tokens_per_batch=cfg.data.tokens_per_batch,
                         seq_len=seq_len, seed=cfg.seed, pad_id=tokenizer.pad_token_id)
    eval_batches = BatchStream(held_out, pack=cfg.data.pack, tokens_per_batch=cfg.data.tokens_per_batch,
                               seq_len=seq_len, seed=cfg.seed, pad_id=tokenizer.pad_token_id).all_batches() if held_out else []
    accuracy = _accuracy_probe(cfg, tokenizer) if cfg.eval_generate else None
    run_dir = Path(cfg.out_dir)
    start = _maybe_resume(cfg, run_dir, trainer, printer)
    logger = open_run(run_dir, cfg, start, world)
    try:
        return _train_loop(cfg, trainer, stream, eval_batches, logger, tokenizer, run_dir, start, accuracy)
    finally:
        if logger is not None:
            logger.close()


def _maybe_resume(cfg: SFTConfig, run_dir: Path, trainer: SFTTrainer, printer) -> int:
    ckpt = latest_checkpoint(run_dir) if cfg.resume else None
    if ckpt is None:
        return 0
    state = load_checkpoint(ckpt, trainables={"model": (trainer.model, trainer.optimizer)}, world=trainer.world)
    trainer.scheduler.load_state_dict(state["scheduler"])
    if trainer.world.main:
        printer(f"resumed from {ckpt} (step {state['step']})")
    return state["step"]


def _accuracy_probe(cfg: SFTConfig, tokenizer):
    """``probe(model) -> accuracy``: greedy decoding of the first held-out prompts, judged by a verifier."""
    from posttrain.data.chat import encode_prompt
    from posttrain.data.records import load_records
    from posttrain.verifiers.evaluate import evaluate
    from posttrain.rollout import SamplingParams, TorchEngine
    from posttrain.verifiers import resolve_verifier

    if not cfg.data.eval_path:
        raise UserError("eval_generate: needs data.eval_path (held-out records with a prompt)")
    verifier = resolve_verifier(cfg.eval_verifier)
    examples = [r for r in load_records(cfg.data.eval_path) if "prompt" in r][: cfg.eval_generate]
    if not examples:
        raise UserError(f"{cfg.data.eval_path}: eval_generate needs records with a 'prompt' field")
    prompts = [encode_prompt(tokenizer, ex["prompt"], cfg.data.use_chat_template) for ex in examples]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=cfg.data.max_len)

    def probe(model) -> float:
        engine = TorchEngine(model, tokenizer=tokenizer, device=str(next(model.parameters()).device))
        return evaluate(engine, prompts, examples, verifier, profile="greedy", sampling=greedy, n=1).pass_at_k[1]

    return probe


def _probe_on_rank0(accuracy, trainer: SFTTrainer, cfg: SFTConfig, tokenizer) -> float:
    """Greedy accuracy: on the model itself in one process; sharded, on rank 0 from gathered weights."""
    world = trainer.world
    if not world.distributed:
        return accuracy(trainer.model)
    weights = export_state_dict(trainer.model, world)
    value = None
    if world.main:
        model = load_model(dataclasses.replace(cfg.model, device="cpu", lora=dataclasses.replace(cfg.model.lora, enabled=False)),
                           trainable=False)
        model.load_state_dict(weights, strict=False)
        value = accuracy(model)
    return world.broadcast_object(value)


def _train_loop(cfg, trainer, stream, eval_batches, logger, tokenizer, run_dir, start, accuracy=None) -> dict:
    world = trainer.world
    summary: dict = {"run_dir": str(run_dir)}
    if start >= cfg.num_steps:  # a finished run run again: nothing to train, its last checkpoint stands
        return summary | {"checkpoint": str(latest_checkpoint(run_dir)), "finished_before": start}

    def step(n: int, timer) -> dict:
        t0 = time.perf_counter()
        first = (n - 1) * cfg.grad_accum
        if cfg.grad_accum % world.world_size == 0:  # whole micro-batches, every world_size-th
            micro = [stream.micro_batch(i) for i in range(first + world.rank, first + cfg.grad_accum, world.world_size)]
        else:  # fewer micro-batches than ranks (or no equal share): a share of each one's examples
            micro = [stream.micro_batch(i, (world.rank, world.world_size)) for i in range(first, first + cfg.grad_accum)]
        metrics = trainer.train_step(micro)
        real = world.all_reduce(sum(b.num_real_tokens for b in micro))
        return metrics | {"tokens_per_s": real / (time.perf_counter() - t0), "tokens": real}

    def evaluate() -> dict:
        if not eval_batches:
            return {}
        out = {"eval/loss": trainer.eval_loss(eval_batches)}
        if accuracy is not None:
            out["eval/heldout/greedy/pass@1"] = _probe_on_rank0(accuracy, trainer, cfg, tokenizer)
        return out

    def save(n: int) -> None:
        state = {"step": n, "scheduler": trainer.scheduler.state_dict()}
        summary["checkpoint"] = str(save_checkpoint(
            run_dir, n, trainables={"model": (trainer.model, trainer.optimizer)}, export_model=trainer.model,
            tokenizer=tokenizer, state=state, keep_last=cfg.keep_last, world=world))

    plan = Plan("sft", cfg.num_steps, start, cfg.eval_every, cfg.save_every, cfg.logging.progress)
    last = drive(plan, step, logger=logger, save=save, evaluate=evaluate, world=world,
                 describe=lambda m: f"loss {m['loss']:.3f} {m['tokens_per_s']:.0f} tok/s")
    summary |= {k: last[k] for k in ("loss", "eval/loss", "eval/heldout/greedy/pass@1") if k in last}
    return summary
