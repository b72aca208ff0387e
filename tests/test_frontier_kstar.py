"""The frontier's answer (:func:`sitelens.lenses.frontier._summary`): k* chosen on valid and
reported on test, no k* where full SITE does not beat zero-shot, stability as the chance-adjusted
Jaccard at k* (null where not measured). Constructed per-item scores give cases whose answer is
known by hand; one tiny random model checks the mark end to end.

Tolerances: ``pytest.approx`` defaults (relative 1e-6) where a summary figure is a mean of a few
exact fractions computed in float64 by another route."""

from __future__ import annotations

import json
from itertools import combinations

import numpy as np
import pandas as pd
import pytest

from sitelens import load_task
from sitelens.lenses.frontier import (
    SITE_NOT_ABOVE_ZERO_SHOT,
    UNSTABLE_BELOW,
    FrontierResult,
    _summary,
    frontier,
)
from sitelens.lenses.selectors import Selection
from sitelens.stats import wilson_interval

BUDGETS = (1, 2, 5)
N_HEADS = 8  # a 2-layer, 4-head model


def _case(test_by_k, valid_by_k, *, full=(1.0, 1.0), zero=(0.0, 0.0), n=20, sets=None, boot=(),
          seeds=(0,)):
    """Summary inputs of one selector (``alpha``, injection ``alpha1``): per-item correctness
    with the given accuracy per budget (the first items right), full SITE's and zero-shot's
    (test, valid) accuracies, and the sets per seed (default: the first k heads, every seed)."""
    def items(acc):
        return (np.arange(n) < round(acc * n)).astype(float)

    scores, rows, selections = {}, [], []
    for s in seeds:
        test = np.stack([items(zero[0]), items(full[0]), *(items(test_by_k[k]) for k in BUDGETS)])
        valid = np.stack([items(zero[1]), items(full[1]), *(items(valid_by_k[k]) for k in BUDGETS)])
        scores[s] = {"test": test, "valid": valid}
        for i, k in enumerate(BUDGETS):
            rows.append({"selector": "alpha", "k": k, "injection": "alpha1", "cond": 2 + i, "seed": s,
                         "first_token_acc": test[2 + i].mean(), "full_site": test[1].mean(),
                         "zero_shot": test[0].mean(), "full_site_valid": valid[1].mean(),
                         "zero_shot_valid": valid[0].mean(), "full_site_exact_match": np.nan,
                         "zero_shot_exact_match": np.nan, "n_test": n, "n_valid": n,
                         "forward_passes": 0, "backward_passes": 0, "seconds": 0.0})
        got = (sets or {}).get(s, {k: list(range(k)) for k in BUDGETS})
        selections.append(Selection("alpha", s, got))
    boot = {"alpha": list(boot)}
    return _summary(pd.DataFrame(rows), selections, boot, BUDGETS, scores, N_HEADS)


def test_k_star_is_chosen_on_valid_and_reported_on_test():
    # on test k = 1 already reaches 90% of full SITE; on valid only k = 2 does
    s = _case({1: 0.95, 2: 0.6, 5: 1.0}, {1: 0.5, 2: 0.95, 5: 1.0})
    a = s["selectors"]["alpha"]["at_k_star"]["alpha1"]
    assert s["status"] == "ok" and s["selectors"]["alpha"]["k_star"] == {"alpha1": 2}
    assert a["k_star"] == 2 and a["valid_acc"] == pytest.approx(0.95)
    assert a["test_acc"] == pytest.approx(0.6)  # the test accuracy AT the valid k*, not the best
    assert a["test_ci"] == pytest.approx(list(wilson_interval(12, 20)))
    lo, hi = a["k_star_interval"]
    assert lo in BUDGETS and hi in BUDGETS and lo <= 2 <= hi


def test_k_star_not_reached_on_valid_says_so():
    s = _case({1: 1.0, 2: 1.0, 5: 1.0}, {1: 0.1, 2: 0.2, 5: 0.3})
    a = s["selectors"]["alpha"]["at_k_star"]["alpha1"]
    assert a["k_star"] == "not reached" and a["stability"] is None and a["unstable"] is None


@pytest.mark.parametrize("full, zero, marked", [
    ((0.6, 0.6), (0.5, 0.5), True),  # ahead by 0.1 over 20 items: the interval reaches 0
    ((1.0, 1.0), (1.0, 1.0), True),  # both perfect: nothing to carry
    ((0.0, 0.0), (0.0, 0.0), True),  # a random model
    ((0.9, 0.9), (0.1, 0.1), False),
])
def test_site_not_above_zero_shot_gets_no_k_star(full, zero, marked):
    s = _case({1: 1.0, 2: 1.0, 5: 1.0}, {1: 1.0, 2: 1.0, 5: 1.0}, full=full, zero=zero)
    g = s["full_site_minus_zero_shot"]
    assert g["over"] == "items" and g["n"] == 20
    assert g["diff"] == pytest.approx(full[0] - zero[0], abs=1e-12)
    k = s["selectors"]["alpha"]["k_star"]["alpha1"]
    if marked:
        assert s["status"] == SITE_NOT_ABOVE_ZERO_SHOT and k is None and g["ci_low"] <= 0
    else:
        assert s["status"] == "ok" and k == 1 and g["ci_low"] > 0


def _expected_jaccard_by_enumeration(k: int, n: int) -> float:
    """E[J] of two random k-sets of n: every pair of k-sets, counted."""
    sets = [set(c) for c in combinations(range(n), k)]
    return float(np.mean([len(a & b) / len(a | b) for a in sets for b in sets]))


def test_stability_is_chance_adjusted_at_k_star_only():
    # k* = 5 (valid). S_5 differs between the seeds by one head: raw Jaccard 4/6 = 0.67 looks
    # stable, but two random 5-sets of 8 heads already share 0.47, so the adjusted index is 0.37.
    # S_1 and S_2 are identical over the seeds (adjusted 1): a mean over k would read stable.
    sets = {0: {1: [0], 2: [0, 1], 5: [0, 1, 2, 3, 4]}, 1: {1: [0], 2: [0, 1], 5: [0, 1, 2, 3, 5]}}
    s = _case({1: 0.0, 2: 0.0, 5: 1.0}, {1: 0.0, 2: 0.0, 5: 1.0}, sets=sets, seeds=(0, 1))
    sel = s["selectors"]["alpha"]
    a = sel["at_k_star"]["alpha1"]
    e = _expected_jaccard_by_enumeration(5, N_HEADS)
    assert a["k_star"] == 5
    assert a["stability"] == pytest.approx((4 / 6 - e) / (1 - e))
    assert a["raw_jaccard"] == pytest.approx(4 / 6) and a["chance_jaccard"] == pytest.approx(e)
    assert a["stability"] < UNSTABLE_BELOW < a["raw_jaccard"]  # the raw index would call it stable
    assert a["unstable"] is True and a["n_pairs"] == 1
    assert sel["stability_by_k"][1]["stability"] == pytest.approx(1.0)  # at k = 1: not the one printed


def test_stability_spread_over_seeds_and_resamples():
    sets = {0: {k: list(range(k)) for k in BUDGETS}, 1: {k: list(range(k)) for k in BUDGETS},
            2: {1: [0], 2: [0, 1], 5: [3, 4, 5, 6, 7]}}
    boot = [{1: [0], 2: [0, 1], 5: [0, 1, 2, 3, 4]}]
    s = _case({1: 0.0, 2: 0.0, 5: 1.0}, {1: 0.0, 2: 0.0, 5: 1.0}, sets=sets, seeds=(0, 1, 2), boot=boot)
    a = s["selectors"]["alpha"]["at_k_star"]["alpha1"]
    e = _expected_jaccard_by_enumeration(5, N_HEADS)
    # pairs: seeds (0,1) J = 1, (0,2) and (1,2) J = 2/8, and resample vs seed 0: J = 1
    adj = [(j - e) / (1 - e) for j in (1.0, 2 / 8, 2 / 8, 1.0)]
    assert a["n_pairs"] == 4
    assert a["stability"] == pytest.approx(np.mean(adj))
    assert a["stability_sd"] == pytest.approx(np.std(adj, ddof=1))


def test_stability_not_measured_is_null_not_false(tmp_path):
    s = _case({1: 1.0, 2: 1.0, 5: 1.0}, {1: 1.0, 2: 1.0, 5: 1.0})  # one seed, no resample
    a = s["selectors"]["alpha"]["at_k_star"]["alpha1"]
    assert a["k_star"] == 1 and a["stability"] is None and a["unstable"] is None
    _, js = FrontierResult(pd.DataFrame({"x": [1]}), s).to_dir(tmp_path)
    written = json.loads(js.read_text())["selectors"]["alpha"]["at_k_star"]["alpha1"]
    assert written["stability"] is None and written["unstable"] is None


def test_cli_table_prints_the_figures_at_k_star(capsys):
    from sitelens.cli.frontier import _print_summary

    sets = {0: {1: [0], 2: [0, 1], 5: [0, 1, 2, 3, 4]}, 1: {1: [0], 2: [0, 1], 5: [0, 1, 2, 3, 5]}}
    s = _case({1: 0.0, 2: 0.0, 5: 0.85}, {1: 0.0, 2: 0.0, 5: 1.0}, sets=sets, seeds=(0, 1))
    _print_summary(s, "m", "t")
    out = capsys.readouterr().out
    a = s["selectors"]["alpha"]["at_k_star"]["alpha1"]
    lo, hi = a["test_ci"]
    assert f"{a['stability']:.2f} (n = 1)" in out and "1.00" not in out.split("\n", 2)[2]
    assert f"0.850 [{lo:.3f}, {hi:.3f}]" in out and "unstable" in out


def test_random_tiny_model_where_site_does_not_beat_zero_shot_gets_no_k_star(tiny_mha, capsys):
    from test_frontier import CFG

    from sitelens.cli.frontier import _print_summary

    res = frontier(tiny_mha, load_task("antonym"), budgets=(1, 2), selectors=("alpha",),
                   injections=("alpha1",), config=CFG)
    s = res.summary
    assert s["full_site"] == s["zero_shot"] == 0.0  # a random model gets none of the antonyms
    assert s["status"] == SITE_NOT_ABOVE_ZERO_SHOT
    assert s["selectors"]["alpha"]["k_star"] == {"alpha1": None}
    a = s["selectors"]["alpha"]["at_k_star"]["alpha1"]
    assert a["stability"] is None and a["unstable"] is None
    t = res.table
    assert ((t.valid_acc >= 0) & (t.valid_acc <= 1)).all()
    assert (t.full_site_valid == s["full_site_valid"]).all()
    _print_summary(s, "m", "antonym")
    assert "no k*" in capsys.readouterr().out
