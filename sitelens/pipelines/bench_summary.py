"""Summaries of a bench results table (:func:`sitelens.pipelines.bench.read_results`): per (model,
method) means over tasks with bootstrap intervals, the dNTP–accuracy correlation across cells, the
markdown report of each model, its correlations as a table (:func:`correlation_rows`) and the
dNTP–accuracy scatter; the tasks where every method finished
(:func:`complete_tasks`) and each method's gap to a reference method on them
(:func:`gaps_to_reference`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from sitelens.eval.labels import LABEL_METRICS, nan_mean
from sitelens.eval.metrics import correlation
from sitelens.format import fmt_float, fmt_int
from sitelens.stats import bootstrap_ci

# A bootstrap over fewer tasks than this resamples too few values to say how the mean would vary
# over tasks (over 3 tasks it has at most 10 distinct means); such rows get no interval over tasks.
MIN_TASKS_FOR_CI = 5


def summary_table(df: pd.DataFrame, *, n_boot: int = 1000, seed: int = 0) -> pd.DataFrame:
    """Per (model, method), means over tasks: first_token_acc, exact_match (with a bootstrap 95%
    CI over tasks when the method ran on at least :data:`MIN_TASKS_FOR_CI` tasks, else NaN), dntp,
    trainable_params, fit_seconds, seconds_per_item, n_tasks; and the label
    metrics (:data:`LABEL_METRICS`) over the tasks that have them (``n_label_tasks``)."""
    rows = []
    ok = df[pd.to_numeric(df["exact_match"], errors="coerce").notna()]  # failed cells left out
    for (model, method), g in ok.groupby(["model", "method"], sort=False):
        lo, hi = (bootstrap_ci(g["exact_match"].to_numpy(float), n_boot=n_boot, seed=seed)
                  if len(g) >= MIN_TASKS_FOR_CI else (float("nan"), float("nan")))
        rows.append({
            "model": model,
            "method": method,
            "n_tasks": len(g),
            "first_token_acc": g["first_token_acc"].mean(),
            "exact_match": g["exact_match"].mean(),
            "exact_match_lo": lo,
            "exact_match_hi": hi,
            "dntp": g["dntp"].mean(),
            "trainable_params": g["trainable_params"].median(),
            "fit_seconds": g["fit_seconds"].mean(),
            "seconds_per_item": g["seconds_per_item"].mean(),
            "n_label_tasks": int(_numeric(g, "chance").notna().sum()),
            **{m: nan_mean(_numeric(g, m)) for m in LABEL_METRICS},
        })
    return pd.DataFrame(rows)


def complete_tasks(df: pd.DataFrame, methods: Sequence[str] | None = None) -> pd.DataFrame:
    """The finished rows (``exact_match`` a number) of the tasks where every method of ``methods``
    finished (default: every method of ``df``), so that every method is averaged over the same tasks."""
    ok = df[pd.to_numeric(df["exact_match"], errors="coerce").notna()]
    need = set(df["method"] if methods is None else methods)
    return ok[ok["task"].isin([t for t, g in ok.groupby("task") if set(g["method"]) >= need])]


def gaps_to_reference(df: pd.DataFrame, methods: Sequence[str], by: Sequence[str] = ("model",),
                      reference: str = "icl") -> pd.DataFrame:
    """Per ``by`` group and method, over the tasks where all ``methods`` finished: ``n_tasks``,
    ``n_items``, mean ``exact_match`` and ``em_gap`` (minus ``reference``'s); over the tasks with a
    closed label set, ``n_label_tasks``, mean ``label_acc`` (``label_acc_full``), ``label_gap`` and
    ``chance``; the median ``trainable_params`` and mean ``fit_seconds`` and ``seconds_per_item``."""
    rows = []
    for key, g in df.groupby(list(by), sort=False):
        g = complete_tasks(g, methods)
        ref = g[g["method"] == reference]
        ref_lab = ref[_numeric(ref, "chance").notna()]
        for method in [m for m in methods if m in set(g["method"])]:
            m = g[g["method"] == method]
            lab = m[_numeric(m, "chance").notna()]
            rows.append({
                **dict(zip(by, key if isinstance(key, tuple) else (key,))), "method": method,
                "n_tasks": len(m), "n_items": int(m["n"].sum()), "exact_match": m["exact_match"].mean(),
                "em_gap": m["exact_match"].mean() - ref["exact_match"].mean(), "n_label_tasks": len(lab),
                "label_acc": lab["label_acc_full"].mean() if len(lab) else np.nan,
                "label_gap": (lab["label_acc_full"].mean() - ref_lab["label_acc_full"].mean()
                              if len(lab) else np.nan),
                "chance": lab["chance"].mean() if len(lab) else np.nan,
                "trainable_params": m["trainable_params"].median(), "fit_seconds": m["fit_seconds"].mean(),
                "seconds_per_item": m["seconds_per_item"].mean(),
            })
    return pd.DataFrame(rows)


def _numeric(df: pd.DataFrame, column: str) -> pd.Series:
    """``df[column]`` as numbers (NaN where empty, or everywhere in a table without the column)."""
    if column not in df.columns:
        return pd.Series(float("nan"), index=df.index)
    return pd.to_numeric(df[column], errors="coerce")


def dntp_accuracy_correlation(
    df: pd.DataFrame, *, accuracy: str = "exact_match", exclude: Sequence[str] = ("icl",)
) -> dict:
    """Pearson and Spearman correlation of dNTP and accuracy across (task, method) cells, per
    model (``exclude``: the reference method, whose dNTP is 0 by construction).

    Pooled cells mix easy and hard tasks; ``within_task_spearman`` removes that: the Spearman
    correlation across methods inside each task, averaged over the ``n_tasks_within`` tasks
    where it is defined (≥ 3 finite cells, neither column constant)."""
    out = {}
    for model, g in df[~df["method"].isin(exclude)].groupby("model", sort=False):
        per_task = [correlation(t["dntp"], t[accuracy], "spearman") for _, t in g.groupby("task")]
        per_task = [r for r in per_task if np.isfinite(r)]
        out[model] = {
            "pearson": correlation(g["dntp"], g[accuracy], "pearson"),
            "spearman": correlation(g["dntp"], g[accuracy], "spearman"),
            "n_cells": int((np.isfinite(g["dntp"].to_numpy(float))
                            & np.isfinite(g[accuracy].to_numpy(float))).sum()),
            "within_task_spearman": float(np.mean(per_task)) if per_task else float("nan"),
            "n_tasks_within": len(per_task),
        }
    return out


def correlation_rows(df: pd.DataFrame, methods: dict[str, Sequence[str]],
                     accuracies: Sequence[str] = ("exact_match",)) -> pd.DataFrame:
    """:func:`dntp_accuracy_correlation` as a display table: a row per model, accuracy column and
    labelled set of excluded methods (``methods``: label -> methods left out), with ``cells``, the
    pooled Pearson r and Spearman ρ and the mean within-task Spearman ρ (and its task count)."""
    rows = []
    for acc in accuracies:
        for label, exclude in methods.items():
            for model, c in dntp_accuracy_correlation(df, accuracy=acc, exclude=exclude).items():
                rows.append({"model": model, "accuracy": acc, "methods": label, "cells": c["n_cells"],
                             "Pearson r": f"{c['pearson']:.2f}",
                             "Spearman ρ (pooled)": f"{c['spearman']:.2f}",
                             "Spearman ρ within a task (mean)":
                                 f"{c['within_task_spearman']:.2f} ({c['n_tasks_within']} tasks)"})
    return pd.DataFrame(rows)


def summary_markdown(df: pd.DataFrame, *, n_boot: int = 1000, seed: int = 0) -> str:
    """One markdown section per model: a row per method (means over tasks), the label-ranking
    table where some tasks have a closed label set (with the chance level), and the dNTP–accuracy
    correlation across cells."""
    table = summary_table(df, n_boot=n_boot, seed=seed)
    corr = dntp_accuracy_correlation(df)
    parts = []
    for model, g in table.groupby("model", sort=False):
        lines = [
            f"## {model}",
            "",
            "| method | tasks | first-token acc | exact match (95% CI over tasks) | dNTP | "
            "trainable params | fit s | s / item |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in g.itertuples():
            ci = (f" ({fmt_float(r.exact_match_lo)}–{fmt_float(r.exact_match_hi)})"
                  if r.n_tasks >= MIN_TASKS_FOR_CI else "")
            lines.append(
                f"| {r.method} | {r.n_tasks} | {fmt_float(r.first_token_acc)} | "
                f"{fmt_float(r.exact_match)}{ci} | "
                f"{fmt_float(r.dntp)} | {fmt_int(r.trainable_params)} | {fmt_float(r.fit_seconds, 1)} | "
                f"{fmt_float(r.seconds_per_item, 3)} |"
            )
        if (g["n_tasks"] < MIN_TASKS_FOR_CI).any():
            lines += ["", f"No interval over tasks where a method ran on fewer than {MIN_TASKS_FOR_CI} "
                          "tasks: a bootstrap over so few tasks cannot show how the mean varies over "
                          "tasks."]
        lines += _label_lines(g)
        c = corr.get(model)
        if c is not None:
            lines += ["", f"dNTP vs exact match across {c['n_cells']} (task, method) cells "
                          f"(ICL excluded): Pearson r = {fmt_float(c['pearson'], 2)}, "
                          f"Spearman ρ = {fmt_float(c['spearman'], 2)}; within a task, across methods, "
                          f"Spearman ρ = {fmt_float(c['within_task_spearman'], 2)} (mean over "
                          f"{c['n_tasks_within']} tasks)."]
        failed = df[(df["model"] == model) & df["error"].fillna("").str.len().gt(0)
                    & ~df["error"].fillna("").str.startswith("dntp:")]
        if len(failed):
            lines += ["", f"{len(failed)} cell(s) failed: "
                      + "; ".join(f"{r.task}/{r.method}" for r in failed.itertuples()) + "."]
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


def _label_lines(g: pd.DataFrame) -> list[str]:
    """The label-ranking table of one model's :func:`summary_table` rows (none when no task has a
    closed label set)."""
    if not (g["n_label_tasks"] > 0).any():
        return []
    lines = ["", "Label ranking, over the tasks with a closed label set (chance: mean of "
                 "1 / number of labels):", "",
             "| method | tasks | first-token rank | full-label rank | length-normalized | chance |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in g.itertuples():
        lines.append(f"| {r.method} | {r.n_label_tasks} | {fmt_float(r.label_acc_first)} | "
                     f"{fmt_float(r.label_acc_full)} | {fmt_float(r.label_acc_full_norm)} | "
                     f"{fmt_float(r.chance)} |")
    return lines


def dntp_accuracy_figure(df: pd.DataFrame, *, accuracy: str = "exact_match"):
    """A plotly scatter of dNTP (x) vs accuracy (y), one point per (task, method) cell, coloured
    by method, one facet per model."""
    import plotly.express as px

    data = df[np.isfinite(df["dntp"].astype(float))]
    fig = px.scatter(data, x="dntp", y=accuracy, color="method", facet_col="model",
                     hover_data=["task"], labels={"dntp": "dNTP = KL(P_icl ‖ P_method)"})
    fig.update_layout(title="dNTP vs accuracy")
    return fig


__all__ = [
    "MIN_TASKS_FOR_CI", "complete_tasks", "correlation_rows", "dntp_accuracy_correlation",
    "dntp_accuracy_figure", "gaps_to_reference", "summary_markdown", "summary_table",
]
