"""``sitelens.explore()``: the atlas's views as a Jupyter widget (ipywidgets + plotly
``FigureWidget``), built from the same payload and the same lookups
(:mod:`sitelens.atlas.views`) as the HTML page, so the two never disagree.

Click a head in the task map or the overview → the head card; click a cell of the α-similarity
matrix → the task pair. :class:`Explorer` holds the state and can be driven from code
(``ex.select_head(3, 1)``, ``ex.select_pair("antonym", "synonym")``), which is how it is tested.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from functools import partial
from pathlib import Path

from sitelens.atlas.views import (
    head_card,
    minimal_selector,
    minimal_set,
    minimal_view,
    overview,
    pair_view,
    payload,
    task_map,
)
from sitelens.format import fmt_float

_fmt = partial(fmt_float, digits=4, missing="—")  # the card's numbers; null in the payload → a dash


def card_html(card: dict, lenses: Sequence[str]) -> str:
    """The head card as HTML (the same fields as the page's card)."""
    rows = "".join(f'<tr data-lens="{lens}"><td>{lens}</td><td style="text-align:right">'
                   f"{_fmt(card['scores'].get(lens))}</td></tr>" for lens in lenses)
    toks = " ".join(f"<code>{html.escape(t)}</code>" for t in card["tokens"])
    lo, hi = card["alpha_ci"]
    mins = "".join(f'<tr data-selector="{sel}"><td>{sel}</td><td style="text-align:right">{len(ts)}</td>'
                   f"<td><small>{html.escape(', '.join(ts))}</small></td></tr>"
                   for sel, ts in (card.get("minimal") or {}).items())
    mins = (f"<p>Tasks whose minimal set (k*) holds {card['head']}:</p><table>{mins}</table>"
            if mins else "")
    return (f"<h3>{card['head']} <small>{card['model']} · {card['task']}</small></h3>"
            f"<p>α 95% interval over {card['n_seeds']} seed(s): [{_fmt(lo)}, {_fmt(hi)}]</p>"
            f"<table>{rows}</table><p>Top tokens its injected vector promotes: {toks}</p>{mins}")


class Explorer:
    """The widget's state and views (see the module docstring); :attr:`widget` is what a notebook
    displays."""

    def __init__(self, p: dict):
        import ipywidgets as w
        import plotly.graph_objects as go

        self.p = p
        self.model = p.get("default_model") or next(iter(p["models"]))
        self.lens = "alpha"
        self.task = self.m["order"][0]
        self.head = (0, 0)
        self.pair = None
        self.dd_model = w.Dropdown(options=list(p["models"]), value=self.model, description="model")
        self.dd_lens = w.Dropdown(options=self._lenses(), value=self.lens, description="lens")
        self.dd_task = w.Dropdown(options=self.m["order"], value=self.task, description="task")
        self.fig_overview = go.FigureWidget()
        self.fig_task = go.FigureWidget()
        self.fig_across = go.FigureWidget()
        self.fig_sim = go.FigureWidget()
        self.fig_pair = go.FigureWidget(self._pair_figure())
        self.card = w.HTML()
        self.fig_minimal = go.FigureWidget()
        self.minimal_note = w.HTML()
        self.dd_model.observe(lambda c: self.set_model(c["new"]), names="value")
        self.dd_lens.observe(lambda c: self.set_lens(c["new"]), names="value")
        self.dd_task.observe(lambda c: self.set_task(c["new"]), names="value")
        self.widget = w.VBox([
            w.HBox([self.dd_model, self.dd_lens, self.dd_task]), self.fig_overview,
            w.HBox([self.fig_task, w.VBox([self.card, self.fig_across])]),
            w.VBox([self.minimal_note, self.fig_minimal]),
            w.HBox([self.fig_sim, self.fig_pair])])
        self._render_all()

    @staticmethod
    def _pair_figure():
        from plotly.subplots import make_subplots

        fig = make_subplots(rows=1, cols=3, subplot_titles=["α of A", "α of B", "A − B"])
        for i, kw in enumerate([dict(zmin=0, zmax=1, colorscale="Viridis"),
                                dict(zmin=0, zmax=1, colorscale="Viridis"),
                                dict(zmid=0, colorscale="RdBu")], start=1):
            fig.add_heatmap(z=[[0]], showscale=False, row=1, col=i, **kw)
        fig.update_yaxes(autorange="reversed")
        fig.update_layout(height=420, width=640)
        return fig

    @property
    def m(self) -> dict:
        return self.p["models"][self.model]

    def _lenses(self) -> list[str]:
        return [x for x in self.p["lens_order"] if x in self.m["lenses"]]

    # -- state changes -------------------------------------------------------------------------
    def set_model(self, model: str) -> None:
        self.model, self.task, self.head, self.pair = model, None, (0, 0), None
        self.dd_lens.options = self._lenses()
        self.lens = self.lens if self.lens in self._lenses() else "alpha"
        self.dd_task.options = self.m["order"]
        self.task = self.m["order"][0]
        self._render_all()

    def set_lens(self, lens: str) -> None:
        self.lens = lens
        self._render_overview()
        self._render_task()
        self.select_head(*self.head)

    def set_task(self, task: str) -> None:
        self.task = task
        self._render_task()
        self.select_head(*self.head)

    def select_head(self, layer: int, head: int) -> dict:
        """Show head (layer, head) of the current task in the card; returns the card's data."""
        self.head = (int(layer), int(head))
        card = head_card(self.p, self.model, self.task, *self.head)
        self.card.value = card_html(card, self._lenses())
        xs = [t for t, _ in card["alpha_across_tasks"]]
        with self.fig_across.batch_update():
            self.fig_across.data = []
            self.fig_across.add_bar(x=xs, y=[v for _, v in card["alpha_across_tasks"]],
                                    marker_color=["#d62728" if t == self.task else "#1f77b4" for t in xs])
            self.fig_across.update_layout(title=f"α of {card['head']} in every task", height=260,
                                          yaxis_range=[0, 1], margin=dict(l=40, r=10, t=30, b=90))
        return card

    def select_pair(self, a: str, b: str) -> dict:
        """Show tasks A and B side by side; returns the pair view's data."""
        self.pair = (a, b)
        v = pair_view(self.p, self.model, a, b)
        with self.fig_pair.batch_update():
            for trace, z in zip(self.fig_pair.data, (v["alpha_a"], v["alpha_b"], v["diff"]),
                                strict=True):
                trace.z = z
            self.fig_pair.layout.title = (
                f"A = {a} · B = {b} · ρ = {_fmt(v['similarity'])} · B through A's α: "
                f"{_fmt(v['transfer'])} (B zero-shot {_fmt(v['zero_shot_b'])})")
        return v

    # -- rendering -----------------------------------------------------------------------------
    def _render_all(self) -> None:
        self._render_overview()
        self._render_task()
        self.select_head(*self.head)
        self._render_minimal()
        self._render_similarity()
        order = self.m["order"]
        self.select_pair(order[0], order[min(1, len(order) - 1)])

    def _render_overview(self) -> None:
        o = overview(self.p, self.model, self.lens)
        with self.fig_overview.batch_update():
            self.fig_overview.data = []
            self.fig_overview.add_heatmap(z=o["z"], x=o["heads"], y=o["tasks"],
                                          colorscale="Viridis" if self.lens == "alpha" else "RdBu")
            self.fig_overview.update_layout(title=f"{self.model}: {self.lens} per head",
                                            height=max(300, 120 + 11 * len(o["tasks"])),
                                            xaxis=dict(tickmode="array", tickvals=o["ticks"],
                                                       tickangle=-90, tickfont_size=8,
                                                       title="head (L layer, H head)"),
                                            yaxis_autorange="reversed")

        def click(trace, points, selector):
            if points.point_inds:
                r, c = points.point_inds[0]
                self.dd_task.value = o["tasks"][r]
                self.select_head(c // self.m["n_heads"], c % self.m["n_heads"])

        self.fig_overview.data[0].on_click(click)

    def _render_task(self) -> None:
        z = task_map(self.p, self.model, self.task, self.lens)
        with self.fig_task.batch_update():
            self.fig_task.data = []
            self.fig_task.add_heatmap(z=z, colorscale="Viridis" if self.lens == "alpha" else "RdBu")
            sel = minimal_selector(self.p, self.model, self.lens)
            ms = minimal_set(self.p, self.model, self.task, sel)
            title = f"{self.task}: {self.lens}"
            if ms:  # the minimal set S_{k*} of the selector matching the lens (else alpha's)
                self.fig_task.add_scatter(x=[h for _, h in ms], y=[layer for layer, _ in ms],
                                          mode="markers", hoverinfo="skip", showlegend=False,
                                          marker=dict(symbol="x-thin-open", size=11, color="#ff00ff",
                                                      line=dict(width=3, color="#ff00ff")))
                k = self.m["minimal"]["tasks"][self.task]["k_star"][sel]
                title += f" · × minimal set of {sel} (k* = {k})"
            self.fig_task.update_layout(title=title, xaxis_title="head",
                                        yaxis_title="layer", yaxis_autorange="reversed",
                                        height=max(320, 100 + 14 * self.m["n_layers"]))
        self.fig_task.data[0].on_click(
            lambda trace, points, selector: points.point_inds and self.select_head(*points.point_inds[0]))

    def _render_minimal(self) -> None:
        """k* per task and selector (the note instead when there are no minimal sets)."""
        v = minimal_view(self.p, self.model)
        self.minimal_note.value = f"<p><i>{html.escape(v['note'])}</i></p>" if v["note"] else ""
        with self.fig_minimal.batch_update():
            self.fig_minimal.data = []
            if v["tasks"]:
                self.fig_minimal.add_heatmap(z=v["z"], x=v["selectors"], y=v["tasks"], text=v["text"],
                                             texttemplate="%{text}", colorscale="Viridis",
                                             reversescale=True, colorbar_title="k*")
                self.fig_minimal.add_heatmap(  # not reached: a grey cell
                    z=[[1 if z is None else None for z in row] for row in v["z"]], x=v["selectors"],
                    y=v["tasks"], text=v["text"], texttemplate="%{text}", showscale=False,
                    colorscale=[[0, "#dddddd"], [1, "#dddddd"]])
            self.fig_minimal.update_layout(
                title=f"{self.model}: k*, the fewest heads reaching 90% of full SITE (grey: not reached)",
                height=max(300, 160 + 14 * len(v["tasks"])) if v["tasks"] else 10,
                yaxis_autorange="reversed")
        if v["tasks"]:
            self.fig_minimal.data[0].on_click(
                lambda trace, points, selector: points.point_inds
                and setattr(self.dd_task, "value", v["tasks"][points.point_inds[0][0]]))

    def _render_similarity(self) -> None:
        m = self.m
        idx = [m["tasks"].index(t) for t in m["order"]]
        z = [[m["similarity"][i][j] for j in idx] for i in idx]
        with self.fig_sim.batch_update():
            self.fig_sim.data = []
            self.fig_sim.add_heatmap(z=z, x=m["order"], y=m["order"], zmin=-1, zmax=1,
                                     colorscale="RdBu", reversescale=True)
            self.fig_sim.update_layout(title="α similarity; click a cell for the pair", width=560,
                                       height=560, yaxis_autorange="reversed")

        def click(trace, points, selector):
            if points.point_inds:
                r, c = points.point_inds[0]
                self.select_pair(m["order"][r], m["order"][c])

        self.fig_sim.data[0].on_click(click)


def explore(data_dir: str | Path | None = None, models: Sequence[str] | None = None):
    """Load the atlas tables (default: those shipped with sitelens) and return an :class:`Explorer`; display
    ``explorer.widget`` (a notebook cell ending in ``sitelens.explore()`` shows it)."""
    from sitelens.atlas import load_atlas

    ex = Explorer(payload(load_atlas(data_dir, models)))
    return ex


def _ipython_display_(self):  # pragma: no cover - notebook display hook
    from IPython.display import display

    display(self.widget)


Explorer._ipython_display_ = _ipython_display_
