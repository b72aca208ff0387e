"""Metrics: dNTP (the distribution-alignment criterion of the LTV work), accuracy, task means with
their bootstrap CIs (:func:`mean_over_tasks`) and correlations. Intervals and paired comparisons
live in :mod:`sitelens.stats`.

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

from sitelens.stats import bootstrap_ci


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
