"""The seed experiment's table: each run's code benchmarks against its own starting checkpoint.

Rows are the seed's benchmarks, found by the names examples/seed_eval_*.yaml gives them
(`SEED_ROWS`): HumanEval and HumanEval+ (evalplus base / plus inputs), MBPP and MBPP+ (likewise),
LiveCodeBench Easy / Medium / Hard. Columns, per run and decoding profile: pass@1 of the starting
checkpoint (the evaluation labelled ``before``), pass@1 after RL (labelled ``after``; the latest
step when there are several), and the change in percentage points with its paired 95% interval.

Design choices:
- Values are read from the run's eval files (`posttrain.eval.results`), never recomputed from
  samples: the table shows the numbers ``eval.json`` holds.
- The change is the mean over the problems both evaluations judged of (after - before) per-problem
  pass@1, with a percentile bootstrap over those problems (`posttrain.algos.passk.paired_bootstrap_ci`):
  pairing cancels the problem-to-problem spread both checkpoints share. When the two evaluations
  judged the same problems the change equals the difference of the two pass@1 values exactly;
  otherwise the table notes how many problems only one of them has.
- A run without both evaluations of a row leaves that cell empty ("-"); a run with none of the
  seed's benchmarks is left out, so the table is empty for other experiments.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from posttrain.algos.passk import paired_bootstrap_ci
from posttrain.eval.results import EvalResult

SEED_ROWS = (("HumanEval", "humaneval"), ("HumanEval+", "humaneval_plus"), ("MBPP", "mbpp"), ("MBPP+", "mbpp_plus"),
             ("LiveCodeBench Easy", "lcb_easy"), ("LiveCodeBench Medium", "lcb_medium"),
             ("LiveCodeBench Hard", "lcb_hard"))
"""(row title, the benchmark name its evaluations carry)."""

BEFORE, AFTER = "before", "after"


@dataclasses.dataclass(frozen=True)
class Cell:
    """One run's figures on one benchmark, in percent (pass@1 × 100) and percentage points."""

    before: float
    after: float
    change: float
    low: float
    high: float
    problems: int
    """Problems both evaluations judged (the pairs the change is over)."""
    unpaired: int
    """Problems only one of the two evaluations judged (left out of the change)."""


@dataclasses.dataclass(frozen=True)
class SeedTable:
    columns: list[str]
    """One per (run, decoding profile), e.g. ``seed-direct · greedy``."""
    rows: list[tuple[str, list[Cell | None]]]


def _pass1(result: EvalResult) -> float:
    row = next((r for r in result.pass_at_k if r.k == 1), None)
    if row is None:
        raise ValueError(f"{result.benchmark}: the eval file has no pass@1")
    return row.mean


def _per_problem(result: EvalResult) -> dict[str, float]:
    """Each judged problem's pass@1: the fraction of its samples that passed."""
    return {p.problem_id: p.passed / p.n for p in result.per_problem}


def cell(before: EvalResult, after: EvalResult, seed: int = 0) -> Cell:
    """``after`` against ``before`` on the problems both judged."""
    b, a = _per_problem(before), _per_problem(after)
    shared = [pid for pid in b if pid in a]
    change, low, high = paired_bootstrap_ci([b[p] for p in shared], [a[p] for p in shared], seed=seed)
    return Cell(before=100 * _pass1(before), after=100 * _pass1(after), change=100 * change, low=100 * low,
                high=100 * high, problems=len(shared), unpaired=len(set(a) ^ set(b)))


def _latest(results: list[EvalResult]) -> EvalResult | None:
    return max(results, key=lambda r: -1 if r.step is None else r.step) if results else None


def before_after(evals: Sequence[EvalResult], bench: str, profile: str) -> tuple[EvalResult | None, EvalResult | None]:
    """A run's evaluations of its start (``before``) and its end (``after``) on ``bench`` under ``profile``."""
    mine = [r for r in evals if r.benchmark == bench and r.profile == profile]
    return _latest([r for r in mine if r.label == BEFORE]), _latest([r for r in mine if r.label == AFTER])


def pooled_cell(pairs: Sequence[tuple[EvalResult, EvalResult]], seed: int = 0) -> Cell:
    """Several runs (seeds) of one experiment on one benchmark, pooled: each problem's change averaged
    over the runs, then the mean over the problems every run judged, with the percentile bootstrap over
    those problems. The interval is over the problems drawn, for these seeds; it does not make three
    seeds into more (the seeds' own spread is in their separate cells)."""
    per_run = [(_per_problem(b), _per_problem(a)) for b, a in pairs]
    judged = [set(b) & set(a) for b, a in per_run]
    shared = sorted(set.intersection(*judged)) if judged else []
    before = [sum(b[p] for b, _ in per_run) / len(per_run) for p in shared]
    after = [sum(a[p] for _, a in per_run) / len(per_run) for p in shared]
    change, low, high = paired_bootstrap_ci(before, after, seed=seed)
    every = set.union(*judged) if judged else set()
    return Cell(before=100 * sum(before) / max(len(shared), 1), after=100 * sum(after) / max(len(shared), 1),
                change=100 * change, low=100 * low, high=100 * high, problems=len(shared),
                unpaired=len(every - set(shared)))


def seed_table(runs: Sequence[tuple[str, Sequence[EvalResult]]]) -> SeedTable:
    """The table for ``runs``: (run name, its evaluations) in order."""
    names = {bench for _, bench in SEED_ROWS}
    columns: list[tuple[str, str, dict[str, Cell]]] = []
    for run_name, evals in runs:
        profiles = sorted({r.profile for r in evals if r.benchmark in names})
        for profile in profiles:
            cells = {}
            for _, bench in SEED_ROWS:
                before, after = before_after(evals, bench, profile)
                if before is not None and after is not None:
                    cells[bench] = cell(before, after)
            if cells:
                columns.append((run_name, profile, cells))
    labels = [f"{run} · {profile}" if len(columns) > 1 or profile != "greedy" else run for run, profile, _ in columns]
    return SeedTable(columns=labels, rows=[(title, [c.get(bench) for _, _, c in columns]) for title, bench in SEED_ROWS
                                           if any(bench in c for _, _, c in columns)])


def format_cell(c: Cell | None) -> tuple[str, str, str]:
    """(start, after, change [interval]) as printed: percent with one decimal, the change signed."""
    if c is None:
        return "-", "-", "-"
    note = f" ({c.unpaired} unpaired)" if c.unpaired else ""
    return f"{c.before:.1f}", f"{c.after:.1f}", f"{c.change:+.1f} [{c.low:+.1f}, {c.high:+.1f}]{note}"


def header(table: SeedTable) -> list[str]:
    return ["benchmark"] + [f"{col}: {part}" for col in table.columns for part in ("start", "RL", "Δ pp [95% CI]")]


def body(table: SeedTable) -> list[list[str]]:
    return [[title] + [text for c in cells for text in format_cell(c)] for title, cells in table.rows]


def to_markdown(table: SeedTable) -> str:
    """The table as GitHub Markdown (empty string when no run has the seed's benchmarks)."""
    if not table.rows:
        return ""
    lines = ["| " + " | ".join(header(table)) + " |", "|" + "---|" * len(header(table))]
    lines += ["| " + " | ".join(row) + " |" for row in body(table)]
    note = ("pass@1 in percent; start = the run's starting checkpoint (eval label `before`), RL = after "
            "(label `after`); Δ in percentage points with a paired bootstrap 95% interval over problems.")
    return "\n".join(lines) + "\n\n" + note + "\n"
