"""Run directories, metrics logging, stage timers and progress bars shared by every trainer.

A run directory holds ``config.yaml`` (the resolved config), ``metrics.jsonl`` (one JSON object per
step, always written and flushed each step), ``checkpoints/step-N/`` and whatever the stage adds
(RL: ``samples.jsonl``, some rollouts of each step). The per-step JSON-lines files (`STEP_LOGS`)
are removed when a run starts afresh and cut back to the checkpoint's step on resume, so a killed
run's steps past its checkpoint appear once, as the resumed run redoes them.
TensorBoard and Weights & Biases are opt-in mirrors of metrics.jsonl and never required.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import math
import os
import time
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from posttrain.config import ConfigValueError
from posttrain.errors import UserError


@dataclasses.dataclass(kw_only=True)
class LoggingConfig:
    tensorboard: bool = False
    """Also write TensorBoard event files under the run directory (needs `tensorboard`)."""
    wandb_project: str = ""
    """Also log to this Weights & Biases project (needs `wandb` and a login); empty = off."""
    progress: bool = True
    """Show a progress bar on the terminal."""

    def __post_init__(self):
        if self.wandb_project and " " in self.wandb_project:
            raise ConfigValueError("wandb_project", "must not contain spaces")


SAMPLES_FILE = "samples.jsonl"
"""RL's rollouts of each step, one JSON object per rollout with its ``step`` (`posttrain.rl.diagnostics`)."""
STEP_LOGS = ("metrics.jsonl", SAMPLES_FILE)
"""The run directory's files of one JSON object per line, each with its ``step``."""


def restart_step_logs(run_dir: str | Path, resume_step: int) -> None:
    """A fresh run (``resume_step`` 0) removes the step logs an earlier run left in ``run_dir``;
    a resumed one drops their lines logged after the checkpoint, so no step is there twice."""
    for path in (Path(run_dir) / name for name in STEP_LOGS):
        if not resume_step:
            path.unlink(missing_ok=True)
        elif path.exists():
            kept = [line for line in path.read_text().splitlines()
                    if line.strip() and json.loads(line).get("step", 0) <= resume_step]
            path.write_text("".join(line + "\n" for line in kept))


class MetricsLogger:
    """Appends one JSON line per step to ``metrics.jsonl``; mirrors to TensorBoard / W&B if asked."""

    def __init__(self, run_dir: str | Path, cfg: LoggingConfig | None = None, *, resume_step: int = 0,
                 config_dict: dict | None = None):
        self.path = Path(run_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        restart_step_logs(run_dir, resume_step)
        self._file = self.path.open("a")
        cfg = cfg or LoggingConfig()
        self._tb = self._wandb = None
        if cfg.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(Path(run_dir) / "tensorboard"))
        if cfg.wandb_project:
            import wandb

            self._wandb = wandb.init(project=cfg.wandb_project, dir=str(run_dir), config=config_dict)

    def log(self, metrics: dict) -> None:
        clean = {k: _jsonable(v) for k, v in metrics.items()}
        self._file.write(json.dumps(clean) + "\n")
        self._file.flush()
        step = int(clean.get("step", 0))
        if self._tb is not None:
            for k, v in clean.items():
                if isinstance(v, (int, float)) and k != "step":
                    self._tb.add_scalar(k, v, step)
        if self._wandb is not None:
            self._wandb.log(clean, step=step)

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


def _jsonable(v):
    if hasattr(v, "item") and getattr(v, "numel", lambda: 1)() == 1:
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return v


def read_metrics(run_dir: str | Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class StageTimer:
    """``with timer("rollout"): ...`` accumulates seconds per stage; ``pop()`` returns time/<stage>_s."""

    def __init__(self):
        self._acc: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, stage: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._acc[stage] = self._acc.get(stage, 0.0) + time.perf_counter() - t0

    def pop(self) -> dict[str, float]:
        out = {f"time/{k}_s": v for k, v in self._acc.items()}
        self._acc = {}
        return out


PROGRESS_EVERY_ENV = "POSTTRAIN_PROGRESS_EVERY_S"
"""Seconds between the plain progress lines printed off a terminal (default 30)."""


def progress_bar(enabled: bool = True) -> Progress:
    """A rich progress bar with steps, ETA and a free-form ``info`` field (loss, tokens/s...). Off a
    terminal it prints a plain line instead (`PlainLines`)."""
    return PlainLines(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(), TextColumn("{task.fields[info]}"),
        disable=not enabled, transient=False, every_s=progress_every_s(),
    )


def progress_every_s() -> float:
    raw = os.environ.get(PROGRESS_EVERY_ENV, "30")
    try:
        every = float(raw)
    except ValueError:
        every = -1.0
    if not every > 0:
        raise UserError(f"${PROGRESS_EVERY_ENV}: expected seconds > 0, got {raw!r}")
    return every


class PlainLines(Progress):
    """rich's `Progress`, and off a terminal (output to a file: nohup, a cluster's log), where rich
    draws nothing until the bar stops, one plain line per running task at most every ``every_s``
    seconds, when the bar is updated: ``rl 12/40 0:01:23 eta 0:03:10 reward 0.120``."""

    def __init__(self, *columns, every_s: float = 30.0, **kwargs):
        super().__init__(*columns, **kwargs)
        self.every_s = every_s
        self._said = time.monotonic()

    def update(self, task_id, **kwargs) -> None:
        super().update(task_id, **kwargs)
        self._say()

    def advance(self, task_id, advance: float = 1) -> None:
        super().advance(task_id, advance)
        self._say()

    def _say(self) -> None:
        if self.disable or self.console.is_terminal or time.monotonic() - self._said < self.every_s:
            return
        self._said = time.monotonic()
        for task in self.tasks:
            if task.visible and not task.finished:
                self.console.print(plain_line(task), markup=False, highlight=False, soft_wrap=True)


def plain_line(task) -> str:
    """One rich task as text: description, done/total, elapsed, eta, info."""
    clock = lambda s: "-:--:--" if s is None else str(datetime.timedelta(seconds=int(s)))  # noqa: E731
    done = f"{task.completed:g}/{task.total:g}" if task.total is not None else f"{task.completed:g}"
    eta = f" eta {clock(task.time_remaining)}" if task.total is not None else ""
    info = task.fields.get("info", "")
    return f"{task.description} {done} {clock(task.elapsed)}{eta}{' ' + info if info else ''}"


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete ``checkpoints/step-N``; a save killed half-way leaves ``step-N.tmp``, skipped."""
    ckpts = sorted((p for p in (Path(run_dir) / "checkpoints").glob("step-*") if p.name[5:].isdigit()),
                   key=lambda p: int(p.name[5:]))
    complete = [p for p in ckpts if (p / "trainer_state.pt").exists()]
    return complete[-1] if complete else None
