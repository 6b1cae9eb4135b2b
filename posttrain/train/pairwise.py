"""The training loop shared by the pairwise trainers (`posttrain rm`, `posttrain dpo`).

A trainer supplies only ``loss_fn(batch) -> (loss_B, metrics)`` (per pair, with gradient) and
``eval_fn() -> metrics``; this module does the rest the same way for both, on the training core
(`posttrain.core`): seeded batches of pairs (`posttrain.data.preference.batch_indices`, a pure
function of (seed, step), so resuming replays exactly the batches an uninterrupted run would have
seen), micro-batches whose losses are divided by the *whole* step's pair count (accumulation and
sharding give the gradient of one big batch), clipping, AdamW + schedule, metrics.jsonl with stage
timers, checkpoints and resume.

Under torchrun the model is sharded with FSDP2 and each rank takes a contiguous block of every
step's ``batch_pairs`` (blocks differ by at most a pair; a rank with fewer micro-batches than its
peers runs placeholders that weigh nothing), so the global batch, and with global denominators the
update, is the same at any world size. Forward passes that are not
training (held-out metrics, DPO's reference log-probs) are split over the ranks by whole batches
and gathered, so every rank ends with the same numbers; rank 0 writes the metrics.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable

import torch

from posttrain.config import ConfigValueError
from posttrain.core.checkpoint import load_checkpoint, save_checkpoint
from posttrain.core.dist import World, current_world, init_world, shard_range
from posttrain.core.loop import Plan, drive, open_run
from posttrain.core.optim import OptimConfig, build_optimizer, build_scheduler
from posttrain.core.trainer import TrainCore, share_of_step
from posttrain.data.preference import PairBatch, PreferenceDataConfig, TokenizedPair, batch_indices, collate_pairs
from posttrain.errors import UserError
from posttrain.models.hf import ModelConfig
from posttrain.tracking import LoggingConfig, StageTimer, latest_checkpoint

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
    """Pairs per optimizer step, over all ranks (under torchrun each takes a contiguous block of them)."""
    micro_batch_pairs: int = 16
    """Pairs per forward/backward on one rank (memory knob; does not change the math)."""
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


def pairwise_world(cfg: PairwiseConfig) -> World:
    """This process's `World` (joining torchrun's process group)."""
    return init_world(cfg.model.device)


@dataclasses.dataclass
class PairwiseRun:
    """What the loop needs; ``cfg`` is an `RMConfig` or a `DPOConfig`, ``model`` already sharded."""

    cfg: PairwiseConfig
    model: torch.nn.Module
    tokenizer: object
    train: list[TokenizedPair]
    loss_fn: LossFn
    eval_fn: Callable[[], dict]
    name: str
    world: World = dataclasses.field(default_factory=current_world)


def micro_batches(run: PairwiseRun, indices: list[int], count: int, placeholder: int):
    """``(live, batch)``: ``indices`` in ``count`` micro-batches of at most ``micro_batch_pairs``; past
    the last of them, placeholders (``live`` false) of the pair ``placeholder``, for a rank whose block
    is shorter than its peers' (sharded forwards run in lock step)."""
    size = run.cfg.micro_batch_pairs
    for k in range(count):
        chunk = indices[k * size: (k + 1) * size]
        yield bool(chunk), collate_pairs(run.train, chunk or [placeholder], run.tokenizer.pad_token_id)


def train_step(run: PairwiseRun, core: TrainCore, indices: list[int]) -> dict:
    """One optimizer step over the step's global ``indices`` (this rank runs its block of them);
    metrics are pair-weighted means over the whole step."""
    total, block = len(indices), shard_range(len(indices), core.world)
    mine = indices[block.start: block.stop]
    count = core.world.all_reduce(-(-len(mine) // run.cfg.micro_batch_pairs), "max")  # the most any rank needs

    def loss_fn(item):
        live, batch = item
        loss_B, metrics = run.loss_fn(batch)
        share = batch.num_pairs / total
        loss = loss_B.sum() / total
        return loss if live else loss * 0.0, {k: share_of_step(k, float(v), share, live) for k, v in metrics.items()}

    return core.step(micro_batches(run, mine, count, placeholder=indices[0]), loss_fn)


def _maybe_resume(run: PairwiseRun, core: TrainCore, run_dir: Path, printer) -> int:
    ckpt = latest_checkpoint(run_dir) if run.cfg.resume else None
    if ckpt is None:
        return 0
    if not (ckpt / "dcp").is_dir():
        raise UserError(f"{ckpt}: no dcp/ folder (written by an earlier version of this trainer, which "
                        "cannot be resumed); use a new out_dir or resume=false")
    state = load_checkpoint(ckpt, trainables={"model": (core.model, core.optimizer)}, world=core.world)
    core.scheduler.load_state_dict(state["scheduler"])
    if core.world.main:
        printer(f"resumed from {ckpt} (step {state['step']})")
    return state["step"]


def run_pairwise(run: PairwiseRun, printer=print) -> dict:
    """Train (or resume) to ``cfg.num_steps``; returns the last metrics and the checkpoint path.

    Every rank calls it; the optimizer is built here, on the (sharded) model's parameters.
    """
    cfg, world = run.cfg, run.world
    optimizer = build_optimizer(run.model.parameters(), cfg.optim)
    core = TrainCore(run.model, optimizer, build_scheduler(optimizer, cfg.optim, cfg.num_steps),
                     grad_clip=cfg.optim.grad_clip, world=world)
    run_dir = Path(cfg.out_dir)
    start = _maybe_resume(run, core, run_dir, printer)
    logger = open_run(run_dir, cfg, start, world)
    try:
        return _train_loop(run, core, logger, run_dir, start)
    finally:
        if logger is not None:
            logger.close()


def _train_loop(run: PairwiseRun, core: TrainCore, logger, run_dir: Path, start: int) -> dict:
    cfg, world = run.cfg, core.world
    summary: dict = {"run_dir": str(run_dir)}
    if start == 0:
        timer = StageTimer()
        with timer("eval"):
            first = run.eval_fn()
        if world.main:
            logger.log({"step": 0, **first} | timer.pop())

    def step(n: int, timer) -> dict:
        with timer("update"):
            return train_step(run, core, batch_indices(len(run.train), cfg.batch_pairs, cfg.seed, n - 1))

    def save(n: int) -> None:
        state = {"step": n, "scheduler": core.scheduler.state_dict()}
        summary["checkpoint"] = str(save_checkpoint(
            run_dir, n, trainables={"model": (core.model, core.optimizer)}, export_model=core.model,
            tokenizer=run.tokenizer, state=state, keep_last=cfg.keep_last, world=world))

    plan = Plan(run.name, cfg.num_steps, start, cfg.eval_every, cfg.save_every, cfg.logging.progress)
    last = drive(plan, step, logger=logger, save=save, evaluate=run.eval_fn, world=world,
                 describe=lambda m: f"loss {m['loss']:.3f}")
    return summary | last




def eval_in_batches(pairs: list[TokenizedPair], batch_pairs: int, pad_id: int, fn, world: World | None = None) -> list:
    """``fn(batch)`` over all ``pairs`` in order, without gradients, in batches of ``batch_pairs``.

    The batches are those of one process at any world size. Sharded, each rank runs a contiguous
    block of them and every rank gets all the results (``fn`` returns small CPU objects); a rank
    whose block is shorter repeats a one-pair batch, discarded, so that every rank runs the same
    number of forwards (a sharded model's forward is a collective).
    """
    world = world or current_world()
    starts = list(range(0, len(pairs), batch_pairs))
    per = -(-len(starts) // world.world_size)
    mine = starts[world.rank * per: (world.rank + 1) * per]
    out = []
    with torch.no_grad():
        for i in range(per):
            if i < len(mine):
                out.append(fn(collate_pairs(pairs, list(range(mine[i], min(mine[i] + batch_pairs, len(pairs)))), pad_id)))
            else:
                fn(collate_pairs(pairs, [0], pad_id))
    if not world.distributed:
        return out
    return [x for part in world.all_gather_object(out) for x in part]
