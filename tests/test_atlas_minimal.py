"""The atlas's minimal sets (sitelens.atlas.minimal, ``minimal.csv``) on a tiny random model: the
rows against an independent computation (full patched forward passes, no prefix cache, no batched
rows), resuming, skipped tasks, the fingerprint check, the payload's lookups, the widget, and the
script's bad input. The page's k* panel is drawn in Chromium by tests/test_browser_atlas.py."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import torch

from sitelens.atlas import AtlasConfig, AtlasData, build_atlas_data, head_card, payload
from sitelens.atlas import minimal as MIN
from sitelens.atlas.minimal import MinimalConfig, build_minimal, k_star_table, selector_scores
from sitelens.atlas.views import head_minimal, minimal_set, minimal_view
from sitelens.errors import OutputError
from sitelens.lenses.frontier import k_star
from sitelens.models import has_hooked_transformer
from sitelens.patching import patched_last_logits
from sitelens.site import task_embedding
from sitelens.stats import wilson_interval
from sitelens.tasks import Example, Task, Template, answer_token_ids, load_task, zero_shot_prompt
from sitelens.testing import tiny_model

if not has_hooked_transformer():  # the atlas's DLA and promoted tokens read W_O / W_U / the norms
    pytest.skip("the atlas needs a HookedTransformer (TransformerLens 3.x) for DLA and the "
                "per-head logit lens", allow_module_level=True)

BARE = Template(answer_prefix="")  # the byte tokenizer's first answer token is then the answer's first byte
SMALL = AtlasConfig(n_examples=16, n_prompts=4, n_shots=2, transfer_limit=5, n_perm=20)
CFG = MinimalConfig(budgets=(1, 2, 8), test_limit=12, template=BARE)


def _planted(model, task: Task, alpha: np.ndarray, emb) -> Task:
    """``task`` with its test answers set to what the model predicts with α = 1 on the top-1 α head
    (even items) or with no injection (odd items), so the conditions' accuracies differ."""
    L, H = alpha.shape
    top = torch.zeros(L * H)
    top[int(np.argmax(alpha.ravel()))] = 1.0
    items = task.test[: CFG.test_limit]
    prompts = [zero_shot_prompt(ex.input, BARE) for ex in items]
    inj = patched_last_logits(model, prompts, top.reshape(L, H), emb).argmax(-1)
    zs = patched_last_logits(model, prompts).argmax(-1)
    test = []
    for i, ex in enumerate(items):
        tok = int(inj[i] if i % 2 == 0 else zs[i])
        out = model.tokenizer.decode([tok])
        if out and answer_token_ids(model, [out], BARE) == [tok]:
            test.append(Example(ex.input, out))
    return replace(task, test=test)


@pytest.fixture(scope="module")
def atlas(tmp_path_factory):
    model = tiny_model(n_layers=2, n_heads=4, d_head=8, seed=0, backend="hooked")
    tasks = [load_task(t) for t in ("antonym", "synonym", "present_past")]
    data = build_atlas_data(model, tasks, SMALL, cache_dir=tmp_path_factory.mktemp("cache"))
    emb = task_embedding(model, tasks[0], n_prompts=SMALL.n_prompts, n_shots=SMALL.n_shots, seed=0,
                         template=BARE)
    tasks[0] = _planted(model, tasks[0], data.alpha_map("antonym"), emb)
    return model, tasks, data


@pytest.fixture(scope="module")
def rows(atlas, tmp_path_factory):
    model, tasks, data = atlas
    return build_minimal(model, data, tasks, CFG, cache_dir=tmp_path_factory.mktemp("mcache"),
                         progress=False)


def check_against_reference(model, task: Task, data: AtlasData, rows: pd.DataFrame) -> None:
    """Each row's set is the stable top-k of the stored scores, and its accuracy, interval, full
    SITE and zero-shot equal one full patched forward pass per condition on every test prompt."""
    L, H = data.n_layers, data.n_heads
    emb = task_embedding(model, task, n_prompts=SMALL.n_prompts, n_shots=SMALL.n_shots, seed=0,
                         template=BARE)
    items = task.test[: CFG.test_limit]
    prompts = [zero_shot_prompt(ex.input, BARE) for ex in items]
    ans = torch.tensor(answer_token_ids(model, [ex.output for ex in items], BARE))

    def acc(weights) -> tuple[float, int]:
        logits = patched_last_logits(model, prompts, weights, emb, use_cache=False)
        hits = int((logits.argmax(-1) == ans).sum())
        return hits / len(prompts), hits

    mine = rows[rows.task == task.name]
    full, _ = acc(torch.tensor(data.alpha_map(task.name), dtype=torch.float32))
    zero, _ = acc(torch.zeros(L, H))
    # exact: the same argmax decisions, counted over the same items (a ratio of small integers)
    assert mine.full_site.tolist() == [np.round(full, 4)] * len(mine)
    assert mine.zero_shot.tolist() == [np.round(zero, 4)] * len(mine)
    for sel, g in mine.groupby("selector"):
        s = selector_scores(data, task.name, sel)
        order = sorted(range(L * H), key=lambda j: (-s[j], j))  # highest first, ties by index
        for r in g.itertuples():
            heads = order[: r.k]
            assert r.heads == ";".join(f"L{j // H}H{j % H}" for j in heads)
            w = torch.zeros(L * H)
            w[heads] = 1.0
            a, hits = acc(w.reshape(L, H))
            lo, hi = wilson_interval(hits, len(prompts))
            assert (r.first_token_acc, r.ci_low, r.ci_high) == tuple(np.round([a, lo, hi], 4))
        want = k_star(g.k.tolist(), g.first_token_acc.tolist(), g.full_site.iloc[0])
        assert set(g.k_star.astype(str)) == {str(want)}


def test_rows_equal_an_independent_patched_forward(atlas, rows):
    model, tasks, data = atlas
    assert list(rows.columns) == MIN.COLUMNS
    assert len(rows) == 3 * 3 * 3  # task × selector × k
    planted = rows[rows.task == tasks[0].name]
    assert planted.first_token_acc.nunique() > 1  # the planted answers make the check non-trivial
    for task in tasks:
        check_against_reference(model, task, data, rows)
    assert set(rows.fingerprint) == {data.summary["fingerprint"]}
    assert set(rows.numerics_version) == {data.summary["numerics_version"]}


def test_mutation_the_wrong_top_k_is_caught(atlas, monkeypatch, tmp_path):
    """A selector ranking backwards (the lowest scores first) fails the reference check."""
    model, tasks, data = atlas
    monkeypatch.setattr(MIN, "ranking", lambda scores: np.argsort(scores, kind="stable").tolist())
    bad = build_minimal(model, data, tasks[:1], CFG, cache_dir=tmp_path, progress=False)
    with pytest.raises(AssertionError):
        check_against_reference(model, tasks[0], data, bad)


def test_resumes_from_its_cells_and_skips_what_cannot_split(atlas, tmp_path, monkeypatch):
    model, tasks, data = atlas
    tiny = replace(tasks[1], test=tasks[1].test[:1])  # one test item: too small to split
    first = build_minimal(model, data, [tasks[0], tiny], CFG, cache_dir=tmp_path, progress=False)
    skipped = first[first.skipped != ""]
    assert skipped.task.tolist() == [tiny.name] and "too small to split" in skipped.skipped.item()
    assert k_star_table(first).set_index("task").loc[tiny.name, "skipped"] == skipped.skipped.item()

    def boom(*a, **k):
        raise AssertionError("recomputed a cached task")

    monkeypatch.setattr(MIN, "task_rows", boom)
    again = build_minimal(model, data, [tasks[0], tiny], CFG, cache_dir=tmp_path, progress=False)
    pd.testing.assert_frame_equal(first, again)


def test_refuses_other_weights(atlas, tmp_path):
    _, tasks, data = atlas
    other = tiny_model(n_layers=2, n_heads=4, d_head=8, seed=1, backend="hooked")
    with pytest.raises(OutputError, match="fingerprint"):
        build_minimal(other, data, tasks, CFG, cache_dir=tmp_path, progress=False)


def test_saved_tables_load_only_when_current_and_feed_the_views(atlas, rows, tmp_path):
    _, tasks, data = atlas
    folder = replace(data, minimal=rows).save(tmp_path / "cur" / data.model)
    back = AtlasData.load(folder)
    assert back.minimal is not None and back.minimal_note == ""
    p = payload([back])
    m = p["models"][data.model]
    per = m["minimal"]["tasks"]
    assert sorted(per) == sorted(t.name for t in tasks)
    for t in per:
        for sel, ks in per[t]["k_star"].items():
            g = rows[(rows.task == t) & (rows.selector == sel)]
            assert str(ks) == str(g.k_star.iloc[0])
            hit = g[g.k.astype(str) == str(ks)]
            want = hit.heads.iloc[0].split(";") if len(hit) else []
            assert [f"L{a}H{b}" for a, b in minimal_set(p, data.model, t, sel)] == want
    # the head card: every head, brute force over the tasks' sets
    for i in range(data.n_layers * data.n_heads):
        layer, head = divmod(i, data.n_heads)
        hm = head_minimal(p, data.model, layer, head)
        assert head_card(p, data.model, tasks[0].name, layer, head)["minimal"] == hm
        for sel in ("alpha", "alpha-grad", "atp"):
            assert hm[sel] == [t for t in m["order"] if f"L{layer}H{head}" in
                               [f"L{a}H{b}" for a, b in minimal_set(p, data.model, t, sel)]]
    v = minimal_view(p, data.model)
    assert v["selectors"] == ["alpha", "alpha-grad", "atp"] and v["note"] == ""
    assert all(isinstance(z, int) or z is None for row in v["z"] for z in row)
    # absent, then stale (other weights' fingerprint): no table, a note saying why, no crash
    plain = data.save(tmp_path / "old" / data.model)
    old = AtlasData.load(plain)
    assert old.minimal is None and "minimal.csv" in old.minimal_note
    assert minimal_view(payload([old]), data.model)["note"] == old.minimal_note
    assert head_card(payload([old]), data.model, tasks[0].name, 0, 0)["minimal"] == {}
    stale = rows.assign(fingerprint="0000")
    folder = replace(data, minimal=stale).save(tmp_path / "stale" / data.model)
    s = AtlasData.load(folder)
    assert s.minimal is None and "stale" in s.minimal_note


def test_explorer_shows_the_minimal_sets(atlas, rows):
    pytest.importorskip("ipywidgets")
    pytest.importorskip("anywidget")
    from sitelens.atlas.widget import Explorer

    _, tasks, data = atlas
    p = payload([replace(data, minimal=rows)])
    ex = Explorer(p)
    ex.set_task(tasks[0].name)
    ms = minimal_set(p, data.model, tasks[0].name, "alpha")
    layer, head = ms[0] if ms else (0, 0)
    card = ex.select_head(layer, head)
    assert card["minimal"] == head_minimal(p, data.model, layer, head)
    assert 'data-selector="alpha"' in ex.card.value
    v = minimal_view(p, data.model)
    assert list(ex.fig_minimal.data[0].y) == v["tasks"]
    assert [list(r) for r in ex.fig_minimal.data[0].z] == v["z"]
    assert [list(r) for r in ex.fig_minimal.data[1].z] == [[1 if z is None else None for z in row]
                                                           for row in v["z"]]  # grey: not reached
    marks = [d for d in ex.fig_task.data if d.type == "scatter"]
    assert (len(marks) == 1) == bool(ms)
    if ms:
        assert list(zip(marks[0].y, marks[0].x)) == [tuple(x) for x in ms]
    bare = Explorer(payload([data]))  # no minimal sets: the note, no heatmap
    assert "minimal.csv" in bare.minimal_note.value and not bare.fig_minimal.data


def test_script_bad_input_exits_2_before_loading(atlas, tmp_path, capsys, monkeypatch):
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "atlas_minimal", Path(__file__).parent.parent / "scripts" / "atlas_minimal.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    _, _, data = atlas
    data.save(tmp_path / "data" / data.model)

    def no_load(*a, **k):
        raise AssertionError("a model loaded")

    monkeypatch.setattr("sitelens.models.load_model", no_load)
    base = ["--data", str(tmp_path / "data"), "--models", data.model, "--out-dir", str(tmp_path / "o")]
    for extra in (["--tasks", "antonymm"], ["--models", "nope"], ["--budgets", "1,x"],
                  ["--tasks-dir", str(tmp_path / "none")]):
        assert script.main(base + extra) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("atlas_minimal: error: ") and "\n" not in err, err
    assert not (tmp_path / "o").exists()
