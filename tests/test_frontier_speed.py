"""The frontier's speed-ups against the slow computations they replace, on tiny random models.

Tolerance of the joint fits (:func:`sitelens.lenses.joint_fit.fit_many` with R conditions against
R runs of one condition, or against :func:`sitelens.fit_site`): one pass of R × n rows instead of
R passes of n rows sums the same float32 terms in another order (about 1e-7 relative per pass);
over the fit's steps Adam's normalized updates carry that forward, so the kept logits (of order 1)
agree to 1e-4, far below the gaps that decide a top-k or an argmax in these tests.
Where two validation checks give the same loss to within that rounding (a straight-through mask
that did not change between them), either may be kept: the fits here validate only before the
first and after the last step, so the kept step is decided by a real difference."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from bench_util import bench_module
from test_frontier_pin import planted

import sitelens.lenses.joint_fit as J
import sitelens.lenses.selectors as S
from sitelens import FitConfig, fit_site, load_task
from sitelens.heads import mask_of, ranking
from sitelens.patching.engine import ForwardPassCounter
from sitelens.tasks import Template

study = bench_module("frontier_study")  # benchmarks/frontier_study.py

BARE = Template(answer_prefix="")
FIT = FitConfig(n_examples=40, n_valid=8, eval_every=5)  # checks at steps 0 and 5 only (see above)
ATOL = 1e-4  # see the module docstring


@pytest.fixture(scope="module")
def task(tiny_mha):
    return planted(tiny_mha, load_task("antonym"))  # answers the model can learn: the fits move


def _embedding(model, task):
    return fit_site(model, task, n_prompts=4, n_shots=2, config=FIT, template=BARE).embedding


def check_joint_refits_equal_one_by_one(model, task) -> None:
    emb = _embedding(model, task)
    L, H = model.cfg.n_layers, model.cfg.n_heads
    sets = [[0], [1, 5], [2, 3, 7]]
    masks = torch.stack([mask_of(h, (L, H)).flatten() for h in sets])  # [3, L * H]
    joint = J.fit_many(model, task, emb, FIT, lambda a: torch.sigmoid(a) * masks, len(sets),
                       template=BARE, what="test", max_rows=16)  # 16 rows: the sets run in groups
    for i, m in enumerate(masks):
        one = J.fit_many(model, task, emb, FIT, lambda a, m=m: torch.sigmoid(a) * m, 1,
                         template=BARE, what="test")[0]  # [L, H]: the same fit alone
        got, want = joint[i].flatten()[m > 0], one.flatten()[m > 0]
        assert torch.allclose(got, want, atol=ATOL), (
            "joint refit differs from the one-by-one fit", i, got, want)
    assert (joint != FIT.init).any()  # the fits moved: the comparison is not of two starts


def test_joint_refits_equal_one_by_one(tiny_mha, task):
    check_joint_refits_equal_one_by_one(tiny_mha, task)


def test_mutation_joint_fit_with_the_wrong_mix_is_caught(tiny_mha, task, monkeypatch):
    """The joint fit's loss against SITE's own (:func:`fit_site`, another implementation of the
    mix and the loss): halving the weights in the joint fit's mix is caught."""
    real = J._condition_losses

    def wrong(model, items, conds, w, t):  # each condition's weights halved in the mix
        return real(model, items, conds, w * 0.5, t)

    monkeypatch.setattr(J, "_condition_losses", wrong)
    with pytest.raises(AssertionError, match="joint α-sparse fit differs from fit_site"):
        check_joint_alpha_sparse_equals_fit_site(tiny_mha, task)


def test_joint_sparse_fits_equal_one_by_one(tiny_mha, task):
    emb = _embedding(tiny_mha, task)
    L, H = tiny_mha.cfg.n_layers, tiny_mha.cfg.n_heads
    init = 1e-3 * torch.randn(L * H, generator=torch.Generator().manual_seed(0))
    ks = [1, 3]
    joint = J.fit_many(tiny_mha, task, emb, FIT, S.straight_through_topk_rows(ks), len(ks),
                       template=BARE, what="test", init=init.repeat(len(ks), 1))
    for k, got in zip(ks, joint):
        one = J.fit_many(tiny_mha, task, emb, FIT, S.straight_through_topk_rows([k]), 1, template=BARE,
                         what="test", init=init)[0]
        assert torch.allclose(got, one, atol=ATOL)
        assert ranking(got)[:k] == ranking(one)[:k]


def check_joint_alpha_sparse_equals_fit_site(model, task) -> None:
    emb = _embedding(model, task)
    lams = torch.tensor([0.5, 5.0])
    joint = J.fit_many(model, task, emb, FIT, torch.sigmoid, 2, template=BARE, what="test",
                       penalty=lambda a: lams * torch.sigmoid(a).mean(1))
    for lam, got in zip(lams.tolist(), joint):
        ad = fit_site(model, task, config=replace(FIT, sparsity=lam), template=BARE, embedding=emb)
        assert torch.allclose(torch.sigmoid(got), ad.alpha, atol=ATOL), (
            "joint α-sparse fit differs from fit_site", lam, torch.sigmoid(got), ad.alpha)


def test_joint_alpha_sparse_fits_equal_fit_site(tiny_mha, task):
    check_joint_alpha_sparse_equals_fit_site(tiny_mha, task)


# ----------------------------------------------------------------------------------------------
# the study runner and the timing script


def _rows(model, task, seed, heads_by_k, acc_by_k, full=0.8):
    return [{"model": model, "task": task, "selector": "alpha", "injection": "alpha1", "k": k,
             "heads": h, "first_token_acc": acc_by_k[k], "full_site": full, "zero_shot": 0.1, "seed": seed}
            for k, h in heads_by_k.items()]


def test_study_k_star_and_stability_tables():
    import pandas as pd


    df = pd.DataFrame(_rows("m", "t", 0, {1: "L0H0", 2: "L0H0;L0H1"}, {1: 0.5, 2: 0.75})
                      + _rows("m", "t", 1, {1: "L0H1", 2: "L0H0;L0H1"}, {1: 0.7, 2: 0.75}))
    ks = study.k_star_table(df)
    assert ks.k_star.item() == 2  # seed means 0.6 and 0.75; 0.75 >= 0.9 × 0.8 = 0.72
    # over N = 4 heads; k = 1: L0H0 vs L0H1 (raw 0; two random 1-sets of 4 coincide with
    # probability 1/4, so chance is 1/4 and the adjusted index (0 − 1/4)/(1 − 1/4) = −1/3);
    # k = 2: the same set (1)
    st = study.stability_table(df, n_total=lambda m: 4).set_index("k")
    assert st.raw_jaccard.tolist() == [0.0, 1.0] and (st.seeds == 2).all()
    assert st.chance_jaccard[1] == pytest.approx(0.25, abs=1e-12)  # closed form: exact up to rounding
    assert st.stability.tolist() == pytest.approx([-1 / 3, 1.0], abs=1e-12)


def test_study_k_star_is_chosen_on_valid_past_greedys_stop():
    """A cell that scored valid chooses k* on valid for every selector, greedy too, whose budgets
    past its stop have no set and no accuracies (they cannot reach k*); a cell without valid
    scores (scored before the frontier measured it) chooses on test."""
    import pandas as pd

    nan = float("nan")
    rows = [{**r, "selector": "greedy", "full_site_valid": 0.6, "zero_shot_valid": 0.0,
             "valid_acc": {1: 0.3, 2: 0.6, 5: nan}[r["k"]]}
            for r in _rows("m", "t", 0, {1: "L0H0", 2: "L0H0;L0H1", 5: ""}, {1: 0.2, 2: 0.7, 5: nan})]
    old = _rows("m", "u", 0, {1: "L0H0", 2: "L0H0;L0H1"}, {1: 0.5, 2: 0.75})
    ks = study.k_star_table(pd.DataFrame(rows + old)).set_index("task")
    assert ks.loc["t", "chosen_on"] == "valid" and ks.loc["t", "k_star"] == 2  # 0.6 >= 0.9 × 0.6
    assert ks.loc["t", "test_acc_at_k_star"] == 0.7
    assert ks.loc["u", "chosen_on"] == "test" and ks.loc["u", "k_star"] == 2


def test_study_reads_no_k_star_and_the_interval_from_the_cells_summaries():
    """A cell whose summary says full SITE does not clearly beat zero-shot gets no k* (not the k*
    its valid curve would give, and not counted as reached); another cell's k* carries the
    bootstrap interval its summary holds, and the Wilson interval of its test row at k*."""
    import pandas as pd

    def valid(rows):
        return [{**r, "full_site_valid": 0.6, "zero_shot_valid": 0.0, "valid_acc": r["first_token_acc"],
                 "ci_low": r["first_token_acc"] - 0.1, "ci_high": r["first_token_acc"] + 0.1} for r in rows]

    rows = valid(_rows("m", "t", 0, {1: "L0H0", 2: "L0H0;L0H1"}, {1: 0.2, 2: 0.7})
                 + _rows("m", "u", 0, {1: "L0H0", 2: "L0H0;L0H1"}, {1: 0.2, 2: 0.7}))
    at = {"alpha": {"at_k_star": {"alpha1": {"k_star": 2, "k_star_interval": [1, 2]}}}}
    summaries = {("m", "t", 0): {"status": "ok", "selectors": at},
                 ("m", "u", 0): {"status": "site_not_above_zero_shot", "selectors": at}}
    ks = study.k_star_table(pd.DataFrame(rows), summaries=summaries).set_index("task")
    assert ks.loc["t", "k_star"] == 2 and (ks.loc["t", "k_star_low"], ks.loc["t", "k_star_high"]) == (1, 2)
    assert (ks.loc["t", "test_ci_low"], ks.loc["t", "test_ci_high"]) == pytest.approx((0.6, 0.8))
    assert ks.loc["u", "k_star"] == study.NO_K_STAR and ks.loc["u", "k_star_low"] == ""
    st = study.stability_table(pd.DataFrame(rows), n_total=lambda m: 4)
    marked = study.mark_unstable(ks.reset_index(), st).set_index("task").k_star_marked
    assert marked["t"].startswith("2 [1, 2]") and marked["u"] == study.NO_K_STAR


def test_study_unstable_mark_is_chance_adjusted():
    """Two 4-head sets of 6 sharing 3 (raw Jaccard 3/5 = 0.6, above 0.5) are still marked unstable:
    random 4-sets of 6 share 0.52 on average (overlap 2, 3, 4 with probability 6/15, 8/15, 1/15:
    2/6·6/15 + 3/5·8/15 + 1·1/15 = 0.52), so the adjusted index is (0.6 − 0.52)/0.48 = 1/6. A raw
    Jaccard mark would pass it; a mark with the correction dropped fails this test."""
    import pandas as pd

    a, b = "L0H0;L0H1;L0H2;L0H3", "L0H0;L0H1;L0H2;L0H4"
    df = pd.DataFrame(_rows("m", "t", 0, {4: a}, {4: 0.8}) + _rows("m", "t", 1, {4: b}, {4: 0.8}))
    st = study.stability_table(df, n_total=lambda m: 6)
    assert st.raw_jaccard.item() == pytest.approx(0.6, abs=1e-12)
    assert st.stability.item() == pytest.approx(1 / 6, abs=1e-12)
    ks = study.mark_unstable(study.k_star_table(df), st)
    assert ks.k_star_marked.item() == "4 (unstable)"


def test_study_runs_a_cell_resumes_without_recomputing_and_reports(tmp_path, monkeypatch):
    import sitelens.lenses.frontier as F
    from sitelens.pipelines.experiment import main

    argv = ["--tiny", "--budgets", "1,2", "--out", str(tmp_path), "--threads", "0"]
    assert main(study.FrontierStudy(), argv) == 0
    csv = tmp_path / "frontier_study.csv"
    first = csv.read_text()
    assert (tmp_path / "frontier_study" / "tiny-random" / "antonym_seed0" / "summary.json").exists()
    monkeypatch.setattr(F, "frontier", lambda *a, **k: pytest.fail("a done cell was recomputed"))
    assert main(study.FrontierStudy(), argv) == 0
    assert csv.read_text() == first
    md = (tmp_path / "frontier_study.md").read_text()
    assert "## k* per selector" in md and "alpha/alpha1" in md
    assert (tmp_path / "frontier_study_kstar.html").exists()


def test_frontier_time_smoke(tmp_path):
    import time

    import pandas as pd

    from sitelens.pipelines.experiment import main

    argv = ["--tiny", "--budgets", "1,2", "--out", str(tmp_path), "--threads", "0"]
    t0 = time.perf_counter()
    assert main(bench_module("frontier_time").FrontierTime(), argv) == 0
    wall = time.perf_counter() - t0
    t = pd.read_csv(tmp_path / "frontier_time.csv").set_index("part")
    assert list(t.index) == ["fit", "alpha", "alpha-sparse", "alpha-grad", "atp", "effect", "greedy",
                             "sparse", "scoring", "total"]
    # "scoring" is the total less the other parts, so the parts add up to the total by construction;
    # what is measured apart: the total (the frontier call) lies within this test's own clock around
    # the script, the parts measured on their own fit inside it (scoring, what is left, is not
    # negative beyond the rounding of the 9 parts it subtracts, 0.05 s each), and the refits
    # (measured per set, inside scoring) fit inside scoring (rounding of both: 0.1 s)
    assert t.seconds["total"] <= wall + 0.05, (t.seconds["total"], wall)
    assert (t.seconds.drop(["scoring", "total"]) >= 0).all(), t.seconds
    assert t.seconds["scoring"] >= -9 * 0.05, t.seconds
    assert t.refit_seconds["scoring"] <= t.seconds["scoring"] + 0.1, t[["seconds", "refit_seconds"]]


# ----------------------------------------------------------------------------------------------
# greedy: candidates branched at their own layer


def check_branched_equals_full_rows(model, task, batch_size: int = 64) -> None:
    from conftest import needs_hooked

    needs_hooked(model, "the branched rows start the forward pass at a layer (start_at_layer)")
    emb = _embedding(model, task)
    L, H = model.cfg.n_layers, model.cfg.n_heads
    ad = S.SiteAdapter(torch.zeros(L, H), emb, {"template": BARE.to_dict()})
    cfg = S.FrontierConfig(n_valid=8, template=BARE, batch_size=batch_size)
    fast = S.SelectionContext(model, task, ad, cfg, 0)
    slow = S.SelectionContext(model, task, ad, replace(cfg, greedy_branch=False), 0)
    chosen, cands = [1], [j for j in range(L * H) if j != 1][::-1]  # any order, every layer
    n = len(fast.valid)  # the prefix cache (built once per greedy run), outside the count
    with ForwardPassCounter(model) as passes:
        acc_f, prob_f = S.greedy_step_scores(fast, chosen, cands)
    per_wave = max(1, batch_size // n)
    assert passes.count == 1 + -(-len(cands) // per_wave)  # the chosen set's pass + one per wave
    acc_s, prob_s = S.greedy_step_scores(slow, chosen, cands)
    differ = "branched rows differ from the full rows"
    assert torch.equal(acc_f, acc_s), (differ, acc_f, acc_s)
    # the same pass, split in two: float32 rounding
    assert torch.allclose(prob_f, prob_s, atol=1e-6), (differ, prob_f, prob_s)
    assert prob_s.std() > 1e-3  # the candidates differ: the comparison is of distinct rows


@pytest.mark.parametrize("batch_size", [64, 8, 24])  # one wave; one candidate a wave; 3 a wave
def test_greedy_branched_rows_equal_the_full_rows(tiny_mha, task, batch_size):
    """Waves of every size (a wave's rows join at their candidates' layers) give the full rows'
    accuracy and probabilities."""
    check_branched_equals_full_rows(tiny_mha, task, batch_size)


def test_greedy_branched_rows_equal_the_full_rows_with_a_logit_soft_cap():
    """Gemma 2's logit soft-cap (family gemma2, cap 3 at the tiny scale): the branched rows'
    unembedding caps the logits as the full pass does (an uncapped one fails the probabilities;
    seed 1's candidates differ by more than the check's floor on distinct rows)."""
    from sitelens.models import has_hooked_transformer
    from sitelens.testing import family_model

    if not has_hooked_transformer():
        pytest.skip("HookedTransformer only: family models are HookedTransformers (TL 3.x)")
    model = family_model("gemma2", seed=1)
    assert model.cfg.output_logits_soft_cap > 0
    check_branched_equals_full_rows(model, planted(model, load_task("antonym")))


def test_mutation_branched_rows_with_the_wrong_targets_are_caught(tiny_mha, task, monkeypatch):
    import sitelens.lenses.greedy_rows as G

    real = G.place_layer_rows
    monkeypatch.setattr(G, "place_layer_rows", lambda x, m: [r * 0.5 for r in real(x, m)])  # wrong targets
    with pytest.raises(AssertionError, match="branched rows differ from the full rows"):
        check_branched_equals_full_rows(tiny_mha, task)


def test_study_report_compares_top10_alpha_and_effect(tmp_path):
    """The k = 10 comparison (our top-10 α, FV's top-10 causal heads) on a written table: the
    Jaccard of the two 10-head sets and their mean accuracies are the table's, computed by hand;
    the paper's figure is cited in the text, never a column of the measured table."""
    import pandas as pd

    from sitelens.lenses.frontier import COLUMNS
    from sitelens.pipelines.experiment import main

    alpha = ";".join(f"L0H{h}" for h in range(10))
    effect = ";".join(f"L0H{h}" for h in range(5, 15))  # 5 shared of 15: Jaccard 1/3
    rows = []
    for task, acc in (("antonym", (0.2, 0.6)), ("present_past", (0.4, 0.8))):
        for sel, heads, a in (("alpha", alpha, acc[0]), ("effect", effect, acc[1])):
            rows.append(dict.fromkeys(COLUMNS) | {
                "key": f"m/{task}/{sel}", "model": "gemma-3-270m", "task": task, "selector": sel, "k": 10,
                "injection": "alpha1", "heads": heads,
                "first_token_acc": a, "exact_match": a, "ci_low": 0.0, "ci_high": 1.0, "full_site": 0.9,
                "zero_shot": 0.0, "forward_passes": 1, "backward_passes": 0, "seconds": 1.0, "seed": 0})
    pd.DataFrame(rows, columns=["key", *COLUMNS]).to_csv(tmp_path / "frontier_study.csv", index=False)
    assert main(study.FrontierStudy(), ["--report", "--out", str(tmp_path)]) == 0
    md = (tmp_path / "frontier_study.md").read_text()
    cmp = md[md.index("## At k = 10"):]
    line = next(s for s in cmp.splitlines() if s.startswith("| gemma-3-270m |"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[1:] == ["2", "0.9", "0.3", "0.7", "0.333"]
    assert "paper_top10_alpha" not in cmp and "cited, not measured here" in cmp
