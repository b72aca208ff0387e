"""The committed atlas (``sitelens/data/atlas/``, both bundled models, shipped in the package) as a
user gets it on a fresh clone: ``sitelens atlas --out`` builds the page from the tables alone (no
model is loaded), it stays within its size budget (the committed tables' measured size + 10%), and
in headless Chromium (network cut off) every model's page draws, a click on a head shows that head's
card exactly as :func:`sitelens.atlas.head_card` computes it, and a click on a similarity cell draws
the pair — with no console error. The page opens on the default model (SmolLM2), and with ``?all`` a
full-page screenshot shows every panel drawn (none blank)."""

import re

import pytest
from browser_util import file_url, panel_colours

from sitelens.atlas import DEFAULT_DATA_DIR, head_card, load_atlas, overview, payload
from sitelens.atlas.html import plotly_bundle
from sitelens.cli import main
from sitelens.models import DEFAULT_MODEL

DATA = DEFAULT_DATA_DIR
MODELS = ("gemma-3-270m", "smollm2-135m-instruct")
# The page is the inlined plotly.js (cartesian bundle 1.5 MB, or the full one 4.8 MB) plus both models'
# tables and the page's CSS/JS: 1.27 MB measured on the committed tables (a 2.8 MB page with
# the cartesian bundle, 6.1 MB with the full one). The budget for all but plotly.js is that measure
# + 10% headroom, so tables that grow by more than a tenth fail whichever bundle is inlined.
BUDGET_WITHOUT_PLOTLY_MB = 1.4


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("atlas") / "atlas.html"
    assert main(["atlas", "--out", str(out), "--data", str(DATA)]) == 0
    return out, payload(load_atlas(DATA))


def test_committed_tables_cover_both_models_and_every_task(built):
    _, p = built
    assert sorted(p["models"]) == sorted(MODELS)
    # SmolLM2: all 57 FV tasks; Gemma: the 29 abstractive ones (ATLAS_MODELS)
    assert len(p["models"]["smollm2-135m-instruct"]["order"]) == 57
    assert len(p["models"]["gemma-3-270m"]["order"]) == 29


def test_committed_page_within_size_budget(built):
    out, _ = built
    html = out.read_text(encoding="utf-8")
    bundle = re.search(r'<meta name="plotly-bundle" content="(\w+)">', html).group(1)
    plotly_mb = len(plotly_bundle(bundle)[1].encode()) / 1e6
    assert out.stat().st_size / 1e6 - plotly_mb < BUDGET_WITHOUT_PLOTLY_MB


def _fmt(v) -> str:
    return "—" if v is None else f"{v:.4f}"


@pytest.mark.browser
@pytest.mark.parametrize("model", MODELS)
def test_committed_page_clicks(offline_page, built, model):
    out, p = built
    page, log = offline_page.page, offline_page.log
    page.goto(file_url(out))
    page.wait_for_function("window.atlasReady === true", timeout=60_000)
    page.select_option("#model", model)
    task = page.eval_on_selector("#task", "e => e.value")
    layer = p["models"][model]["n_layers"] // 2
    page.locator("#taskmap").scroll_into_view_if_needed()
    page.wait_for_function("document.getElementById('taskmap').dataset.drawn === '1'")  # drawn when seen
    px, py = page.evaluate(
        """([x, y]) => { const gd = document.getElementById('taskmap');
           const bb = gd.querySelector('.nsewdrag').getBoundingClientRect();
           return [bb.left + gd._fullLayout.xaxis.d2p(x), bb.top + gd._fullLayout.yaxis.d2p(y)]; }""",
        [1, layer])
    page.mouse.move(px, py)
    page.mouse.click(px, py)
    page.wait_for_function(f"document.getElementById('card').dataset.head === 'L{layer}H1'")
    card = head_card(p, model, task, layer, 1)
    shown = page.eval_on_selector_all(
        "#card-scores tr", "rows => rows.map(r => [r.dataset.lens, r.querySelector('.v').textContent])")
    assert dict(shown) == {lens: _fmt(v) for lens, v in card["scores"].items()}
    page.locator("#sim").scroll_into_view_if_needed()
    page.wait_for_function("document.getElementById('sim').dataset.drawn === '1'")  # drawn when seen
    order = p["models"][model]["order"]
    a, b = order[1], order[0]
    px, py = page.evaluate(
        """([x, y]) => { const gd = document.getElementById('sim');
           const bb = gd.querySelector('.nsewdrag').getBoundingClientRect();
           return [bb.left + gd._fullLayout.xaxis.d2p(x), bb.top + gd._fullLayout.yaxis.d2p(y)]; }""",
        [b, a])
    page.mouse.move(px, py)
    page.mouse.click(px, py)
    page.wait_for_function(f"document.getElementById('pair').dataset.a === '{a}'")
    assert page.locator("#pair g.hm").count() == 3  # both maps and their difference drew
    assert not log.problems(), log.problems()


PANELS = ("overview", "taskmap", "card", "sim", "pair", "depth")


@pytest.mark.browser
def test_full_page_screenshot_shows_every_panel(offline_page, built):
    """``?all`` (what a headless ``chromium --screenshot`` or a print needs): every panel is drawn at
    once, on the default model, with the overview's heads named; in a full-page screenshot no
    panel is blank (a blank one is its background alone, one colour, as
    tests/test_browser_atlas.py shows; a drawn one, hundreds)."""
    out, p = built
    page, log = offline_page.page, offline_page.log
    page.set_viewport_size({"width": 1400, "height": 1000})
    page.goto(file_url(out) + "?all")
    page.wait_for_function("window.atlasReady === true", timeout=60_000)
    assert page.eval_on_selector("#model", "e => e.value") == DEFAULT_MODEL == "smollm2-135m-instruct"
    drawn = page.evaluate("ids => ids.map(id => { const e = document.getElementById(id); return "
                          "[e.dataset.drawn || '', e.querySelectorAll('svg.main-svg, canvas').length]; })",
                          list(PANELS))
    assert all(d == "1" and n > 0 for d, n in drawn), dict(zip(PANELS, drawn))
    ticks = page.eval_on_selector_all("#overview .xtick text", "s => s.map(e => e.textContent)")
    assert ticks == overview(p, DEFAULT_MODEL)["ticks"] == [f"L{layer}H0" for layer in range(30)]
    png = page.screenshot(full_page=True)
    colours = panel_colours(page, png)
    assert sorted(colours) == sorted((*PANELS, "minimal"))
    assert all(colours[k] > 16 for k in PANELS), colours
    # the k* panel: drawn when the tables have a current minimal.csv, else the note saying why
    if p["models"][DEFAULT_MODEL]["minimal"]["tasks"]:
        assert colours["minimal"] > 16 and page.locator("#minimal g.hm").count() >= 1
    else:
        assert "minimal.csv" in page.eval_on_selector("#minimal-note", "e => e.textContent")
    assert not log.problems(), log.problems()
