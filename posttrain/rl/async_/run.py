"""``run_async``: the async counterpart of `posttrain.rl.loop.run_rl`.

One step, top to bottom (the engine keeps generating in its own process throughout):

    take P buffered groups (wait only if the bound forces it) -> staleness metrics
    -> learn (rewards, trainer log-probs, advantages, IS correction vs the sampler, update),
       while a thread receives, judges and admits groups (`AsyncController.while_training`)
    -> push weights v+1 (queued; acknowledged and checked later) -> admit new requests

Everything after generation is the sync loop's own `learn`, so sync and async differ only in who
calls ``generate`` and when. A checkpoint adds the ledger and the buffered groups; requests in flight
go back to pending on resume. An engine that hangs or dies for good stops the run with a
checkpoint of the last finished step and an error that names what failed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time

import torch

from posttrain.core.checkpoint import load_trainer_state
from posttrain.core.loop import Plan, drive, open_run
from posttrain.errors import UserError
from posttrain.models.hf import model_folder
from posttrain.envs.trajectory import episode_metrics
from posttrain.rl.async_.controller import AsyncController, groups_to_rollouts
from posttrain.rollout.protocol import EngineError
from posttrain.rollout.types import WeightSyncError
from posttrain.rl.async_.selftest import self_test
from posttrain.rl.async_.worker import ProcessEngine
from posttrain.rl.config import RLConfig
from posttrain.rl.diagnostics import Watchdog
from posttrain.rl.engines import http_engine, ray_engines
from posttrain.rl.loop import (checkpoint, held_out_eval, learn, maybe_resume, resume_point, setup,
                               share_step, sync_weights, tokens_so_far)
from posttrain.tracking import StageTimer


def split_threads(cfg: RLConfig) -> tuple[int, int]:
    """(engine, trainer) torch threads: by default the engine gets half the cores, the trainer the rest."""
    cores = os.cpu_count() or 2
    engine = cfg.asynchrony.engine_threads or max(1, cores // 2)
    trainer = cfg.asynchrony.trainer_threads or max(1, cores - engine)
    return engine, trainer


def start_engine(cfg: RLConfig, tokenizer, printer=print):
    """The engine process, or with runtime=ray the engine replicas (`posttrain.distributed.engines`),
    or with rollout.backend=openai|vllm|sglang a client of the servers (`posttrain.rollout.http`)."""
    if cfg.runtime == "ray":
        return ray_engines(cfg, printer)
    if cfg.rollout.backend != "torch":
        return http_engine(cfg, tokenizer, printer)
    engine_threads, _ = split_threads(cfg)
    return ProcessEngine(model_folder(cfg.model.path), dtype=cfg.rollout.engine_dtype, device=cfg.model.device,
                         threads=engine_threads, timeout_s=cfg.asynchrony.timeout_s,
                         max_restarts=cfg.asynchrony.max_engine_restarts, printer=printer)


def save(run, ctl: AsyncController | None, step: int) -> None:
    """Every rank calls it (the checkpoint is a collective); rank 0 adds the controller's state."""
    checkpoint(run, step, extra={"async": ctl.state_dict() if ctl is not None else None})
    if ctl is None:
        return
    tmp = run.run_dir / "ledger.json.tmp"
    tmp.write_text(json.dumps(ctl.ledger.summary()))
    tmp.replace(run.run_dir / "ledger.json")


def one_step(run, ctl: AsyncController | None, step: int, timer: StageTimer) -> dict:
    """Under torchrun the controller lives on rank 0 (``ctl`` is None on the others): it takes the
    step's groups and hands every rank all of them; each rank trains its own (`learn`)."""
    groups, info = share_step(run, lambda: _take(run, ctl, step))
    if not groups:
        return {"update/skipped": 1, "dynamic_sampling/starved": 1, "tokens/generated": 0} | info
    ro, outcomes, episode_of_row = groups_to_rollouts(groups, run.cfg.rollout.group_size)
    during = ctl.while_training() if ctl is not None else contextlib.nullcontext()
    metrics = learn(run, step, timer, ro, outcomes, info, episode_of_row, during=during)

    def refill() -> dict:
        ctl.fill()
        return metrics | ctl.overlap

    return share_step(run, refill)  # every rank logs and checks the same row: rank 0's


def _take(run, ctl: AsyncController, step: int) -> tuple[list, dict]:
    """Rank 0: the step's groups (their episodes, which stay here, reduced to env/* metrics) and
    the step's async metrics."""
    groups = ctl.take(step)
    info = ctl.step_metrics(groups)  # staleness against the version that trains on them
    if groups:  # rank 0's engine (or the engines apart it drives) generates every group
        info |= {"dynamic_sampling/rounds": 1, "rollout/generating_ranks": 1}
    if run.env is not None and groups:
        info |= episode_metrics([e for g in groups for e in g.episodes])
        groups = [dataclasses.replace(g, episodes=None) for g in groups]
    return groups, info


def run_async(cfg: RLConfig, printer=print) -> dict:
    """Run (or resume) async RL; returns the last step's metrics."""
    run = setup(cfg)
    threads = torch.get_num_threads()
    torch.set_num_threads(split_threads(cfg)[1])
    run.run_dir.mkdir(parents=True, exist_ok=True)
    # under torchrun, rank 0 alone holds the engine (or the client of engines apart) and the controller
    started = {}

    def start() -> None:
        started["engine"] = start_engine(cfg, run.tokenizer, printer)

    share_step(run, start)  # an engine that cannot start stops every rank
    run.engine = engine = started.get("engine")
    try:
        if cfg.rollout.backend != "torch" and resume_point(cfg) is None:  # a resume sends its checkpoint's
            sync_weights(run, version=0)  # servers confirm they hold exactly the starting weights
        return _train(run, engine, printer)
    finally:
        if engine is not None:
            engine.close()
        torch.set_num_threads(threads)


def _train(run, engine, printer) -> dict:
    cfg = run.cfg
    saved = load_trainer_state(resume_point(cfg)) if resume_point(cfg) is not None else None
    if saved is not None and "async" not in saved:  # every rank, before any of them waits on another
        raise UserError(f"{resume_point(cfg)}: written by a sync run; an async run resumes only its own "
                        f"checkpoints (use a new out_dir, or mode=sync)")
    start = maybe_resume(run, printer)
    ctl = AsyncController(run, engine) if run.world.main else None
    if start and ctl is not None:
        ctl.load_state_dict(saved["async"])
    logger = open_run(run.run_dir, cfg, start, run.world)
    first = self_test(run, engine) if cfg.asynchrony.self_test else {}
    if first:
        printer(f"async self-test passed: mismatch KL {first['selftest/mismatch_kl']:.1e}, "
                f"IS ratio {first['selftest/is_ratio_mean']:.4f}, weight sync reached the engine")
    first |= held_out_eval(run) if start == 0 else {}
    if first and start == 0 and run.world.main:
        logger.log({"step": 0, "tokens/total": 0, **first})
    watchdog = Watchdog(printer, zero_variance_warning=cfg.algorithm != "ppo")
    done, tokens = start, tokens_so_far(run, start)

    def step(n: int, timer: StageTimer) -> dict:
        nonlocal done, tokens
        t0 = time.perf_counter()
        metrics = one_step(run, ctl, n, timer)
        done, tokens = n, tokens + metrics["tokens/generated"]
        return metrics | {"policy_version": run.version, "tokens/total": tokens,
                          "tokens_per_s": metrics["tokens/generated"] / (time.perf_counter() - t0)}

    plan = Plan("rl-async", cfg.num_steps, start, cfg.eval_every, cfg.save_every, cfg.logging.progress)
    try:
        last = drive(plan, step, logger=logger, save=lambda n: save(run, ctl, n), evaluate=lambda: held_out_eval(run),
                     check=watchdog.check, world=run.world,
                     describe=lambda m: f"reward {m.get('reward/mean', float('nan')):.3f} "
                                        f"stale {m['async/staleness_mean']:.2f} idle {m['time/trainer_idle_s']:.2f}s")
    except (EngineError, WeightSyncError):  # a refused weight acknowledgement ends the run like a death
        save(run, ctl, done)
        printer(f"the rollout engine failed; saved a checkpoint at step {done} (re-run to resume)")
        raise
    finally:
        if logger is not None:
            logger.close()
    if ctl is not None and ctl.failure is not None:  # during the last step: every step trained, nothing is lost
        printer(f"WARNING [engine_failed] the rollout engine failed during the last step, after its groups "
                f"were generated; the run is complete ({ctl.failure})")
    return last or first
