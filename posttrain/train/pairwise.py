"""The training loop shared by the pairwise trainers (`posttrain rm`, `posttrain dpo`).

A trainer supplies only ``loss_fn(batch) -> (loss_B, metrics)`` (per pair, with gradient) and
``eval_fn() -> metrics``; this module does the rest the same way for both: seeded batches of
pairs (`posttrain.data.preference.batch_indices`, a pure function of (seed, step), so resuming
replays exactly the batches an uninterrupted run would have seen), micro-batches whose losses are
divided by the *whole* step's pair count (accumulation gives the gradient of one big batch),
clipping, AdamW + schedule, metrics.jsonl with stage timers, checkpoints and resume.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Callable

import torch

from posttrain.config import ConfigValueError, save_config, to_dict
from posttrain.data.preference import PairBatch, PreferenceDataConfig, TokenizedPair, batch_indices, collate_pairs
from posttrain.models.hf import ModelConfig
from posttrain.tracking import LoggingConfig, MetricsLogger, StageTimer, latest_checkpoint, progress_bar
from posttrain.train.checkpoint import load_trainer_state, restore_weights, save_checkpoint
from posttrain.train.optim import (OptimConfig, build_optimizer, build_scheduler, clip_gradients, rng_state,
                                   set_rng_state)

LossFn = Callable[[PairBatch], tuple[torch.Tensor, dict]]


@dataclasses.dataclass(kw_only=True)
class PairwiseConfig:
    """The fields every pairwise trainer shares; `RMConfig` and `DPOConfig` add their own."""

    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    """The model to train (LoRA or full)."""
    data: PreferenceDataConfig = dataclasses.field(default_factory=PreferenceDataConfig)
    """Training and held-out pairs."""
    optim: OptimConfig = dataclasses.field(default_factory=lambda: OptimConfig(lr=1e-4, warmup_steps=5))
    """Optimizer and schedule."""
    logging: LoggingConfig = dataclasses.field(default_factory=LoggingConfig)
    """Mirrors of metrics.jsonl."""
    num_steps: int = 200
    """Optimizer steps."""
    batch_pairs: int = 16
    """Pairs per optimizer step."""
    micro_batch_pairs: int = 16
    """Pairs per forward/backward (memory knob; does not change the math)."""
    eval_every: int = 50
    """Held-out metrics every N steps (and at step 0 and the end); 0 = start and end only."""
    save_every: int = 100
    """Checkpoint every N steps (and at the end); 0 = only at the end."""
    keep_last: int = 2
    """Checkpoints to keep."""
    seed: int = 0
    """Seed of the pair order (and of a new head's init)."""
    out_dir: str = "runs/pairwise"
    """Run directory: config.yaml, metrics.jsonl, checkpoints/step-N/."""
    resume: bool = True
    """Continue from the last checkpoint in out_dir when there is one."""

    def __post_init__(self):
        for key in ("num_steps", "batch_pairs", "micro_batch_pairs"):
            if getattr(self, key) < 1:
                raise ConfigValueError(key, "must be >= 1")


@dataclasses.dataclass
class PairwiseRun:
    """What the loop needs; ``cfg`` is an `RMConfig` or a `DPOConfig`."""

    cfg: PairwiseConfig
    model: torch.nn.Module
    tokenizer: object
    train: list[TokenizedPair]
    loss_fn: LossFn
    eval_fn: Callable[[], dict]
    name: str


def micro_batches(run: PairwiseRun, indices: list[int]):
    size = run.cfg.micro_batch_pairs
    for start in range(0, len(indices), size):
        yield collate_pairs(run.train, indices[start: start + size], run.tokenizer.pad_token_id)


def train_step(run: PairwiseRun, optimizer, scheduler, indices: list[int]) -> dict:
    """One optimizer step over ``indices``; metrics are pair-weighted means over the step."""
    run.model.train()
    total = len(indices)
    sums: dict[str, float] = {"loss": 0.0}
    for batch in micro_batches(run, indices):
        loss_B, metrics = run.loss_fn(batch)
        loss = loss_B.sum() / total
        loss.backward()
        sums["loss"] += float(loss.detach())
        share = batch.num_pairs / total
        for k, v in metrics.items():
            sums[k] = sums.get(k, 0.0) + float(v) * share
    grad_norm = clip_gradients(run.model.parameters(), run.cfg.optim.grad_clip)
    lr = optimizer.param_groups[0]["lr"]
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return sums | {"grad_norm": float(grad_norm), "lr": lr}


def resume(run: PairwiseRun, optimizer, scheduler, run_dir: Path, printer) -> int:
    ckpt = latest_checkpoint(run_dir) if run.cfg.resume else None
    if ckpt is None:
        return 0
    state = load_trainer_state(ckpt)
    restore_weights(run.model, ckpt)
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    set_rng_state(state["rng"])
    printer(f"resumed from {ckpt} (step {state['step']})")
    return state["step"]


def run_pairwise(run: PairwiseRun, printer=print) -> dict:
    """Train (or resume) to ``cfg.num_steps``; returns the last metrics and the checkpoint path."""
    cfg = run.cfg
    optimizer = build_optimizer(run.model.parameters(), cfg.optim)
    scheduler = build_scheduler(optimizer, cfg.optim, cfg.num_steps)
    run_dir = Path(cfg.out_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    start = resume(run, optimizer, scheduler, run_dir, printer)
    save_config(cfg, run_dir / "config.yaml")
    logger = MetricsLogger(run_dir, cfg.logging, resume_step=start, config_dict=to_dict(cfg))
    timer, summary = StageTimer(), {"run_dir": str(run_dir)}
    if start == 0:
        with timer("eval"):
            first = run.eval_fn()
        logger.log({"step": 0, **first} | timer.pop())
    with progress_bar(cfg.logging.progress) as bar:
        task = bar.add_task(run.name, total=cfg.num_steps, completed=start, info="")
        for step in range(start + 1, cfg.num_steps + 1):
            t0 = time.perf_counter()
            with timer("update"):
                metrics = train_step(run, optimizer, scheduler,
                                     batch_indices(len(run.train), cfg.batch_pairs, cfg.seed, step - 1))
            last = step == cfg.num_steps
            if last or cfg.eval_every and step % cfg.eval_every == 0:
                with timer("eval"):
                    metrics |= run.eval_fn()
            metrics |= timer.pop() | {"step": step, "time/step_s": time.perf_counter() - t0}
            logger.log(metrics)
            if last or cfg.save_every and step % cfg.save_every == 0:
                state = {"step": step, "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                         "rng": rng_state()}
                summary["checkpoint"] = str(save_checkpoint(run_dir, step, run.model, run.tokenizer, state,
                                                            cfg.keep_last))
            bar.update(task, advance=1, info=f"loss {metrics['loss']:.3f}")
            summary |= metrics
    logger.close()
    return summary


def eval_in_batches(pairs: list[TokenizedPair], batch_pairs: int, pad_id: int, fn) -> list:
    """``fn(batch)`` over all ``pairs`` in order, without gradients, in batches of ``batch_pairs``."""
    out = []
    with torch.no_grad():
        for start in range(0, len(pairs), batch_pairs):
            out.append(fn(collate_pairs(pairs, list(range(start, min(start + batch_pairs, len(pairs)))), pad_id)))
    return out
