"""The demos' stages: each one run and timed in wall and CPU seconds, a finished one reused only when
made with the same settings, and the code demos' per-run report."""

from __future__ import annotations

import json
import time
from pathlib import Path

from posttrain.errors import UserError


def timed(stages: dict, name: str, fn, *args):
    """Run one stage, recording its wall and CPU seconds (CPU: all of this process's threads, so a
    busy machine's share of the cores can be told from the work itself)."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn(*args)
    stages[name] = {"wall_s": round(time.perf_counter() - wall, 1), "cpu_s": round(time.process_time() - cpu, 1)}
    print(f"[demo] {name}: {stages[name]['wall_s']:.0f} s wall, {stages[name]['cpu_s']:.0f} s CPU")
    return result


# Keys whose values name where things are, not how they were made: a run directory moved or seen
# under another name is the same stage. Logging only changes what is printed.
_PLACE_KEYS = ("path", "eval_path", "out_dir")


def _settings(config: dict, prefix: str = "") -> dict:
    """``config`` flattened to dotted keys, without the keys that name places or logging."""
    flat = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if key in _PLACE_KEYS or name.startswith("logging"):
            continue
        flat |= _settings(value, f"{name}.") if isinstance(value, dict) else {name: value}
    return flat


def finished_stage(cfg) -> str | None:
    """The checkpoint a finished training stage left in ``cfg.out_dir``, when it was made with the
    settings of ``cfg`` (its saved config.yaml, paths and logging aside); None when the stage has not
    finished there. A stage made with other settings raises UserError naming its folder: reusing it
    would mix two experiments, and training over it would resume from the other one's weights."""
    import yaml

    from posttrain.config import to_dict
    from posttrain.tracking import latest_checkpoint

    run_dir = Path(cfg.out_dir)
    ckpt = latest_checkpoint(run_dir)
    if ckpt is None:
        return None
    saved = run_dir / "config.yaml"
    old = _settings(yaml.safe_load(saved.read_text(encoding="utf-8")) or {}) if saved.is_file() else {}
    new = _settings(yaml.safe_load(yaml.safe_dump(to_dict(cfg))))
    changed = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
    if changed:
        raise UserError(f"{run_dir}: holds a stage made with other settings (differing: {', '.join(changed[:4])}"
                        f"{', ...' if len(changed) > 4 else ''}); remove it or choose another --out")
    if int(ckpt.name[len("step-"):]) < cfg.num_steps:
        return None  # an interrupted stage with these settings: training resumes it
    print(f"[demo] {run_dir}: finished with these settings ({ckpt}), reused")
    return str(ckpt)


def finish(out: Path, stages: dict, seconds: float, arms: tuple[str, ...]) -> str:
    """Write report.html, report.md (the seed's table of ``arms``) and summary.json; return the table's Markdown."""
    from posttrain.eval.report import find_runs, write_report_files
    from posttrain.eval.seed_table import seed_table

    html, md = write_report_files([out / arm for arm in arms], out / "report.html")
    runs = find_runs([out / arm for arm in arms])
    table = seed_table([(run.name, run.evals) for run in runs])
    rows = {title: [None if c is None else {"before": c.before, "after": c.after, "change": c.change,
                                            "low": c.low, "high": c.high, "problems": c.problems} for c in cells]
            for title, cells in table.rows}
    summary = {"out_dir": str(out), "seconds": seconds, "stages": stages, "columns": table.columns, "table": rows}
    part = out / ".summary.json.part"  # a seed's summary.json says it finished: never half a file
    part.write_text(json.dumps(summary, indent=1))
    part.replace(out / "summary.json")
    print(f"[demo] {seconds / 60:.1f} min; report: {html}")
    return md.read_text(encoding="utf-8") if md else "(no table: no evaluation was written)"
