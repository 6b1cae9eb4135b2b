"""Held-out evaluation with the rollout engine: pass@k per decoding profile, outcome counts, lengths.

Used by the RL loop (every ``eval_every`` steps) and by the demo. pass@k comes from
``posttrain.algos.passk`` (one implementation everywhere).
"""

from __future__ import annotations

import dataclasses

from posttrain.algos.passk import pass_at_k_table, solve_fractions
from posttrain.outcome import Outcome, OutcomeClass, ungraded_fracs, ungraded_metrics
from posttrain.rollout.types import SamplingParams


@dataclasses.dataclass
class EvalSummary:
    profile: str
    n: int
    pass_at_k: dict[int, float]
    ci: dict[int, tuple[float, float]]
    passes_per_problem: list[int]
    outcome_counts: dict[str, int]
    mean_length: float
    solve_all_frac: float
    solve_none_frac: float
    ungraded: dict[str, float] = dataclasses.field(default_factory=dict)
    """Share of samples masked per ``CLASS/reason`` (TASK_FAIL, INFRA_FAIL): counted as not passed."""


def score(verifier, texts: list[str], examples: list[dict], finish: list[str] | None = None) -> list:
    """Judge each completion; a verifier exception becomes INFRA_FAIL, never reward 0.

    The one place a sample the engine could not produce (finish reason "error" in ``finish``: a
    server request that failed) becomes an outcome: INFRA_FAIL, without asking the verifier.
    """
    from posttrain.verifiers import score_batch

    failed = [f == "error" for f in finish] if finish is not None else [False] * len(texts)
    judged = iter(score_batch(verifier, [t for t, bad in zip(texts, failed) if not bad],
                              [ex for ex, bad in zip(examples, failed) if not bad]))
    return [Outcome.infra_fail("rollout_error", "the rollout engine returned no sample") if bad else next(judged)
            for bad in failed]


def evaluate(engine, prompt_ids: list[list[int]], examples: list[dict], verifier, *, profile: str,
             sampling: SamplingParams, n: int, seed: int = 0) -> EvalSummary:
    ro = engine.generate(prompt_ids, n, dataclasses.replace(sampling, seed=seed))
    outcomes = score(verifier, ro.completion_texts(), [examples[i] for i in ro.prompt_idx], ro.finish_reason)
    passes = [0] * len(examples)
    for i, o in zip(ro.prompt_idx, outcomes):
        passes[i] += int(o.cls is OutcomeClass.PASS)
    table = pass_at_k_table([n] * len(examples), passes, seed=seed)
    counts = {c.value: sum(o.cls is c for o in outcomes) for c in OutcomeClass}
    solve_all, solve_none = solve_fractions([n] * len(examples), passes)
    return EvalSummary(
        profile=profile, n=n,
        pass_at_k={row.k: row.mean for row in table},
        ci={row.k: (row.low, row.high) for row in table},
        passes_per_problem=passes, outcome_counts=counts,
        mean_length=sum(len(c) for c in ro.completion_ids) / len(ro.completion_ids),
        solve_all_frac=solve_all, solve_none_frac=solve_none, ungraded=ungraded_fracs(outcomes),
    )


def eval_metrics(summary: EvalSummary, bench: str) -> dict:
    out = {f"eval/{bench}/{summary.profile}/pass@{k}": v for k, v in summary.pass_at_k.items()}
    out[f"eval/{bench}/{summary.profile}/mean_length"] = summary.mean_length
    return out | ungraded_metrics(summary.ungraded, f"eval/{bench}/{summary.profile}")
