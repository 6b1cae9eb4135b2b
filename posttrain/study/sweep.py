"""`posttrain sweep`: a grid of runs of any training command, then one report across seeds.

Design choices:

- **Every point is checked before anything runs.** The grid is expanded (product of the ``--grid``
  values, times seeds) and each point's config is built with the command's own config class, so a
  bad key or value in any point stops the sweep with one line, and nothing is written.
- **Each run is a subprocess** (``python -m posttrain COMMAND CONFIG overrides...``) with its own
  directory ``OUT/runs/<settings>/seed-<s>``: a crash or a leak in one run cannot touch the others,
  and an interrupted run resumes through the command's own resume from its last checkpoint.
- **A finished run is skipped**: it leaves ``sweep_done.json`` holding its resolved config; a rerun
  whose config differs is refused rather than mixed into the report.
- **Intervals are across seeds**: mean ± t(0.975, n−1)·sd/√n of the per-seed values (Student's t,
  n = seeds); with one seed there is no interval.

The report (``sweep.md``, ``sweep.json``, ``sweep.png``) summarises every held-out metric a run
logged (``eval/...`` keys, except lengths): its value at the start (step 0), its final value and
its best after step 0 (the highest, or the lowest for losses and NLLs), and, for RL, the training reward's first- and last-quarter means.
"""

from __future__ import annotations

import dataclasses
import importlib
import itertools
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from posttrain.errors import UserError

# Commands a sweep can run, and their config classes (validated before any run starts).
CONFIGS = {
    "sft": "posttrain.train.sft:SFTConfig",
    "dpo": "posttrain.train.dpo:DPOConfig",
    "rm": "posttrain.train.rm:RMConfig",
    "rl": "posttrain.rl.config:RLConfig",
    "distill": "posttrain.rl.distill:DistillConfig",
}
DONE = "sweep_done.json"
# Student's t quantile t(0.975, df) for df = 1..30; above 30 the normal 1.96 is within 4%.
T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
        2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
        2.045, 2.042]


@dataclasses.dataclass(frozen=True)
class Point:
    """One run of the sweep: a setting (grid key -> value, in grid order) and a seed."""

    setting: tuple[tuple[str, str], ...]
    seed: int

    @property
    def label(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.setting) or "base"

    @property
    def dirname(self) -> str:
        name = "_".join(f"{k}={v}" for k, v in self.setting) or "base"
        return name.replace("/", "-")

    def overrides(self) -> list[str]:
        return [f"{k}={v}" for k, v in self.setting] + [f"seed={self.seed}"]


def parse_grid(items: list[str]) -> list[tuple[str, list[str]]]:
    """``["optim.lr=1e-4,3e-4", "rollout.group_size=8"]`` -> [(key, values), ...] in the given order."""
    grid = []
    for item in items:
        key, sep, raw = item.partition("=")
        values = [v.strip() for v in raw.split(",") if v.strip()]
        if not sep or not key.strip() or not values:
            raise UserError(f"--grid {item!r}: expected key=v1,v2,...")
        if key.strip() == "seed":
            raise UserError("--grid seed: use --seeds N (seeds 0..N-1) instead")
        if key.strip() in (k for k, _ in grid):
            raise UserError(f"--grid {key.strip()}: given twice")
        grid.append((key.strip(), values))
    return grid


def expand(grid: list[tuple[str, list[str]]], seeds: int) -> list[Point]:
    """Every combination of the grid's values (the last key varies fastest), each with seeds 0..seeds-1."""
    if seeds < 1:
        raise UserError(f"--seeds {seeds}: must be >= 1")
    keys = [k for k, _ in grid]
    combos = itertools.product(*(values for _, values in grid))
    return [Point(tuple(zip(keys, combo)), seed) for combo in combos for seed in range(seeds)]


def config_class(command: str) -> type:
    if command not in CONFIGS:
        raise UserError(f"--command {command}: choose from {', '.join(CONFIGS)}")
    module, name = CONFIGS[command].split(":")
    return getattr(importlib.import_module(module), name)


def run_dir(out: Path, point: Point) -> Path:
    return out / "runs" / point.dirname / f"seed-{point.seed}"


def resolve(command: str, config: str | None, base: list[str], out: Path, points: list[Point]) -> list[dict]:
    """Each point's resolved config as a dict; any bad key or value raises UserError naming it."""
    from posttrain.config import load_config, to_dict

    cls = config_class(command)
    resolved = []
    for p in points:
        try:
            cfg = load_config(cls, config, [*base, *p.overrides(), f"out_dir={run_dir(out, p)}"])
        except UserError as e:
            raise UserError(f"sweep point {p.label}: {e}") from None
        resolved.append(to_dict(cfg))
    return resolved


def finished(path: Path, resolved: dict) -> bool:
    """True when the run in ``path`` completed with this config; a different config is refused."""
    done = path / DONE
    if not done.is_file():
        return False
    if json.loads(done.read_text())["config"] != json.loads(json.dumps(resolved)):
        raise UserError(f"{done}: this run finished with other settings; use another --out or delete {path}")
    return True


def subprocess_runner(argv: list[str], log_path: Path) -> int:
    """Run ``posttrain ARGV`` in a child Python, its output to ``log_path``; returns its exit code."""
    with log_path.open("a") as log:
        return subprocess.call([sys.executable, "-m", "posttrain", *argv], stdout=log, stderr=subprocess.STDOUT)


def run_sweep(command: str, config: str | None, base: list[str], grid: list[tuple[str, list[str]]], seeds: int,
              out: Path, *, runner: Callable[[list[str], Path], int] = subprocess_runner,
              progress: bool = True) -> dict:
    """Validate every point, run the unfinished ones in order, write the report; returns its summary."""
    from posttrain.tracking import progress_bar

    points = expand(grid, seeds)
    resolved = resolve(command, config, base, out, points)
    done = [finished(run_dir(out, p), cfg) for p, cfg in zip(points, resolved)]  # refuses stale runs up front
    failed = []
    with progress_bar(progress) as bar:
        task = bar.add_task(f"sweep {command}", total=len(points), completed=sum(done), info="")
        for point, cfg, skip in zip(points, resolved, done):
            path = run_dir(out, point)
            bar.update(task, info=f"{point.label} seed {point.seed}")
            if not skip:
                rc = run_point(command, config, base, point, path, cfg, runner)
                if rc != 0:
                    failed.append(f"{point.label} seed {point.seed} (exit {rc}, log {path / 'sweep.log'})")
                bar.update(task, advance=1)
    summary = summarise(points, out)
    write_report(summary, out)
    return summary | {"failed": failed}


def run_point(command: str, config: str | None, base: list[str], point: Point, path: Path, cfg: dict,
              runner: Callable[[list[str], Path], int]) -> int:
    path.mkdir(parents=True, exist_ok=True)
    argv = [command, *([config] if config else []), *base, *point.overrides(), f"out_dir={path}",
            "logging.progress=false"]
    t0 = time.perf_counter()
    rc = runner(argv, path / "sweep.log")
    if rc == 0:
        done = {"config": cfg, "argv": argv, "seconds": time.perf_counter() - t0}
        (path / DONE).write_text(json.dumps(done, indent=1))
    return rc


# ---------------------------------------------------------------------------------------------- report


def lower_is_better(key: str) -> bool:
    return "loss" in key or "nll" in key


SAMPLED_REWARD = "dynamic_sampling/sampled_reward_mean"


def run_metrics(rows: list[dict]) -> dict[str, float]:
    """One run's numbers: each held-out metric at the start (step 0, when logged), its final and best
    value after training, and the first/last-quarter training reward."""
    out: dict[str, float] = {}
    keys = sorted({k for r in rows for k in r if k.startswith("eval/") and not k.endswith("mean_length")
                   and "/ungraded" not in k})
    for key in keys:
        logged = [(r.get("step"), float(r[key])) for r in rows if isinstance(r.get(key), (int, float))]
        trained = [v for step, v in logged if step != 0]  # step 0 is the start, not a trained model
        if logged[0][0] == 0:
            out[f"{key} start"] = logged[0][1]
        if trained:
            out[f"{key} final"] = trained[-1]
            out[f"{key} best"] = min(trained) if lower_is_better(key) else max(trained)
    # With dynamic sampling reward/mean covers the kept groups only; the first round's is every group's.
    key = SAMPLED_REWARD if any(SAMPLED_REWARD in r for r in rows) else "reward/mean"
    rewards = [float(r[key]) for r in rows if isinstance(r.get(key), (int, float))]
    if len(rewards) >= 4:
        q = len(rewards) // 4
        out["reward first quarter"] = sum(rewards[:q]) / q
        out["reward last quarter"] = sum(rewards[-q:]) / q
    return out


def interval(values: list[float]) -> tuple[float, float]:
    """(mean, half-width of the 95% Student's t interval of the mean); half-width nan for one value."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, float("nan")
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    t = T975[n - 2] if n - 1 <= len(T975) else 1.96
    return mean, t * sd / math.sqrt(n)


def summarise(points: list[Point], out: Path) -> dict:
    """Per setting: each seed's numbers and, per metric, the mean and 95% half-width across seeds."""
    from posttrain.tracking import read_metrics

    settings: dict[str, dict] = {}
    for p in points:
        s = settings.setdefault(p.label, {"setting": dict(p.setting), "dir": p.dirname, "seeds": {}})
        rows = read_metrics(run_dir(out, p))
        if rows:
            s["seeds"][p.seed] = run_metrics(rows)
    for s in settings.values():
        keys = sorted({k for m in s["seeds"].values() for k in m})
        s["metrics"] = {}
        for key in keys:
            values = [m[key] for m in s["seeds"].values() if key in m]
            mean, half = interval(values)
            s["metrics"][key] = {"mean": mean, "half_width": half, "n": len(values)}
    return {"settings": list(settings.values()),
            "interval": "mean ± t(0.975, n-1)·sd/√n over n seeds (Student's t); none with one seed"}


COLUMN_ORDER = {"start": 0, "final": 1, "best": 2}


def format_table(summary: dict) -> str:
    """Markdown: one row per setting; per metric its start, final and best, then the reward quarters."""
    keys = sorted({k for s in summary["settings"] for k in s["metrics"]},
                  key=lambda k: (k.startswith("reward"), k.rsplit(" ", 1)[0], COLUMN_ORDER.get(k.rsplit(" ", 1)[1], 3)))
    lines = ["| setting | seeds | " + " | ".join(keys) + " |", "|---|---|" + "---|" * len(keys)]
    for s in summary["settings"]:
        cells = [cell(s["metrics"].get(k)) for k in keys]
        label = " ".join(f"{k}={v}" for k, v in s["setting"].items()) or "base"
        lines.append(f"| {label} | {len(s['seeds'])} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def cell(m: dict | None) -> str:
    if m is None:
        return "-"
    if math.isnan(m["half_width"]):
        return f"{m['mean']:.3f}"
    return f"{m['mean']:.3f} ± {m['half_width']:.3f}"


def write_report(summary: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep.json").write_text(json.dumps(summary, indent=1))
    md = (f"# sweep\n\n{format_table(summary)}\n\nEach cell: {summary['interval']}. `start` = the value "
          f"at step 0, `final` = the last value logged, `best` = the best value after step 0 (highest; lowest "
          f"for losses) of each run, then averaged over seeds. Runs: `runs/<setting>/seed-<s>/`.\n")
    (out / "sweep.md").write_text(md)
    plot(summary, out)


def headline(summary: dict) -> str | None:
    """The metric the plot shows: the first held-out pass@1 final, else any final held-out metric."""
    keys = sorted({k for s in summary["settings"] for k in s["metrics"] if k.endswith(" final")})
    return next((k for k in keys if "pass@1" in k), keys[0] if keys else None)


def plot(summary: dict, out: Path) -> None:
    """sweep.png: the headline metric's final and best per setting, with 95% intervals across seeds."""
    from matplotlib.figure import Figure  # imported here: `posttrain --help` must not pay for matplotlib

    key = headline(summary)
    if key is None:
        return
    base = key[: -len(" final")]
    labels = [" ".join(f"{k}={v}" for k, v in s["setting"].items()) or "base" for s in summary["settings"]]
    fig = Figure(figsize=(max(5.0, 1.1 * len(labels) + 2), 3.6))
    ax = fig.subplots()
    for offset, which in ((-0.15, "final"), (0.15, "best")):
        stats = [s["metrics"].get(f"{base} {which}") for s in summary["settings"]]
        xs = [i + offset for i, m in enumerate(stats) if m]
        ys = [m["mean"] for m in stats if m]
        errs = [0.0 if math.isnan(m["half_width"]) else m["half_width"] for m in stats if m]
        ax.errorbar(xs, ys, yerr=errs, fmt="o", capsize=3, label=which)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=7)
    ax.set_ylabel(base, fontsize=8)
    ax.set_title(f"{base}: mean over seeds, 95% t interval", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.savefig(out / "sweep.png", dpi=90, bbox_inches="tight")
