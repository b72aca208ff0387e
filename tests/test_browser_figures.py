"""HTML figures render offline: every committed ``.html`` under ``figures/`` and
``benchmarks/results/`` draws its plot in headless Chromium with the network cut off (marker
``browser``), new figures get the shared ``plotly.min.js`` beside them, and
``scripts/offline_figures.py`` localizes CDN pages and its ``--check`` passes on the repository."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
import pytest
from browser_util import file_url

from sitelens.viz.export import (
    PLOTLYJS_NAME,
    FigureWriter,
    ensure_plotlyjs,
    plotlyjs_bytes,
    write_figure_html,
)

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "offline_figures.py"


def _load_script():
    spec = importlib.util.spec_from_file_location("offline_figures", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


offline_figures = _load_script()
COMMITTED = [p.relative_to(ROOT).as_posix()
             for p in offline_figures.html_files([ROOT / r for r in offline_figures.DEFAULT_ROOTS])]

# every plotly graph div has drawn its SVG from its traces
_DRAWN = """() => {
  const gds = [...document.querySelectorAll('.plotly-graph-div')];
  if (!window.Plotly || gds.length === 0) return false;
  return gds.every(gd => gd._fullLayout && gd._fullData && gd._fullData.length > 0
                         && gd.querySelector('.plotly .main-svg'));
}"""


def assert_plot_drawn(op, url: str, timeout_ms: int = 15_000) -> None:
    """Open ``url`` in the offline page ``op`` and assert that every plotly figure on it drew,
    with no console error, uncaught exception, failed or blocked request."""
    op.page.goto(url, wait_until="load")
    try:
        op.page.wait_for_function(_DRAWN, timeout=timeout_ms)
    except Exception as e:
        problems = "; ".join(op.log.problems()) or "no console error or failed request"
        raise AssertionError(f"{url}: the plot did not draw within {timeout_ms} ms "
                             f"({type(e).__name__}; {problems})") from None
    assert op.page.locator(".plotly .main-svg").count() >= 1
    assert not op.log.problems(), f"{url}: {op.log.problems()}"


@pytest.mark.browser
@pytest.mark.parametrize("rel", COMMITTED)
def test_committed_html_figure_renders_offline(offline_page, rel):
    assert_plot_drawn(offline_page, file_url(ROOT / rel))


@pytest.mark.browser
def test_new_figure_html_renders_offline_and_cdn_page_does_not(offline_page, tmp_path):
    fig = go.Figure(go.Heatmap(z=[[0.1, 0.9], [0.5, 0.3]]))
    page = write_figure_html(fig, tmp_path / "figs" / "f.html")
    assert (tmp_path / "figs" / PLOTLYJS_NAME).read_bytes() == plotlyjs_bytes()
    assert_plot_drawn(offline_page, file_url(page))
    # the network really is cut off: the same figure with plotly.js from the CDN stays blank
    cdn = tmp_path / "cdn.html"
    cdn.write_text(fig.to_html(include_plotlyjs="cdn"))
    with pytest.raises(AssertionError, match="blocked"):
        assert_plot_drawn(offline_page, file_url(cdn), timeout_ms=1500)


@pytest.mark.browser
def test_crossorigin_local_script_does_not_load_from_disk(offline_page, tmp_path):
    """Why scripts/offline_figures.py drops plotly's ``integrity``/``crossorigin`` attributes."""
    fig = go.Figure(go.Scatter(x=[1, 2], y=[3, 4]))
    page = write_figure_html(fig, tmp_path / "f.html")
    page.write_text(page.read_text().replace('src="plotly.min.js"', 'src="plotly.min.js" crossorigin'))
    with pytest.raises(AssertionError, match="CORS"):
        assert_plot_drawn(offline_page, file_url(page), timeout_ms=1500)


def test_writer_ships_one_shared_plotlyjs(tmp_path):
    w = FigureWriter(("html",))
    fig = go.Figure(go.Scatter(x=[1, 2], y=[3, 4]))
    d = tmp_path / "m"
    assert w.write(fig, pd.DataFrame({"x": [1, 2]}), d / "a") == ["a.csv", "a.html"]
    js = d / PLOTLYJS_NAME
    inode = js.stat().st_ino
    assert w.write(fig, None, d / "b") == ["b.html"]
    for name in ("a.html", "b.html"):
        html = (d / name).read_text()
        assert f'src="{PLOTLYJS_NAME}"' in html and "cdn.plot.ly" not in html
        assert offline_figures.problems(d / name) == []
    assert js.stat().st_ino == inode  # an identical copy is not rewritten
    js.write_text("stale")
    ensure_plotlyjs(d)
    assert js.read_bytes() == plotlyjs_bytes()


def test_offline_figures_localizes_cdn_pages(tmp_path, capsys):
    fig = go.Figure(go.Bar(x=["a"], y=[1]))
    d = tmp_path / "figs"
    d.mkdir()
    (d / "p.html").write_text(fig.to_html(include_plotlyjs="cdn"))
    (d / "p.csv").write_text("a,b\n1,2\n")
    (tmp_path / ".runs").mkdir()
    (tmp_path / ".runs" / "hidden.html").write_text(fig.to_html(include_plotlyjs="cdn"))
    assert offline_figures.main(["--check", str(tmp_path)]) == 1
    assert "cdn.plot.ly" in capsys.readouterr().out
    assert offline_figures.main([str(tmp_path)]) == 0
    html = (d / "p.html").read_text()
    assert f'<script charset="utf-8" src="{PLOTLYJS_NAME}">' in html and "cdn.plot.ly" not in html
    assert (d / PLOTLYJS_NAME).read_bytes() == plotlyjs_bytes()
    assert (d / "p.csv").read_text() == "a,b\n1,2\n"
    assert "cdn.plot.ly" in (tmp_path / ".runs" / "hidden.html").read_text()  # hidden folders skipped
    before = {p: p.stat().st_mtime_ns for p in d.iterdir()}
    assert offline_figures.main([str(tmp_path)]) == 0  # idempotent
    assert {p: p.stat().st_mtime_ns for p in d.iterdir()} == before
    assert offline_figures.main(["--check", str(tmp_path)]) == 0
    (d / PLOTLYJS_NAME).unlink()
    assert offline_figures.main(["--check", str(tmp_path)]) == 1  # the local copy is missing
    assert "missing" in capsys.readouterr().out
    # a local script marked crossorigin is a CORS request, which Chromium refuses under file://
    ensure_plotlyjs(d)
    (d / "p.html").write_text(html.replace('src="plotly.min.js"', 'src="plotly.min.js" crossorigin'))
    assert offline_figures.main(["--check", str(tmp_path)]) == 1
    assert "crossorigin" in capsys.readouterr().out


def test_offline_figures_check_passes_on_repo(capsys):
    """``python scripts/offline_figures.py --check`` on the repository (in-process: the script
    imports sitelens, which is loaded here already)."""
    assert COMMITTED, "no HTML figures found under figures/ or benchmarks/results/"
    rc = offline_figures.main(["--check"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert f"{len(COMMITTED)} HTML files, 0 not offline-ready" in out
