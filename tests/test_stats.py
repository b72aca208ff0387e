"""sitelens.stats against independent computations: exact enumeration on small cases, scipy, and
hand-worked examples. Each test also flips the thing it guards (a sign, the chance correction) and
checks that the flip is seen."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats as sps

from sitelens.stats import (
    adjusted_jaccard,
    bootstrap_ci,
    expected_jaccard,
    holm,
    jaccard,
    k_star_interval,
    mcnemar_exact,
    paired_difference,
    smallest_reaching,
    wilson_interval,
)


def _exact_bootstrap_quantiles(d: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """Percentiles of the bootstrap distribution of the mean, by enumerating all n^n resamples."""
    n = len(d)
    means = np.array([d[list(idx)].mean() for idx in itertools.product(range(n), repeat=n)])
    q = (1 - level) / 2
    return float(np.quantile(means, q)), float(np.quantile(means, 1 - q))


def test_paired_difference_matches_exact_enumeration():
    a = np.array([0.9, 0.5, 0.7, 0.4, 0.8, 0.6])
    b = np.array([0.6, 0.5, 0.4, 0.5, 0.5, 0.3])
    r = paired_difference(a, b, n_boot=40_000, seed=1)
    lo, hi = _exact_bootstrap_quantiles(a - b)
    assert r.diff == pytest.approx((a - b).mean(), abs=1e-12)
    # Monte Carlo percentiles of 40,000 resamples: within about 0.01 of the exact ones here
    # (the mean's bootstrap sd is about 0.05; a quantile's MC error is a few percent of that)
    assert r.ci_low == pytest.approx(lo, abs=0.01) and r.ci_high == pytest.approx(hi, abs=0.01)
    assert (r.n, r.a_ahead, r.b_ahead, r.over) == (6, 4, 1, "tasks")
    # pairing matters: the unpaired intervals of a and b overlap, the paired difference does not
    # contain 0 (this is what "their intervals overlap" gets wrong)
    a_lo, b_hi = bootstrap_ci(a, 10_000)[0], bootstrap_ci(b, 10_000)[1]
    assert a_lo < b_hi and r.excludes_zero
    flipped = paired_difference(b, a, n_boot=40_000, seed=1)
    assert flipped.diff == pytest.approx(-r.diff)
    assert flipped.ci_low == pytest.approx(-r.ci_high, abs=1e-12)
    assert flipped.ci_high == pytest.approx(-r.ci_low, abs=1e-12)
    want = f"{100 * r.diff:+.1f} [{100 * r.ci_low:.1f}, {100 * r.ci_high:.1f}] points over 6 tasks"
    assert r.describe() == want


def test_paired_difference_drops_unpaired_units_and_refuses_mismatch():
    r = paired_difference([1.0, np.nan, 0.5], [0.0, 0.2, np.nan], n_boot=100)
    assert r.n == 1 and r.diff == 1.0
    with pytest.raises(ValueError, match="same units"):
        paired_difference([1.0, 2.0], [1.0])


def test_mcnemar_matches_scipy_binomtest_and_enumeration():
    rng = np.random.default_rng(0)
    for _ in range(20):
        a = rng.random(40) < 0.6
        b = rng.random(40) < 0.45
        r = mcnemar_exact(a, b)
        m = r.only_a + r.only_b
        assert (r.only_a, r.only_b) == (int((a & ~b).sum()), int((~a & b).sum()))
        want = sps.binomtest(r.only_a, m, 0.5).pvalue if m else 1.0
        assert r.p_value == pytest.approx(want, rel=1e-12)
        assert mcnemar_exact(b, a).p_value == pytest.approx(r.p_value)  # symmetric
    # hand-worked: 5 discordant items all favouring a: p = 2 / 2^5
    assert mcnemar_exact([1] * 5 + [0] * 3, [0] * 5 + [0] * 3).p_value == pytest.approx(2 / 32)
    assert mcnemar_exact([1, 0], [1, 0]).p_value == 1.0


def test_holm_matches_hand_worked_and_brute_force():
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.5, np.nan, 0.01])[[0, 2]] == pytest.approx([0.5, 0.02])
    assert np.isnan(holm([0.5, np.nan, 0.01])[1])
    rng = np.random.default_rng(3)
    for _ in range(20):
        p = rng.random(6) ** 3
        # brute force: adjusted p_i = max over j with p_j <= p_i of min(1, (m - rank_j) p_j)
        order = np.argsort(p)
        want = np.empty(6)
        for r, i in enumerate(order):
            want[i] = max(min(1.0, (6 - s) * p[order[s]]) for s in range(r + 1))
        assert holm(p) == pytest.approx(want)


def _enumerated_expected_jaccard(k1: int, k2: int, n: int) -> float:
    vals = [jaccard(a, b) for a in itertools.combinations(range(n), k1)
            for b in itertools.combinations(range(n), k2)]
    return float(np.mean(vals))


@pytest.mark.parametrize(("k1", "k2", "n"), [(1, 1, 4), (2, 2, 5), (2, 3, 6), (3, 3, 7), (4, 2, 8)])
def test_expected_jaccard_matches_enumeration(k1, k2, n):
    assert expected_jaccard(k1, k2, n) == pytest.approx(_enumerated_expected_jaccard(k1, k2, n), abs=1e-12)


def test_expected_jaccard_at_head_counts_and_chance_correction():
    rng = np.random.default_rng(0)
    for k, n in ((10, 270), (20, 72), (50, 72)):
        sims = [jaccard(rng.choice(n, k, replace=False), rng.choice(n, k, replace=False))
                for _ in range(4000)]
        # Monte Carlo mean of 4,000 draws: its standard error is under 0.002 at these sizes
        assert expected_jaccard(k, k, n) == pytest.approx(np.mean(sims), abs=0.006)
    assert expected_jaccard(50, 50, 72) > 0.5  # a raw 0.5 threshold cannot flag a random 50-of-72
    # adjusted: 1 for identical sets, about 0 for random ones, below 0 for disjoint ones
    a = set(range(10))
    assert adjusted_jaccard(a, a, 270) == 1.0
    adj = [adjusted_jaccard(rng.choice(72, 50, replace=False), rng.choice(72, 50, replace=False), 72)
           for _ in range(4000)]
    assert abs(np.mean(adj)) < 0.02
    assert adjusted_jaccard(set(range(5)), set(range(5, 10)), 20) < 0
    # the correction is what separates two sets with the same raw Jaccard at different sizes
    big = adjusted_jaccard(set(range(48)), set(range(16, 64)), 72)  # raw 32 / 64 = 0.5
    small = adjusted_jaccard(set(range(6)), set(range(2, 8)), 72)  # raw 4 / 8 = 0.5
    assert jaccard(set(range(48)), set(range(16, 64))) == jaccard(set(range(6)), set(range(2, 8))) == 0.5
    assert small > 0.45 > 0.05 > big


def test_wilson_interval_matches_scipy():
    for x, n in ((0, 12), (10, 12), (12, 12), (4, 28), (17, 50)):
        ci = sps.binomtest(x, n).proportion_ci(confidence_level=0.95, method="wilson")
        assert wilson_interval(x, n) == pytest.approx((ci.low, ci.high), abs=1e-12)


def test_k_star_interval_against_hand_enumeration():
    budgets = [1, 5, 10]
    reference = np.array([1, 1, 1, 1, 0, 1, 1, 1, 1, 1])  # 0.9
    correct = np.array([[0, 0, 0, 1, 0, 0, 0, 0, 1, 0],   # 0.2
                        [1, 1, 0, 1, 0, 1, 1, 0, 1, 1],   # 0.7
                        [1, 1, 1, 1, 0, 1, 1, 1, 0, 1]])  # 0.8 >= 0.9 * 0.9 = 0.81? no
    assert smallest_reaching(budgets, correct.mean(1), reference.mean(), 0.9) == math.inf
    correct[2, 8] = 1  # 0.9 now reaches 0.81
    k, lo, hi = k_star_interval(budgets, correct, reference, n_boot=4000, seed=0)
    assert k == 10.0
    # every resample: budget 10 matches the reference on every drawn item but the ones where
    # both fail, so it always reaches; budget 5 reaches only on draws rich in its hits
    ks = []
    rng = np.random.default_rng(0)
    idx = rng.integers(0, 10, size=(4000, 10))
    for row in idx:
        ks.append(smallest_reaching(budgets, correct[:, row].mean(1), reference[row].mean(), 0.9))
    assert (lo, hi) == (float(np.quantile(ks, 0.025, method="lower")),
                        float(np.quantile(ks, 0.975, method="higher")))
    assert lo in (5.0, 10.0) and hi == 10.0
    assert math.isnan(smallest_reaching(budgets, [0, 0, 0], float("nan"), 0.9))
    with pytest.raises(ValueError, match="n_budgets"):
        k_star_interval(budgets, correct[:2], reference)
