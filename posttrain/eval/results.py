"""Evaluation results on disk: ``eval.json`` summaries and per-sample JSONL.

Two files per evaluation:

- ``samples.jsonl`` (one `SampleRecord` per line): every generated completion with its verdict.
  It is appended to as problems finish, so an interrupted evaluation resumes by skipping the
  problems already present. A torn last line (the process died mid-write) is dropped on reading.
- ``eval.json``: a list of `EvalResult`, one per (benchmark, decoding profile): n samples per
  problem, pass@k on the k grid with bootstrap intervals, per-problem pass counts, outcome class
  counts and mean completion length. `posttrain report` reads ``evals/*.json`` of a run directory.

Design choices:
- pass@k counts every sample in n and only PASS in c. TASK_FAIL / INFRA_FAIL samples are thus
  counted as not passed *and* reported in ``outcomes``: a nonzero INFRA_FAIL count means the
  pass@k figures are lower bounds, and the report says so rather than silently shrinking n.
- Reading validates every key and raises `UserError` naming the file and the key or line.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
from pathlib import Path
from typing import Any, Iterable, Sequence

from posttrain.errors import UserError
from posttrain.algos.passk import PassAtK, k_grid, pass_at_k_table, solve_fractions
from posttrain.outcome import OutcomeClass

FORMAT = "posttrain.eval/1"


@dataclasses.dataclass(frozen=True, kw_only=True)
class SampleRecord:
    """One judged completion of one problem (a line of ``samples.jsonl``)."""

    problem_id: str
    sample_index: int
    completion: str
    outcome: str
    """OutcomeClass value: PASS, MODEL_FAIL, TASK_FAIL or INFRA_FAIL."""
    reason: str = ""
    """MODEL_FAIL sub-reason (wrong_answer, format, timeout, ...), or why a task/infra failure happened."""
    reward: float = 0.0
    completion_tokens: int = 0
    finish_reason: str = ""
    turns: int = 0
    """Environment benchmarks: model turns of the episode (0 for single-turn samples)."""
    tool_calls: int = 0
    """Environment benchmarks: tool calls the model made (malformed ones included)."""
    tool_errors: int = 0
    """Environment benchmarks: tool calls that were malformed or whose tool raised."""
    scores: dict[str, float] = dataclasses.field(default_factory=dict)
    """Environment benchmarks: the numbers the environment reported when the episode ended
    (e.g. ``fail_to_pass``, ``pass_to_pass`` of a SWE task)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class ProblemCount:
    """Samples drawn (n) and passed for one problem."""

    problem_id: str
    n: int
    passed: int


@dataclasses.dataclass(kw_only=True)
class EvalResult:
    """The summary of one benchmark under one decoding profile."""

    benchmark: str
    profile: str
    """Decoding profile name, e.g. greedy or sampled."""
    model: str
    label: str = ""
    """Free text telling evaluations of the same run apart, e.g. before / after."""
    step: int | None = None
    """Training step of the evaluated checkpoint, where known."""
    n: int
    """Samples per problem (the smallest, if problems differ)."""
    num_problems: int
    pass_at_k: list[PassAtK]
    per_problem: list[ProblemCount]
    outcomes: dict[str, int]
    """Counts per outcome class (all four classes present, zeros included)."""
    fail_reasons: dict[str, int]
    """Counts per MODEL_FAIL reason."""
    mean_completion_tokens: float
    solve_all_frac: float
    solve_none_frac: float
    sampling: dict[str, Any] = dataclasses.field(default_factory=dict)
    """The decoding settings used (temperature, top_p, max_new_tokens, thinking, ...)."""
    env: dict[str, float] = dataclasses.field(default_factory=dict)
    """Environment benchmarks: ``env/turns_mean``, ``env/tool_calls_mean`` (per episode) and
    ``env/tool_error_frac`` (of the tool calls); empty for single-turn benchmarks."""
    notes: list[str] = dataclasses.field(default_factory=list)
    """What a reader must know to trust the score (e.g. SWE tasks split within one project)."""


def summarize(samples: Iterable[SampleRecord], *, benchmark: str, profile: str, model: str,
              ks: Sequence[int] | None = None, label: str = "", step: int | None = None,
              sampling: dict[str, Any] | None = None, seed: int = 0) -> EvalResult:
    """Fold per-sample records into an `EvalResult`. ``ks`` defaults to the k grid of n; any k above
    the smallest per-problem n raises ValueError (pass@k is undefined there)."""
    samples = list(samples)
    if not samples:
        raise ValueError(f"no samples to summarize for benchmark {benchmark!r}")
    n_by: dict[str, int] = collections.Counter()
    c_by: dict[str, int] = collections.Counter()
    outcomes = {cls.value: 0 for cls in OutcomeClass}
    reasons: dict[str, int] = collections.Counter()
    for s in samples:
        n_by[s.problem_id] += 1
        c_by[s.problem_id] += s.outcome == OutcomeClass.PASS.value
        outcomes[OutcomeClass(s.outcome).value] += 1
        if s.outcome == OutcomeClass.MODEL_FAIL.value:
            reasons[s.reason or "unspecified"] += 1
    ids = list(n_by)
    n_P = [n_by[i] for i in ids]
    c_P = [c_by[i] for i in ids]
    table = pass_at_k_table(n_P, c_P, ks if ks is not None else k_grid(min(n_P)), seed=seed)
    solve_all, solve_none = solve_fractions(n_P, c_P)
    return EvalResult(
        benchmark=benchmark, profile=profile, model=model, label=label, step=step, n=min(n_P),
        num_problems=len(ids), pass_at_k=table,
        per_problem=[ProblemCount(problem_id=i, n=n_by[i], passed=c_by[i]) for i in ids],
        outcomes=outcomes, fail_reasons=dict(sorted(reasons.items())),
        mean_completion_tokens=sum(s.completion_tokens for s in samples) / len(samples),
        solve_all_frac=solve_all, solve_none_frac=solve_none, sampling=dict(sampling or {}), env=env_summary(samples))


def env_summary(samples: Sequence[SampleRecord]) -> dict[str, float]:
    """Turns and tool calls per episode and the tool-error fraction; {} when no sample has turns."""
    if not any(s.turns for s in samples):
        return {}
    calls = sum(s.tool_calls for s in samples)
    keys = sorted({k for s in samples for k in s.scores})
    scores = {f"env/{k}_mean": sum(s.scores[k] for s in samples if k in s.scores)
              / sum(k in s.scores for s in samples) for k in keys}
    return {"env/turns_mean": sum(s.turns for s in samples) / len(samples),
            "env/tool_calls_mean": calls / len(samples),
            "env/tool_error_frac": sum(s.tool_errors for s in samples) / calls if calls else 0.0, **scores}


def write_eval_json(path: str | Path, results: Sequence[EvalResult]) -> None:
    """Write ``results`` to ``path`` atomically (a temp file renamed over it)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    payload = {"format": FORMAT, "results": [dataclasses.asdict(r) for r in results]}
    tmp = p.with_suffix(p.suffix + ".tmp")
    tmp.write_text(json.dumps(payload, indent=1) + "\n")
    os.replace(tmp, p)


def read_eval_json(path: str | Path) -> list[EvalResult]:
    """Read an ``eval.json``; UserError naming the file and key for anything malformed."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"{p}: file not found")
    try:
        payload = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise UserError(f"{p}:{e.lineno}: malformed JSON ({e.msg})") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise UserError(f"{p}: key 'format' must be {FORMAT!r}; not an eval.json written by posttrain eval")
    if not isinstance(payload.get("results"), list):
        raise UserError(f"{p}: key 'results' must be a list")
    return [_result_from_dict(r, f"{p}: results[{i}]") for i, r in enumerate(payload["results"])]


def _result_from_dict(data: Any, where: str) -> EvalResult:
    if not isinstance(data, dict):
        raise UserError(f"{where} must be an object")
    fields = dataclasses.fields(EvalResult)
    unknown = sorted(set(data) - {f.name for f in fields})
    if unknown:
        raise UserError(f"{where}: unknown key {unknown[0]!r}")
    required = [f.name for f in fields
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    missing = [name for name in required if name not in data]
    if missing:
        raise UserError(f"{where}: missing key {missing[0]!r}")
    try:
        data = dict(data)
        data["pass_at_k"] = [PassAtK(**row) for row in data["pass_at_k"]]
        data["per_problem"] = [ProblemCount(**row) for row in data["per_problem"]]
        return EvalResult(**data)
    except KeyError as e:
        raise UserError(f"{where}: missing key {e.args[0]!r}") from None
    except TypeError as e:
        raise UserError(f"{where}: {e}") from None


def append_samples(path: str | Path, samples: Iterable[SampleRecord]) -> None:
    """Append records to a per-sample JSONL, flushed and fsynced so a crash loses at most one line."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with open(p, "a", encoding="utf-8") as f:
        for s in samples:
            f.write(json.dumps(dataclasses.asdict(s), ensure_ascii=False) + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_samples(path: str | Path, *, repair: bool = False) -> list[SampleRecord]:
    """Read a per-sample JSONL (a missing file reads as empty).

    A last line without its newline is a write torn by an interruption: it is ignored, and with
    ``repair`` cut from the file so appends start on a clean line. Any other malformed line is a
    UserError naming file:line."""
    p = Path(path)
    if not p.exists():
        return []
    data = p.read_bytes()
    complete = data[: data.rfind(b"\n") + 1]
    if repair and len(complete) != len(data):
        with open(p, "r+b") as f:
            f.truncate(len(complete))
    records = []
    for lineno, line in enumerate(complete.decode("utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            records.append(SampleRecord(**json.loads(line)))
        except (json.JSONDecodeError, TypeError) as e:
            raise UserError(f"{p}:{lineno}: not a sample record ({e})") from None
    return records
