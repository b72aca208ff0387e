"""The atlas page in a real headless Chromium (marker ``browser``; network cut off): click a
heatmap cell → the head card shows that head's values, exactly as :func:`sitelens.atlas.head_card`
computes them; click a similarity cell → the pair view shows that pair's α maps, their difference,
similarity and transfer, exactly as :func:`sitelens.atlas.pair_view` computes them; no console
errors, nothing requested from the network."""

import copy

import pytest
from browser_util import file_url, panel_colours

from sitelens.atlas import AtlasConfig, build_atlas_data, build_atlas_html, head_card, pair_view, payload
from sitelens.atlas.views import head_minimal, minimal_set, minimal_view, overview
from sitelens.models import has_hooked_transformer
from sitelens.tasks import load_task
from sitelens.testing import tiny_model

pytestmark = pytest.mark.browser

TASKS = ("antonym", "synonym", "present_past", "english_french")

if not has_hooked_transformer():  # the atlas's DLA and promoted tokens read W_O / W_U / the norms
    pytest.skip("the atlas needs a HookedTransformer (TransformerLens 3.x) for DLA and the "
                "per-head logit lens", allow_module_level=True)


@pytest.fixture(scope="module")
def page_file(tmp_path_factory):
    model = tiny_model(n_layers=2, n_heads=4, d_head=8, seed=0, backend="hooked")
    data = build_atlas_data(
        model, [load_task(t) for t in TASKS],
        AtlasConfig(n_examples=16, n_prompts=4, n_shots=2, transfer_limit=5, n_perm=20),
        cache_dir=tmp_path_factory.mktemp("cache"))
    p = payload([data])
    path = tmp_path_factory.mktemp("atlas") / "atlas.html"
    path.write_text(build_atlas_html(p), encoding="utf-8")
    return path, p, data.model


def _cell_xy(page, div: str, x, y) -> tuple[float, float]:
    """Viewport pixel of data point (x, y) in the first subplot of plot ``div``."""
    return page.evaluate(
        """([div, x, y]) => { const gd = document.getElementById(div);
           const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis;
           const bb = gd.querySelector('.nsewdrag').getBoundingClientRect();
           return [bb.left + xa.d2p(x), bb.top + ya.d2p(y)]; }""", [div, x, y])


def _click(page, div: str, x, y) -> None:
    page.locator(f"#{div}").scroll_into_view_if_needed()
    page.wait_for_function(f"document.getElementById('{div}').dataset.drawn === '1'")  # drawn when seen
    px, py = _cell_xy(page, div, x, y)
    page.mouse.move(px, py)
    page.mouse.click(px, py)


def _fmt(v) -> str:
    return "—" if v is None else f"{v:.4f}"


def test_click_a_head_shows_its_card(offline_page, page_file):
    path, p, model = page_file
    page, log = offline_page.page, offline_page.log
    page.goto(file_url(path))
    page.wait_for_function("window.atlasReady === true")
    task = p["models"][model]["order"][0]
    _click(page, "taskmap", 2, 1)  # head 2 (x), layer 1 (y)
    page.wait_for_function("document.getElementById('card').dataset.head === 'L1H2'")
    card = head_card(p, model, task, 1, 2)
    assert page.eval_on_selector("#card", "e => e.dataset.task") == task
    shown = page.eval_on_selector_all(
        "#card-scores tr", "rows => rows.map(r => [r.dataset.lens, r.querySelector('.v').textContent])")
    assert dict(shown) == {lens: _fmt(v) for lens, v in card["scores"].items()}
    tokens = page.eval_on_selector_all("#card-tokens span", "s => s.map(e => e.textContent)")
    assert tokens == card["tokens"]
    assert not log.problems(), log.problems()


def test_click_a_similarity_cell_shows_the_pair(offline_page, page_file, tmp_path):
    _, p, model = page_file
    # The tiny model transfers nothing (every transfer and zero-shot accuracy is 0), so the page here
    # gets a distinct value in every cell: reading another cell (B through A swapped, the wrong row)
    # then shows another number.
    p = copy.deepcopy(p)
    m = p["models"][model]
    n = len(m["tasks"])
    m["transfer"] = [[round(0.01 * (i * n + j + 1), 4) for j in range(n)] for i in range(n)]
    m["zero_shot"] = [round(0.5 + 0.1 * i, 4) for i in range(n)]
    path = tmp_path / "atlas.html"
    path.write_text(build_atlas_html(p), encoding="utf-8")
    page, log = offline_page.page, offline_page.log
    page.goto(file_url(path))
    page.wait_for_function("window.atlasReady === true")
    order = p["models"][model]["order"]
    a, b = order[2], order[0]
    _click(page, "sim", b, a)  # x = B, y = A
    page.wait_for_function(f"document.getElementById('pair').dataset.a === '{a}'")
    assert page.eval_on_selector("#pair", "e => e.dataset.b") == b
    view = pair_view(p, model, a, b)
    assert view["alpha_a"] != view["alpha_b"]  # the two tasks' maps differ, so a swapped pair shows
    shown = page.eval_on_selector("#pair", "e => ({names: e.data.map(t => t.name), "
                                  "z: e.data.map(t => t.z), title: e.layout.title.text})")
    assert shown["names"] == [a, b, "A − B"]
    assert shown["z"][0] == view["alpha_a"]  # the payload's floats, unchanged through JSON
    assert shown["z"][1] == view["alpha_b"]
    diff = [x for row in shown["z"][2] for x in row]
    want = [x for row in view["diff"] for x in row]
    assert diff == pytest.approx(want, abs=1.5e-4)  # both round A − B to 4 decimals (JS vs Python)
    assert shown["title"] == (f"A = {a} · B = {b} · ρ = {_fmt(view['similarity'])} · B through A's α: "
                              f"{_fmt(view['transfer'])} (B zero-shot {_fmt(view['zero_shot_b'])})")
    assert page.locator("#pair g.hm").count() == 3  # both maps and their difference drew
    assert not log.problems(), log.problems()


def test_views_below_the_first_screen_draw_when_scrolled_to(offline_page, page_file):
    """The first paint is the overview alone; the depth chart draws once scrolled near, not before."""
    path, p, model = page_file
    page, log = offline_page.page, offline_page.log
    page.set_viewport_size({"width": 1400, "height": 400})
    page.goto(file_url(path))
    page.wait_for_function("window.atlasReady === true")
    assert page.eval_on_selector("#overview", "e => e.dataset.drawn") == "1"
    assert page.eval_on_selector("#depth", "e => e.dataset.drawn || ''") == ""
    assert page.locator("#depth .main-svg").count() == 0
    page.locator("#depth").scroll_into_view_if_needed()
    page.wait_for_function("document.getElementById('depth').dataset.drawn === '1'")
    assert page.locator("#depth g.trace.bars").count() == len(p["models"])  # one bar trace per model
    assert not log.problems(), log.problems()


PANELS = ("overview", "taskmap", "card", "minimal", "sim", "pair", "depth")
DRAWN = "ids => ids.map(id => document.getElementById(id).dataset.drawn || '')"


def test_all_parameter_draws_every_view_at_once(offline_page, page_file):
    """``?all``: every view is drawn once the page is ready, none waits to be scrolled to; the
    overview's x-axis names the heads as :func:`sitelens.atlas.overview` does."""
    path, p, model = page_file
    page, log = offline_page.page, offline_page.log
    page.set_viewport_size({"width": 1400, "height": 400})
    page.goto(file_url(path) + "?all")
    page.wait_for_function("window.atlasReady === true")
    assert page.evaluate(DRAWN, list(PANELS)) == ["1"] * len(PANELS)
    assert page.locator("#depth g.trace.bars").count() == len(p["models"])
    ticks = page.eval_on_selector_all("#overview .xtick text", "s => s.map(e => e.textContent)")
    assert ticks == overview(p, model)["ticks"] == [f"L{i // 4}H{i % 4}" for i in range(8)]
    assert not log.problems(), log.problems()


def test_printing_draws_every_view(offline_page, page_file, tmp_path):
    """A print (here Chromium's PDF, which fires ``beforeprint``) draws the views still waiting."""
    path, _, _ = page_file
    page, log = offline_page.page, offline_page.log
    page.set_viewport_size({"width": 1400, "height": 400})
    page.goto(file_url(path))
    page.wait_for_function("window.atlasReady === true")
    assert page.evaluate(DRAWN, ["depth"]) == [""]  # below the first screen: waiting
    page.pdf(path=str(tmp_path / "atlas.pdf"))
    assert page.evaluate(DRAWN, list(PANELS)) == ["1"] * len(PANELS)
    assert (tmp_path / "atlas.pdf").stat().st_size > 0
    assert not log.problems(), log.problems()


def test_panel_colours_tell_a_blank_panel_from_a_drawn_one(offline_page, page_file):
    """The blank-panel check of the committed page's screenshot test, on a page without ``?all``:
    the views still waiting below the first screen count as blank (so that test can fail)."""
    path, _, _ = page_file
    page = offline_page.page
    page.set_viewport_size({"width": 1400, "height": 400})
    page.goto(file_url(path))
    page.wait_for_function("window.atlasReady === true")
    page.evaluate("io.disconnect()")  # the screenshot's resize must not draw the waiting views
    colours = panel_colours(page, page.screenshot(full_page=True))
    assert colours["overview"] > 16, colours  # drawn: hundreds of colours
    assert colours["sim"] == colours["pair"] == colours["depth"] == 1, colours  # blank: the background


def test_page_with_the_full_plotly_bundle_also_works(offline_page, page_file, tmp_path):
    """Without the cartesian bundle (setup offline) the page inlines the full plotly.js: same page."""
    _, p, _ = page_file
    path = tmp_path / "full.html"
    path.write_text(build_atlas_html(p, plotly="full"), encoding="utf-8")
    page, log = offline_page.page, offline_page.log
    page.goto(file_url(path))
    page.wait_for_function("window.atlasReady === true")
    assert page.eval_on_selector('meta[name="plotly-bundle"]', "e => e.content") == "full"
    _click(page, "taskmap", 0, 1)
    page.wait_for_function("document.getElementById('card').dataset.head === 'L1H0'")
    assert not log.problems(), log.problems()


def _with_minimal(p: dict, model: str) -> dict:
    """``p`` with minimal sets for every task (k* a number, or not reached; distinct sets)."""
    p = copy.deepcopy(p)
    m = p["models"][model]
    n = m["n_layers"] * m["n_heads"]
    tasks = {}
    for i, t in enumerate(m["tasks"]):
        tasks[t] = {"k_star": {"alpha": 1, "alpha-grad": "not reached", "atp": 2},
                    "sets": {"alpha": [i % n], "alpha-grad": [], "atp": [i % n, (i + 3) % n]},
                    "full_site": 0.5, "zero_shot": 0.1, "n_test": 20}
    m["minimal"] = {"note": "", "selectors": ["alpha", "alpha-grad", "atp"], "budgets": [1, 2, 5],
                    "tasks": tasks, "skipped": {}}
    return p


def test_minimal_sets_draw_on_the_task_map_the_card_and_their_panel(offline_page, page_file, tmp_path):
    """With minimal sets: the k* panel draws the task × selector matrix of
    :func:`sitelens.atlas.views.minimal_view`, the task map marks the task's minimal set
    (:func:`~sitelens.atlas.views.minimal_set`), and the head card lists, per selector, the tasks whose
    set holds the head (:func:`~sitelens.atlas.views.head_minimal`)."""
    _, p, model = page_file
    p = _with_minimal(p, model)
    path = tmp_path / "atlas.html"
    path.write_text(build_atlas_html(p), encoding="utf-8")
    page, log = offline_page.page, offline_page.log
    page.set_viewport_size({"width": 1400, "height": 900})
    page.goto(file_url(path) + "?all")
    page.wait_for_function("window.atlasReady === true")
    v = minimal_view(p, model)
    shown = page.eval_on_selector("#minimal", "e => ({z: e.data[0].z, y: e.data[0].y, x: e.data[0].x})")
    assert shown == {"z": v["z"], "y": v["tasks"], "x": v["selectors"]}
    assert page.locator("#minimal g.hm").count() == 2  # k*, and the grey layer of the not reached
    grey = page.eval_on_selector("#minimal", "e => e.data[1].z")
    assert grey == [[1 if z is None else None for z in row] for row in v["z"]]
    assert any(1 in row for row in grey) and any(z is not None for row in v["z"] for z in row)
    task = page.eval_on_selector("#task", "e => e.value")
    want = ";".join(f"L{a}H{b}" for a, b in minimal_set(p, model, task, "alpha"))
    assert page.eval_on_selector("#taskmap", "e => e.dataset.minimal") == want
    assert page.locator("#taskmap g.scatterlayer .point").count() == 1  # the set's one head, marked
    layer, head = minimal_set(p, model, task, "atp")[1]
    _click(page, "taskmap", head, layer)
    page.wait_for_function(f"document.getElementById('card').dataset.head === 'L{layer}H{head}'")
    rows = page.eval_on_selector_all(
        "#card-minimal tr", "rs => rs.map(r => [r.dataset.selector, r.querySelector('.tasks').textContent])")
    assert dict(rows) == {s: ", ".join(ts) for s, ts in head_minimal(p, model, layer, head).items()}
    assert any(ts for ts in dict(rows).values())  # the clicked head is in some task's set
    assert not log.problems(), log.problems()


def test_page_without_minimal_sets_says_so(offline_page, page_file):
    """Older tables (no minimal.csv): the panel shows why, and everything else still works."""
    path, p, model = page_file
    page, log = offline_page.page, offline_page.log
    page.goto(file_url(path) + "?all")
    page.wait_for_function("window.atlasReady === true")
    note = page.eval_on_selector("#minimal-note", "e => e.textContent")
    assert note == minimal_view(p, model)["note"] and "minimal.csv" in note
    assert page.locator("#card-minimal").count() == 0
    _click(page, "taskmap", 2, 1)
    page.wait_for_function("document.getElementById('card').dataset.head === 'L1H2'")
    assert not log.problems(), log.problems()
