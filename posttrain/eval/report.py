"""`report.html`: one self-contained page of charts and tables for one or more run directories.

A run directory holds ``config.yaml``, ``metrics.jsonl`` (one JSON object per step) and
evaluation results written by `posttrain.eval.results.write_eval_json`: ``evals/*.json``,
``evals/*/eval.json`` or its own ``eval.json`` (a `posttrain eval` output folder). A directory may
also hold sub-runs (a demo's ``sft/`` and ``rl/``): every directory below the given paths that has
a ``metrics.jsonl``, an ``evals/`` folder or an ``eval.json`` is a run, named by its path relative
to the argument.

Design choices:
- Self-contained: plots are PNGs drawn with matplotlib's object API (``Figure``, Agg; no pyplot
  global state) and embedded as base64 ``data:`` URIs; CSS is inline; nothing is fetched.
- Panels are declared as data (`PANELS`: a title and a regex over metric keys), so adding a metric
  to the report is one line. Each key matched becomes a subplot (its own y scale, so
  ``mismatch/kl`` and ``mismatch/logprob_abs_diff_max`` are both readable) unless the regex
  names a ``plot`` group that puts several series on one axes (outcome fractions, pass@k by k).
  Every run is a line on the same axes, so runs compare on one chart.
- Missing data is never an error: a panel with no matching key is listed under "Not in these
  runs"; a torn last line of ``metrics.jsonl`` (a run still writing) is skipped with a note.
  Only a RUN_DIR that does not exist, or holds no run at all, is a `UserError`.
"""

from __future__ import annotations

import base64
import dataclasses
import html
import io
import json
import math
import re
from pathlib import Path
from typing import Any, Sequence

from posttrain.errors import UserError
from posttrain.eval.results import EvalResult, read_eval_json
from posttrain.eval.seed_table import body as seed_body, header as seed_header, seed_table, to_markdown


@dataclasses.dataclass(frozen=True)
class Panel:
    """A chart: metric keys matching ``pattern``; optional regex groups ``plot`` (which subplot)
    and ``series`` (which line within it)."""

    title: str
    pattern: str
    note: str = ""


PANELS = (
    Panel("Reward", r"^(?P<plot>reward/mean)$", "mean verifier reward of the training rollouts"),
    Panel("Gold and proxy reward", r"^(?P<series>reward/(?:gold|proxy))$",
          "verifier (gold) and reward-model (proxy) scores of the same rollouts"),
    Panel("Preference accuracy", r"^(?P<series>(?:eval/)?(?:rewards/)?accuracy)$",
          "reward model: chosen scored above rejected; DPO: implicit reward of chosen above rejected"),
    Panel("Held-out accuracy", r"^(?P<plot>eval/.+?)/(?P<series>pass@\d+)$", "eval/<bench>[/<profile>]/pass@k"),
    Panel("KL to the reference", r"^(?P<plot>kl/ref)$"),
    Panel("Entropy", r"^(?P<plot>entropy)$", "mean per-token entropy of the policy on its rollouts"),
    Panel("Response length", r"^(?P<plot>response_length/mean)$", "tokens per completion"),
    Panel("Zero-variance groups", r"^(?P<plot>groups/zero_variance_frac)$",
          "fraction of prompt groups whose rollouts all got the same reward (no group-relative signal)"),
    Panel("Sampler/trainer mismatch", r"^(?P<plot>mismatch/.+)$",
          "disagreement between the rollout engine's logprobs and the trainer's on the same tokens"),
    Panel("Outcome classes", r"^(?P<plot>outcomes)/(?P<series>[A-Z_]+)_frac$",
          "fraction of rollouts per class; TASK_FAIL and INFRA_FAIL are masked from the gradient"),
    Panel("MODEL_FAIL reasons", r"^(?P<plot>outcomes/MODEL_FAIL)/(?P<series>[a-z_]+)_frac$"),
    Panel("SFT loss", r"^(?P<series>(?:eval/)?loss)$", "training loss and held-out loss"),
    Panel("Learning rate", r"^(?P<plot>lr)$"),
    Panel("Throughput", r"^(?P<plot>tokens_per_s)$"),
)

ENV_PANEL = Panel("Episodes", r"^(?P<plot>env/(?:turns_mean|tool_calls_mean|tool_error_frac)|time/env_reset_ms_mean)$",
                  "multi-turn environments: model turns and tool calls per episode, fraction of tool calls "
                  "that failed, milliseconds to make and reset an episode's environment (drawn only for runs "
                  "in an environment)")

TIME_KEY = re.compile(r"^time/(?P<stage>.+)_s$")


@dataclasses.dataclass
class Run:
    """One run directory as read from disk."""

    name: str
    path: Path
    config_text: str
    metrics: list[dict[str, Any]]
    evals: list[EvalResult]
    notes: list[str]


def find_runs(paths: Sequence[str | Path], max_depth: int = 3) -> list[Run]:
    """Every run at or below ``paths`` (a directory with ``metrics.jsonl`` or ``evals/``)."""
    runs: list[Run] = []
    for arg in paths:
        root = Path(arg)
        if not root.is_dir():
            raise UserError(f"{root}: run directory not found")
        found = [d for d in _walk_dirs(root, max_depth)
                 if (d / "metrics.jsonl").is_file() or (d / "evals").is_dir() or (d / "eval.json").is_file()]
        if not found:
            raise UserError(f"{root}: no run here (no metrics.jsonl or evals/ in it or its sub-directories)")
        for d in found:
            rel = d.relative_to(root).as_posix()
            runs.append(load_run(d, root.name if rel == "." else f"{root.name}/{rel}"))
    return runs


def _walk_dirs(root: Path, depth: int):
    yield root
    if depth > 0:
        for child in sorted(p for p in root.iterdir() if p.is_dir() and p.name not in ("evals", "checkpoints", "samples")):
            yield from _walk_dirs(child, depth - 1)


def load_run(path: Path, name: str) -> Run:
    """Read one run directory; anything unreadable becomes a note on the run."""
    notes: list[str] = []
    config = path / "config.yaml"
    config_text = config.read_text() if config.is_file() else ""
    metrics = read_metrics(path / "metrics.jsonl", notes) if (path / "metrics.jsonl").is_file() else []
    evals: list[EvalResult] = []
    # posttrain eval writes OUT/eval.json; a run keeps its evaluations under evals/ (files or OUT dirs).
    eval_files = [path / "eval.json"] + sorted((path / "evals").glob("*.json")) + sorted((path / "evals").glob("*/eval.json"))
    for eval_file in [f for f in eval_files if f.is_file()]:
        try:
            evals.extend(read_eval_json(eval_file))
        except UserError as e:
            notes.append(f"skipped {e}")
    return Run(name=name, path=path, config_text=config_text, metrics=metrics, evals=evals, notes=notes)


def read_metrics(path: Path, notes: list[str]) -> list[dict[str, Any]]:
    """Rows of a ``metrics.jsonl``; malformed lines are skipped and noted (a torn last line is normal
    while a run is still writing)."""
    rows = []
    lines = path.read_text().splitlines()
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            row = None
        if not isinstance(row, dict):
            notes.append(f"{path}:{lineno}: skipped a line that is not a JSON object"
                         + (" (torn last line: the run may still be writing)" if lineno == len(lines) else ""))
            continue
        rows.append(row)
    return rows


def series_for(panel: Panel, runs: Sequence[Run]) -> dict[str, dict[str, tuple[list[float], list[float]]]]:
    """{subplot: {line label: (steps, values)}} for the keys ``panel`` matches across ``runs``."""
    pattern = re.compile(panel.pattern)
    plots: dict[str, dict[str, tuple[list[float], list[float]]]] = {}
    for run in runs:
        for i, row in enumerate(run.metrics):
            step = row.get("step", i)  # metrics rows without a step are plotted by position
            for key, value in row.items():
                m = pattern.match(key)
                if m is None or not _is_number(value):
                    continue
                groups = m.groupdict()
                plot = groups.get("plot") or panel.title
                series = groups.get("series") or ""
                label = " · ".join(x for x in (run.name if len(runs) > 1 else "", series) if x) or run.name
                xs, ys = plots.setdefault(plot, {}).setdefault(label, ([], []))
                xs.append(step)
                ys.append(float(value))
    return plots


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# ---------------------------------------------------------------------------------------------
# Drawing: each function returns a base64 PNG (or None when there is nothing to draw).

def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _figure(num_plots: int, width: float = 5.2, height: float = 3.2):
    from matplotlib.figure import Figure  # imported here: `posttrain --help` must not pay for matplotlib

    cols = min(num_plots, 2)
    rows = math.ceil(num_plots / cols)
    fig = Figure(figsize=(width * cols, height * rows))
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax in axes[num_plots:]:
        ax.set_visible(False)
    return fig, axes


def plot_panel(panel: Panel, runs: Sequence[Run]) -> str | None:
    plots = series_for(panel, runs)
    if not plots:
        return None
    fig, axes = _figure(len(plots))
    for ax, (name, lines) in zip(axes, sorted(plots.items())):
        for label, (xs, ys) in sorted(lines.items()):
            ax.plot(xs, ys, label=label, marker="o" if len(xs) < 20 else None, markersize=3)
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if len(lines) > 1 or runs and len(runs) > 1:
            ax.legend(fontsize=7)
    return _png(fig)


def stage_times(run: Run) -> dict[str, float]:
    """Mean seconds per step of each ``time/<stage>_s`` (except the whole step)."""
    sums: dict[str, list[float]] = {}
    for row in run.metrics:
        for key, value in row.items():
            m = TIME_KEY.match(key)
            if m and m["stage"] != "step" and _is_number(value):
                sums.setdefault(m["stage"], []).append(float(value))
    return {stage: sum(v) / len(v) for stage, v in sums.items()}


def _running_mean(values: Sequence[float], window: int) -> list[float]:
    """Mean of each value and the ``window - 1`` before it (fewer at the start)."""
    return [sum(values[max(0, i - window + 1): i + 1]) / (i + 1 - max(0, i - window + 1)) for i in range(len(values))]


def plot_overoptimisation(runs: Sequence[Run]) -> str | None:
    """Gold and proxy reward against ``kl/from_start`` (Gao et al. 2022), one pair of lines per run."""
    points = [(run.name, [(r["kl/from_start"], r["reward/gold"], r["reward/proxy"]) for r in run.metrics
                          if all(_is_number(r.get(k)) for k in ("kl/from_start", "reward/gold", "reward/proxy"))])
              for run in runs]
    points = [(name, pts) for name, pts in points if pts]
    if not points:
        return None
    fig, axes = _figure(1, width=6.4, height=3.8)
    ax, ax2 = axes[0], axes[0].twinx()  # proxy and gold live on different scales
    for i, (name, pts) in enumerate(points):
        pts = sorted(pts)
        label = f"{name} · " if len(points) > 1 else ""
        kl, gold, proxy = ([p[j] for p in pts] for j in range(3))
        # Per-step rewards are noisy: faint points, and a line through a 5-point mean along KL.
        ax.plot(kl, gold, "o", color=f"C{2 * i}", markersize=3, alpha=0.3)
        ax.plot(kl, _running_mean(gold, 5), "-", color=f"C{2 * i}", label=label + "gold (5-pt mean)")
        ax2.plot(kl, proxy, "s", color=f"C{2 * i + 1}", markersize=3, alpha=0.3)
        ax2.plot(kl, _running_mean(proxy, 5), "--", color=f"C{2 * i + 1}", label=label + "proxy (5-pt mean)")
    ax.set_xlabel("KL from the start (nats per completion)")
    ax.set_ylabel("gold reward")
    ax2.set_ylabel("proxy reward")
    ax.grid(alpha=0.3)
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], fontsize=7)
    return _png(fig)


PRECISION_KEY, SWITCH_KEY = "rollout/precision", "rollout/precision_switch"


def precision_events(run: Run) -> list[tuple[Any, int, float | None]]:
    """(step, bits from the next step on, that step's ``mismatch/kl``) of each switch of
    ``rollout.precision_fallback`` in ``run``."""
    return [(row.get("step", i), int(row[SWITCH_KEY]), row.get("mismatch/kl"))
            for i, row in enumerate(run.metrics) if _is_number(row.get(SWITCH_KEY))]


def plot_precision(runs: Sequence[Run]) -> str | None:
    """The bits each step's rollouts were sampled in, one step line per run, each switch marked
    (up: to float32, down: back to 16 bits) and ``mismatch/kl`` beneath on a log axis: the gap that
    moved the engine up and the quiet that let it down."""
    timed = [(run, [(row.get("step", i), row[PRECISION_KEY]) for i, row in enumerate(run.metrics)
                    if _is_number(row.get(PRECISION_KEY))]) for run in runs]
    timed = [(run, pts) for run, pts in timed if pts]
    if not timed:
        return None
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 4.2))
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=(1, 1.3))
    for i, (run, pts) in enumerate(timed):
        label = run.name if len(timed) > 1 else None
        top.step([p[0] for p in pts], [p[1] for p in pts], where="mid", color=f"C{i % 10}", label=label)
        for step, bits, _ in precision_events(run):  # the switch takes effect from the next step
            top.plot(step + 0.5, 24, "^" if bits == 32 else "v", color=f"C{i % 10}", markersize=7)
        kl = [(row.get("step", j), row["mismatch/kl"]) for j, row in enumerate(run.metrics)
              if _is_number(row.get("mismatch/kl")) and row["mismatch/kl"] > 0]
        if kl:
            bottom.plot([p[0] for p in kl], [p[1] for p in kl], marker="o", markersize=3, color=f"C{i % 10}", label=label)
    top.set_yticks([16, 32])
    top.set_ylim(12, 36)
    top.set_ylabel("rollout bits")
    top.grid(alpha=0.3)
    bottom.set_yscale("log")
    bottom.set_ylabel("mismatch/kl")
    bottom.set_xlabel("step")
    bottom.grid(alpha=0.3)
    if len(timed) > 1:
        top.legend(fontsize=7)
    return _png(fig)


def precision_panel(runs: Sequence[Run]) -> str | None:
    """The precision chart and the switch events as a table, or None when no run had the fallback on."""
    png = plot_precision(runs)
    if png is None:
        return None
    rows = [(run.name, step, "float32" if bits == 32 else f"{bits}-bit",
             f"{kl:.2e}" if _is_number(kl) else "") for run in runs for step, bits, kl in precision_events(run)]
    events = (_table(("run", "after step", "engine samples in", "mismatch/kl that step"), rows) if rows
              else '<p class="note">no switch</p>')
    note = ("rollout.precision_fallback: the bits each step's rollouts were sampled in (16 or 32); a "
            "marker at each switch (up: mismatch KL past the threshold, down: enough quiet steps)")
    return (f'<div class="panel"><h3>Rollout precision</h3><p class="note">{html.escape(note)}</p>'
            f'{_img(png, "Rollout precision")}{events}</div>')


def plot_timing(runs: Sequence[Run]) -> str | None:
    """One horizontal stacked bar per run: mean seconds per step spent in each stage."""
    timed = [(run.name, stage_times(run)) for run in runs]
    timed = [(name, t) for name, t in timed if t]
    if not timed:
        return None
    stages = sorted({s for _, t in timed for s in t})
    fig, axes = _figure(1, width=9, height=0.9 + 0.5 * len(timed))
    ax = axes[0]
    for i, (_, t) in enumerate(timed):
        left = 0.0
        for j, stage in enumerate(stages):
            width = t.get(stage, 0.0)
            ax.barh(i, width, left=left, color=f"C{j % 10}", label=stage if i == 0 else None)
            left += width
    ax.set_yticks(range(len(timed)), [name for name, _ in timed])
    ax.set_xlabel("mean seconds per step")
    ax.legend(fontsize=8, ncols=min(len(stages), 6), loc="upper center", bbox_to_anchor=(0.5, -0.35))
    return _png(fig)


def plot_passk(key: tuple[str, str], results: Sequence[tuple[str, EvalResult]]) -> str:
    """pass@k against k (log2 axis) with the bootstrap band, one line per (run, label)."""
    fig, axes = _figure(1, width=6.4, height=3.8)
    ax = axes[0]
    for i, (run_name, r) in enumerate(results):
        ks = [row.k for row in r.pass_at_k]
        ax.plot(ks, [row.mean for row in r.pass_at_k], marker="o", color=f"C{i % 10}",
                label=" · ".join(x for x in (run_name, r.label or (f"step {r.step}" if r.step is not None else "")) if x))
        ax.fill_between(ks, [row.low for row in r.pass_at_k], [row.high for row in r.pass_at_k],
                        color=f"C{i % 10}", alpha=0.15)
    ax.set_xscale("log", base=2)
    all_ks = sorted({row.k for _, r in results for row in r.pass_at_k})
    ax.set_xticks(all_ks, [str(k) for k in all_ks])
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("k")
    ax.set_ylabel("pass@k")
    ax.set_title(f"{key[0]} · {key[1]}", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _png(fig)


# ---------------------------------------------------------------------------------------------
# The page.

CSS = """
body { font-family: system-ui, sans-serif; margin: 24px; color: #222; max-width: 1250px; }
h1 { font-size: 22px; } h2 { font-size: 18px; border-bottom: 1px solid #ccc; padding-bottom: 4px; }
table { border-collapse: collapse; font-size: 13px; margin: 8px 0 16px; }
td, th { border: 1px solid #ddd; padding: 3px 8px; text-align: right; }
td:first-child, th:first-child { text-align: left; }
.note { color: #666; font-size: 13px; } .warn { color: #a33; font-size: 13px; }
img { max-width: 100%; display: block; margin: 6px 0 18px; }
.grid { display: flex; flex-wrap: wrap; gap: 0 24px; } .panel { max-width: 100%; }
h3 { font-size: 15px; margin-bottom: 2px; } pre { background: #f6f6f6; padding: 8px; font-size: 12px; overflow-x: auto; }
"""


def _img(b64: str, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{b64}">'


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def runs_section(runs: Sequence[Run]) -> list[str]:
    rows = []
    for run in runs:
        steps = [r["step"] for r in run.metrics if _is_number(r.get("step"))]
        total = sum(float(r["time/step_s"]) for r in run.metrics if _is_number(r.get("time/step_s")))
        rows.append((run.name, str(run.path), len(run.metrics), f"{max(steps)}" if steps else "-",
                     f"{total:.1f}" if total else "-", len(run.evals)))
    out = ["<h2>Runs</h2>", _table(("run", "path", "metric rows", "last step", "train time (s)", "eval results"), rows)]
    out += [f'<p class="note">{html.escape(run.name)}: {html.escape(n)}</p>' for run in runs for n in run.notes]
    return out


def evals_section(runs: Sequence[Run]) -> list[str]:
    groups: dict[tuple[str, str], list[tuple[str, EvalResult]]] = {}
    for run in runs:
        for r in run.evals:
            groups.setdefault((r.benchmark, r.profile), []).append((run.name if len(runs) > 1 else "", r))
    if not groups:
        return []
    out = ["<h2>Evaluations: pass@k</h2>",
           '<p class="note">Unbiased pass@k (Chen et al. 2021) on a log<sub>2</sub> k axis; bands are '
           "bootstrap intervals over problems.</p>"]
    for key, results in sorted(groups.items()):
        out.append(_img(plot_passk(key, results), f"pass@k {key[0]} {key[1]}"))
        rows = []
        for run_name, r in results:
            first, last = r.pass_at_k[0], r.pass_at_k[-1]
            rows.append((" · ".join(x for x in (run_name, r.label) if x) or r.model, r.step if r.step is not None else "-",
                         r.n, r.num_problems, f"{first.mean:.3f} [{first.low:.3f}, {first.high:.3f}]",
                         f"pass@{last.k} {last.mean:.3f}", f"{r.solve_all_frac:.2f} / {r.solve_none_frac:.2f}",
                         " ".join(f"{c}={v}" for c, v in r.outcomes.items() if v), f"{r.mean_completion_tokens:.1f}"))
            lost = r.outcomes.get("INFRA_FAIL", 0) + r.outcomes.get("TASK_FAIL", 0)
            if lost:
                out.append(f'<p class="warn">{html.escape(key[0])} {html.escape(r.label)}: {lost} samples are '
                           "TASK_FAIL/INFRA_FAIL and count as not passed: pass@k is a lower bound.</p>")
        out.append(_table(("run", "step", "n", "problems", f"pass@{results[0][1].pass_at_k[0].k} [CI]", "largest k",
                           "solve all / none", "outcomes", "mean tokens"), rows))
        episodes = [(run_name, r) for run_name, r in results if r.env]
        if episodes:
            out.append(_table(("run (episodes)", "turns / episode", "tool calls / episode", "tool-error fraction"),
                              [(" · ".join(x for x in (run_name, r.label) if x) or r.model,
                                f"{r.env.get('env/turns_mean', 0.0):.2f}", f"{r.env.get('env/tool_calls_mean', 0.0):.2f}",
                                f"{r.env.get('env/tool_error_frac', 0.0):.3f}") for run_name, r in episodes]))
    return out


def seed_section(runs: Sequence[Run]) -> list[str]:
    """The seed's code benchmarks against each run's starting checkpoint (`posttrain.eval.seed_table`)."""
    table = seed_table([(run.name, run.evals) for run in runs])
    if not table.rows:
        return []
    return ["<h2>Code benchmarks against the starting checkpoint</h2>",
            '<p class="note">pass@1 in percent: start = the evaluation labelled <code>before</code>, RL = '
            "<code>after</code>; the change in percentage points with a paired bootstrap 95% interval over "
            "the problems both judged.</p>", _table(seed_header(table), seed_body(table))]


def _panel_div(title: str, note: str, png: str) -> str:
    note_html = f'<p class="note">{html.escape(note)}</p>' if note else ""
    return f'<div class="panel"><h3>{html.escape(title)}</h3>{note_html}{_img(png, title)}</div>'


def render_html(runs: Sequence[Run]) -> str:
    """The whole page for ``runs``."""
    body = ["<h1>posttrain report</h1>"] + runs_section(runs) + seed_section(runs) + evals_section(runs)
    missing = []
    panels_html = []
    for panel in PANELS:
        png = plot_panel(panel, runs)
        if png is None:
            missing.append(panel)
            continue
        panels_html.append(_panel_div(panel.title, panel.note, png))
    episodes = plot_panel(ENV_PANEL, runs)  # single-turn runs have none, and miss nothing
    if episodes is not None:
        panels_html.append(_panel_div(ENV_PANEL.title, ENV_PANEL.note, episodes))
    precision = precision_panel(runs)  # runs without rollout.precision_fallback have none, and miss nothing
    if precision is not None:
        panels_html.append(precision)
    overopt = plot_overoptimisation(runs)
    if overopt is not None:
        panels_html.append(_panel_div("Gold and proxy vs KL", "reward over-optimisation: the proxy (reward model) "
                                      "keeps rising with KL from the start; watch whether the gold reward follows", overopt))
    timing = plot_timing(runs)
    if timing is not None:
        panels_html.append(_panel_div("Stage timing", "mean seconds per step in each time/<stage>_s", timing))
    else:
        missing.append(Panel("Stage timing", r"^time/.+_s$"))
    if panels_html:
        body += ["<h2>Training</h2>", '<div class="grid">'] + panels_html + ["</div>"]
    if missing:
        body += ["<h2>Not in these runs</h2>", "<ul>"]
        body += [f"<li>{html.escape(p.title)}: no metric matching <code>{html.escape(p.pattern)}</code></li>"
                 for p in missing]
        body += ["</ul>"]
    configs = [f"<details><summary>{html.escape(r.name)}/config.yaml</summary><pre>{html.escape(r.config_text)}</pre>"
               "</details>" for r in runs if r.config_text]
    if configs:
        body += ["<h2>Configs</h2>"] + configs
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>posttrain report</title>"
            f"<style>{CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")


def write_report(paths: Sequence[str | Path], out: str | Path) -> Path:
    """Render every run under ``paths`` into the self-contained HTML file ``out`` (`write_report_files`)."""
    return write_report_files(paths, out)[0]


def write_report_files(paths: Sequence[str | Path], out: str | Path) -> tuple[Path, Path | None]:
    """The HTML page ``out`` and, when the runs have the seed's code benchmarks, their table as
    Markdown next to it (``out`` with suffix ``.md``; None when there is no table)."""
    runs = find_runs(paths)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_html(runs), encoding="utf-8")
    markdown = to_markdown(seed_table([(run.name, run.evals) for run in runs]))
    if not markdown:
        return out, None
    table = out.with_suffix(".md")
    table.write_text(markdown, encoding="utf-8")
    return out, table
