"""The frontier's stability: selection-only replicates (fit seeds, bootstrap resamples of the
selection items) against the selections of scored frontier cells, and the study's Jaccard tables
against Jaccards computed by hand. Tiny random models; sets are compared exactly (the same seeds
run the same float32 operations in the same order)."""

from __future__ import annotations

from dataclasses import replace

import pandas as pd
import pytest
from bench_util import bench_module
from test_frontier import CFG, _ctx

from sitelens import load_task
from sitelens.lenses.frontier import frontier, frontier_sets, frontier_sets_tasks, resample_selection_items
from sitelens.lenses.selectors import fit_site_counted, select

study = bench_module("frontier_study")  # benchmarks/frontier_study.py
FAST = ("alpha", "alpha-grad", "atp")


@pytest.fixture(scope="module")
def task():
    return load_task("antonym")


def test_selection_only_seed_equals_a_scored_cells_selection(tiny_mha, task):
    scored = frontier(tiny_mha, task, budgets=(1, 2, 5), seeds=[1], selectors=FAST, injections=("alpha1",),
                      config=CFG)
    only = frontier_sets(tiny_mha, task, budgets=(1, 2, 5), seed=1, selectors=FAST, config=CFG)
    assert [s.sets for s in only] == [s.sets for s in scored.selections]
    assert only[0].backward_passes > 0  # alpha's cost is the fit's


def test_bootstrap_replicate_selects_on_the_resampled_items(tiny_mha, task):
    rs = resample_selection_items(task, 3)
    assert len(rs.train) == len(task.train) and rs.test == task.test
    assert rs.train != task.train and set(map(id, rs.train)) <= set(map(id, task.train))  # drawn from it
    assert resample_selection_items(task, 3) == rs  # resample b is the same everywhere
    got = frontier_sets(tiny_mha, task, budgets=(1, 2), seed=0, bootstrap=3, selectors=FAST, config=CFG)
    ctx = _ctx(tiny_mha, rs, CFG, 0)  # independently: fit and select on the resampled task
    assert [s.sets for s in got] == [select(ctx, name, (1, 2)).sets for name in FAST]


# The joint fit's α against the one-task fit's: 1e-5 absolute, the tolerance of
# tests/test_joint_tasks.py (float32 rows summed in another order, carried through Adam's few
# steps); fitting one task on another's items moves α by far more (checked below).
ATOL_JOINT = 1e-5


def test_joint_sets_fit_each_task_as_alone(tiny_mha, task):
    """frontier_sets_tasks on a bootstrap resample: each task's full fit equals its one-task fit on
    the same resampled items (α within ATOL_JOINT; ``alpha``'s S_k, α's top k in order, equal to
    the one-task α's), and its ``alpha`` cost is a share of the joint fit."""
    import torch

    from sitelens.heads import ranking
    from sitelens.lenses.selectors import fit_site_counted_tasks

    tasks = [task, load_task("country_capital")]
    resampled = [resample_selection_items(t, 3) for t in tasks]
    alone = [fit_site_counted(tiny_mha, t, CFG, 0)[0].alpha for t in resampled]
    # the two tasks' α (and an unresampled task's) differ by far more than the tolerance, so a
    # joint fit that gave a task another task's α, or fitted the items before resampling, fails
    assert (alone[0] - alone[1]).abs().max() > 100 * ATOL_JOINT
    assert (fit_site_counted(tiny_mha, task, CFG, 0)[0].alpha - alone[0]).abs().max() > 100 * ATOL_JOINT
    for (ad, cost), a in zip(fit_site_counted_tasks(tiny_mha, resampled, CFG, 0), alone):
        assert torch.allclose(ad.alpha, a, rtol=0, atol=ATOL_JOINT)
        assert cost["joint_tasks"] == 2
    got = frontier_sets_tasks(tiny_mha, tasks, budgets=(1, 2, 5), seed=0, bootstrap=3, selectors=("alpha",),
                              config=CFG)
    for a, (sel,) in zip(alone, got):
        assert sel.sets == {k: ranking(a)[:k] for k in (1, 2, 5)}
        assert sel.meta["fit_joint_tasks"] == 2 and sel.backward_passes > 0


def _main_rows(task, sets):
    return [{"model": "m", "task": task, "selector": "alpha", "k": k, "injection": inj, "heads": h,
             "seed": 0} for k, h in sets.items() for inj in ("alpha1", "refit")]


def _rep(task, replicate, index, sets):
    return [{"key": f"m/{task}/{replicate}{index}", "model": "m", "task": task, "replicate": replicate,
             "index": index, "selector": "alpha", "k": k, "heads": h} for k, h in sets.items()]


def test_stability_table_equals_hand_adjusted_jaccards():
    """The study's stability is the chance-adjusted Jaccard over every seed pair and seed 0 vs each
    resample, worked by hand over N = 9 heads: (J − E) / (1 − E) per pair, E the expected Jaccard
    of two random k-sets (k = 1: 1/9; k = 2: overlap 0, 1, 2 with probability 21/36, 14/36, 1/36,
    so E = 14/36 · 1/3 + 1/36 = 17/108)."""
    df = pd.DataFrame(_main_rows("t", {1: "L0H0", 2: "L0H0;L0H1"}))
    sets = pd.DataFrame(_rep("t", "seed", 1, {1: "L0H1", 2: "L0H0;L0H1"})
                        + _rep("t", "seed", 2, {1: "L0H0", 2: "L0H0;L1H0"})
                        + _rep("t", "bootstrap", 0, {1: "L0H0", 2: "L1H1;L1H0"})
                        + _rep("t", "bootstrap", 1, {1: "L2H2", 2: "L0H1;L1H0"}))
    st = study.stability_table(df, sets, n_total=lambda m: 9).set_index("k")
    # k = 1: seed pairs 0, 1, 0 and seed 0 vs the resamples 1, 0: raw 2/5; adjusted 1 for J = 1,
    # (0 − 1/9) / (8/9) = −1/8 for J = 0: (2 − 3/8) / 5 = 13/40
    assert st.loc[1, "raw_jaccard"] == pytest.approx(2 / 5, abs=1e-12)
    assert st.loc[1, "stability"] == pytest.approx(13 / 40, abs=1e-12)
    # k = 2: seed pairs 1, 1/3, 1/3, resamples 0, 1/3: adjusted 1, 19/91 (three), −17/91: 131/455
    assert st.loc[2, "stability"] == pytest.approx(131 / 455, abs=1e-12)
    assert (st.n_pairs == 5).all() and (st.seeds == 3).all() and (st.bootstraps == 2).all()
    ks = pd.DataFrame([{"model": "m", "task": "t", "selector": "alpha", "injection": "alpha1", "k_star": 1},
                       {"model": "m", "task": "t", "selector": "alpha", "injection": "refit", "k_star": 2}])
    marked = study.mark_unstable(ks, st.reset_index())
    assert list(marked.k_star_marked) == ["1 (unstable)", "2 (unstable)"]  # 0.325 and 0.288 < 0.5
    stable = sets.assign(heads=sets.k.map({1: "L0H0", 2: "L0H0;L0H1"}))
    st2 = study.stability_table(df, stable, n_total=lambda m: 9)
    assert list(study.mark_unstable(ks, st2).k_star_marked) == ["1", "2"]


def test_study_stability_cells_run_resume_and_report(tmp_path, monkeypatch):
    import sitelens.lenses.frontier as F
    from sitelens.pipelines.experiment import main

    argv = ["--tiny", "--budgets", "1,2", "--out", str(tmp_path), "--threads", "0",
            "--stability-seeds", "1", "--n-bootstrap", "1"]
    assert main(study.FrontierStudy(), argv) == 0
    sets = pd.read_csv(tmp_path / "frontier_study_sets.csv")
    assert set(sets.key) == {"tiny-random/antonym/select-seed1", "tiny-random/antonym/select-boot0"}
    assert len(sets) == 2 * 7 * 2  # replicates × selectors × budgets
    first = (tmp_path / "frontier_study_sets.csv").read_text()
    monkeypatch.setattr(F, "frontier_sets", lambda *a, **k: pytest.fail("a done replicate was recomputed"))
    monkeypatch.setattr(F, "frontier", lambda *a, **k: pytest.fail("a done cell was recomputed"))
    assert main(study.FrontierStudy(), argv) == 0
    assert (tmp_path / "frontier_study_sets.csv").read_text() == first
    md = (tmp_path / "frontier_study.md").read_text()
    per_sel = md[md.index("Per model and selector"):md.index("Per task (mean over budgets)")]
    row = next(s for s in per_sel.splitlines() if s.startswith("| tiny-random | alpha |"))
    header = next(s for s in per_sel.splitlines() if s.startswith("| model | selector |"))
    cells = dict(zip([c.strip() for c in header.strip("|").split("|")],
                     [c.strip() for c in row.strip("|").split("|")]))
    assert cells["stability"] != "nan" and cells["raw_jaccard"] != "nan"  # measured
    # two seed sets (the scored cell's and one replicate) and one resample: 2 pairs per value
    assert (cells["seeds"], cells["bootstraps"], cells["pairs_per_value"]) == ("2", "1", "2.0")


def test_study_joint_cells_fit_together_resume_and_keep_old_rows(tmp_path, monkeypatch):
    """``--joint``: the stability cells of one replicate (here 2 tasks × seed 1, and 2 tasks ×
    resample 0) share one joint fit each (``joint_tasks`` = 2 on their rows); a sets table written
    before the column existed is read and kept (its rows' ``joint_tasks`` blank); a rerun fits
    nothing."""
    import sitelens.lenses.frontier as S  # where joint_full_fits finds fit_site_counted_tasks
    from sitelens.pipelines.experiment import main

    old = pd.DataFrame([{"key": "m/t/select-seed9", "model": "m", "task": "t", "replicate": "seed",
                         "index": 9, "selector": "alpha", "k": 1, "heads": "L0H0", "forward_passes": 1,
                         "backward_passes": 1, "seconds": 0.1}])
    old.to_csv(tmp_path / "frontier_study_sets.csv", index=False)
    assert list(old.columns) == study.OLDER_SET_COLUMNS[0]
    calls = []
    real = S.fit_site_counted_tasks
    monkeypatch.setattr(S, "fit_site_counted_tasks", lambda m, tasks, *a, **k: calls.append(
        [t.name for t in tasks]) or real(m, tasks, *a, **k))
    argv = ["--tiny", "--tasks", "antonym,country_capital", "--seeds", "0", "--budgets", "1,2", "--out",
            str(tmp_path), "--threads", "0", "--stability-seeds", "1", "--n-bootstrap", "1", "--joint"]
    assert main(study.FrontierStudy(), argv) == 0
    assert calls == [["antonym", "country_capital"]] * 2  # one joint fit per replicate
    sets = pd.read_csv(tmp_path / "frontier_study_sets.csv")
    assert list(sets.columns) == study.SET_COLUMNS
    new = sets[sets.key != "m/t/select-seed9"]
    assert set(new.key) == {f"tiny-random/{t}/select-{r}" for t in ("antonym", "country_capital")
                            for r in ("seed1", "boot0")}
    assert (new.joint_tasks == 2).all() and sets[sets.key == "m/t/select-seed9"].joint_tasks.isna().all()
    first = (tmp_path / "frontier_study_sets.csv").read_text()
    monkeypatch.setattr(S, "fit_site_counted_tasks", lambda *a, **k: pytest.fail("a done group was refitted"))
    assert main(study.FrontierStudy(), argv) == 0
    assert (tmp_path / "frontier_study_sets.csv").read_text() == first


def test_config_bootstrap_in_frontier_uses_the_same_replicates(tiny_mha, task):
    cfg = replace(CFG, n_bootstrap=1)
    res = frontier(tiny_mha, task, budgets=(1, 2), seeds=[0], selectors=("alpha",), injections=("alpha1",),
                   config=cfg)
    rep = frontier_sets(tiny_mha, task, budgets=(1, 2), seed=0, bootstrap=0, selectors=("alpha",), config=CFG)
    from sitelens.stats import jaccard

    want = {k: jaccard(set(res.selections[0].sets[k]), set(rep[0].sets[k])) for k in (1, 2)}
    got = res.summary["selectors"]["alpha"]["jaccard_bootstrap"]
    assert {int(k): v for k, v in got.items()} == pytest.approx(want)


def test_overlap_table_equals_hand_jaccards():

    def row(task, sel, heads, seed=0, k=10, inj="alpha1"):
        return {"model": "m", "task": task, "selector": sel, "k": k, "injection": inj, "heads": heads,
                "seed": seed}

    df = pd.DataFrame([row("t1", "a", "L0H0;L0H1"), row("t1", "b", "L0H1;L0H2"),
                       row("t2", "a", "L1H0"), row("t2", "b", "L1H0"),
                       row("t1", "a", "L9H9", seed=1), row("t1", "b", "L5H5", inj="refit"),
                       row("t1", "c", "")])  # another seed, injection or no set: not counted
    o = study.overlap_table(df, "m", k=10).set_index("selector")
    assert o.loc["a", "b"] == o.loc["b", "a"] == pytest.approx((1 / 3 + 1) / 2, abs=0.005)  # rounded to 0.01
    assert o.loc["a", "a"] == 1.0 and pd.isna(o.loc["a", "c"])
