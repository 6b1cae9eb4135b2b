"""`posttrain demo --task code [--model M] --seeds 0,1,2`: several seeds in one command, and their
combined report.

One seed is not an answer to the seed experiment's question; three with paired intervals are. The
command runs the demo's start once and each seed's RL from it:

- ``OUT/`` holds the start every seed shares, built once with the first seed (the miniature's
  ``model/``, ``data/``, ``midtrain/``, ``sft-ARM/``; the real demo's ``data/`` and its converted
  model in the cache);
- ``OUT/seed-S/`` holds seed S's RL run(s) and evaluations exactly as a single-seed run writes its
  ``--out`` (``ARM/`` with ``evals/``, ``summary.json``, ``report.md``, ``report.html``);
- ``OUT/report.md``, ``OUT/summary.json`` and ``OUT/report.html`` combine the seeds.

Design choices:
- Resume at seed granularity: a seed whose ``summary.json`` exists (written last, whole) finished
  and is not run again. The start is built only when some seed still needs it, and a start stage
  already in ``OUT`` is reused only when it was made with the same settings
  (`posttrain.demo.stages.finished_stage`), so re-running a finished command only rewrites the
  combined report, and a changed one is refused rather than mixed.
- The combined table is each seed's own table (`posttrain.eval.seed_table`, from its eval files)
  side by side, with the mean change over seeds. The start is one column only where every seed's
  evaluation of it gave the same figures (checked, not assumed: a sampled evaluation draws other
  samples under each seed), else one per seed.
- What varies between the demos (their arms, how the start is built, what one seed runs) is a
  `Demo` the demo module passes in; this module imports neither demo.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import time
from pathlib import Path
from typing import Callable

from posttrain.demo.stages import finish
from posttrain.errors import UserError

WINDOW = 4
"""Steps averaged at each end of a training-reward curve (a step's value moves with its draw of prompts)."""
COLUMNS = 24
"""At most this many columns of training reward a run in the report: a longer run's are step averages."""


@dataclasses.dataclass(frozen=True)
class Demo:
    """What one code demo runs, as the seeds need it."""

    arms: tuple[str, ...]
    """The RL runs of one seed, each a folder ``ARM/`` of the seed's directory."""
    build_starts: Callable[[Path, dict, argparse.Namespace, dict], dict]
    """(out, profile, args, stages) -> what every seed starts from; args.seed is the first seed."""
    run_seed: Callable[[Path, dict, dict, argparse.Namespace, dict], None]
    """(seed's out, profile, the starts, args, stages): its RL runs and evaluations."""


def parse_seeds(text: str) -> list[int]:
    """``0,1,2`` -> [0, 1, 2]; empty, non-integer or repeated seeds raise UserError."""
    parts = [part.strip() for part in text.split(",")]
    if not all(parts):
        raise UserError(f"--seeds {text!r}: give seeds as integers separated by commas, e.g. --seeds 0,1,2")
    try:
        seeds = [int(part) for part in parts]
    except ValueError:
        bad = next(part for part in parts if not part.lstrip("+-").isdigit())
        raise UserError(f"--seeds {text!r}: {bad!r} is not an integer") from None
    repeated = next((s for i, s in enumerate(seeds) if s in seeds[:i]), None)
    if repeated is not None:
        raise UserError(f"--seeds {text!r}: seed {repeated} is given twice (each seed runs once)")
    return seeds


def seed_dir(out: Path, seed: int) -> Path:
    return out / f"seed-{seed}"


def run_seeds(args: argparse.Namespace, p: dict, demo: Demo) -> int:
    """Run every seed of ``args.seeds`` not yet finished in ``args.out``, then write and print the
    combined report."""
    out, seeds = Path(args.out), parse_seeds(args.seeds)
    record = out / "seeds.json"
    start = check_settings(record, {"model": args.model, "profile": p}, seeds[0])
    todo = []
    for seed in seeds:
        done = seed_dir(out, seed) / "summary.json"
        if done.is_file():
            print(f"[demo] seed {seed}: finished ({done} exists), not run again")
        else:
            todo.append(seed)
    if todo:
        print(f"[demo] the start every seed shares, in {out} (seed {start['start_seed']})")
        stages: dict[str, dict] = {}
        starts = demo.build_starts(out, p, with_seed(args, start["start_seed"]), stages)
        # A stage reused from an earlier command keeps the time it took to build.
        start["start_stages"] = {name: start["start_stages"].get(name, t) for name, t in stages.items()}
        record.write_text(json.dumps(start, indent=1))
        for seed in todo:
            print(f"[demo] seed {seed}: RL and evaluations in {seed_dir(out, seed)}")
            t0, stages = time.perf_counter(), {}
            demo.run_seed(seed_dir(out, seed), p, starts, with_seed(args, seed), stages)
            print(finish(seed_dir(out, seed), stages, time.perf_counter() - t0, demo.arms))
            gc.collect()  # the seed's models, before the next seed loads its own: one seed's memory at a time
    print(write_combined(out, seeds, demo.arms, start["start_stages"]))
    return 0


def check_settings(record: Path, settings: dict, first_seed: int) -> dict:
    """What ``record`` (``OUT/seeds.json``) holds: the settings of the seeds in OUT, the seed their start
    is built with (the recorded one where OUT has seeds already, else ``first_seed``) and the start's
    stage times. Seeds run with other settings (profile, model) would make one table of two
    experiments: refused."""
    settings = json.loads(json.dumps({**settings, "profile": {k: v for k, v in settings["profile"].items()
                                                              if k != "progress"}}))
    if record.is_file():
        kept = json.loads(record.read_text())
        changed = sorted(k for k in kept["settings"]["profile"].keys() | settings["profile"].keys()
                         if kept["settings"]["profile"].get(k) != settings["profile"].get(k))
        changed += ["model"] if kept["settings"]["model"] != settings["model"] else []
        if changed:
            raise UserError(f"{record}: the seeds in {record.parent} ran with other settings (differing: "
                            f"{', '.join(changed)}); choose another --out")
        return kept
    kept = {"start_seed": first_seed, "settings": settings, "start_stages": {}}
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps(kept, indent=1))
    return kept


def with_seed(args: argparse.Namespace, seed: int) -> argparse.Namespace:
    return argparse.Namespace(**{**vars(args), "seed": seed})


def write_combined(out: Path, seeds: list[int], arms: tuple[str, ...], start_stages: dict) -> str:
    """``OUT/summary.json``, ``OUT/report.md`` and ``OUT/report.html`` of the seeds; returns the Markdown.
    ``start_stages``: the times of the stages that built the start."""
    from posttrain.eval.report import find_runs, render_html

    held_out, held_md = held_out_section(out, seeds, arms)
    reward, reward_md = reward_section(out, seeds, arms)
    tracked, tracked_md = tracked_section(out, seeds, arms)
    seconds = {seed: json.loads((seed_dir(out, seed) / "summary.json").read_text()) for seed in seeds}
    time_md = time_section(seconds, start_stages)
    summary = {"out_dir": str(out), "seeds": seeds, "start_stages": start_stages, "held_out": held_out,
               "reward": reward, "tracked": tracked, "seconds": {str(s): v["seconds"] for s, v in seconds.items()},
               "stages": {str(s): v["stages"] for s, v in seconds.items()}}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    markdown = "\n".join(held_md + reward_md + tracked_md + time_md)
    (out / "report.md").write_text(markdown, encoding="utf-8")
    runs = find_runs([seed_dir(out, seed) for seed in seeds])
    (out / "report.html").write_text(render_html(runs), encoding="utf-8")
    print(f"[demo] the seeds' combined report: {out / 'report.md'}, {out / 'report.html'}")
    return markdown


def _tables(out: Path, seeds: list[int], arms: tuple[str, ...]) -> tuple[dict, dict, dict]:
    """Each seed's seed table, each arm's evaluated start model(s) over all seeds, and each seed's
    evaluations by arm."""
    from posttrain.eval.report import load_run
    from posttrain.eval.seed_table import BEFORE, seed_table

    tables, starts, evals = {}, {arm: set() for arm in arms}, {}
    for seed in seeds:
        runs = [load_run(seed_dir(out, seed) / arm, arm) for arm in arms]
        tables[seed] = seed_table([(run.name, run.evals) for run in runs])
        evals[seed] = {run.name: run.evals for run in runs}
        for run in runs:
            starts[run.name] |= {r.model for r in run.evals if r.label == BEFORE}
    return tables, starts, evals


def pooled(evals: dict, col: str, title: str):
    """The seeds' pooled change on one row of one column (`posttrain.eval.seed_table.pooled_cell`), or
    None where a seed lacks either evaluation."""
    from posttrain.eval.seed_table import SEED_ROWS, before_after, pooled_cell

    arm, _, profile = col.partition(" · ")
    bench = dict(SEED_ROWS)[title]
    pairs = [before_after(by_arm.get(arm, []), bench, profile or "greedy") for by_arm in evals.values()]
    return pooled_cell(pairs) if all(b is not None and a is not None for b, a in pairs) else None


def held_out_section(out: Path, seeds: list[int], arms: tuple[str, ...]) -> tuple[dict, list[str]]:
    """Per column of the seeds' tables (an arm and its decoding) and benchmark: the start's pass@1,
    each seed's after and paired change, and the mean change over seeds."""
    tables, starts, evals = _tables(out, seeds, arms)
    columns = list(dict.fromkeys(col for t in tables.values() for col in t.columns))
    data, lines = {}, ["## Held-out pass@1, each seed against the start", ""]
    for col in columns:
        rows = {}  # title -> {seed: Cell}
        for seed, table in tables.items():
            if col in table.columns:
                for title, cells in table.rows:
                    if cells[table.columns.index(col)] is not None:
                        rows.setdefault(title, {})[seed] = cells[table.columns.index(col)]
        models = sorted(starts[col.split(" · ")[0]])
        same = len(models) == 1 and all(len({(c.before, c.problems) for c in by_seed.values()}) == 1
                                        for by_seed in rows.values())
        pools = {title: pooled(evals, col, title) for title in rows}
        data[col] = {"start_models": models, "same_start": same, "rows": {
            title: {"seeds": {str(s): dataclasses.asdict(c) for s, c in by_seed.items()},
                    "mean_change": sum(c.change for c in by_seed.values()) / len(by_seed),
                    "pooled": None if pools[title] is None else dataclasses.asdict(pools[title])}
            for title, by_seed in rows.items()}}
        lines += [f"### {col}", "", start_note(models, same), ""] + column_table(rows, seeds, same, pools) + [""]
    lines += ["pass@1 in percent; RL = after the seed's RL run (eval label `after`), start = its start "
              "(label `before`); Δ in percentage points with the paired bootstrap 95% interval over problems "
              "(`posttrain.eval.seed_table`); mean Δ: the mean of the seeds' changes, with the paired bootstrap 95% "
              "interval over problems of each problem's change averaged over the seeds (an interval over the "
              "problems drawn, for these seeds: the seeds' own spread is in their columns).", ""]
    return data, lines


def start_note(models: list[str], same: bool) -> str:
    if len(models) != 1:
        return f"The seeds start from different checkpoints ({', '.join(f'`{m}`' for m in models)}): a start column per seed."
    if same:
        return (f"Every seed starts from the same checkpoint (`{models[0]}`) and its evaluation gave the same "
                "pass@1 in every seed: one start column.")
    return (f"Every seed starts from the same checkpoint (`{models[0]}`), but its evaluation differs between "
            "seeds (sampled decoding draws other samples under each seed): a start column per seed.")


def column_table(rows: dict, seeds: list[int], same: bool, pools: dict) -> list[str]:
    from posttrain.eval.seed_table import format_cell

    head = ["benchmark"] + (["start"] if same else [])
    for seed in seeds:
        head += ([] if same else [f"seed {seed}: start"]) + [f"seed {seed}: RL", f"seed {seed}: Δ pp [95% CI]"]
    head += ["mean Δ pp [95% CI]"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for title, by_seed in rows.items():
        cells = [title] + ([format_cell(next(iter(by_seed.values())))[0]] if same else [])
        for seed in seeds:
            start, after, change = format_cell(by_seed.get(seed))
            cells += ([] if same else [start]) + [after, change]
        mean = sum(c.change for c in by_seed.values()) / len(by_seed)
        note = "" if len(by_seed) == len(seeds) else f" ({len(by_seed)} of {len(seeds)} seeds)"
        pool = pools.get(title)
        interval = "" if pool is None or note else f" [{pool.low:+.1f}, {pool.high:+.1f}]"
        lines.append("| " + " | ".join(cells + [f"{mean:+.1f}{interval}{note}"]) + " |")
    return lines


def curve(metrics: list[dict]) -> dict:
    """One RL run's training reward per step, its means over the first and last `WINDOW` steps, its
    last step's zero-variance fraction and entropy, and the last KL to the reference it logged (the
    loop measures it every few steps when the loss has no KL term; None where never logged)."""
    steps = [m for m in metrics if "reward/mean" in m]
    reward = [m["reward/mean"] for m in steps]
    passed = [m.get("outcomes/PASS_frac") for m in steps]
    last = steps[-1] if steps else {}
    kl = [m for m in metrics if "kl/ref" in m][-1:] or [{"kl/ref": None, "step": None}]

    def ends(values: list) -> tuple:
        if not values or None in values:
            return None, None
        return sum(values[:WINDOW]) / len(values[:WINDOW]), sum(values[-WINDOW:]) / len(values[-WINDOW:])

    return {"steps": [m["step"] for m in steps], "reward": reward, "pass": passed,
            "reward_first": ends(reward)[0], "reward_last": ends(reward)[1],
            "pass_first": ends(passed)[0], "pass_last": ends(passed)[1],
            "zero_variance_last": last.get("groups/zero_variance_frac"), "entropy_last": last.get("entropy"),
            "kl_last": kl[0]["kl/ref"], "kl_step": kl[0]["step"]}


def reward_section(out: Path, seeds: list[int], arms: tuple[str, ...]) -> tuple[dict, list[str]]:
    """Per arm, each seed's training reward per step (``reward/mean``, with ``outcomes/PASS_frac`` in
    brackets where the reward is not the pass fraction), as one row per seed."""
    from posttrain.eval.report import read_metrics

    data, lines = {}, ["## Training reward per RL step", ""]
    for arm in arms:
        curves = {seed: curve(read_metrics(seed_dir(out, seed) / arm / "metrics.jsonl", []))
                  for seed in seeds if (seed_dir(out, seed) / arm / "metrics.jsonl").is_file()}
        data[arm] = {str(s): c for s, c in curves.items()}
        both = any(p is not None and abs(p - r) > 1e-9 for c in curves.values() for r, p in zip(c["reward"], c["pass"]))
        n = max((len(c["steps"]) for c in curves.values()), default=0)
        width = -(-n // COLUMNS)  # steps a column averages: one a column up to COLUMNS steps
        head = ["seed"] + [_steps_label(i, width, n) for i in range(0, n, width)] + [
            f"first {WINDOW}", f"last {WINDOW}", "zero-variance groups, last step", "entropy, last step",
            "KL to the start (step)"]
        lines += [f"### {arm}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for seed, c in curves.items():
            reward, passed = _blocks(c["reward"], width), _blocks(c["pass"], width)
            values = [_pair(r, p, both) for r, p in zip(reward, passed)] + ["-"] * (-(-n // width) - len(reward))
            lines.append("| " + " | ".join([str(seed)] + values + [
                _pair(c["reward_first"], c["pass_first"], both), _pair(c["reward_last"], c["pass_last"], both),
                _number(c["zero_variance_last"]), _number(c["entropy_last"]),
                f"{_number(c['kl_last'], '{:.4f}')} ({c['kl_step']})" if c["kl_step"] else "-"]) + " |")
        note = (" In brackets: the pass fraction (`outcomes/PASS_frac`), where the reward adds a format bonus."
                if both else "")
        per = "each RL step" if width == 1 else f"each RL step, averaged over {width} steps a column"
        lines += ["", f"`reward/mean` of {per} (`{arm}/metrics.jsonl`); first / last {WINDOW}: the mean "
                      f"over those steps.{note}", ""]
    return data, lines


def tracked_curves(metrics: list[dict]) -> dict[str, dict[int, float]]:
    """Each pass@1 the RL run evaluated during training (``eval/<set>/<profile>/pass@1``), by step."""
    curves: dict[str, dict[int, float]] = {}
    for m in metrics:
        for key, value in m.items():
            if key.startswith("eval/") and key.endswith("/pass@1"):
                curves.setdefault(key, {})[int(m["step"])] = value
    return curves


def tracked_section(out: Path, seeds: list[int], arms: tuple[str, ...]) -> tuple[dict, list[str]]:
    """Per arm and tracked metric, each seed's pass@1 at every evaluation step of its RL run, and
    the seeds' mean: the training task's learning curve where the run tracked one (the code demo's
    fixed draw of training problems, sampled the same way at every step)."""
    from posttrain.eval.report import read_metrics

    data, lines = {}, []
    for arm in arms:
        by_seed = {seed: tracked_curves(read_metrics(seed_dir(out, seed) / arm / "metrics.jsonl", []))
                   for seed in seeds if (seed_dir(out, seed) / arm / "metrics.jsonl").is_file()}
        for key in sorted({key for curves in by_seed.values() for key in curves}):
            rows = {seed: curves[key] for seed, curves in by_seed.items() if key in curves}
            steps = sorted({step for row in rows.values() for step in row})
            common = [step for step in steps if all(step in row for row in rows.values())]
            mean = {step: sum(row[step] for row in rows.values()) / len(rows) for step in common}
            data.setdefault(arm, {})[key] = {"seeds": {str(s): row for s, row in rows.items()}, "mean": mean}
            head = ["seed"] + [f"step {step}" for step in steps] + ["last − first"]
            lines += [f"### {arm}: `{key}`", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
            for label, row in [*rows.items(), ("mean", mean)]:
                change = 100 * (row[max(row)] - row[min(row)]) if row else None
                values = [_number(100 * row[step] if step in row else None, "{:.1f}") for step in steps]
                lines.append("| " + " | ".join([str(label)] + values + [_number(change, "{:+.1f}")]) + " |")
            lines.append("")
    if lines:
        lines = ["## Tracked during RL", "", "pass@1 in percent, evaluated by the RL run itself every few steps "
                 "(`ARM/metrics.jsonl`); each evaluation samples with the run's seed, so one seed's steps differ "
                 "by its policy alone.", ""] + lines
    return data, lines


def _steps_label(start: int, width: int, n: int) -> str:
    """The header of the column holding steps start+1 ... start+width (1-based, cut at step n)."""
    return str(start + 1) if width == 1 else f"{start + 1}-{min(start + width, n)}"


def _blocks(values: list, width: int) -> list:
    """Means of consecutive ``width`` values (None where a block holds a None)."""
    chunks = [values[i:i + width] for i in range(0, len(values), width)]
    return [None if None in chunk else sum(chunk) / len(chunk) for chunk in chunks]


def _number(value, fmt: str = "{:.2f}") -> str:
    return "-" if value is None else fmt.format(value)


def _pair(reward, passed, both: bool) -> str:
    return f"{_number(reward)} ({_number(passed)})" if both else _number(reward)


def time_section(summaries: dict[int, dict], start_stages: dict) -> list[str]:
    """Each seed's wall time (its summary.json) and its stages', and the shared start's."""
    names = list(dict.fromkeys(name for s in summaries.values() for name in s["stages"]))
    head = ["seed", "wall, min"] + [f"{name}, min" for name in names]
    lines = ["## Wall time", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for seed, s in summaries.items():
        stages = [_number(s["stages"][n]["wall_s"] / 60, "{:.1f}") if n in s["stages"] else "-" for n in names]
        lines.append("| " + " | ".join([str(seed), f"{s['seconds'] / 60:.1f}"] + stages) + " |")
    if start_stages:
        built = ", ".join(f"{name} {v['wall_s'] / 60:.1f}" for name, v in start_stages.items())
        lines += ["", f"The start, built once for every seed (min): {built}."]
    return lines + [""]
