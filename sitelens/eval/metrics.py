"""Metrics: dNTP (the distribution-alignment criterion of the LTV work), accuracy, the Wilson score
interval of an accuracy over items, bootstrap CIs (of items, and of task means:
:func:`mean_over_tasks`) and correlations.

dNTP = KL(P_icl ‖ P_method) of the next-token distribution at the answer position (the position
after the prompt), over the full vocabulary, averaged over queries; P_icl is the k-shot (10-shot)
ICL distribution of the same query.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor


def dntp_per_item(
    p_icl_logits: Float[Tensor, "n d_vocab"], p_method_logits: Float[Tensor, "n d_vocab"]
) -> Float[Tensor, " n"]:
    """``KL(P_icl ‖ P_method)`` per query, from logits or log-probabilities (either is
    normalised with ``log_softmax``), computed in float64."""
    a = torch.as_tensor(p_icl_logits)
    b = torch.as_tensor(p_method_logits)
    if a.shape != b.shape or a.dim() != 2:
        raise ValueError(
            f"dNTP needs two [n, d_vocab] tensors of the same shape, got {list(a.shape)} and "
            f"{list(b.shape)}"
        )
    log_p = torch.log_softmax(a.double(), dim=-1)  # [n, d_vocab]
    log_q = torch.log_softmax(b.double(), dim=-1)  # [n, d_vocab]
    return (log_p.exp() * (log_p - log_q)).sum(-1)  # [n]


def dntp(
    p_icl_logits: Float[Tensor, "n d_vocab"], p_method_logits: Float[Tensor, "n d_vocab"]
) -> float:
    """Mean over queries of ``KL(P_icl ‖ P_method)`` (nats)."""
    return float(dntp_per_item(p_icl_logits, p_method_logits).mean())


def accuracy(predictions, targets=None) -> float:
    """Mean of ``predictions == targets``; with one argument, the mean of booleans (e.g. a
    ``correct`` column). NaN for no items."""
    pred = np.asarray(torch.as_tensor(predictions).cpu() if isinstance(predictions, Tensor)
                      else predictions)
    if targets is not None:
        tgt = np.asarray(torch.as_tensor(targets).cpu() if isinstance(targets, Tensor)
                         else targets)
        if pred.shape != tgt.shape:
            raise ValueError(f"predictions {pred.shape} and targets {tgt.shape} differ in shape")
        pred = pred == tgt
    if pred.size == 0:
        return float("nan")
    return float(np.mean(pred.astype(float)))


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


def bootstrap_ci(
    values, n_boot: int = 1000, seed: int = 0, *, level: float = 0.95
):
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


def mean_over_tasks(df: pd.DataFrame, by: Sequence[str], value: str = "accuracy", *, n_boot: int = 2000,
                    seed: int = 0) -> pd.DataFrame:
    """Per group of ``by`` (in sorted order): the mean over tasks of each task's mean ``value`` (the
    seeds, draws and items of a task averaged first; non-finite task means left out), its 95%
    percentile bootstrap CI over tasks (:func:`bootstrap_ci`) and ``n_tasks``."""
    rows = []
    for key, g in df.groupby([*by, "task"])[value].mean().groupby(level=list(range(len(by)))):
        x = g.to_numpy(float)
        f = x[np.isfinite(x)]
        lo, hi = bootstrap_ci(f, n_boot=n_boot, seed=seed)
        rows.append({**dict(zip(by, key if isinstance(key, tuple) else (key,))),
                     value: float(f.mean()) if len(f) else float("nan"), "ci_low": lo, "ci_high": hi,
                     "n_tasks": len(x)})
    return pd.DataFrame(rows)


def _as_float_array(x) -> np.ndarray:
    """A flat float64 array; a tensor is detached and read as float32 first (as stored)."""
    if isinstance(x, Tensor):
        x = x.detach().float().cpu().numpy()
    return np.asarray(x, dtype=float).ravel()


def correlation(x, y, method: str = "pearson") -> float:
    """Pearson or Spearman (ties ranked by their average) correlation of two equally long
    sequences, arrays or tensors (flattened: ``[n_layers, n_heads]`` maps compare head by head),
    over the pairs where both are finite; NaN with fewer than 3 pairs or no variance."""
    a, b = _as_float_array(x), _as_float_array(y)
    if a.shape != b.shape:
        raise ValueError(f"correlation needs equally long inputs, got {a.size} and {b.size}.")
    ok = np.isfinite(a) & np.isfinite(b)
    a, b = a[ok], b[ok]
    if a.size < 3:
        return float("nan")
    if method == "spearman":
        import pandas as pd

        a = pd.Series(a).rank(method="average").to_numpy()
        b = pd.Series(b).rank(method="average").to_numpy()
    elif method != "pearson":
        raise ValueError(f"method must be 'pearson' or 'spearman', got {method!r}")
    if a.std() == 0 or b.std() == 0:
        return float("nan")
    return float(np.corrcoef(a, b)[0, 1])
