"""The accuracy-vs-heads frontier (sitelens.lenses.frontier, sitelens.lenses.selectors) on tiny
random models, each selector against an independent computation.

Tolerances: greedy's scores (batched rows on a prefix cache) and the exhaustive reference (one full
patched forward pass per head) are two float32 paths of the same forward pass, so they agree to
float rounding (tests/tolerances.py); the test first checks that the best head leads the runner-up
by far more than that, so the comparison of picks is meaningful. Accuracies compared with
intra-task patching are exact: the same rows through the same engine."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch

import sitelens.lenses.registry as R
import sitelens.lenses.selectors as S
from sitelens import FitConfig, fit_site, load_task
from sitelens.errors import LensError, TaskError
from sitelens.heads import mask_of, ranking
from sitelens.lazy import resolve
from sitelens.lenses.attribution import AttributionConfig
from sitelens.lenses.frontier import COLUMNS, NOT_REACHED, frontier, k_star, mean_jaccard
from sitelens.lenses.selectors import FrontierConfig, SelectionContext, select
from sitelens.patching import intra_task, patched_last_logits
from sitelens.patching.engine import BackwardPassCounter, ForwardPassCounter
from sitelens.tasks import Example, Task, Template, answer_token_ids, zero_shot_prompt

BARE = Template(answer_prefix="")  # the byte tokenizer's first answer token is then the answer's first byte
CFG = FrontierConfig(
    fit=FitConfig(n_examples=16, n_valid=8),
    attribution=AttributionConfig(n_prompts=4, n_shots=2, n_mean_prompts=4, n_boot=20, n_alpha_items=6),
    n_prompts=4, n_shots=2, n_valid=8, test_limit=8, exact_match=False, sparsity_grid=(1.0,),
    template=BARE,
)


@pytest.fixture(scope="module")
def task():
    return load_task("antonym")


def _ctx(model, task, cfg=CFG, seed=0):
    adapter = fit_site(model, task, n_prompts=cfg.n_prompts, n_shots=cfg.n_shots,
                       config=replace(cfg.fit, seed=seed), template=cfg.template)
    return SelectionContext(model, task, adapter, cfg, seed)


# ----------------------------------------------------------------------------------------------
# greedy


def check_greedy_first_pick(model, task) -> None:
    """Greedy's first head is the best single head by exhaustive evaluation: one full patched
    forward pass per head on the valid prompts (no prefix cache, no batched rows)."""
    ctx = _ctx(model, task)
    picked = select(ctx, "greedy", [1]).sets[1]
    L, H = ctx.shape
    items = task.valid[: CFG.n_valid]
    prompts = [zero_shot_prompt(ex.input, BARE) for ex in items]
    ans = torch.tensor(answer_token_ids(model, [ex.output for ex in items], BARE))
    scores = []
    for j in range(L * H):
        w = torch.zeros(L * H)
        w[j] = 1.0
        logits = patched_last_logits(model, prompts, w.reshape(L, H), ctx.adapter.embedding,
                                     use_cache=False)  # [n, d_vocab]
        acc = float((logits.argmax(-1) == ans).float().mean())
        prob = float(torch.softmax(logits, -1).gather(1, ans[:, None]).mean())
        scores.append((acc, prob))
    order = sorted(range(L * H), key=lambda j: scores[j], reverse=True)
    best, second = scores[order[0]], scores[order[1]]
    assert best[0] > second[0] or best[1] - second[1] > 1e-4  # a clear winner: rounding cannot swap
    assert picked == [order[0]], ("greedy's first pick is not the exhaustive best head", picked, order[:3],
                                  [scores[j] for j in order[:3]])


def test_greedy_first_pick_is_the_exhaustive_best_head(tiny_mha, task):
    check_greedy_first_pick(tiny_mha, task)


def test_mutation_greedy_scoring_the_wrong_head_is_caught(tiny_mha, task, monkeypatch):
    real = S.best_candidate
    monkeypatch.setattr(S, "best_candidate", lambda acc, prob: (real(acc, prob) + 1) % len(acc))
    with pytest.raises(AssertionError, match="greedy's first pick is not the exhaustive best head"):
        check_greedy_first_pick(tiny_mha, task)


def test_greedy_stops_at_max_k_or_full_site_and_leaves_the_rest_empty(tiny_mha, task):
    ctx = _ctx(tiny_mha, task, replace(CFG, greedy_max_k=2, greedy_stop=False))
    sel = select(ctx, "greedy", [1, 2, 3, 5])
    assert [len(sel.sets[k]) for k in (1, 2)] == [1, 2] and sel.sets[3] is None and sel.sets[5] is None
    assert sel.sets[2][:1] == sel.sets[1] and sel.meta["stop"] == "max_k"  # nested: forward selection
    # full SITE scores 0 on valid on a random model, so one head already reaches it
    ctx = _ctx(tiny_mha, task, replace(CFG, greedy_max_k=3))
    sel = select(ctx, "greedy", [1, 2, 3])
    assert sel.meta["valid_target"] == 0.0 and sel.meta["stop"] == "reached full SITE's valid accuracy"
    assert len(sel.sets[1]) == 1 and sel.sets[2] is None and sel.sets[3] is None


def test_greedy_pool_prunes_the_candidates_and_measures_it(tiny_mha, task):
    ctx = _ctx(tiny_mha, task, replace(CFG, greedy_pool=2, greedy_stop=False))
    sel = select(ctx, "greedy", [1, 2])
    grad = ranking(R.get_lens("alpha-grad").run(R.LensInputs(
        tiny_mha, task, ctx.adapter.embedding, replace(CFG.attribution, template=BARE))).map())[:2]
    assert sorted(sel.sets[2]) == sorted(grad) and sel.meta["pool"] == 2  # only the pool's heads
    pr = sel.meta["pruning"]
    acc, prob = S.greedy_step_scores(ctx, [], list(range(8)))
    assert pr["unpruned_first_pick"] == S.best_candidate(acc, prob)
    assert pr["in_pool"] == (pr["unpruned_first_pick"] in grad)


def test_counted_passes_equal_the_observed(tiny_mha, task):
    """A selector's forward/backward counts equal what independent hooks on the model saw: calls of
    the model, plus passes that reach the unembedding outside a call of the model (greedy's waves
    run the blocks one by one)."""
    ctx = _ctx(tiny_mha, task)
    seen = {"fwd": 0, "inside": 0}

    def enter(*a):
        seen["fwd"] += 1
        seen["inside"] += 1

    def leave(*a):
        seen["inside"] -= 1

    def unembed(*a):
        seen["fwd"] += seen["inside"] == 0

    hs = [tiny_mha.register_forward_pre_hook(enter), tiny_mha.register_forward_hook(leave, always_call=True),
          tiny_mha.unembed.register_forward_pre_hook(unembed)]
    try:
        with BackwardPassCounter(tiny_mha) as bwd:
            sel_g = select(ctx, "greedy", [1, 2])
            sel_a = select(ctx, "alpha-grad", [1, 2])
    finally:
        for h in hs:
            h.remove()
    assert sel_g.forward_passes > 0 and sel_a.backward_passes > 0
    assert sel_g.forward_passes + sel_a.forward_passes == seen["fwd"]
    assert sel_g.backward_passes == 0 and sel_a.backward_passes == bwd.count
    with ForwardPassCounter(tiny_mha) as fwd:
        sel = select(ctx, "greedy", [1, 2])
    assert sel.forward_passes == fwd.count


# ----------------------------------------------------------------------------------------------
# sparse


def check_sparse_keeps_k(model, task, monkeypatch, ks=(1, 2)) -> None:
    """Every mix the k-sparse fits run (all budgets at once, one row per budget and item) injects
    into at most that row's k heads, and S_k has k heads."""
    import sitelens.lenses.joint_fit as J

    counts: list[list[int]] = []
    real = J.site_mix

    def spy(alpha, embedding, seq_len=None):
        counts.append([int((r.detach() != 0).sum()) for r in alpha])  # per row [L, H]
        return real(alpha, embedding, seq_len)

    monkeypatch.setattr(J, "site_mix", spy)
    ctx = _ctx(model, task)
    sel = select(ctx, "sparse", list(ks))
    assert counts
    for c in counts:  # rows are budget-major: each budget's rows hold as many as that budget's k
        per = len(c) // len(ks)
        assert all(n <= k for i, n in enumerate(c) for k in [ks[i // per]]), (
            "sparse: more than k heads active", c)
    assert all(len(set(sel.sets[k])) == k for k in ks)


def test_sparse_alpha_keeps_at_most_k_heads_active(tiny_mha, task, monkeypatch):
    check_sparse_keeps_k(tiny_mha, task, monkeypatch)


def test_mutation_sparse_not_enforcing_k_is_caught(tiny_mha, task, monkeypatch):
    monkeypatch.setattr(S, "topk_mask", lambda flat, k: torch.ones_like(flat))
    with pytest.raises(AssertionError, match="sparse: more than k heads active"):
        check_sparse_keeps_k(tiny_mha, task, monkeypatch)


def test_straight_through_topk_forward_and_gradient():
    a = torch.tensor([0.3, -1.0, 2.0, 0.1], requires_grad=True)
    w = S.straight_through_topk(2)(a)
    assert torch.equal(w.detach(), torch.tensor([1.0, 0.0, 1.0, 0.0]))
    w.sum().backward()
    s = torch.sigmoid(a.detach())
    assert torch.allclose(a.grad, s * (1 - s))  # sigmoid's gradient, every head (float32 rounding)


# ----------------------------------------------------------------------------------------------
# α = 1 injection = intra-task patching


def _planted_task(model, task):
    """``task`` with its test answers set to what the model predicts under α = 1 on the top-1 head
    (half the items) or with no injection (the others), so the conditions' accuracies differ."""
    ad = fit_site(model, task, n_prompts=CFG.n_prompts, n_shots=CFG.n_shots,
                  config=replace(CFG.fit, seed=0), template=BARE)
    L, H = ad.alpha.shape
    top = mask_of(ranking(ad.alpha)[:1], (L, H))
    items = task.test[: CFG.test_limit]
    prompts = [zero_shot_prompt(ex.input, BARE) for ex in items]
    inj = patched_last_logits(model, prompts, top, ad.embedding).argmax(-1)
    zs = patched_last_logits(model, prompts).argmax(-1)
    test = []
    for i, ex in enumerate(items):
        tok = int(inj[i] if i % 2 == 0 else zs[i])
        out = model.tokenizer.decode([tok])
        if out and answer_token_ids(model, [out], BARE) == [tok]:
            test.append(Example(ex.input, out))
    return Task("planted", task.train, task.valid, test), ad


def test_alpha1_injection_equals_intra_task_patching(tiny_mha, task):
    planted, ad = _planted_task(tiny_mha, task)
    res = frontier(tiny_mha, planted, budgets=(1, 2, 3), selectors=("alpha",), injections=("alpha1",),
                   config=CFG)
    ref = intra_task(tiny_mha, planted, ad, ks=[1, 2, 3], n_random_seeds=0, reverse=False, n_boot=10)
    top = ref[ref.selection == "top"].set_index("k").accuracy
    got = res.table.set_index("k").first_token_acc
    assert np.array_equal(got.loc[[1, 2, 3]].to_numpy(), top.loc[[1, 2, 3]].to_numpy())
    assert len(set(top)) > 1 or top.iloc[0] not in (0.0, 1.0)  # the planted answers make it non-trivial
    assert res.table.full_site.iloc[0] == ref.loc[ref.selection == "site", "accuracy"].item()
    assert res.table.zero_shot.iloc[0] == ref.loc[ref.selection == "zero_shot", "accuracy"].item()
    heads = [f"L{layer}H{h}" for layer, h, _ in ad.top_heads(3)]
    assert res.table.set_index("k").heads.loc[3] == ";".join(heads)


# ----------------------------------------------------------------------------------------------
# the answer: k*, Jaccard; the whole result


def test_k_star_logic():
    assert k_star([1, 2, 5, 10], [0.1, 0.5, 0.85, 0.95], full=0.9) == 5  # 0.85 >= 0.81
    assert k_star([10, 1, 5], [0.95, 0.1, 0.2], full=0.9) == 10  # order of the input does not matter
    assert k_star([1, 2], [0.1, float("nan")], full=0.9) == NOT_REACHED  # an empty point never reaches
    assert k_star([1, 2], [0.8, 0.9], full=0.9, threshold=1.0) == 2


def test_jaccard():
    assert mean_jaccard([[1, 2], [2, 3]]) == pytest.approx(1 / 3)
    assert mean_jaccard([[1, 2], [1, 2], [3, 4]]) == pytest.approx((1 + 0 + 0) / 3)
    assert np.isnan(mean_jaccard([[1, 2]])) and np.isnan(mean_jaccard([[1], None]))


def test_frontier_table_summary_and_figure(tiny_mha, task, tmp_path):
    import plotly.graph_objects as go

    cfg = replace(CFG, greedy_max_k=2, greedy_stop=False, n_bootstrap=1)
    res = frontier(tiny_mha, task, budgets=(1, 2, 5), seeds=2, config=cfg,
                   selectors=("alpha", "alpha-sparse", "alpha-grad", "atp", "effect", "greedy", "sparse"))
    t = res.table
    assert list(t.columns) == COLUMNS
    assert len(t) == 7 * 3 * 2 * 2  # selectors × budgets × injections × seeds
    g = t[(t.selector == "greedy") & (t.k == 5)]
    assert g.heads.eq("").all() and g.first_token_acc.isna().all()  # past max k: empty, not guessed
    ok = t[t.heads != ""]
    assert ok.heads.str.split(";").map(len).eq(ok.k).all()
    assert ((ok.ci_low <= ok.first_token_acc) & (ok.first_token_acc <= ok.ci_high)).all()
    refit = ok[ok.injection == "refit"]
    a1 = t.loc[refit.index - 1]  # the alpha1 row of the same selector, k and seed
    assert (a1.injection == "alpha1").all()
    assert (refit.backward_passes.to_numpy() > a1.backward_passes.to_numpy()).all()  # + the refit's cost
    s = res.summary
    assert set(s["selectors"]) == set(t.selector)
    for v in s["selectors"].values():
        assert set(v["k_star"]) == {"alpha1", "refit"}
    assert set(s["overlap"]) == {"1", "2", "5"}
    assert isinstance(res.figure(), go.Figure)
    csv, js = res.to_dir(tmp_path / "out")
    assert json.loads(js.read_text())["threshold"] == 0.9 and csv.read_text().startswith("model,task")


# ----------------------------------------------------------------------------------------------
# bad input


def test_bad_input_raises_typed_errors(tiny_mha, task):
    n = tiny_mha.cfg.n_layers * tiny_mha.cfg.n_heads
    with pytest.raises(LensError, match=rf"outside \[1, {n}\]"):
        frontier(tiny_mha, task, budgets=(1, n + 1), config=CFG)
    with pytest.raises(LensError, match="Did you mean 'greedy'"):
        frontier(tiny_mha, task, selectors=("greedyy",), config=CFG)
    with pytest.raises(LensError, match="Did you mean 'alpha-sparse'"):
        R.parse_selectors(["alpha_sparse"])
    tiny_task = Task("tiny", task.train[:1], task.valid[:3], task.test[:3])
    with pytest.raises(TaskError, match="too small"):
        frontier(tiny_mha, tiny_task, budgets=(1,), config=CFG)


def test_selectors_are_one_registry(tiny_mha, task, monkeypatch):
    """The names, the parser and :func:`select` read one registry: a selector added there (a toy
    one) is parsed and run with no other edit; an unknown name is refused before any work; every
    entry names a function that exists."""
    assert R.SELECTORS == tuple(s.name for s in R.SELECTOR_REGISTRY)
    assert len(set(R.SELECTORS)) == len(R.SELECTORS) and all(s.what for s in R.SELECTOR_REGISTRY)
    assert all(callable(resolve(s.impl)) for s in R.SELECTOR_REGISTRY)
    assert R.parse_selectors(["atp", "alpha", "atp"]) == ["atp", "alpha"]
    toy = R.Selector("first-heads", "the first k heads", lambda ctx, budgets: ({k: list(range(k))
                                                                                for k in budgets}, {}))
    monkeypatch.setattr(R, "SELECTOR_REGISTRY", (*R.SELECTOR_REGISTRY, toy))
    assert R.parse_selectors(["first-heads"]) == ["first-heads"]
    ctx = SelectionContext(tiny_mha, task, None, CFG, 0)  # the toy reads nothing of the context
    sel = select(ctx, "first-heads", [1, 3])
    assert sel.sets == {1: [0], 3: [0, 1, 2]} and sel.forward_passes == 0
    with pytest.raises(LensError, match="Unknown selector 'nope'"):
        select(ctx, "nope", [1])


# ----------------------------------------------------------------------------------------------
# the command line


def _cli(argv, monkeypatch, tmp_path, *, load_ok=False):
    import contextlib
    import io

    import sitelens.models as M
    from sitelens.cli import main

    if not load_ok:  # bad input must be refused before any model loads
        monkeypatch.setattr(M, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    monkeypatch.chdir(tmp_path)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue(), err.getvalue()


TINY_ARGS = ["frontier", "--model", "tiny-random", "--task", "antonym", "--out", "fr",
             "--n-examples", "8", "--n-mean-prompts", "4", "--n-shots", "2", "--n-prompts", "4",
             "--limit", "6", "--n-boot", "20", "--test-limit", "4"]


@pytest.mark.parametrize("extra, needle", [
    (["--selectors", "greedyy"], "Did you mean 'greedy'?"),
    (["--budgets", "1,9"], "outside [1, 8]"),
    (["--budgets", "1,x"], "argument --budgets"),
    (["--task", "pairs.json", "--n-shots", "1", "--budgets", "1"],
     "needs at least 15 pairs for 1 shot and the splits"),
    (["--lenses", "atp"], "unrecognized arguments: --lenses"),
])
def test_cli_frontier_bad_input_exits_2_before_loading(extra, needle, monkeypatch, tmp_path):
    (tmp_path / "pairs.json").write_text(json.dumps([{"input": c, "output": c} for c in "abc"]))
    rc, out, err = _cli(TINY_ARGS + extra, monkeypatch, tmp_path)
    assert rc == 2 and out == "" and err.count("\n") == 1 and err.startswith("sitelens: error: ")
    assert needle in err and not (tmp_path / "fr").exists()


def test_cli_frontier_writes_the_table_and_summary(monkeypatch, tmp_path):
    rc, out, err = _cli(TINY_ARGS + ["--budgets", "1,2", "--selectors", "alpha,greedy", "--json",
                                     "--no-exact-match"], monkeypatch, tmp_path, load_ok=True)
    assert rc == 0, err
    summary = json.loads(out)
    assert set(summary["selectors"]) == {"alpha", "greedy"}
    import pandas as pd

    t = pd.read_csv(tmp_path / "fr" / "frontier.csv")
    assert list(t.columns) == COLUMNS and len(t) == 2 * 2 * 2 and set(t.seed) == {0}
    assert json.loads((tmp_path / "fr" / "summary.json").read_text()) == summary
