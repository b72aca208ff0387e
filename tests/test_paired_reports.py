"""The reports' paired comparisons: A − B per unit, never B − A, and the numbers of a hand-made
table. Flipping the sign of a report's difference, or pairing the wrong rows, fails here."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from bench_util import bench_module


def _bench_table(acc: dict[str, list[float]]) -> pd.DataFrame:
    tasks = [f"t{i}" for i in range(len(next(iter(acc.values()))))]
    return pd.DataFrame([{"model": "m", "task": t, "method": m, "exact_match": a, "label_acc_full": a}
                         for m, xs in acc.items() for t, a in zip(tasks, xs)])


def test_paired_rows_is_a_minus_b_over_tasks():
    from lib.paired import paired_rows

    df = _bench_table({"site": [0.9, 0.5, 0.7, 0.6], "icl": [0.5, 0.4, 0.7, 0.2]})
    r = paired_rows(df, [("site", "icl")]).iloc[0]
    # per-task differences 0.4, 0.1, 0.0, 0.4: mean 0.225, site ahead on 3, icl on none
    assert r["diff"] == pytest.approx(0.225, abs=1e-12)  # a mean of 4 exact decimals: rounding only
    assert (r.a_ahead, r.b_ahead, r.n) == (3, 0, 4)
    assert 0.0 <= r.ci_low <= r["diff"] <= r.ci_high <= 0.4  # inside the range of the differences
    flipped = paired_rows(df, [("icl", "site")]).iloc[0]
    assert flipped["diff"] == pytest.approx(-0.225, abs=1e-12)
    assert (flipped.a_ahead, flipped.b_ahead) == (0, 3)


def test_cls_report_compares_ltv_valid_with_every_other_method():
    cls = bench_module("cls_report")
    df = _bench_table({"ltv-valid": [0.6, 0.5, 0.4], "icl": [0.4, 0.5, 0.1], "tv": [0.7, 0.6, 0.5]})
    table = cls.paired_table(df, "label_acc_full").set_index("A − B")
    # ltv-valid − icl: 0.2, 0.0, 0.3 -> +16.7 points; ltv-valid − tv: −0.1 each -> −10.0
    assert table.loc["ltv-valid − icl", "diff"] == pytest.approx(16.7, abs=0.05)  # rounded to 0.1
    assert table.loc["ltv-valid − tv", "diff"] == pytest.approx(-10.0, abs=0.05)
    assert table.loc["ltv-valid − tv", "A ahead / B ahead"] == "0 / 3"


def test_heads_paired_topk_is_each_lens_minus_alphas_top_k():
    heads = bench_module("heads")
    rows = []
    for task, (alpha_seeds, effect, site) in {"a": ((0.1, 0.3), 0.5, 0.9),
                                              "b": ((0.0, 0.0), 0.2, 0.8)}.items():
        for seed, acc in enumerate(alpha_seeds):  # α's top-k: the mean over its fit seeds
            rows.append({"task": task, "k": 10, "selection": "top", "accuracy": acc,
                         "kind": "alpha_fit", "schedule": "default", "fit_seed": seed, "lens": "alpha"})
        rows.append({"task": task, "k": 270, "selection": "site", "accuracy": site, "kind": "alpha_fit",
                     "schedule": "default", "fit_seed": 0, "lens": "alpha"})
        rows.append({"task": task, "k": 10, "selection": "top", "accuracy": effect, "kind": "lens_topk",
                     "schedule": "", "fit_seed": np.nan, "lens": "effect"})
    units = {("m", t): {"intra": g.assign(model="m")} for t, g in pd.DataFrame(rows).groupby("task")}
    p = heads.paired_topk(units, 10).set_index("a")
    # effect − α top-10: task a 0.5 − 0.2 = 0.3, task b 0.2 − 0.0 = 0.2 -> 0.25
    assert p.loc["effect top-10", "diff"] == pytest.approx(0.25, abs=1e-12)
    assert p.loc["effect top-10", "b"] == "alpha top-10"
    # full α − α top-10: 0.9 − 0.2 and 0.8 − 0.0 -> 0.75, ahead on both tasks
    assert p.loc["full α (site)", "diff"] == pytest.approx(0.75, abs=1e-12)
    assert (p.loc["full α (site)", "a_ahead"], p.loc["full α (site)", "n"]) == (2, 2)


def test_cross_model_pairs_items_and_tests_them_exactly():
    xm = bench_module("cross_model")
    correct = {"tv-transfer-valid": [1, 1, 1, 0, 1], "zero-shot": [0, 0, 1, 0, 0]}
    df = pd.DataFrame([{"collection": "fv", "model": xm.DST, "key": m, "method": m} for m in correct])
    items = pd.DataFrame([{"key": m, "task": "t", "item": i, "correct": c, "label_correct": c}
                          for m, cs in correct.items() for i, c in enumerate(cs)])
    r = xm.paired_items(df, items).iloc[0]
    assert (r.a, r.b, r.n) == ("tv-transfer-valid", "zero-shot", 5)
    assert r["diff"] == pytest.approx(0.6, abs=1e-12)  # 3 of 5 items gained, none lost
    # McNemar: 3 discordant items all for A: two-sided exact p = 2 · (1/2)^3 = 0.25
    assert (r.only_a, r.only_b) == (3, 0) and r.p_mcnemar == pytest.approx(0.25, abs=1e-12)
    assert r.p_holm == pytest.approx(0.25, abs=1e-12)  # one comparison: Holm changes nothing


def test_figures_gap_is_top_minus_bottom_paired_over_tasks():
    from sitelens.patching.analysis import paired_gaps

    gaps = pd.DataFrame([
        {"sparsity": 5.0, "task": "a", "k": 10, "top": 0.9, "bottom": 0.1},
        {"sparsity": 5.0, "task": "b", "k": 10, "top": 0.2, "bottom": 0.4},
        {"sparsity": 5.0, "task": "mean", "k": 10, "top": 0.55, "bottom": 0.25},  # not a task
    ])
    r = paired_gaps(gaps).iloc[0]
    # per task 0.8 and −0.2: mean 0.3, top ahead on one task, bottom on the other; n counts tasks only
    assert r["diff"] == pytest.approx(0.3, abs=1e-12)
    assert (r.n, r.top_ahead, r.bottom_ahead) == (2, 1, 1)
    assert r.ci_low == pytest.approx(-0.2, abs=1e-12) and r.ci_high == pytest.approx(0.8, abs=1e-12)
