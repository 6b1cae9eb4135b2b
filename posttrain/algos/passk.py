"""pass@k: the unbiased estimator, the k grid, bootstrap confidence intervals.

pass@k is the chance that at least one of k samples, drawn without replacement from the n samples
generated for a problem, is correct. Chen et al. 2021 ("Evaluating Large Language Models Trained on
Code", arXiv:2107.03374) give the unbiased estimator from n samples of which c passed:

    pass@k = 1 - C(n - c, k) / C(n, k)

computed here in its numerically stable product form

    pass@k = 1 - prod_{i = n-c+1}^{n} (1 - k / i)

which never forms the (huge) binomial coefficients. When n - c < k every draw of k holds a pass,
so pass@k = 1 exactly. k > n is refused: the estimator is undefined there, and quietly clipping
k to n would report a different quantity under the requested name.

Design choices:
- One implementation, used by evaluation, reports and the RL pass-rate store: plain numpy
  functions on arrays of per-problem (n, c), no classes.
- Problems may carry different n (a resumed run, a dropped sample); each k must be <= every n.
- Confidence intervals are percentile bootstrap intervals over *problems* (the unit that was
  sampled from the benchmark), seeded, so the same inputs always give the same interval.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem with ``n`` samples of which ``c`` passed (Chen et al. 2021)."""
    _check_counts(n, c)
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n, got k={k}, n={n}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))


def pass_at_k_per_problem(n: Sequence[int] | np.ndarray, c: Sequence[int] | np.ndarray, k: int) -> np.ndarray:
    """pass@k for each problem; ``n`` and ``c`` are per-problem sample and pass counts (P,)."""
    n_P, c_P = _as_counts(n, c)
    if k < 1:
        raise ValueError(f"pass@k needs k >= 1, got k={k}")
    if n_P.size and k > int(n_P.min()):
        raise ValueError(f"pass@{k} needs at least {k} samples per problem; the smallest n is {int(n_P.min())}")
    return np.array([pass_at_k(int(ni), int(ci), k) for ni, ci in zip(n_P, c_P)], dtype=np.float64)


def k_grid(n: int) -> list[int]:
    """The powers of two up to ``n``, plus ``n`` itself: 1, 2, 4, ..., n."""
    if n < 1:
        raise ValueError(f"k grid needs n >= 1, got n={n}")
    grid = []
    k = 1
    while k <= n:
        grid.append(k)
        k *= 2
    if grid[-1] != n:
        grid.append(n)
    return grid


@dataclasses.dataclass(frozen=True)
class PassAtK:
    """pass@k averaged over problems, with a bootstrap interval ``[low, high]`` at ``confidence``."""

    k: int
    mean: float
    low: float
    high: float
    confidence: float


def bootstrap_ci(values_P: np.ndarray, *, num_resamples: int = 1000, confidence: float = 0.95,
                 seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of per-problem ``values_P`` (P,), resampling problems."""
    values_P = np.asarray(values_P, dtype=np.float64)
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if values_P.size == 0:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    idx_BP = rng.integers(0, values_P.size, size=(num_resamples, values_P.size))
    means_B = values_P[idx_BP].mean(axis=1)
    alpha = (1.0 - confidence) / 2.0
    low, high = np.quantile(means_B, [alpha, 1.0 - alpha])
    return float(low), float(high)


def pass_at_k_table(n: Sequence[int] | np.ndarray, c: Sequence[int] | np.ndarray,
                    ks: Sequence[int] | None = None, *, num_resamples: int = 1000,
                    confidence: float = 0.95, seed: int = 0) -> list[PassAtK]:
    """Mean pass@k over problems with bootstrap intervals, for each k in ``ks`` (default: the k grid
    of the smallest n). Any k above the smallest n raises ValueError."""
    n_P, c_P = _as_counts(n, c)
    if n_P.size == 0:
        raise ValueError("pass@k needs at least one problem")
    ks = list(ks) if ks is not None else k_grid(int(n_P.min()))
    table = []
    for k in ks:
        values_P = pass_at_k_per_problem(n_P, c_P, k)
        low, high = bootstrap_ci(values_P, num_resamples=num_resamples, confidence=confidence, seed=seed)
        table.append(PassAtK(k=int(k), mean=float(values_P.mean()), low=low, high=high, confidence=confidence))
    return table


def paired_bootstrap_ci(before_P: np.ndarray, after_P: np.ndarray, *, num_resamples: int = 1000,
                        confidence: float = 0.95, seed: int = 0) -> tuple[float, float, float]:
    """(mean change, low, high) of ``after_P - before_P``, per-problem values (P,) of the same problems:
    the percentile bootstrap of the mean difference, resampling problems with both arms together.
    Pairing removes the spread between problems that both arms share (an easy problem is easy for
    both), so the interval of a change is far narrower than two independent intervals suggest."""
    before_P, after_P = np.asarray(before_P, dtype=np.float64), np.asarray(after_P, dtype=np.float64)
    if before_P.shape != after_P.shape:
        raise ValueError(f"paired values need one entry per problem in each arm, got {before_P.size} and {after_P.size}")
    diff_P = after_P - before_P
    low, high = bootstrap_ci(diff_P, num_resamples=num_resamples, confidence=confidence, seed=seed)
    return (float(diff_P.mean()) if diff_P.size else float("nan")), low, high


def solve_fractions(n: Sequence[int] | np.ndarray, c: Sequence[int] | np.ndarray) -> tuple[float, float]:
    """(solve-all, solve-none): the fractions of problems where every sample passed, and where none did.

    In RL these are the prompts that carry no group-relative signal (zero-variance groups)."""
    n_P, c_P = _as_counts(n, c)
    if n_P.size == 0:
        raise ValueError("solve fractions need at least one problem")
    return float(np.mean(c_P == n_P)), float(np.mean(c_P == 0))


def _check_counts(n: int, c: int) -> None:
    if n < 1 or c < 0 or c > n:
        raise ValueError(f"pass@k needs n >= 1 and 0 <= c <= n, got n={n}, c={c}")


def _as_counts(n, c) -> tuple[np.ndarray, np.ndarray]:
    n_P = np.asarray(n, dtype=np.int64).reshape(-1)
    c_P = np.asarray(c, dtype=np.int64).reshape(-1)
    if n_P.shape != c_P.shape:
        raise ValueError(f"n and c must have one entry per problem, got {n_P.size} and {c_P.size}")
    for ni, ci in zip(n_P, c_P):
        _check_counts(int(ni), int(ci))
    return n_P, c_P
