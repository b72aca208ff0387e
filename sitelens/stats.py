"""The statistics every report uses, in one place.

- :func:`wilson_interval`: a proportion over items (an accuracy on one task).
- :func:`bootstrap_ci`: a mean's percentile bootstrap interval (items or tasks).
- :func:`paired_difference`: two methods on the *same* units (tasks or items): the mean of the
  per-unit differences with its paired percentile bootstrap interval and n. Comparing two
  unpaired intervals ("they overlap") throws away the pairing and understates a consistent gap.
- :func:`mcnemar_exact`: the exact test of two methods scored on the same items (the discordant
  pairs under Binomial(b + c, 1/2)).
- :func:`expected_jaccard` / :func:`adjusted_jaccard`: the overlap of two head sets against what
  two random sets of the same sizes would share. A raw Jaccard means little alone: two random
  50-head sets of 72 heads share about 0.53, two random 10-head sets of 270 about 0.02.
- :func:`k_star_interval`: the smallest budget reaching a share of a reference accuracy, with a
  bootstrap interval over items.
- :func:`holm`: Holm's step-down adjustment of many p-values in one report.

Every function is checked in ``tests/test_stats.py`` against an independent computation (scipy,
exact enumeration on small cases, or a hand-worked example).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# the two-sided 95% normal quantile, Φ⁻¹(0.975)
Z95 = 1.959963984540054


def wilson_interval(successes, n, z: float = Z95):
    """The Wilson score interval of a proportion: ``successes`` hits out of ``n`` items, two-sided
    at the normal quantile ``z`` (default 95%). Unlike the normal-approximation interval it stays
    inside [0, 1] and is not empty at 0 or n hits, so it suits the small item counts of a custom
    task (12 test items: 10 hits give [0.552, 0.953]). NaN for ``n = 0``. Scalars give a pair of
    floats; arrays broadcast and give a pair of arrays.

        centre = (p + z²/2n) / (1 + z²/n),  half = z·sqrt(p(1 − p)/n + z²/4n²) / (1 + z²/n)
    """
    x, m = np.asarray(successes, dtype=float), np.asarray(n, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        p = x / m
        denom = 1 + z * z / m
        centre = (p + z * z / (2 * m)) / denom
        half = z * np.sqrt(p * (1 - p) / m + z * z / (4 * m * m)) / denom
        # exactly 0 / 1 at the ends (the closed form, without its rounding)
        lo = np.where(x <= 0, 0.0, np.clip(centre - half, 0.0, 1.0))
        hi = np.where(x >= m, 1.0, np.clip(centre + half, 0.0, 1.0))
    lo, hi = np.where(m > 0, lo, np.nan), np.where(m > 0, hi, np.nan)
    if lo.ndim == 0:
        return float(lo), float(hi)
    return lo, hi


def bootstrap_ci(values, n_boot: int = 1000, seed: int = 0, *, level: float = 0.95):
    """Percentile bootstrap confidence interval of the mean over the last axis (``level``
    two-sided).

    1-D ``values``: NaNs are dropped and ``(lo, hi)`` are floats (``(nan, nan)`` when nothing is
    left). ``values`` of shape ``[..., n_items]``: the same seeded resamples of items are used for
    every leading index (paired across conditions) and ``(lo, hi)`` are arrays of the leading
    shape. ``n_boot=0`` gives NaNs."""
    x = np.asarray(values, dtype=float)
    if x.ndim == 1:
        x = x[~np.isnan(x)]
    lead, n = x.shape[:-1], x.shape[-1]
    if n_boot <= 0 or n == 0:
        lo = np.full(lead, np.nan)
        return (float(lo), float(lo)) if x.ndim == 1 else (lo, lo.copy())
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(n_boot, n))  # [n_boot, n_items]
    means = x[..., idx].mean(-1)  # [..., n_boot]
    q = (1 - level) / 2
    lo, hi = np.quantile(means, q, axis=-1), np.quantile(means, 1 - q, axis=-1)
    return (float(lo), float(hi)) if x.ndim == 1 else (lo, hi)


# ----------------------------------------------------------------------------------------------
# paired comparisons


@dataclass(frozen=True)
class PairedDifference:
    """``a − b`` over ``n`` paired units (``over``: "tasks" or "items"): the mean difference, its
    percentile bootstrap interval (``level``) and the counts of units where a is ahead / behind."""

    diff: float
    ci_low: float
    ci_high: float
    n: int
    over: str
    a_ahead: int
    b_ahead: int
    level: float = 0.95

    def describe(self, scale: float = 100.0, unit: str = "points") -> str:
        """E.g. ``"+5.7 [3.3, 8.1] points over 57 tasks"`` (values times ``scale``)."""
        return (f"{scale * self.diff:+.1f} [{scale * self.ci_low:.1f}, {scale * self.ci_high:.1f}] "
                f"{unit} over {self.n} {self.over}")

    @property
    def excludes_zero(self) -> bool:
        return self.ci_low > 0 or self.ci_high < 0


def paired_difference(a, b, *, over: str = "tasks", n_boot: int = 10_000, seed: int = 0,
                      level: float = 0.95) -> PairedDifference:
    """The paired difference ``a − b`` of two methods measured on the same units (the i-th entry
    of each is the same task or item): the mean of the per-unit differences and its percentile
    bootstrap interval, resampling units (pairs stay together). Units where either value is NaN
    are dropped (both sides, so the pairing holds)."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"paired_difference needs two 1-D arrays of the same units; got shapes "
                         f"{x.shape} and {y.shape}.")
    keep = np.isfinite(x) & np.isfinite(y)
    d = x[keep] - y[keep]
    if len(d) == 0:
        return PairedDifference(math.nan, math.nan, math.nan, 0, over, 0, 0, level)
    lo, hi = bootstrap_ci(d, n_boot=n_boot, seed=seed, level=level)
    return PairedDifference(float(d.mean()), lo, hi, len(d), over, int((d > 0).sum()),
                            int((d < 0).sum()), level)


@dataclass(frozen=True)
class McNemar:
    """Two methods on the same items: ``only_a`` items right by a alone, ``only_b`` by b alone,
    and the exact two-sided p-value of "equally accurate" (the discordant items split 1/2 : 1/2)."""

    only_a: int
    only_b: int
    n: int
    p_value: float


def mcnemar_exact(a_correct, b_correct) -> McNemar:
    """The exact McNemar test: under the null each discordant item is equally likely to favour
    either method, so ``only_a ~ Binomial(only_a + only_b, 1/2)``; the two-sided p-value is
    ``min(1, 2 · P(X ≤ min(only_a, only_b)))`` (1.0 with no discordant item)."""
    x, y = np.asarray(a_correct, dtype=bool), np.asarray(b_correct, dtype=bool)
    if x.shape != y.shape:
        raise ValueError(f"mcnemar_exact needs the same items on both sides; got shapes {x.shape} "
                         f"and {y.shape}.")
    only_a, only_b = int((x & ~y).sum()), int((~x & y).sum())
    m = only_a + only_b
    if m == 0:
        return McNemar(only_a, only_b, len(x), 1.0)
    tail = sum(math.comb(m, i) for i in range(min(only_a, only_b) + 1)) / 2**m
    return McNemar(only_a, only_b, len(x), min(1.0, 2 * tail))


def holm(p_values: Sequence[float]) -> np.ndarray:
    """Holm's step-down adjusted p-values (family-wise error across one report's comparisons),
    in the input order: the i-th smallest p times (m − i), made monotone, capped at 1. NaNs stay
    NaN and do not count toward m."""
    p = np.asarray(p_values, dtype=float)
    out = np.full(p.shape, np.nan)
    ok = np.flatnonzero(np.isfinite(p))
    m = len(ok)
    order = ok[np.argsort(p[ok], kind="stable")]
    running = 0.0
    for i, j in enumerate(order):
        running = max(running, min(1.0, (m - i) * p[j]))
        out[j] = running
    return out


# ----------------------------------------------------------------------------------------------
# set overlap against chance


def jaccard(a, b) -> float:
    """|a ∩ b| / |a ∪ b| of two sets (1.0 for two empty sets)."""
    a, b = set(a), set(b)
    union = a | b
    return len(a & b) / len(union) if union else 1.0


def expected_jaccard(k1: int, k2: int, n: int) -> float:
    """The expected Jaccard index of two independent uniformly random subsets of sizes ``k1`` and
    ``k2`` of ``n`` elements (e.g. heads): their intersection is hypergeometric,
    ``P(|A ∩ B| = i) = C(k1, i) C(n − k1, k2 − i) / C(n, k2)``, and the index is
    ``i / (k1 + k2 − i)``."""
    if not (0 <= k1 <= n and 0 <= k2 <= n):
        raise ValueError(f"set sizes {k1} and {k2} must lie in [0, n = {n}].")
    if k1 == 0 and k2 == 0:
        return 1.0
    total = math.comb(n, k2)
    e = 0.0
    for i in range(max(0, k1 + k2 - n), min(k1, k2) + 1):
        e += math.comb(k1, i) * math.comb(n - k1, k2 - i) / total * i / (k1 + k2 - i)
    return e


def adjusted_jaccard(a, b, n: int) -> float:
    """The chance-adjusted overlap of two head sets out of ``n``: ``(J − E[J]) / (1 − E[J])`` with
    ``E[J]`` of two random sets of the same sizes (:func:`expected_jaccard`): 1 for identical
    sets, 0 for the overlap chance gives, negative below it. NaN when chance already gives 1
    (both sets hold every head, or both are empty)."""
    a, b = set(a), set(b)
    e = expected_jaccard(len(a), len(b), n)
    if e >= 1.0:
        return math.nan
    return (jaccard(a, b) - e) / (1.0 - e)


# ----------------------------------------------------------------------------------------------
# k*: the smallest budget that reaches a share of a reference


def smallest_reaching(budgets: Sequence[int], accuracy, reference: float, share: float) -> float:
    """The smallest budget whose accuracy reaches ``share`` × ``reference`` (budgets ascending);
    ``inf`` when none does, NaN when the reference is not finite."""
    if not math.isfinite(reference):
        return math.nan
    for k, acc in zip(budgets, accuracy, strict=True):
        if acc >= share * reference:
            return float(k)
    return math.inf


def k_star_interval(budgets: Sequence[int], correct, reference_correct, *, share: float = 0.9,
                    n_boot: int = 2000, seed: int = 0, level: float = 0.95) -> tuple[float, float, float]:
    """``(k*, lo, hi)``: k* (:func:`smallest_reaching`) of the per-item correctness ``correct``
    ``[n_budgets, n_items]`` against the reference's ``[n_items]`` (the same items), and its
    percentile bootstrap interval over items (each resample recomputes every accuracy and the
    reference on the same drawn items; ``inf``: not reached within the budgets)."""
    c = np.asarray(correct, dtype=float)
    r = np.asarray(reference_correct, dtype=float)
    if c.ndim != 2 or c.shape[0] != len(budgets) or c.shape[1] != len(r):
        raise ValueError(f"correct must be [n_budgets={len(budgets)}, n_items={len(r)}]; got "
                         f"{list(c.shape)}.")
    k = smallest_reaching(budgets, c.mean(1), float(r.mean()), share)
    if n_boot <= 0 or len(r) == 0:
        return k, math.nan, math.nan
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(r), size=(n_boot, len(r)))  # [n_boot, n_items]
    acc = c[:, idx].mean(-1)  # [n_budgets, n_boot]
    ref = r[idx].mean(-1)  # [n_boot]
    ks = np.array([smallest_reaching(budgets, acc[:, j], float(ref[j]), share) for j in range(n_boot)])
    q = (1 - level) / 2
    # quantiles of an ordinal statistic: "lower"/"higher" keep them on budgets (or inf)
    return k, float(np.quantile(ks, q, method="lower")), float(np.quantile(ks, 1 - q, method="higher"))


__all__ = [
    "Z95", "wilson_interval", "bootstrap_ci", "PairedDifference", "paired_difference", "McNemar",
    "mcnemar_exact", "holm", "jaccard", "expected_jaccard", "adjusted_jaccard", "smallest_reaching",
    "k_star_interval",
]
