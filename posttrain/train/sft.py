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
from posttrain.config import ConfigValueError, save_config, to_dict
from posttrain.errors import UserError
from posttrain.models.hf import ModelConfig, load_model, load_tokenizer, quiet_transformers
from posttrain.tracking import LoggingConfig, MetricsLogger, latest_checkpoint, progress_bar
from posttrain.train.checkpoint import load_trainer_state, restore_weights, save_checkpoint
from posttrain.train.optim import (OptimConfig, build_optimizer, build_scheduler, clip_gradients, rng_state,
                                   seed_everything, set_rng_state)


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
    """Micro-batches per optimizer step."""
    precision: str = "fp32"
    """fp32, or bf16 (autocast; master weights stay in the model dtype)."""
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
    """Thin: one optimizer step over a list of micro-batches; eval loss without gradients."""

    def __init__(self, model, optimizer, scheduler, *, grad_clip: float, precision: str = "fp32"):
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.grad_clip, self.precision = grad_clip, precision
        self.device = next(model.parameters()).device

    def _batch_nll(self, batch):
        b = batch.to(self.device) if hasattr(batch, "to") else batch
        with autocast(self.precision, self.device):
            out = self.model(**b.model_inputs())
        mask_BT = b.labels_BT != -100
        return sft_token_nll(out.logits.float(), b.labels_BT, mask_BT), mask_BT

    def train_step(self, micro_batches) -> dict:
        self.model.train()
        total_tokens = sum(b.num_loss_tokens for b in micro_batches)
        loss_sum = torch.zeros(())
        for b in micro_batches:
            nll_BT, mask_BT = self._batch_nll(b)
            loss = AGGREGATIONS["token_mean"](nll_BT, mask_BT, global_num_tokens=total_tokens)
            loss.backward()
            loss_sum += loss.detach().cpu()
        grad_norm = clip_gradients(self.model.parameters(), self.grad_clip)
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return {"loss": float(loss_sum), "grad_norm": float(grad_norm), "lr": lr}

    @torch.no_grad()
    def eval_loss(self, batches) -> float:
        self.model.eval()
        nll_sum, count = 0.0, 0
        for b in batches:
            nll_BT, mask_BT = self._batch_nll(b)
            nll_sum += float(nll_BT.sum())
            count += int(mask_BT.sum())
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

    def micro_batch(self, i: int):
        from posttrain.data.packing import collate

        epoch = 0
        while i >= len(self._epoch(epoch)):
            i -= len(self._epoch(epoch))
            epoch += 1
        return collate(self.examples, self._epoch(epoch)[i], pack=self.pack, seq_len=self.seq_len,
                       pad_id=self.pad_id)

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
    """Train (or resume) SFT; returns a summary with the final losses and checkpoint path."""
    from posttrain.models.hf import check_model_path

    quiet_transformers()
    seed_everything(cfg.seed)
    check_model_path(cfg.model.path)
    tokenizer = load_tokenizer(cfg.model.path)
    train = load_sft_data(cfg.data, tokenizer, cfg.data.path)
    held_out = load_sft_data(cfg.data, tokenizer, cfg.data.eval_path)[: cfg.data.eval_max_examples] \
        if cfg.data.eval_path else []
    model = load_model(cfg.model)
    optimizer = build_optimizer(model.parameters(), cfg.optim)
    trainer = SFTTrainer(model, optimizer, build_scheduler(optimizer, cfg.optim, cfg.num_steps),
                         grad_clip=cfg.optim.grad_clip, precision=cfg.precision)
    seq_len = cfg.data.max_len
    stream = BatchStream(train, pack=cfg.data.pack, tokens_per_batch=cfg.data.tokens_per_batch,
                         seq_len=seq_len, seed=cfg.seed, pad_id=tokenizer.pad_token_id)
    eval_batches = BatchStream(held_out, pack=cfg.data.pack, tokens_per_batch=cfg.data.tokens_per_batch,
                               seq_len=seq_len, seed=cfg.seed, pad_id=tokenizer.pad_token_id).all_batches() if held_out else []
    accuracy = _accuracy_probe(cfg, tokenizer) if cfg.eval_generate else None
    run_dir = Path(cfg.out_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    start = _maybe_resume(cfg, run_dir, trainer, printer)
    save_config(cfg, run_dir / "config.yaml")
    logger = MetricsLogger(run_dir, cfg.logging, resume_step=start, config_dict=to_dict(cfg))
    summary = _train_loop(cfg, trainer, stream, eval_batches, logger, tokenizer, run_dir, start, accuracy)
    logger.close()
    return summary


def _maybe_resume(cfg: SFTConfig, run_dir: Path, trainer: SFTTrainer, printer) -> int:
    ckpt = latest_checkpoint(run_dir) if cfg.resume else None
    if ckpt is None:
        return 0
    state = load_trainer_state(ckpt)
    restore_weights(trainer.model, ckpt)
    trainer.optimizer.load_state_dict(state["optimizer"])
    trainer.scheduler.load_state_dict(state["scheduler"])
    set_rng_state(state["rng"])
    printer(f"resumed from {ckpt} (step {state['step']})")
    return state["step"]


def _accuracy_probe(cfg: SFTConfig, tokenizer):
    """``probe(model) -> accuracy``: greedy decoding of the first held-out prompts, judged by a verifier."""
    from posttrain.data.chat import encode_prompt
    from posttrain.data.records import load_records
    from posttrain.rl.evaluate import evaluate
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


def _train_loop(cfg, trainer, stream, eval_batches, logger, tokenizer, run_dir, start, accuracy=None) -> dict:
    summary: dict = {"run_dir": str(run_dir)}
    with progress_bar(cfg.logging.progress) as bar:
        task = bar.add_task("sft", total=cfg.num_steps, completed=start, info="")
        for step in range(start + 1, cfg.num_steps + 1):
            t0 = time.perf_counter()
            first = (step - 1) * cfg.grad_accum
            micro = [stream.micro_batch(first + j) for j in range(cfg.grad_accum)]
            metrics = trainer.train_step(micro)
            dt = time.perf_counter() - t0
            real = sum(b.num_real_tokens for b in micro)
            metrics |= {"step": step, "time/step_s": dt, "tokens_per_s": real / dt, "tokens": real}
            last = step == cfg.num_steps
            if eval_batches and (last or cfg.eval_every and step % cfg.eval_every == 0):
                metrics["eval/loss"] = trainer.eval_loss(eval_batches)
                if accuracy is not None:
                    metrics["eval/heldout/greedy/pass@1"] = accuracy(trainer.model)
            logger.log(metrics)
            if last or cfg.save_every and step % cfg.save_every == 0:
                state = {"step": step, "optimizer": trainer.optimizer.state_dict(),
                         "scheduler": trainer.scheduler.state_dict(), "rng": rng_state()}
                summary["checkpoint"] = str(save_checkpoint(run_dir, step, trainer.model, tokenizer, state,
                                                            cfg.keep_last))
            bar.update(task, advance=1, info=f"loss {metrics['loss']:.3f} {metrics['tokens_per_s']:.0f} tok/s")
            summary |= {k: metrics[k] for k in ("loss", "eval/loss", "eval/heldout/greedy/pass@1") if k in metrics}
    return summary
