"""Unit tests of sitelens.viz.plotting: every function returns a Figure with the right data."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest
import torch

from sitelens.viz import plotting as plots
from sitelens.viz.matrices import _upgma_order


def _heatmaps(fig):
    return [t for t in fig.data if isinstance(t, go.Heatmap)]


def test_alpha_heatmap_hover_and_shape():
    alpha = torch.arange(12.0).reshape(3, 4) / 12  # [n_layers=3, n_heads=4]
    fig = plots.alpha_heatmap(alpha, title="α antonym")
    assert isinstance(fig, go.Figure)
    (hm,) = _heatmaps(fig)
    assert np.asarray(hm.z).shape == (3, 4)
    assert hm.text[1][2] == f"L1H2: {alpha[1, 2].item():.3f}"
    assert hm.text[0][0] == "L0H0: 0.000"
    assert "%{text}" in hm.hovertemplate
    assert fig.layout.title.text == "α antonym"
    assert fig.layout.xaxis.title.text == "head" and fig.layout.yaxis.title.text == "layer"


def test_alpha_facets_share_one_colour_scale():
    maps = {f"task{i}": torch.rand(2, 3, generator=torch.Generator().manual_seed(i)) * (i + 1)
            for i in range(5)}
    fig = plots.alpha_facets(maps, cols=3)
    hms = _heatmaps(fig)
    assert len(hms) == 5
    assert all(h.coloraxis == "coloraxis" for h in hms)
    lo = min(float(m.min()) for m in maps.values())
    hi = max(float(m.max()) for m in maps.values())
    # the same float32 extremes, possibly converted to float64 on the way into the figure:
    # equal to the float32 value, or within its rounding (6e-8 relative); approx's rel 1e-6
    assert fig.layout.coloraxis.cmin == pytest.approx(lo)
    assert fig.layout.coloraxis.cmax == pytest.approx(hi)
    assert [a.text for a in fig.layout.annotations] == list(maps)
    assert hms[3].text[1][0].startswith("L1H0: ")
    with pytest.raises(ValueError):
        plots.alpha_facets({})


def test_effect_vs_alpha_side_by_side():
    e = torch.tensor([[0.01, -0.02, 0.0], [0.05, 0.0, -0.01]])
    a = torch.sigmoid(e * 50)
    fig = plots.effect_vs_alpha(e, a)
    hms = _heatmaps(fig)
    assert len(hms) == 2
    assert hms[0].xaxis == "x" and hms[1].xaxis == "x2"
    assert hms[0].zmid == 0
    assert "ρ = 1.00" in fig.layout.title.text
    assert hms[0].text[1][0] == "L1H0: 0.0500"
    with pytest.raises(ValueError):
        plots.effect_vs_alpha(e, torch.zeros(3, 3))


def _intra_df(tasks=("antonym",), reverse=True):
    rows = []
    for t in tasks:
        rows += [dict(task=t, k=0, selection="zero_shot", seed=None, accuracy=0.1),
                 dict(task=t, k=8, selection="site", seed=None, accuracy=0.8)]
        for k in (1, 2, 4, 8):
            rows += [dict(task=t, k=k, selection="top", seed=None, accuracy=0.2 + 0.07 * k),
                     dict(task=t, k=k, selection="bottom", seed=None, accuracy=0.1)]
            rows += [dict(task=t, k=k, selection="random", seed=s, accuracy=0.1 + 0.01 * s)
                     for s in range(3)]
            if reverse:
                rows += [dict(task=t, k=k, selection="full_minus_top", seed=None, accuracy=0.3),
                         dict(task=t, k=k, selection="full_minus_bottom", seed=None,
                              accuracy=0.8)]
    df = pd.DataFrame(rows)
    df["ci_low"] = df["accuracy"] - 0.05
    df["ci_high"] = df["accuracy"] + 0.05
    df["answer_prob"] = df["accuracy"] / 2
    return df


def test_patching_curves():
    fig = plots.patching_curves(_intra_df())
    assert isinstance(fig, go.Figure)
    lines = [t for t in fig.data if t.mode == "lines+markers"]
    bands = [t for t in fig.data if t.fill == "toself"]
    names = {t.name for t in lines}
    assert {plots.LABELS[s] for s in ("top", "bottom", "random", "full_minus_top",
                                      "full_minus_bottom")} == names
    assert len(bands) == len(lines)  # one CI band per curve
    top = next(t for t in lines if t.name == plots.LABELS["top"])
    assert list(top.x) == [1, 2, 4, 8]
    # Float64 bookkeeping on decimal fixtures (ci_low = accuracy − 0.05, a mean of 0.10, 0.11,
    # 0.12): a few ulp off the decimal answer; assert_allclose's default rtol 1e-7 and approx's
    # rel 1e-6 absorb that, a wrong column or a missing mean (>= 0.01 off) does not.
    np.testing.assert_allclose(top.customdata[:, 0], np.asarray(top.y) - 0.05)
    rnd = next(t for t in lines if t.name == plots.LABELS["random"])
    np.testing.assert_allclose(rnd.y, 0.11)  # mean over seeds
    rnd_band = next(t for t in bands if t.legendgroup == "random")
    assert max(rnd_band.y) == pytest.approx(0.12 + 0.05)  # envelope of the seeds' CIs
    refs = [s for s in fig.layout.shapes if s.type == "line"]
    assert len(refs) == 4  # zero-shot and SITE lines in both panels
    assert fig.layout.xaxis.type == "log"


def test_patching_curves_multi_task_and_answer_prob():
    df = _intra_df(("antonym", "synonym"), reverse=False)
    fig = plots.patching_curves(df, y="answer_prob", log_x=False)
    lines = [t for t in fig.data if t.mode == "lines+markers"]
    assert len(lines) == 2 * 3
    assert sum(t.showlegend for t in lines) == 3
    one = plots.patching_curves(df, task="synonym")
    assert len([t for t in one.data if t.mode == "lines+markers"]) == 3
    with pytest.raises(ValueError):
        plots.patching_curves(df, task="missing")


def _blocks(seed=0):
    """A similarity matrix with two blocks {a*} and {b*}, tasks listed interleaved."""
    names = ["a1", "b1", "a2", "b2", "a3", "b3"]
    rng = np.random.default_rng(seed)
    m = np.full((6, 6), 0.1) + rng.random((6, 6)) * 0.02
    for i, x in enumerate(names):
        for j, y in enumerate(names):
            if x[0] == y[0]:
                m[i, j] = 0.9
    m = (m + m.T) / 2
    np.fill_diagonal(m, 1.0)
    return pd.DataFrame(m, index=names, columns=names)


def test_cluster_order_groups_blocks():
    df = _blocks()
    order = plots.cluster_order(df)
    assert sorted(order) == sorted(df.index)
    groups = [n[0] for n in order]
    assert groups in (["a"] * 3 + ["b"] * 3, ["b"] * 3 + ["a"] * 3)
    D = 1 - df.to_numpy()
    assert sorted(_upgma_order(D)) == list(range(6))


def test_matrix_heatmap_similarity_square():
    df = _blocks()
    fig = plots.matrix_heatmap(df, "α cosine similarity")
    (hm,) = _heatmaps(fig)
    order = list(fig.layout.meta["order"])
    assert list(hm.x) == list(hm.y) == order
    i, j = order.index("a1"), order.index("a2")
    assert hm.text[i][j] == f"a1 vs a2: {df.loc['a1', 'a2']:.3f}"
    assert np.asarray(hm.z)[i, j] == pytest.approx(df.loc["a1", "a2"])  # the same float64 (reordered)
    assert fig.layout.title.text == "α cosine similarity"
    fixed = plots.matrix_heatmap(df, order=["b1", "a1", "b2", "a2", "b3", "a3"])
    assert list(_heatmaps(fixed)[0].x) == ["b1", "a1", "b2", "a2", "b3", "a3"]
    as_given = plots.matrix_heatmap(df, cluster=False)
    assert list(_heatmaps(as_given)[0].x) == list(df.index)
    with pytest.raises(ValueError):
        plots.matrix_heatmap(df, order=["zz"])


def test_matrix_heatmap_inter_task_long():
    names = ["x", "y", "z"]
    rows = [dict(source_task=a, target_task=b, mode=mode, accuracy=(i * 3 + j) / 10,
                 zero_shot=0.0)
            for mode in ("alpha", "topk")
            for i, a in enumerate(names) for j, b in enumerate(names)]
    df = pd.DataFrame(rows)
    fig = plots.matrix_heatmap(df, "transfer", cluster=False, mode="alpha")
    (hm,) = _heatmaps(fig)
    assert np.asarray(hm.z)[0, 2] == pytest.approx(0.2)  # source x -> target z; (0·3 + 2) / 10 in float64
    assert hm.text[0][2] == "x → z: 0.200"
    assert fig.layout.yaxis.title.text.startswith("source")
    assert fig.layout.xaxis.title.text.startswith("target")


def test_dntp_scatter():
    df = pd.DataFrame({
        "method": ["site", "site", "fv", "fv", "icl", "icl"],
        "task": ["a", "b", "a", "b", "a", "b"],
        "dntp": [0.1, 0.2, 1.0, 1.5, 0.0, 0.05],
        "accuracy": [0.8, 0.75, 0.3, 0.2, 0.9, 0.85],
    })
    fig = plots.dntp_scatter(df)
    assert isinstance(fig, go.Figure)
    assert [t.name for t in fig.data] == ["site", "fv", "icl"]
    assert "task=a" in fig.data[0].text[0]
    assert "ρ = -1.00" in fig.layout.title.text
    assert fig.layout.xaxis.title.text.startswith("dNTP")
    fig2 = plots.dntp_scatter(df.rename(columns={"accuracy": "exact_match"}), y="exact_match",
                              log_x=True)
    assert fig2.layout.xaxis.type == "log"
    with pytest.raises(ValueError):
        plots.dntp_scatter(df.drop(columns="dntp"))


def test_plots_from_real_patching_output():
    """The plotting functions accept the library's own outputs (tiny model)."""
    from sitelens import patching as P
    from sitelens.site import SiteAdapter, task_embedding
    from sitelens.tasks import load_task
    from sitelens.testing import tiny_model

    model = tiny_model()
    task = load_task("antonym")
    emb = task_embedding(model, task, n_prompts=2, n_shots=2)
    ad = SiteAdapter(torch.rand(2, 4, generator=torch.Generator().manual_seed(0)), emb, {})
    df = P.intra_task(model, task, ad, limit=3, n_random_seeds=2, n_boot=20)
    assert isinstance(plots.patching_curves(df), go.Figure)
    eff = P.head_causal_effects(model, task, n_prompts=2, n_shots=2, embedding=emb)
    assert isinstance(plots.effect_vs_alpha(eff, ad.alpha), go.Figure)
    sim = P.alpha_similarity({"a": ad, "b": torch.rand(2, 4), "c": torch.rand(2, 4)})
    assert isinstance(plots.matrix_heatmap(sim["spearman"]), go.Figure)


def test_log_ticks_do_not_crowd():
    from sitelens.viz.plotting import log_ticks

    assert log_ticks([1, 2, 4, 8, 10, 14, 16, 32, 64, 128, 256, 270]) == [1, 2, 4, 8, 14, 32, 64, 128, 270]
    assert log_ticks([3]) == [3]
    ticks = log_ticks(list(range(1, 300)))
    assert ticks[0] == 1 and ticks[-1] == 299
    assert all(b / a >= 1.3 for a, b in zip(ticks, ticks[1:]))


def test_cost_scaling_draws_each_stage_and_its_fitted_line():
    from sitelens.viz.plotting import cost_scaling

    df = pd.DataFrame({"model": ["a", "b", "a", "b"], "stage": ["stage1", "stage1", "generate", "generate"],
                       "length": [64, 64, 64, 64], "params_compute": [1e6, 4e6, 1e6, 4e6],
                       "prompt_tokens": [60.0, 60.0, 60.0, 60.0], "sec": [1.0, 2.0, 3.0, 6.0],
                       "mem": [0.1, 0.3, 0.1, 0.3]})
    fig = cost_scaling(df, {"stage1": {"a": 0.5}}, y="sec", memory="mem", basis="CPU s",
                       stages=["stage1", "stage2", "generate"],
                       units={"stage1": "prompt", "generate": "item"},
                       predict=lambda f, P, T: f["a"] * P)
    titles = [a.text for a in fig.layout.annotations]
    assert titles == ["stage1 (CPU s / prompt)", "generate (CPU s / item)", "peak memory (GiB)"]
    markers = [t for t in fig.data if t.mode == "markers"]
    assert [list(t.y) for t in markers] == [[1.0, 2.0], [3.0, 6.0], [0.1, 0.3]]
    (line,) = [t for t in fig.data if t.mode == "lines"]  # only stage1 has a fit
    assert np.allclose(line.y, 0.5 * np.asarray(line.x))
