"""The frontier on a bundled model (SmolLM2-135M, antonym): each selector against an independent
computation at real scale, where the tiny models of tests/test_frontier.py cannot show it (270
heads, a real tokenizer, a task the model learns).

- ``alpha``'s S_k are the top-k heads of an adapter fitted separately with the same seed (the fit
  is deterministic on CPU, so the two fits are equal and the sets must be identical);
- its ``alpha1`` rows equal intra-task patching of the same sets (the same rows through the same
  engine: exact equality), and full SITE and zero-shot equal intra-task's references;
- ``atp``'s S_k are the top-k of the ``atp`` lens run on its own with the same seed.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from sitelens import FitConfig, fit_site, load_task
from sitelens.lenses import head_scores
from sitelens.lenses.frontier import frontier
from sitelens.lenses.selectors import FrontierConfig
from sitelens.patching import intra_task

pytestmark = pytest.mark.integration

KS = (1, 5, 10)
CFG = FrontierConfig(fit=FitConfig(n_examples=100), test_limit=15, exact_match=False)


@pytest.fixture(scope="module")
def run(smollm2):
    task = load_task("antonym")
    res = frontier(smollm2, task, budgets=KS, selectors=("alpha", "atp"), injections=("alpha1",),
                   config=CFG)
    adapter = fit_site(smollm2, task, n_prompts=CFG.n_prompts, n_shots=CFG.n_shots,
                       config=replace(CFG.fit, seed=0), template=CFG.template)
    return task, res, adapter


def _heads(table, selector):
    return table[table.selector == selector].set_index("k").heads


def test_alpha_sets_are_the_top_alpha_heads_of_the_same_fit(run):
    _, res, adapter = run
    for k in KS:
        want = ";".join(f"L{layer}H{h}" for layer, h, _ in adapter.top_heads(k))
        assert _heads(res.table, "alpha").loc[k] == want


def test_alpha1_rows_equal_intra_task_patching(smollm2, run):
    task, res, adapter = run
    ref = intra_task(smollm2, task, adapter, ks=list(KS), n_random_seeds=0, reverse=False,
                     limit=CFG.test_limit, n_boot=10)
    top = ref[ref.selection == "top"].set_index("k").accuracy
    got = res.table[res.table.selector == "alpha"].set_index("k").first_token_acc
    assert np.array_equal(got.loc[list(KS)].to_numpy(), top.loc[list(KS)].to_numpy())
    site = ref.loc[ref.selection == "site", "accuracy"].item()
    zero = ref.loc[ref.selection == "zero_shot", "accuracy"].item()
    assert (res.table.full_site == site).all() and (res.table.zero_shot == zero).all()
    assert site > zero  # SmolLM2 learns antonym from SITE (0.73 vs 0.0 on these items)


def test_atp_sets_are_the_top_of_the_atp_lens(smollm2, run):
    task, res, adapter = run
    att = replace(CFG.attribution, seed=0, template=adapter.template)
    run_ = head_scores(smollm2, task, ["atp"], attribution=att, adapter=adapter)
    flat = run_.scores.map("atp").flatten()
    order = torch.argsort(flat, descending=True, stable=True).tolist()  # ties by index, as ranking()
    n_heads = smollm2.cfg.n_heads
    for k in KS:
        want = ";".join(f"L{i // n_heads}H{i % n_heads}" for i in order[:k])
        assert _heads(res.table, "atp").loc[k] == want


def test_k_star_is_chosen_on_valid_and_reported_on_test(run):
    """On a task the model learns, full SITE clearly beats zero-shot and k* is the smallest budget
    whose valid accuracy (the table's ``valid_acc``) reaches 90% of full SITE's valid accuracy;
    the accuracy reported beside it is the test accuracy of that row."""
    from sitelens.stats import smallest_reaching

    _, res, _ = run
    s = res.summary
    assert s["status"] == "ok" and s["full_site_minus_zero_shot"]["ci_low"] > 0
    d = res.table[res.table.selector == "alpha"].set_index("k")
    want = smallest_reaching(list(KS), d.valid_acc.loc[list(KS)].tolist(), s["full_site_valid"], 0.9)
    a = s["selectors"]["alpha"]["at_k_star"]["alpha1"]
    if np.isfinite(want):
        assert a["k_star"] == int(want)
        assert a["test_acc"] == d.first_token_acc.loc[int(want)]
        assert a["stability"] is None and a["unstable"] is None  # one seed, no resample
    else:
        assert a["k_star"] == "not reached"
