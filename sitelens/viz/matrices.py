"""Task × task matrices (inter-task accuracy, α similarity) as heatmaps, tasks ordered by
average-linkage hierarchical clustering (UPGMA) so that blocks of related tasks sit together.
Every function returns a ``plotly.graph_objects.Figure``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

if TYPE_CHECKING:  # plotly (and torch, through patching) only when a heatmap is drawn
    import plotly.graph_objects as go


def _upgma_order(D: np.ndarray) -> list[int]:
    """Leaf order of average-linkage (UPGMA) agglomerative clustering of a distance matrix
    (deterministic: the closest pair merges first, ties by index; each merge puts the two
    sub-orders so that their closest ends meet)."""
    n = D.shape[0]
    clusters: dict[int, list[int]] = {i: [i] for i in range(n)}
    dist = {(i, j): float(D[i, j]) for i in range(n) for j in range(i + 1, n)}
    nxt = n
    while len(clusters) > 1:
        (a, b), _ = min(dist.items(), key=lambda kv: (kv[1], kv[0]))
        la, lb = clusters.pop(a), clusters.pop(b)
        # orient the two leaf lists so that the most similar ends are adjacent
        best = min(
            ((D[x[-1], y[0]], x, y) for x in (la, la[::-1]) for y in (lb, lb[::-1])),
            key=lambda t: t[0],
        )
        merged = list(best[1]) + list(best[2])
        new = {}
        for c in clusters:
            da = dist.pop((min(a, c), max(a, c)))
            db = dist.pop((min(b, c), max(b, c)))
            new[(c, nxt)] = (len(la) * da + len(lb) * db) / (len(la) + len(lb))
        dist.pop((min(a, b), max(a, b)))
        dist.update(new)
        clusters[nxt] = merged
        nxt += 1
    return next(iter(clusters.values()))


def cluster_order(matrix: pd.DataFrame) -> list[str]:
    """Order the tasks of a square task × task matrix by average-linkage hierarchical clustering
    of their profiles (each task's row and column concatenated; Euclidean distance). Uses scipy
    (optimal leaf ordering) when it is installed, else a numpy UPGMA."""
    names = list(matrix.index)
    if len(names) <= 2:
        return names
    M = matrix.loc[names, names].to_numpy(dtype=float)
    M = np.where(np.isfinite(M), M, np.nanmean(M) if np.isfinite(M).any() else 0.0)
    feats = np.concatenate([M, M.T], axis=1)  # [T, 2T]
    D = np.sqrt(((feats[:, None, :] - feats[None, :, :]) ** 2).sum(-1))  # [T, T]
    try:
        from scipy.cluster.hierarchy import leaves_list, linkage
        from scipy.spatial.distance import squareform

        Z = linkage(squareform(D, checks=False), method="average", optimal_ordering=True)
        idx = [int(i) for i in leaves_list(Z)]
    except ImportError:
        idx = _upgma_order(D)
    return [names[i] for i in idx]


def matrix_heatmap(
    df: pd.DataFrame,
    title: str | None = None,
    order: Sequence[str] | None = None,
    *,
    cluster: bool = True,
    mode: str = "alpha",
    value: str = "accuracy",
    value_name: str | None = None,
    colorscale: str = "Viridis",
    zmin: float | None = None,
    zmax: float | None = None,
    row_title: str | None = None,
    col_title: str | None = None,
    annotate: bool | None = None,
) -> go.Figure:
    """A task × task heatmap: a square DataFrame (e.g. an α-similarity matrix from
    :func:`sitelens.patching.alpha_similarity`) or the long output of
    :func:`sitelens.patching.inter_task` (pivoted for ``mode``: rows = source task A whose heads,
    columns = target task B whose embedding and test split).

    Tasks are shown in ``order``, else (``cluster``) in :func:`cluster_order`, else as given; the
    order used is stored in ``fig.layout.meta["order"]``. Cells are annotated with their value when
    there are at most 16 tasks (``annotate``)."""
    import plotly.graph_objects as go

    from sitelens.patching.analysis import transfer_matrix

    long = {"source_task", "target_task"} <= set(df.columns)
    if long:
        M = transfer_matrix(df, mode=mode, value=value)
        row_title = row_title or "source task (heads / α from)"
        col_title = col_title or "target task (embedding, test split)"
        value_name = value_name or value.replace("_", " ")
    else:
        M = df
        row_title = row_title or "task"
        col_title = col_title or "task"
        value_name = value_name or "similarity"
    if list(M.index) != list(M.columns):
        common = [n for n in M.index if n in M.columns]
        M = M.loc[common, common]
    if order is not None:
        names = list(order)
        missing = [n for n in names if n not in M.index]
        if missing:
            raise ValueError(f"order names tasks not in the matrix: {', '.join(missing)}.")
    elif cluster:
        names = cluster_order(M)
    else:
        names = list(M.index)
    Z = M.loc[names, names].to_numpy(dtype=float)  # [T, T]
    sep = " → " if long else " vs "
    text = [[f"{r}{sep}{c}: {Z[i, j]:.3f}" for j, c in enumerate(names)]
            for i, r in enumerate(names)]
    annotate = len(names) <= 16 if annotate is None else annotate
    hm = go.Heatmap(
        z=Z, x=names, y=names, text=text, hovertemplate="%{text}<extra></extra>",
        colorscale=colorscale, zmin=zmin, zmax=zmax, colorbar={"title": {"text": value_name}},
    )
    if annotate:
        hm.update(texttemplate="%{z:.2f}", textfont={"size": 9})
    fig = go.Figure(hm)
    fig.update_layout(
        title=title or value_name,
        xaxis_title=col_title,
        yaxis_title=row_title,
        template="plotly_white",
        width=max(480, 160 + 34 * len(names)),
        height=max(420, 140 + 34 * len(names)),
        meta={"order": names},
    )
    fig.update_yaxes(autorange="reversed")
    fig.update_xaxes(tickangle=-45)
    return fig


# ----------------------------------------------------------------------------------------------
# baselines


__all__ = ["cluster_order", "matrix_heatmap"]
