"""The head atlas (sitelens.atlas) on a tiny random model: the data it builds, the payload and its
lookups, the page, the CLI and the Jupyter explorer. The browser tier (tests/test_browser_atlas.py)
opens the page in Chromium."""

import json
import re

import numpy as np
import pandas as pd
import pytest

from sitelens.atlas import AtlasConfig, AtlasData, build_atlas_data, build_atlas_html, payload
from sitelens.atlas.data import depth_profile, family_test, task_family
from sitelens.atlas.views import head_card, overview, pair_view, task_map
from sitelens.cli import main
from sitelens.models import has_hooked_transformer
from sitelens.tasks import load_task
from sitelens.testing import tiny_model

TASKS = ("antonym", "synonym", "present_past", "english_french")

if not has_hooked_transformer():  # the atlas's DLA and promoted tokens read W_O / W_U / the norms
    pytest.skip("the atlas needs a HookedTransformer (TransformerLens 3.x) for DLA and the "
                "per-head logit lens", allow_module_level=True)
SMALL = AtlasConfig(n_examples=16, n_prompts=4, n_shots=2, transfer_limit=5, n_perm=50)


@pytest.fixture(scope="module")
def atlas(tmp_path_factory):
    model = tiny_model(n_layers=2, n_heads=4, d_head=8, seed=0, backend="hooked")
    tasks = [load_task(t) for t in TASKS]
    cache = tmp_path_factory.mktemp("atlas_cache")
    data = build_atlas_data(model, tasks, SMALL, cache_dir=cache)
    folder = data.save(tmp_path_factory.mktemp("atlas") / data.model)
    return model, tasks, data, folder, cache


def test_atlas_data_tables_and_roundtrip(atlas):
    model, tasks, data, folder, _ = atlas
    L, H = model.cfg.n_layers, model.cfg.n_heads
    assert data.tasks == list(TASKS) and len(data.alpha) == len(TASKS) * L * H
    assert data.alpha.alpha.between(0, 1).all()
    assert set(data.lenses.lens) == set(SMALL.fast_lenses)
    # every ordered pair measured in both modes (alpha, topk), diagonal included
    assert len(data.transfer) == 2 * len(TASKS) ** 2
    back = AtlasData.load(folder)
    pd.testing.assert_frame_equal(back.alpha, data.alpha, check_dtype=False)
    # NaN where a task's α never moved on the random model (a constant has no rank correlation)
    pd.testing.assert_frame_equal(back.similarity, data.similarity, check_dtype=False, check_names=False,
                                  atol=1e-5)  # float round trip through CSV
    s = back.summary["similarity_vs_transfer"]["alpha"]
    sim = data.similarity.to_numpy(float)
    finite_pairs = int(np.isfinite(sim).sum()) - len(TASKS)  # ordered pairs with a defined ρ
    assert s["n_pairs"] == finite_pairs >= 2


def rebuild_without_computing(model, tasks, cache, monkeypatch):
    """Rebuild the atlas from ``cache`` with every computation it caches made to raise: a fit, the
    transfer table and the fast lenses must all be read back."""
    import sitelens.lenses
    import sitelens.patching
    import sitelens.site

    def refuse(what):
        def fn(*a, **k):
            raise AssertionError(f"the atlas recomputed {what} instead of reading its cache")
        return fn

    monkeypatch.setattr(sitelens.site, "fit_site", refuse("a fit"))
    monkeypatch.setattr(sitelens.patching, "inter_task", refuse("the transfer table"))
    monkeypatch.setattr(sitelens.lenses, "attribution_patching", refuse("the fast lenses"))
    return build_atlas_data(model, tasks, SMALL, cache_dir=cache)


def test_atlas_fits_are_cached(atlas, monkeypatch):
    model, tasks, data, _, cache = atlas
    again = rebuild_without_computing(model, tasks, cache, monkeypatch)
    pd.testing.assert_frame_equal(again.alpha, data.alpha)
    pd.testing.assert_frame_equal(again.lenses, data.lenses)


def test_family_test_detects_structure():
    fam = {f"t{i}": "xyz"[i % 3] for i in range(12)}  # 3 families of 4 tasks
    names = list(fam)
    S = np.array([[1.0 if fam[i] == fam[j] else 0.0 for j in names] for i in names])
    sim = pd.DataFrame(S, index=names, columns=names)
    res = family_test(sim, fam, n_perm=200)
    assert res["gap"] == pytest.approx(1.0) and res["p_value"] < 0.05
    rng = np.random.default_rng(0)
    R = rng.uniform(-1, 1, (12, 12))
    R = (R + R.T) / 2
    flat = family_test(pd.DataFrame(R, index=names, columns=names), fam, n_perm=200)
    assert flat["p_value"] > res["p_value"]
    assert task_family("choose_first_of_3") == "list selection"
    assert task_family("english-french") == "translation"


def test_depth_profile_bins_alpha_mass_by_relative_depth():
    """Two layers: layer ℓ sits at relative depth (ℓ + 0.5)/2, i.e. deciles 2 and 7. Task a puts
    1/4 of its α in layer 0, task b 1/2: the mass of decile 2 is their mean, 3/8."""
    rows = [(task, layer, head, a) for task, per_layer in (("a", (0.1, 0.3)), ("b", (0.2, 0.2)))
            for layer, a in enumerate(per_layer) for head in range(2)]
    alpha = pd.DataFrame(rows, columns=["task", "layer", "head", "alpha"])
    prof = depth_profile(AtlasData("m", 2, 2, alpha, None, None, None, None))
    want = np.zeros(10)
    want[2], want[7] = 3 / 8, 5 / 8
    assert np.allclose(prof.mass, want), ("depth_profile: α mass in the wrong deciles", list(prof.mass))
    assert list(prof.depth_low) == pytest.approx(np.arange(10) / 10)
    assert prof.mean_alpha[2] == pytest.approx(0.15) and prof.mean_alpha[7] == pytest.approx(0.25)
    assert prof.mean_alpha.isna().sum() == 8  # no layer in the other deciles


def test_payload_lookups_match_the_tables(atlas):
    _, _, data, _, _ = atlas
    p = payload([data])
    json.dumps(p, allow_nan=False)  # JSON-safe: NaN became null
    card = head_card(p, data.model, "synonym", 1, 2)
    assert card["head"] == "L1H2"
    assert card["scores"]["alpha"] == pytest.approx(data.alpha_map("synonym")[1, 2], abs=1e-4)
    atp = data.lenses[(data.lenses.task == "synonym") & (data.lenses.lens == "atp")
                      & (data.lenses.layer == 1) & (data.lenses["head"] == 2)].score.item()
    assert card["scores"]["atp"] == pytest.approx(atp, rel=1e-3, abs=1e-4)
    assert dict(card["alpha_across_tasks"])["antonym"] == pytest.approx(
        data.alpha_map("antonym")[1, 2], abs=1e-4)
    toks = data.tokens[(data.tokens.task == "synonym") & (data.tokens.layer == 1)
                       & (data.tokens["head"] == 2)].sort_values("rank").token.tolist()
    assert card["tokens"] == toks
    v = pair_view(p, data.model, "antonym", "synonym")
    assert np.allclose(np.array(v["diff"]), data.alpha_map("antonym") - data.alpha_map("synonym"),
                       atol=2e-4)  # two maps rounded to 4 decimals, then their difference
    row = data.transfer[(data.transfer["mode"] == "alpha") & (data.transfer.source_task == "antonym")
                        & (data.transfer.target_task == "synonym")]
    assert v["transfer"] == pytest.approx(row.accuracy.item(), abs=1e-4)
    assert np.array(task_map(p, data.model, "antonym")).shape == (2, 4)
    o = overview(p, data.model, "atp")
    assert sorted(o["tasks"]) == sorted(TASKS) and len(o["heads"]) == 8


def test_carried_alpha_lens_of_a_few_tasks_does_not_replace_the_atlas_alpha(atlas):
    """Lens rows carried in from benchmarks/heads.py hold an "alpha" (over its own seeds) for only
    the tasks it ran; the atlas's α of every task must stay the "alpha" lens (a regression: the
    carried rows replaced it and the head card of any other task raised KeyError)."""
    _, _, data, _, _ = atlas
    carried = data.lenses[(data.lenses.task == "antonym") & (data.lenses.lens == "atp")].assign(
        lens="alpha", score=0.5)
    d2 = AtlasData(**{**vars(data), "lenses": pd.concat([data.lenses, carried], ignore_index=True)})
    p = payload([d2])
    assert sorted(p["models"][data.model]["lenses"]["alpha"]) == sorted(TASKS)
    assert list(p["models"][data.model]["lenses"]["alpha-seeds"]) == ["antonym"]
    card = head_card(p, data.model, "synonym", 1, 2)
    assert card["scores"]["alpha"] == pytest.approx(data.alpha_map("synonym")[1, 2], abs=1e-4)
    assert card["scores"]["alpha-seeds"] is None


def test_payload_opens_on_the_default_model(atlas):
    """Page and explorer open on sitelens's default model (SmolLM2) when it is there, whatever order
    the tables came in (load_atlas sorts them: Gemma first); else on the first."""
    from dataclasses import replace

    from sitelens.models import DEFAULT_MODEL

    _, _, data, _, _ = atlas
    other, default = replace(data, model="gemma-3-270m"), replace(data, model=DEFAULT_MODEL)
    p = payload([other, default])
    assert p["default_model"] == DEFAULT_MODEL and list(p["models"]) == [DEFAULT_MODEL, "gemma-3-270m"]
    assert payload([data])["default_model"] == data.model


def test_overview_names_its_heads():
    """Every head named up to MAX_HEAD_TICKS heads; past it each layer's first (L{l}H0)."""
    from sitelens.atlas.views import MAX_HEAD_TICKS

    def p(L, H):
        return {"models": {"m": {"n_layers": L, "n_heads": H, "order": ["t"],
                                 "lenses": {"alpha": {"t": [0.5] * (L * H)}}}}}

    small = overview(p(2, 4), "m")
    assert small["ticks"] == small["heads"] == [f"L{i // 4}H{i % 4}" for i in range(8)]
    big = overview(p(30, 9), "m")  # SmolLM2's 270 heads
    assert len(big["heads"]) == 270 > MAX_HEAD_TICKS
    assert big["ticks"] == [f"L{layer}H0" for layer in range(30)]


def test_page_embeds_the_payload_and_no_network(atlas):
    _, _, data, _, _ = atlas
    page = build_atlas_html(payload([data]))
    start = page.index('<script id="atlas-data" type="application/json">') + len(
        '<script id="atlas-data" type="application/json">')
    embedded = json.loads(page[start: page.index("</script>", start)].replace("<\\/", "</"))
    assert embedded == json.loads(json.dumps(payload([data])))
    assert "https://" not in page.split("<script>", 1)[0]  # no CDN: plotly.js is inlined
    assert "<script src=" not in page  # nothing loaded from elsewhere


def test_cli_atlas_builds_from_tables_and_refuses_bad_input(atlas, tmp_path, capsys):
    _, _, data, folder, _ = atlas
    out = tmp_path / "atlas.html"
    assert main(["atlas", "--out", str(out), "--data", str(folder.parent)]) == 0
    assert out.stat().st_size > 1e6 and data.model in capsys.readouterr().out
    assert main(["atlas", "--out", str(tmp_path / "a.csv"), "--data", str(folder.parent)]) == 2
    assert main(["atlas", "--out", str(tmp_path / "b.html"), "--data", str(tmp_path / "none")]) == 2
    assert main(["atlas", "--out", str(tmp_path / "c.html"), "--data", str(folder.parent),
                 "--models", "no-such-model"]) == 2
    assert main(["atlas", "--out", str(tmp_path / "d.html"), "--refit",
                 "--tasks-dir", str(tmp_path / "none")]) == 2
    assert not any((tmp_path / n).exists() for n in ("a.csv", "b.html", "c.html", "d.html"))


def test_explorer_shows_the_same_card(atlas):
    pytest.importorskip("ipywidgets")
    pytest.importorskip("anywidget")
    from sitelens.atlas.widget import Explorer

    _, _, data, _, _ = atlas
    p = payload([data])
    ex = Explorer(p)
    ex.set_task("present_past")
    card = ex.select_head(0, 3)
    assert card == head_card(p, data.model, "present_past", 0, 3)
    assert "L0H3" in ex.card.value and f"{card['scores']['alpha']:.4f}" in ex.card.value
    assert list(ex.fig_overview.layout.xaxis.tickvals) == overview(p, data.model)["ticks"]  # heads named
    v = ex.select_pair("synonym", "antonym")
    assert np.allclose(np.array(ex.fig_pair.data[2].z, dtype=float), np.array(v["diff"], dtype=float))
    ex.set_lens("atp")
    assert np.allclose(np.array(ex.fig_task.data[0].z, dtype=float),
                       np.array(task_map(p, data.model, "present_past", "atp"), dtype=float))


def test_plotly_bundle_choice(monkeypatch, tmp_path):
    """auto → the cartesian bundle when it is there (and of the plotly package's version), else full;
    asking for a missing or mismatched cartesian bundle, or an unknown one, is a UsageError."""
    import sitelens.atlas.html as html
    from sitelens.errors import UsageError

    name, full = html.plotly_bundle("full")
    assert name == "full" and "plotly.js" in full[:300]
    with pytest.raises(UsageError, match="'auto', 'cartesian' or 'full'"):
        html.plotly_bundle("basic")
    version = re.search(r"v(\d+\.\d+\.\d+)", full[:300]).group(1)
    pkg = tmp_path / "pkg"
    (pkg / "vendor").mkdir(parents=True)
    monkeypatch.setattr("importlib.resources.files", lambda _: pkg)
    assert html.plotly_bundle("auto")[0] == "full"  # nothing fetched
    with pytest.raises(UsageError, match="run scripts/setup.sh"):
        html.plotly_bundle("cartesian")
    (pkg / html.CARTESIAN).write_text(f"/* plotly.js (cartesian - minified) v{version} */ x")
    assert html.plotly_bundle("auto") == ("cartesian", f"/* plotly.js (cartesian - minified) v{version} */ x")
    (pkg / html.CARTESIAN).write_text("/* plotly.js (cartesian - minified) v0.0.1 */ x")
    assert html.plotly_bundle("auto")[0] == "full"  # another version: never mix
    with pytest.raises(UsageError, match="v?0.0.1"):
        html.plotly_bundle("cartesian")


def test_atlas_joint_fits_equal_one_task_fits(atlas, tmp_path):
    """``joint=True``: the fits run all tasks at once (sitelens.site.fit_site_tasks) and give the
    same α table up to float32 rounding (1e-4: ~1e-7 per pass carried over the steps by Adam, as in
    tests/test_joint_tasks.py; a real change of α moves it by far more)."""
    import glob

    from sitelens.site import SiteAdapter

    model, tasks, data, _, _ = atlas
    joint = build_atlas_data(model, tasks, SMALL, cache_dir=tmp_path, joint=True)
    assert joint.alpha[["task", "layer", "head"]].equals(data.alpha[["task", "layer", "head"]])
    assert np.allclose(joint.alpha.alpha, data.alpha.alpha, rtol=0, atol=1e-4)
    saved = glob.glob(str(tmp_path / "**" / "adapter.json"), recursive=True)
    assert len(saved) == len(tasks)
    assert all(SiteAdapter.load(p.rsplit("/", 1)[0]).meta["joint_tasks"] == len(tasks) for p in saved)


# --- carrying tables across a numerics bump (sitelens.atlas.carry) ---------------------------------


def _as_made_at(data: AtlasData, version: int, **tables) -> AtlasData:
    """The fixture's tables as if made at numerics ``version`` (``tables`` replace its own)."""
    from dataclasses import replace

    return replace(data, summary={**data.summary, "numerics_version": version}, **tables)


def _bump_touching(monkeypatch, *names: str) -> int:
    """A pretend bump from the current version to the next whose rule touches ``names`` only
    (the tables are then "made" at the current version, one below the bumped one)."""
    import sitelens.provenance as prov
    from sitelens.tasks.numerics import NUMERICS_TOUCHES

    monkeypatch.setattr(prov, "NUMERICS_VERSION", prov.NUMERICS_VERSION + 1)
    monkeypatch.setitem(NUMERICS_TOUCHES, prov.NUMERICS_VERSION,
                        lambda model, task, template: task.name in names)
    return prov.NUMERICS_VERSION


def test_carry_measures_again_only_what_the_bump_touched(atlas, tmp_path, monkeypatch):
    """A bump touching ``synonym``: every transfer row with synonym as source or target and its
    lenses and tokens are measured again (and equal the full build's, which ran the same code), the
    other rows are the previous tables' own (marked here with an impossible answer_prob of -1, so
    a carry that measured everything again, or nothing, fails)."""
    from sitelens.atlas.carry import carry_atlas_data

    model, tasks, data, folder, _ = atlas
    version = _bump_touching(monkeypatch, "synonym")
    loaded = AtlasData.load(folder)  # as a carry reads them: from the CSVs
    previous = _as_made_at(loaded, version - 1, transfer=loaded.transfer.assign(answer_prob=-1.0))
    new = carry_atlas_data(model, tasks, previous, SMALL, cache_dir=tmp_path, n_check=1)

    c = new.summary["carried"]
    assert new.summary["numerics_version"] == version and c["from_numerics_version"] == version - 1
    assert c["refitted"] == ["synonym"] and sorted(c["carried"]) == sorted(set(TASKS) - {"synonym"})
    assert len(c["check"]["tasks"]) == 1 and c["check"]["tasks"][0] != "synonym"
    assert c["check"]["max_abs_alpha_difference"] <= c["check"]["tolerance"]
    assert new.tasks == data.tasks and len(new.transfer) == len(data.transfer)
    assert new.transfer.k.dtype == data.transfer.k.dtype  # the CSV keeps "10", never "10.0"
    # the seconds are the cells' own (the ledger's): a carry again from the same cache reports them
    # (every part recorded; on this tiny model a part may round to 0.0 s, so only the sum is > 0)
    secs = new.summary["seconds"]
    assert all(v is not None for v in secs.values()) and sum(secs.values()) > 0
    again = carry_atlas_data(model, tasks, previous, SMALL, cache_dir=tmp_path, n_check=1)
    assert again.summary["seconds"] == new.summary["seconds"]
    key = ["source_task", "target_task", "mode"]
    got = new.transfer.set_index(key).sort_index()
    want = data.transfer.set_index(key).sort_index()
    touched = (got.index.get_level_values(0) == "synonym") | (got.index.get_level_values(1) == "synonym")
    assert (got.answer_prob[~touched] == -1).all()  # carried, not measured
    # measured again: the same code as the full build, in other batches (float32 rounding of the
    # batched products, ~1e-7 on probabilities of this size; accuracy is an argmax of the same)
    assert np.allclose(got.answer_prob[touched], want.answer_prob[touched], rtol=0, atol=1e-5)
    assert (got.accuracy[touched] == want.accuracy[touched]).all()
    # the same tables in the same layout as the full build (row order included: the page and the
    # diffs of committed tables read them so); 1e-4: α through Adam in other batches, as above
    pd.testing.assert_frame_equal(new.alpha, data.alpha, check_dtype=False, atol=1e-4)
    for name in ("lenses", "tokens"):
        pd.testing.assert_frame_equal(getattr(new, name), getattr(data, name), check_dtype=False,
                                      atol=1e-4)


def test_carry_refuses_when_an_untouched_task_moved(atlas, tmp_path, monkeypatch):
    """The rule is checked on the data: previous tables whose untouched α differ from a refit (here
    shifted by 0.01, a hundred times the tolerance) are refused, naming the rule."""
    from sitelens.atlas.carry import carry_atlas_data
    from sitelens.errors import OutputError

    model, tasks, data, _, _ = atlas
    version = _bump_touching(monkeypatch, "synonym")
    shifted = data.alpha.assign(alpha=lambda d: np.where(d.task == "synonym", d.alpha,
                                                         (d.alpha + 0.01).clip(0, 1)))
    previous = _as_made_at(data, version - 1, alpha=shifted)
    with pytest.raises(OutputError, match="NUMERICS_TOUCHES misses a change"):
        carry_atlas_data(model, tasks, previous, SMALL, cache_dir=tmp_path, n_check=1)


def test_carry_refuses_tables_of_another_config_or_none(atlas, tmp_path):
    from dataclasses import replace

    from sitelens.atlas import _carry
    from sitelens.atlas.carry import carry_atlas_data
    from sitelens.errors import OutputError

    model, tasks, data, _, _ = atlas
    with pytest.raises(OutputError, match="made with"):
        carry_atlas_data(model, tasks, data, replace(SMALL, k=3), cache_dir=tmp_path)
    with pytest.raises(OutputError, match="--carry needs the tables"):
        _carry(model, tasks, tmp_path / "nothing", SMALL)


def test_carry_measures_again_the_touched_minimal_rows(atlas, tmp_path, monkeypatch):
    """minimal.csv across the bump: synonym's rows are measured again with the table's own budgets
    and test limit (equal to a fresh build's), the others carried (all marked -1 before) at the new
    version."""
    from dataclasses import replace

    from sitelens.atlas.carry import carry_atlas_data
    from sitelens.atlas.minimal import MinimalConfig, build_minimal

    model, tasks, data, _, cache = atlas
    cfg = MinimalConfig(budgets=(1, 2), test_limit=3)
    made = build_minimal(model, data, tasks, cfg, cache_dir=tmp_path / "m", progress=False)
    version = _bump_touching(monkeypatch, "synonym")
    marked = made.assign(first_token_acc=-1.0)  # every row: a carry that measured nothing fails too
    previous = replace(_as_made_at(data, version - 1), minimal=marked)
    new = carry_atlas_data(model, tasks, previous, SMALL, cache_dir=cache, n_check=1)
    got = new.minimal
    assert list(got.columns) == list(made.columns) and len(got) == len(made)
    assert (got.numerics_version == version).all()
    assert (got.first_token_acc[got.task != "synonym"] == -1).all()  # carried
    syn = got[got.task == "synonym"].reset_index(drop=True)
    want = made[made.task == "synonym"].reset_index(drop=True)
    assert syn.k.tolist() == want.k.tolist() and (syn.n_test <= 3).all()
    assert np.array_equal(syn.first_token_acc, want.first_token_acc)  # the same injected rows
