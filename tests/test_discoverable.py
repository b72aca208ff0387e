"""What a new user finds without reading the source (issue 32, item 6):

- the README's "Use from Python" example runs (on the tiny random model, a few items) and ends in
  a plot and a comparison of two lenses;
- ``sitelens CMD --help`` gives every option help text and names the default of each option that
  has one;
- the result objects print as one line (never a tensor's values);
- the lens plots' titles fit the figure (wrapped, with a top margin for their lines).

The checks of ``--help`` and of titles also run on a planted break and must fail there.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import numpy as np
import pytest
import torch

import sitelens as sl
from sitelens.cli import build_parser, options
from sitelens.cli.options import add_options, has_default, option
from sitelens.lenses import HeadScores
from sitelens.site import FitConfig

ROOT = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------------------------
# the README example


def readme_example() -> str:
    """The Python code block of the README's "Use from Python" section."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Use from Python", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 1, "the section should hold one python block"
    return blocks[0]


# (README text, what the test runs instead): the tiny random model and a few items. Each must be
# found, so the test never runs the real models by accident and fails when the example changes.
SUBSTITUTIONS = [
    ("sl.load_model()", "sl.tiny_model()"),
    ("limit=100", "limit=4"),
]


def test_readme_python_example_runs_and_ends_in_a_plot_and_two_lenses(tmp_path, monkeypatch, capsys):
    import plotly.graph_objects as go

    code = readme_example()
    for old, new in SUBSTITUTIONS:
        assert old in code, f"the README example no longer has {old!r}; update SUBSTITUTIONS"
        code = code.replace(old, new)
    shown: list = []
    monkeypatch.setattr(go.Figure, "show", lambda fig, *a, **k: shown.append(fig))
    monkeypatch.chdir(tmp_path)  # adapter.save("runs/...") writes here
    ns: dict = {}
    exec(compile(code, "README.md (Use from Python)", "exec"), ns)

    last = [ln for ln in code.splitlines() if ln.strip() and not ln.startswith("#")][-1]
    assert ".show()" in last, f"the example should end in a plot, ends in {last!r}"
    assert shown and all(isinstance(f, go.Figure) for f in shown)
    runs = [v for v in ns.values() if isinstance(v, sl.lenses.LensRun)]
    assert runs and len(runs[0].scores.lenses) >= 2, "the example should compare two lenses"
    assert {tr.type for tr in shown[-1].data} == {"heatmap"} and len(shown[-1].data) >= 2
    assert (tmp_path / "runs" / "antonym" / "adapter.json").is_file()
    out = capsys.readouterr().out
    assert out.startswith("SiteAdapter(") and out.count("\n") == 1  # print(adapter): one line


# ----------------------------------------------------------------------------------------------
# --help


def option_blocks(help_text: str) -> dict[str, str]:
    """Each option's help in ``--help`` output, keyed by its first flag, continuation lines
    joined."""
    blocks: dict[str, str] = {}
    current = None
    for line in help_text.splitlines():
        m = re.match(r"^  (-[-\w]+)", line)
        if m:
            current = m.group(1)
            blocks[current] = line
        elif current and line.startswith("    "):
            blocks[current] += " " + line.strip()
        else:
            current = None
    return blocks


def subparsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """``parser`` and every subcommand parser under it, depth first."""
    out = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                out += subparsers(sub)
    return out


def help_problems(parser: argparse.ArgumentParser) -> list[str]:
    """Options of any subcommand whose ``--help`` has no help text or does not name its default."""
    bad = []
    for p in subparsers(parser):
        blocks = option_blocks(p.format_help())
        for a in p._actions:
            if not a.option_strings or a.dest == "help":
                continue
            block = blocks.get(a.option_strings[0], "")
            flag = f"{p.prog} {a.option_strings[0]}"
            if not a.help:
                bad.append(f"{flag}: no help")
            if has_default(a.default) and str(a.default) not in block:
                bad.append(f"{flag}: default {a.default!r} not named in {block!r}")
    return bad


def test_every_option_has_help_and_names_its_default(monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")  # one line per option: no wrapping inside a default
    parser = build_parser()
    assert len(subparsers(parser)) >= 14  # sitelens, 10 commands, 3 patch subcommands
    assert help_problems(parser) == []
    fit = option_blocks(next(p for p in subparsers(parser) if p.prog == "sitelens fit").format_help())
    assert "(default: 0.2)" in fit["--lr"] and "(default: 0)" in fit["--seed"]


def test_the_help_check_catches_a_missing_default(monkeypatch):
    """The planted break: the help no longer gets its default appended."""
    monkeypatch.setenv("COLUMNS", "1000")
    monkeypatch.setattr(options, "help_text", lambda text, default: text.replace("%", "%%"))
    problems = help_problems(build_parser())
    assert any("sitelens fit --lr: default 0.2 not named" in p for p in problems), problems


def test_an_option_without_help_fails_the_parser_build():
    from dataclasses import dataclass

    @dataclass
    class Config:
        no_such_option: int = option(3, help="")

    with pytest.raises(RuntimeError, match="sitelens fit --no-such-option` has no help"):
        add_options(argparse.ArgumentParser(prog="sitelens fit"), Config)


# ----------------------------------------------------------------------------------------------
# one-line reprs


@pytest.fixture(scope="module")
def fitted():
    model, task = sl.tiny_model(), sl.load_task("antonym")
    run = sl.head_scores(model, task, ["alpha", "atp"], seeds=(0, 1),
                         fit_config=FitConfig(n_examples=16),
                         attribution=sl.lenses.AttributionConfig(n_prompts=4, n_shots=2,
                                                                 n_mean_prompts=8, n_boot=5))
    return model, task, run


def test_result_objects_print_as_one_line(fitted):
    from sitelens.site import fit_alpha

    model, task, run = fitted
    adapter = run.alpha.adapters[0]
    objects = [adapter, run, run.alpha, run.scores, task, adapter.mix(), adapter.mix().placed(model),
               fit_alpha(model, task, adapter.embedding, FitConfig(n_examples=16)),
               sl.SiteAdapter(adapter.alpha, adapter.embedding)]  # no metadata
    for obj in objects:
        r = repr(obj)
        assert "\n" not in r and len(r) <= 300, f"{type(obj).__name__}: {r[:400]}"
        assert "tensor([" not in r, r  # shapes, never values
    r = repr(adapter)
    L, H = adapter.alpha.shape
    layer, head, a = adapter.top_heads(1)[0]
    for part in (f"model={model.cfg.model_name!r}", "task='antonym'", f"{L}×{H} heads",
                 f"L{layer}H{head}={a:.2f}", "lr=0.2", "n_examples=16", "seed=0"):
        assert part in r, (part, r)
    assert str(adapter) == r  # print(adapter) is the same line


# ----------------------------------------------------------------------------------------------
# titles that fit


def title_problems(fig) -> list[str]:
    """Why the title would not fit: a line wider than the figure right of where it starts
    (characters at 0.6 em, an upper bound for this text), or a top margin smaller than its lines
    (1.3 em each) plus 40 px for the space around them and the panel titles."""
    from sitelens.lenses.plots import TITLE_X

    lay = fig.layout
    font = lay.title.font.size or 17
    lines = (lay.title.text or "").split("<br>")
    room = lay.width * (1 - TITLE_X) - 10
    bad = [f"{line!r}: about {len(line) * 0.6 * font:.0f} px > {room:.0f} px"
           for line in lines if len(line) * 0.6 * font > room]
    top = 100 if lay.margin.t is None else lay.margin.t  # plotly's default
    if top < len(lines) * 1.3 * font + 40:
        bad.append(f"top margin {top} px for {len(lines)} title lines")
    return bad


def _scores(lenses, model="smollm2-135m-instruct") -> HeadScores:
    rng = np.random.default_rng(0)
    return HeadScores.concat([HeadScores.from_map(rng.random((30, 9)), model=model, task="antonym",
                                                  lens=lens) for lens in lenses])


@pytest.mark.parametrize("n_lenses", [1, 2, 4, 9])
def test_lens_plot_titles_fit(n_lenses):
    from sitelens.lenses.compare import lens_agreement
    from sitelens.lenses.plots import agreement_matrix, alpha_uncertainty, lens_maps

    lenses = ["alpha", "alpha-grad", "atp", "atp-star", "effect", "ablation-mean", "ablation-zero",
              "dla", "alpha-official"][:n_lenses]
    s = _scores(lenses)
    figs = [lens_maps(s), alpha_uncertainty(s, "alpha")]
    if n_lenses > 1:
        figs.append(agreement_matrix(lens_agreement(s))[0])
    for fig in figs:
        assert title_problems(fig) == [], fig.layout.title.text
    if n_lenses == 2:  # the narrow figure of the README's example: its title wraps
        assert "<br>" in figs[0].layout.title.text


def test_the_title_check_catches_an_unwrapped_title():
    """The planted break: the two-lens figure with its title as one line and plotly's margin."""
    from sitelens.lenses.plots import lens_maps

    fig = lens_maps(_scores(["alpha-grad", "atp"]))
    fig.update_layout(title_text=fig.layout.title.text.replace("<br>", " "), margin_t=None)
    assert any("px >" in p for p in title_problems(fig))


def test_saturated_adapter_prints_without_a_warning():
    """print(adapter) in a notebook: a saturated α (most heads above 0.95) is stated in the line,
    never raised as the ranking warning that top_heads() gives."""
    import warnings

    from sitelens.site.saturation import AlphaSaturationWarning

    L, H, d = 2, 4, 3
    alpha = torch.full((L, H), 0.99)
    alpha[0, 1] = 0.999
    ad = sl.SiteAdapter(alpha, torch.zeros(L, H, d), meta={"model": "m", "task": "t"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r = repr(ad)
    assert "L0H1=1.00" in r and "(of 8 heads at α > 0.95)" in r, r
    with pytest.warns(AlphaSaturationWarning):  # the ranking itself still warns
        ad.top_heads(3)


# ----------------------------------------------------------------------------------------------
# Jupyter as researchers use it (issue 43, point 7): short reprs with L{l}H{h} labels, figures
# that show on GitHub and nbviewer


def _big_frontier():
    """A FrontierResult the size of a real one: 7 selectors × 6 budgets × 2 injections on a
    30-layer, 9-head model, k* = 50 for every selector (S_50: 50 labels in the table)."""
    import pandas as pd

    from sitelens.heads import head_label
    from sitelens.lenses.frontier import FrontierResult
    from sitelens.lenses.registry import SELECTORS

    rows, summary = [], {"status": "ok", "selectors": {}}
    for i, sel in enumerate(SELECTORS):
        for k in (1, 2, 5, 10, 20, 50):
            for inj in ("alpha1", "refit"):
                heads = ";".join(head_label((i * 7 + j) % 270, 9) for j in range(k))
                rows.append({"model": "smollm2-135m-instruct", "task": "antonym", "selector": sel,
                             "k": k, "injection": inj, "heads": heads, "seed": 0})
        summary["selectors"][sel] = {"k_star": {"alpha1": 50, "refit": 20}}
    return FrontierResult(pd.DataFrame(rows), summary, [])


def test_frontier_result_prints_short_with_head_labels():
    r = repr(_big_frontier())
    assert "\n" not in r and len(r) <= 600, (len(r), r)
    assert "alpha k*=50/20 {L0H0 L0H1 L0H2 … (+47)}" in r, r  # labels, never flat indices
    assert not re.search(r"\[\d+, \d+", r), r


def test_fitted_selection_and_large_head_sets_print_short():
    from sitelens.baselines.base import Fitted
    from sitelens.heads import HeadSet
    from sitelens.lenses.selectors import Selection

    f = Fitted("function-vector", n_params=576, fit_seconds=1.234,
               state={"vector": torch.zeros(576), "layer": 3, "W": torch.zeros(64, 64)})
    r = repr(f)
    assert r == ("Fitted(method='function-vector', scope=none, n_params=576, fit_seconds=1.23, "
                 "state: vector=tensor[576 float32], layer=3, W=tensor[64×64 float32])"), r
    hs = HeadSet(30, 9, tuple(range(100)))
    assert repr(hs).endswith("L1H2 … (+88))") and len(repr(hs)) < 150, repr(hs)
    sel = Selection("alpha", 0, {1: [51], 2: [51, 127], 50: list(range(50))}, n_heads=9)
    r = repr(sel)
    assert "k=1: L5H6; k=2: L5H6 L14H1; k=50: L0H0 L0H1 L0H2 L0H3 … (+46)" in r and len(r) < 200, r


def test_notebook_setup_saves_plotly_json_and_a_static_png(monkeypatch):
    """One call: every figure's output holds plotly's JSON (interactive in Jupyter) and a PNG
    (what GitHub and nbviewer show). The PNG's maker is stubbed here (kaleido + Chromium are
    the figures extra's); the real export is tested where it works."""
    import plotly.graph_objects as go
    import plotly.io as pio
    import plotly.io._base_renderers as base

    import sitelens.viz.export as export

    before = pio.renderers.default
    monkeypatch.setattr(export, "png_export_error", lambda: None)
    monkeypatch.setattr(export, "_start_kaleido_server", lambda: False)
    monkeypatch.setattr(base, "to_image", lambda *a, **kw: b"\x89PNG fake")
    try:
        assert sl.notebook_setup() == "plotly_mimetype+png"
        bundle = go.Figure(go.Bar(y=[1, 2]))._repr_mimebundle_()
    finally:
        pio.renderers.default = before
    assert {"application/vnd.plotly.v1+json", "image/png"} <= set(bundle), set(bundle)


def test_notebook_setup_without_png_export_says_why(monkeypatch):
    import plotly.io as pio

    import sitelens.viz.export as export

    before = pio.renderers.default
    monkeypatch.setattr(export, "png_export_error", lambda: "kaleido is not installed (pip install "
                        "'sitelens[figures]')")
    try:
        with pytest.warns(export.StaticFigureWarning, match="blank on GitHub and nbviewer: kaleido"):
            assert sl.notebook_setup() == "plotly_mimetype"
    finally:
        pio.renderers.default = before


def test_notebook_setup_makes_a_real_png_offline():
    """Where kaleido and a Chromium are installed: the PNG is made here (no network needed)."""
    import plotly.graph_objects as go
    import plotly.io as pio

    from sitelens.viz.export import png_export_error

    if png_export_error() is not None:
        pytest.skip(f"no PNG export here: {png_export_error()}")
    before = pio.renderers.default
    try:
        sl.notebook_setup()
        bundle = go.Figure(go.Bar(y=[1, 2]))._repr_mimebundle_()
    finally:
        pio.renderers.default = before
    import base64

    assert base64.b64decode(bundle["image/png"])[:4] == b"\x89PNG"


def test_the_dev_install_opens_the_notebooks():
    """The dev extra brings a notebook front end, and the notebooks page says how to open them."""
    import tomllib

    root = Path(__file__).parents[1]
    dev = tomllib.loads((root / "pyproject.toml").read_text())["project"]["optional-dependencies"]["dev"]
    assert any(re.match(r"(jupyterlab|notebook)\b", d) for d in dev), dev
    page = (root / "docs" / "notebooks.md").read_text()
    assert "jupyter lab notebooks/" in page and "notebook_setup()" in page
