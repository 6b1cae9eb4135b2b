"""The one driver loop: step, evaluate when due, log, checkpoint when due, show progress.

Every trainer (SFT, reward model, DPO, RL sync and async, distillation) runs its steps through
`drive`; what differs is the ``step`` function it passes. Side effects that must happen once
(metrics.jsonl, the progress bar) happen on rank 0 only; evaluation and saving run on every rank,
because a sharded model's forward and its checkpoint are collectives.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable

from posttrain.core.dist import World, current_world
from posttrain.tracking import StageTimer, progress_bar


@dataclasses.dataclass
class Plan:
    """When things happen: steps ``start + 1 .. num_steps``, eval and save every N (and at the end)."""

    name: str
    num_steps: int
    start: int = 0
    eval_every: int = 0
    save_every: int = 0
    progress: bool = True

    def due(self, every: int, step: int) -> bool:
        return step == self.num_steps or bool(every) and step % every == 0


def drive(plan: Plan, step: Callable[[int, StageTimer], dict], *, logger, save: Callable[[int], object],
          evaluate: Callable[[], dict] | None = None, describe: Callable[[dict], str] = lambda m: "",
          check: Callable[[int, dict], None] | None = None, stop: Callable[[int, dict], bool] | None = None,
          world: World | None = None) -> dict:
    """Run the plan; returns the last step's metrics.

    ``step(n, timer)`` returns the step's metrics; ``evaluate()`` held-out metrics when due;
    ``save(n)`` writes a checkpoint; ``check(n, metrics)`` is a watchdog; ``stop(n, metrics)`` ends
    the run early (the step that stops is evaluated and saved as a last step).
    """
    world = world or current_world()
    timer, last = StageTimer(), {}
    with progress_bar(plan.progress and world.main) as bar:
        task = bar.add_task(plan.name, total=plan.num_steps, completed=plan.start, info="")
        for n in range(plan.start + 1, plan.num_steps + 1):
            t0 = time.perf_counter()
            metrics = step(n, timer)
            final = n == plan.num_steps or (stop is not None and stop(n, metrics))
            if evaluate is not None and (final or plan.due(plan.eval_every, n)):
                with timer("eval"):
                    metrics |= evaluate()
            metrics |= timer.pop()
            metrics["time/step_s"] = time.perf_counter() - t0
            if world.main:
                logger.log({"step": n, **metrics})
            if check is not None:
                check(n, metrics)
            if final or plan.due(plan.save_every, n):
                save(n)
            bar.update(task, advance=1, info=describe(metrics))
            last = metrics
            if final:
                break
    return last


def open_run(run_dir, cfg, start: int, world: World):
    """Rank 0: create the run directory, write config.yaml, open metrics.jsonl; other ranks: None."""
    from pathlib import Path

    from posttrain.config import save_config, to_dict
    from posttrain.tracking import MetricsLogger

    if not world.main:
        return None
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    save_config(cfg, run_dir / "config.yaml")
    return MetricsLogger(run_dir, cfg.logging, resume_step=start, config_dict=to_dict(cfg))
