"""Plots (plotly). Every function returns a ``plotly.graph_objects.Figure`` and never shows it.

- :func:`alpha_heatmap`: one α map (layer × head, hover ``L{l}H{h}: value``).
- :func:`alpha_facets`: α maps of several tasks on one shared colour scale.
- :func:`effect_vs_alpha`: per-head causal-effect map beside the α map.
- :func:`patching_curves`: intra-task accuracy vs k for top / bottom / random heads, with CIs.
- :func:`matrix_heatmap`: task × task matrices (inter-task accuracy, α similarity), tasks ordered by
  hierarchical clustering (:func:`cluster_order`); both live in :mod:`sitelens.viz.matrices`.
- :func:`dntp_scatter`: dNTP vs accuracy per method (baselines).
- :func:`cost_scaling`: cost per stage vs model size, log-log, with fitted power laws (scaling).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from jaxtyping import Float
from plotly.subplots import make_subplots
from torch import Tensor

from sitelens.eval.metrics import correlation
from sitelens.viz.matrices import cluster_order, matrix_heatmap

COLORS = {
    "top": "#d62728",
    "bottom": "#1f77b4",
    "random": "#7f7f7f",
    "full_minus_top": "#d62728",
    "full_minus_bottom": "#1f77b4",
    "zero_shot": "#2ca02c",
    "site": "#9467bd",
}
LABELS = {
    "top": "top-k by α",
    "bottom": "bottom-k by α",
    "random": "random k (mean of seeds)",
    "full_minus_top": "SITE α without top-k",
    "full_minus_bottom": "SITE α without bottom-k",
    "zero_shot": "zero-shot",
    "site": "SITE (full α)",
}


def _np2d(x) -> np.ndarray:
    if isinstance(x, Tensor):
        x = x.detach().float().cpu().numpy()
    a = np.asarray(x, dtype=float)
    if a.ndim != 2:
        raise ValueError(f"Expected a [n_layers, n_heads] map, got shape {a.shape}.")
    return a


def _head_hover(a: np.ndarray, fmt: str) -> list[list[str]]:
    n_layers, n_heads = a.shape
    return [[f"L{layer}H{h}: {a[layer, h]:{fmt}}" for h in range(n_heads)]
            for layer in range(n_layers)]


def _head_heatmap(
    a: np.ndarray, *, name: str, fmt: str, colorscale, zmin=None, zmax=None, zmid=None,
    coloraxis: str | None = None, colorbar: dict | None = None,
) -> go.Heatmap:
    kw = dict(
        z=a,
        x=list(range(a.shape[1])),
        y=list(range(a.shape[0])),
        text=_head_hover(a, fmt),
        hovertemplate="%{text}<extra>" + name + "</extra>",
        name=name,
    )
    if coloraxis:
        kw["coloraxis"] = coloraxis
    else:
        kw.update(colorscale=colorscale, zmin=zmin, zmax=zmax, zmid=zmid)
        if colorbar:
            kw["colorbar"] = colorbar
    return go.Heatmap(**kw)


def alpha_heatmap(
    alpha: Float[Tensor, "n_layers n_heads"],
    title: str | None = None,
    *,
    colorscale: str = "Viridis",
    zmin: float | None = 0.0,
    zmax: float | None = 1.0,
    value_name: str = "α",
    fmt: str = ".3f",
) -> go.Figure:
    """Heatmap of a ``[n_layers, n_heads]`` map (x = head, y = layer, layer 0 at the top);
    hover ``L{l}H{h}: value``. ``zmin``/``zmax`` default to α's range [0, 1]; pass ``None`` to
    fit the data."""
    a = _np2d(alpha)
    fig = go.Figure(
        _head_heatmap(a, name=value_name, fmt=fmt, colorscale=colorscale, zmin=zmin, zmax=zmax,
                      colorbar={"title": {"text": value_name}})
    )
    fig.update_layout(
        title=title or f"{value_name} per head",
        xaxis_title="head",
        yaxis_title="layer",
        template="plotly_white",
        width=max(360, 60 + 28 * a.shape[1] + 120),
        height=max(300, 100 + 18 * a.shape[0]),
    )
    fig.update_yaxes(autorange="reversed")
    return fig


def alpha_facets(
    alphas: Mapping[str, Float[Tensor, "n_layers n_heads"]],
    *,
    title: str | None = None,
    cols: int = 4,
    colorscale: str = "Viridis",
    zmin: float | None = None,
    zmax: float | None = None,
    value_name: str = "α",
    fmt: str = ".3f",
) -> go.Figure:
    """One α map per task (a panel each), all on one shared colour scale (one colour bar).
    ``zmin``/``zmax`` default to the range over all maps."""
    names = list(alphas)
    if not names:
        raise ValueError("alpha_facets needs at least one α map.")
    maps = [_np2d(alphas[n]) for n in names]
    lo = min(float(np.nanmin(m)) for m in maps) if zmin is None else zmin
    hi = max(float(np.nanmax(m)) for m in maps) if zmax is None else zmax
    cols = max(1, min(cols, len(names)))
    rows = math.ceil(len(names) / cols)
    fig = make_subplots(
        rows=rows, cols=cols, subplot_titles=names, horizontal_spacing=0.04,
        vertical_spacing=min(0.12, 0.3 / rows),
    )
    for i, (n, m) in enumerate(zip(names, maps, strict=True)):
        fig.add_trace(
            _head_heatmap(m, name=n, fmt=fmt, colorscale=colorscale, coloraxis="coloraxis"),
            row=i // cols + 1, col=i % cols + 1,
        )
    fig.update_layout(
        title=title or f"{value_name} per head across tasks (one colour scale)",
        coloraxis={"colorscale": colorscale, "cmin": lo, "cmax": hi,
                   "colorbar": {"title": {"text": value_name}}},
        template="plotly_white",
        width=max(500, 260 * cols + 100),
        height=max(320, 240 * rows + 80),
    )
    fig.update_yaxes(autorange="reversed")
    return fig


def effect_vs_alpha(
    effects: Float[Tensor, "n_layers n_heads"],
    alpha: Float[Tensor, "n_layers n_heads"],
    *,
    title: str | None = None,
    effect_name: str = "causal effect",
) -> go.Figure:
    """The per-head causal-effect map (diverging scale centred at 0) beside the α map; the title
    reports their Spearman ρ."""
    e, a = _np2d(effects), _np2d(alpha)
    if e.shape != a.shape:
        raise ValueError(f"effects {e.shape} and alpha {a.shape} must have the same shape.")
    rho = correlation(e, a, "spearman")
    fig = make_subplots(rows=1, cols=2, subplot_titles=(effect_name, "α"), horizontal_spacing=0.14)
    bound = float(np.nanmax(np.abs(e))) or 1.0
    fig.add_trace(
        _head_heatmap(e, name=effect_name, fmt=".4f", colorscale="RdBu_r", zmin=-bound,
                      zmax=bound, zmid=0.0, colorbar={"x": 0.43, "title": {"text": "Δp"}}),
        row=1, col=1,
    )
    fig.add_trace(
        _head_heatmap(a, name="α", fmt=".3f", colorscale="Viridis", zmin=0.0, zmax=1.0,
                      colorbar={"x": 1.0, "title": {"text": "α"}}),
        row=1, col=2,
    )
    fig.update_layout(
        title=(title or "Per-head causal effect vs α") + f" (Spearman ρ = {rho:.2f})",
        template="plotly_white",
        width=max(700, 2 * (60 + 28 * a.shape[1]) + 260),
        height=max(320, 100 + 18 * a.shape[0]),
    )
    fig.update_xaxes(title_text="head")
    fig.update_yaxes(title_text="layer", autorange="reversed")
    return fig


# ----------------------------------------------------------------------------------------------
# patching curves


def _band(x, lo, hi, color: str, group: str) -> go.Scatter:
    return go.Scatter(
        x=list(x) + list(x)[::-1],
        y=list(hi) + list(lo)[::-1],
        fill="toself",
        fillcolor=color,
        opacity=0.18,
        line={"width": 0},
        hoverinfo="skip",
        showlegend=False,
        legendgroup=group,
        name=f"{group} CI",
    )


def _curve_frame(df: pd.DataFrame, selection: str, y: str) -> pd.DataFrame:
    sub = df[df["selection"] == selection]
    if sub.empty:
        return sub
    if selection == "random":
        # mean over seeds; band = envelope of the seeds' CIs (item and seed variability)
        g = sub.groupby("k", sort=True)
        lo_col = "ci_low" if y == "accuracy" else y
        hi_col = "ci_high" if y == "accuracy" else y
        return pd.DataFrame(
            {"k": g[y].mean().index, y: g[y].mean().values,
             "ci_low": g[lo_col].min().values, "ci_high": g[hi_col].max().values,
             "n_seeds": g[y].size().values}
        )
    return sub.sort_values("k")


def log_ticks(values: Sequence[int], min_ratio: float = 1.3) -> list[int]:
    """The tick values of a log axis that do not crowd each other: ascending, each at least
    ``min_ratio`` times the previous one, the largest value always kept (it replaces a kept
    neighbour that is too close)."""
    ticks: list[int] = []
    for v in sorted(set(values)):
        if not ticks or v >= ticks[-1] * min_ratio:
            ticks.append(v)
    if values and ticks[-1] != max(values):
        if len(ticks) > 1 and max(values) < ticks[-1] * min_ratio:
            ticks.pop()
        ticks.append(max(values))
    return ticks


def patching_curves(
    df: pd.DataFrame,
    title: str | None = None,
    *,
    task: str | None = None,
    y: str = "accuracy",
    log_x: bool = True,
) -> go.Figure:
    """Intra-task patching curves from :func:`sitelens.patching.intra_task`: ``y`` (default
    first-token accuracy) vs k for top / bottom / random heads (random: mean over seeds, band =
    envelope of the seeds' CIs), with bootstrap-CI bands. If the reverse direction is present, a
    second panel shows the SITE α with the top-k / bottom-k heads removed. ``zero_shot`` and
    ``site`` reference rows become dashed horizontal lines. Several tasks give one row of panels
    per task (or pick one with ``task``).

    About 65 lines of body: the three selections × two panels × bands share one loop, and splitting
    it would scatter the styling of one figure over several helpers."""
    if task is not None:
        df = df[df["task"] == task]
    if df.empty:
        raise ValueError("patching_curves: no rows to plot.")
    tasks = list(dict.fromkeys(df["task"])) if "task" in df.columns else [""]
    has_rev = df["selection"].isin(["full_minus_top", "full_minus_bottom"]).any()
    ncols = 2 if has_rev else 1
    titles = []
    for t in tasks:
        titles.append(f"{t}: inject into k heads (α = 1)" if t else "inject into k heads (α = 1)")
        if has_rev:
            titles.append(f"{t}: SITE α with k heads off" if t else "SITE α with k heads off")
    fig = make_subplots(rows=len(tasks), cols=ncols, subplot_titles=titles, shared_yaxes=True,
                        vertical_spacing=min(0.12, 0.3 / len(tasks)))
    panels = [("top", "bottom", "random")] + ([("full_minus_top", "full_minus_bottom")]
                                              if has_rev else [])
    shown: set[str] = set()
    use_ci = y == "accuracy"
    for r, t in enumerate(tasks, start=1):
        sub = df[df["task"] == t] if t else df
        for c, sels in enumerate(panels, start=1):
            for sel in sels:
                cf = _curve_frame(sub, sel, y)
                if cf.empty:
                    continue
                color = COLORS[sel]
                if use_ci or sel == "random":
                    fig.add_trace(_band(cf["k"], cf["ci_low"], cf["ci_high"], color, sel),
                                  row=r, col=c)
                hover = (
                    "k=%{x}<br>" + y + "=%{y:.3f}"
                    + ("<br>CI [%{customdata[0]:.3f}, %{customdata[1]:.3f}]" if use_ci else "")
                    + "<extra>" + LABELS[sel] + "</extra>"
                )
                fig.add_trace(
                    go.Scatter(
                        x=cf["k"], y=cf[y], mode="lines+markers", name=LABELS[sel],
                        line={"color": color, "dash": "dot" if sel.startswith("full") else None},
                        customdata=np.stack([cf["ci_low"], cf["ci_high"]], axis=1),
                        hovertemplate=hover, legendgroup=sel, showlegend=sel not in shown,
                    ),
                    row=r, col=c,
                )
                shown.add(sel)
            for ref in ("zero_shot", "site"):
                ref_rows = sub[sub["selection"] == ref]
                if not ref_rows.empty:
                    v = float(ref_rows[y].iloc[0])
                    fig.add_hline(
                        y=v, line={"color": COLORS[ref], "dash": "dash", "width": 1},
                        annotation_text=f"{LABELS[ref]} {v:.2f}", annotation_position="top left",
                        row=r, col=c,
                    )
    fig.update_xaxes(title_text="k (heads)", type="log" if log_x else "linear")
    if log_x:
        ks = log_ticks(sorted({int(k) for k in df["k"] if int(k) > 0}))
        fig.update_xaxes(tickvals=ks, ticktext=[str(k) for k in ks], tickangle=0)
    fig.update_yaxes(title_text=y.replace("_", " "), col=1)
    fig.update_layout(
        title=title or "Intra-task activation patching",
        template="plotly_white",
        width=520 * ncols + 120,
        height=360 * len(tasks) + 80,
    )
    return fig


# ----------------------------------------------------------------------------------------------
# task × task matrices


def dntp_scatter(
    df: pd.DataFrame,
    title: str | None = None,
    *,
    x: str = "dntp",
    y: str = "accuracy",
    color: str = "method",
    hover: Sequence[str] = ("model", "task"),
    log_x: bool = False,
) -> go.Figure:
    """Scatter of dNTP (KL(P_icl ‖ P_method) at the answer position) vs accuracy, one colour per
    method, one point per row (e.g. per model × task × method); the title reports Spearman's ρ
    over all points."""
    for col in (x, y, color):
        if col not in df.columns:
            raise ValueError(f"dntp_scatter needs a {col!r} column; columns: {list(df.columns)}.")
    hover = [h for h in hover if h in df.columns]
    fig = go.Figure()
    for i, (name, sub) in enumerate(df.groupby(color, sort=False)):
        lines = [
            "<br>".join(f"{h}={sub[h].iloc[j]}" for h in hover) for j in range(len(sub))
        ]
        fig.add_trace(
            go.Scatter(
                x=sub[x], y=sub[y], mode="markers", name=str(name), text=lines,
                marker={"size": 8, "opacity": 0.8,
                        "color": _palette(i)},
                hovertemplate="%{text}<br>" + x + "=%{x:.3f}<br>" + y + "=%{y:.3f}"
                + "<extra>" + str(name) + "</extra>",
            )
        )
    ok = df[[x, y]].dropna()
    rho = correlation(ok[x].to_numpy(), ok[y].to_numpy(), "spearman")
    fig.update_layout(
        title=(title or f"{y.replace('_', ' ')} vs dNTP") + f" (Spearman ρ = {rho:.2f})",
        xaxis_title="dNTP = KL(P_icl ‖ P_method)" if x == "dntp" else x,
        yaxis_title=y.replace("_", " "),
        template="plotly_white",
        width=720,
        height=480,
    )
    if log_x:
        fig.update_xaxes(type="log")
    return fig


def cost_scaling(
    df: pd.DataFrame, fits: Mapping[str, dict], *, y: str, memory: str, basis: str,
    stages: Sequence[str], units: Mapping[str, str], predict: Callable[[dict, float, float], float],
) -> go.Figure:
    """Cost per stage vs model size, log-log: one panel per stage of ``stages`` present in
    ``df.stage`` (``y`` per unit of ``units[stage]``) plus peak memory (``memory``, the max per
    model), one colour per prompt length ``df.length``, markers at the measured models
    (``df.params_compute``) and the fitted power law ``predict(fits[stage], P, T)`` dotted."""
    panels = [s for s in stages if s in set(df.stage)] + ["memory"]
    cols, rows = 4, -(-len(panels) // 4)
    titles = [f"{s} ({basis} / {units[s]})" if s != "memory" else "peak memory (GiB)" for s in panels]
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=titles, horizontal_spacing=0.06,
                        vertical_spacing=0.14)
    for i, panel in enumerate(panels):
        r, c = i // cols + 1, i % cols + 1
        for j, L in enumerate(sorted(df.length.dropna().astype(int).unique())):
            if panel == "memory":
                d = df[df.length == L].groupby("model").agg(x=("params_compute", "first"),
                                                            y=(memory, "max")).reset_index()
            else:
                d = df[(df.stage == panel) & (df.length == L)].rename(columns={"params_compute": "x", y: "y"})
            d, color, grp = d.sort_values("x"), _palette(j), f"L={L}"
            if d.empty:
                continue
            fig.add_trace(go.Scatter(x=d.x, y=d.y, mode="markers", name=grp, legendgroup=grp,
                                     showlegend=i == 0, marker=dict(color=color, size=7), text=d.model,
                                     hovertemplate="%{text}<br>P=%{x:.3s}<br>%{y:.3g}"), row=r, col=c)
            if panel in fits:
                T = float(df[(df.stage == panel) & (df.length == L)].prompt_tokens.mean())
                xs = np.geomspace(d.x.min(), max(d.x.max(), 1), 20)
                fig.add_trace(go.Scatter(x=xs, y=[predict(fits[panel], x, T) for x in xs], mode="lines",
                                         line=dict(color=color, dash="dot", width=1),
                                         legendgroup=grp, showlegend=False, hoverinfo="skip"), row=r, col=c)
        fig.update_xaxes(type="log", title_text="compute params P" if r == rows else None, row=r, col=c)
        fig.update_yaxes(type="log", row=r, col=c)
    fig.update_layout(width=1400, height=380 * rows, template="plotly_white",
                      title="sitelens cost per stage vs model size (dotted: the log-log fit)",
                      legend=dict(title="prompt tokens"))
    return fig


def _palette(i: int) -> str:
    import plotly.colors

    pal = plotly.colors.qualitative.Plotly
    return pal[i % len(pal)]


__all__ = [
    "alpha_heatmap", "alpha_facets", "effect_vs_alpha", "patching_curves", "cluster_order",
    "matrix_heatmap", "dntp_scatter", "cost_scaling",
]
