"""Paired comparisons of methods in a benchmark table (one row per task and method): A − B over
the tasks both ran, by :func:`sitelens.stats.paired_difference`."""

from __future__ import annotations

from collections.abc import Iterable

import pandas as pd

from sitelens.stats import paired_difference


def paired_rows(df: pd.DataFrame, pairs: Iterable[tuple[str, str]],
                metric: str = "exact_match") -> pd.DataFrame:
    """Per ``(a, b)`` of ``pairs`` whose methods both ran: ``a − b`` of ``metric`` over tasks (the
    same items on both sides), with its 95% bootstrap interval over tasks, n and the counts of
    tasks where each side is ahead."""
    wide = df.pivot_table(index="task", columns="method", values=metric)
    rows = []
    for a, b in pairs:
        if a in wide and b in wide:
            r = paired_difference(wide[a].to_numpy(), wide[b].to_numpy(), over="tasks")
            rows.append({"model": df.model.iloc[0], "metric": metric, "a": a, "b": b, "diff": r.diff,
                         "ci_low": r.ci_low, "ci_high": r.ci_high, "n": r.n, "over": r.over,
                         "a_ahead": r.a_ahead, "b_ahead": r.b_ahead})
    return pd.DataFrame(rows)
