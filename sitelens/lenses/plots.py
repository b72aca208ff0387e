"""Plots of :class:`~sitelens.lenses.HeadScores` (plotly, imported on call; every function
returns a ``plotly.graph_objects.Figure``).

- :func:`alpha_uncertainty`: α over seeds, the mean beside its 95% interval width, heads whose
  interval contains 0.5 masked (neither reliably selected nor reliably off).
- :func:`lens_maps`: every lens of one model × task side by side, each as the heads' percentile
  rank within that lens (0 = least, 1 = most important), so lenses share one colour scale; hover
  shows the raw score and its interval.
- :func:`agreement_matrix`: lens × lens Spearman, mean ± sd over tasks, one panel per model.

Each title is wrapped to the figure's width and the top margin grows with its lines
(:func:`title_layout`), so a narrow figure (two lenses, one model) does not cut its title off.
"""

from __future__ import annotations

import math
import textwrap

import numpy as np
import pandas as pd

from sitelens.lenses.scores import HeadScores

TITLE_FONT = 17  # px, plotly's default title size
CHAR_WIDTH = 0.6  # a character's width in ems: an upper bound for this mostly lower-case text
LINE_HEIGHT = 1.3  # ems per title line
TITLE_X = 0.05  # where the title starts, as a share of the width (the plotly_white template's)


def title_layout(text: str, width: int, font_size: int = TITLE_FONT) -> dict:
    """Layout keys that fit ``text`` as a title into a figure ``width`` px wide: the text wrapped
    (``<br>``) to the characters that fit right of ``TITLE_X``, and a top margin of its lines plus
    35 px above and below them (plotly centres the title in the top margin; the panel titles sit
    below it)."""
    per_line = max(10, int((width * (1 - TITLE_X) - 20) / (CHAR_WIDTH * font_size)))
    lines = textwrap.wrap(text, per_line) or [""]
    height = math.ceil(LINE_HEIGHT * font_size * len(lines))
    return {"title": {"text": "<br>".join(lines), "font": {"size": font_size}, "x": TITLE_X,
                      "xanchor": "left"},  # plotly centres it in the top margin
            "margin": {"t": height + 70}}


def _hover(mean: np.ndarray, lo: np.ndarray, hi: np.ndarray, fmt: str = ".3f") -> list[list[str]]:
    L, H = mean.shape
    return [[f"L{layer}H{h}: {mean[layer, h]:{fmt}} [{lo[layer, h]:{fmt}}, {hi[layer, h]:{fmt}}]"
             for h in range(H)] for layer in range(L)]


def alpha_uncertainty(scores: HeadScores, lens: str = "alpha", *, threshold: float = 0.5,
                      title: str | None = None):
    """Two panels: mean α with heads whose interval contains ``threshold`` masked (grey), and the
    interval's width."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    s = scores.lens(lens) if lens in scores.lenses else scores
    mean = s.map(lens).numpy()
    lo, hi = s.map(lens, "ci_low").numpy(), s.map(lens, "ci_high").numpy()
    unsure = (lo <= threshold) & (hi >= threshold)
    masked = np.where(unsure, np.nan, mean)
    text = _hover(mean, lo, hi)
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.18, subplot_titles=[
        f"mean {lens} ({int(unsure.sum())} heads whose 95% interval contains {threshold} masked)",
        "95% interval width"])
    fig.add_trace(go.Heatmap(z=masked, text=text, hovertemplate="%{text}<extra></extra>",
                             colorscale="Viridis", zmin=0, zmax=1,
                             colorbar={"x": 0.42, "title": {"text": lens}}), row=1, col=1)
    fig.add_trace(go.Heatmap(z=hi - lo, text=text, hovertemplate="%{text}<extra></extra>",
                             colorscale="Greys", zmin=0, colorbar={"title": {"text": "width"}}),
                  row=1, col=2)
    meta = s.df.iloc[0]
    width = max(700, 2 * (60 + 28 * mean.shape[1]) + 300)
    fig.update_layout(title_layout(title or f"{meta.model} · {meta.task}: {lens} over seeds", width),
                      template="plotly_white", plot_bgcolor="#dddddd", width=width,
                      height=max(320, 120 + 18 * mean.shape[0]))
    fig.update_xaxes(title_text="head")
    fig.update_yaxes(title_text="layer", autorange="reversed")
    return fig


def lens_maps(scores: HeadScores, lenses: list[str] | None = None, *, cols: int = 4,
              title: str | None = None):
    """One panel per lens (one model × task), heads coloured by their percentile rank within
    the lens."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    lenses = lenses or scores.lenses
    cols = max(1, min(cols, len(lenses)))
    rows = math.ceil(len(lenses) / cols)
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=lenses, horizontal_spacing=0.04,
                        vertical_spacing=min(0.12, 0.3 / rows))
    for i, lens in enumerate(lenses):
        m = scores.map(lens).numpy()
        lo, hi = scores.map(lens, "ci_low").numpy(), scores.map(lens, "ci_high").numpy()
        pct = pd.Series(m.ravel()).rank(pct=True).to_numpy().reshape(m.shape)
        fig.add_trace(go.Heatmap(z=pct, text=_hover(m, lo, hi, ".3g"), coloraxis="coloraxis",
                                 hovertemplate="%{text}<extra>" + lens + "</extra>"),
                      row=i // cols + 1, col=i % cols + 1)
    d = scores.df.iloc[0]
    width = max(500, 240 * cols + 100)
    head = title_layout(title or f"{d.model} · {d.task}: every lens, percentile rank of each head",
                        width)
    fig.update_layout(head, coloraxis={"colorscale": "Viridis", "cmin": 0, "cmax": 1,
                                       "colorbar": {"title": {"text": "rank"}}},
                      template="plotly_white", width=width,
                      height=max(320, 260 * rows + 80) + head["margin"]["t"] - 100)
    fig.update_yaxes(autorange="reversed")
    return fig


def agreement_matrix(agreement: pd.DataFrame, order: list[str] | None = None, *,
                     title: str | None = None):
    """Lens × lens mean Spearman (text: mean ± sd over tasks), one panel per model, from
    :func:`~sitelens.lenses.compare.lens_agreement` rows. Returns ``(figure, frame)`` with the
    plotted means and sds."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    models = sorted(set(agreement.model))
    fig = make_subplots(rows=1, cols=len(models), subplot_titles=models, horizontal_spacing=0.16)
    frames = []
    for i, model in enumerate(models, start=1):
        d = agreement[agreement.model == model]
        seen = list(dict.fromkeys([*d.lens_a, *d.lens_b]))
        lenses = [x for x in (order or seen) if x in seen]
        mean = pd.DataFrame(np.eye(len(lenses)), index=lenses, columns=lenses)
        sd = pd.DataFrame(np.zeros((len(lenses), len(lenses))), index=lenses, columns=lenses)
        for (a, b), g in d.groupby(["lens_a", "lens_b"]):
            if a in lenses and b in lenses:
                mean.loc[a, b] = mean.loc[b, a] = g.spearman.mean()
                sd.loc[a, b] = sd.loc[b, a] = g.spearman.std(ddof=1) if len(g) > 1 else 0.0
        text = [[f"{mean.iloc[r, c]:.2f}<br>±{sd.iloc[r, c]:.2f}" for c in range(len(lenses))]
                for r in range(len(lenses))]
        fig.add_trace(go.Heatmap(z=mean.to_numpy(), x=lenses, y=lenses, zmin=-1, zmax=1,
                                 colorscale="RdBu", reversescale=True, text=text,
                                 texttemplate="%{text}", textfont={"size": 8},
                                 showscale=i == len(models),
                                 hovertemplate="%{y} vs %{x}: ρ = %{z:.2f}<extra></extra>"),
                      row=1, col=i)
        fig.update_yaxes(autorange="reversed", row=1, col=i)
        frames.append(mean.stack().rename("spearman_mean").to_frame()
                      .join(sd.stack().rename("spearman_sd"))
                      .reset_index(names=["lens_a", "lens_b"]).assign(model=model))
    head = title_layout(title or "Agreement of head-importance lenses: Spearman ρ, mean ± sd over "
                        "tasks", 520 * len(models))
    fig.update_layout(head, width=520 * len(models), height=460 + head["margin"]["t"],
                      template="plotly_white")
    return fig, pd.concat(frames, ignore_index=True)
