"""Unit tests of sitelens.patching on tiny random models (MHA and GQA)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from tolerances import assert_logits_close, assert_probs_close, logit_scale

from sitelens import patching as P
from sitelens.errors import AdapterError
from sitelens.eval.metrics import correlation
from sitelens.models import encode, z_hook_name
from sitelens.patching import engine
from sitelens.site import SiteAdapter, task_embedding
from sitelens.site.injection import HeadMix
from sitelens.stats import bootstrap_ci
from sitelens.tasks import answer_token_ids, load_task, zero_shot_prompts
from sitelens.testing import tiny_model

torch.set_num_threads(1)


@pytest.fixture(scope="module", params=[None, 2], ids=["mha", "gqa"])
def model(request, backend):
    return tiny_model(n_layers=2, n_heads=4, d_head=8, n_key_value_heads=request.param, seed=0,
                      backend=backend)


@pytest.fixture(scope="module")
def task():
    return load_task("antonym")


def _adapter(model, task, seed=0):
    emb = task_embedding(model, task, n_prompts=4, n_shots=3, seed=seed)  # [L, H, d_head]
    g = torch.Generator().manual_seed(seed)
    alpha = torch.rand(model.cfg.n_layers, model.cfg.n_heads, generator=g)  # [L, H]
    return SiteAdapter(alpha=alpha, embedding=emb, meta={"task": task.name})


@pytest.fixture(scope="module")
def adapter(model, task):
    return _adapter(model, task)


def _prompts(task, n=5, model=None):
    """The scored zero-shot prompts (with ``model``: each ending with its answer's prompt-side
    whitespace, as patching builds them) and the outputs of the first ``n`` test items."""
    items = task.test[:n]
    return zero_shot_prompts(model, items), [ex.output for ex in items]


def _answer_prob(model, logits, outputs):
    ans = torch.tensor(answer_token_ids(model, outputs))
    return torch.softmax(logits, -1).gather(1, ans[:, None])[:, 0]


def _scale(model, prompts, adapter):
    """The logit scale S of tests/tolerances.py for probabilities of ``prompts``: the largest
    |logit| unpatched, under α and with every head replaced (the conditions' extremes)."""
    L, H = model.cfg.n_layers, model.cfg.n_heads
    return logit_scale(model, prompts, (None, HeadMix(adapter.alpha, adapter.embedding),
                                        HeadMix(torch.ones(L, H), adapter.embedding)))


# ----------------------------------------------------------------------------------------------
# the patching primitive


@pytest.mark.parametrize("use_cache", [True, False])
def test_patching_zero_heads_equals_zero_shot_exactly(model, task, adapter, use_cache):
    prompts, _ = _prompts(task)
    L, H = model.cfg.n_layers, model.cfg.n_heads
    plain = P.patched_last_logits(model, prompts, use_cache=use_cache)
    zero = P.patched_last_logits(
        model, prompts, torch.zeros(L, H), adapter.embedding, use_cache=use_cache
    )
    # exact: w = 0 gives (1 − 0)·z + 0·t = z bit for bit, and every other op is the same
    assert torch.equal(plain, zero)


def test_zero_shot_full_pass_matches_cached_pass(model, task):
    prompts, _ = _prompts(task)
    full = P.patched_last_logits(model, prompts, use_cache=False)
    cached = P.patched_last_logits(model, prompts, use_cache=True)
    # a KV-cached last token vs a full pass: logit_tolerance (depth 2, reduction 64, scale ~3)
    assert_logits_close(cached, full, model, what="zero-shot logits, cached vs full pass")


def _manual_replacement_logits(model, prompts, targets):
    """Reference: a hand-written hook that sets z[:, -1] = t at every layer."""
    enc = encode(model, prompts)

    def make(layer):
        def fn(z, hook):
            z = z.clone()
            z[:, -1] = targets[layer]  # [batch, n_heads, d_head] <- [n_heads, d_head]
            return z

        return fn

    hooks = [(z_hook_name(model, layer), make(layer)) for layer in range(model.cfg.n_layers)]
    with torch.no_grad(), model.hooks(fwd_hooks=hooks):
        logits = model(enc.tokens, attention_mask=enc.attention_mask)  # [batch, pos, d_vocab]
    return logits[:, -1].float()


def test_patching_all_heads_alpha_one_equals_full_replacement(model, task, adapter):
    prompts, _ = _prompts(task)
    ref = _manual_replacement_logits(model, prompts, adapter.embedding)
    ones = torch.ones(model.cfg.n_layers, model.cfg.n_heads)
    full = P.patched_last_logits(model, prompts, ones, adapter.embedding, use_cache=False)
    # w = 1 gives exactly t, but the reference unembeds every position and patched_last_logits
    # only the last (other GEMM shapes): logit_tolerance, for the full pass and the cached one
    assert_logits_close(full, ref, model, what="all heads replaced, full pass vs manual hook")
    cached = P.patched_last_logits(model, prompts, ones, adapter.embedding, use_cache=True)
    assert_logits_close(cached, ref, model, what="all heads replaced, cached vs manual hook")
    with pytest.raises(AssertionError):  # the replacement moves the logits by far more
        assert_logits_close(P.patched_last_logits(model, prompts), ref, model, what="unpatched")


def test_per_row_weights_equal_separate_runs(model, task, adapter):
    prompts, _ = _prompts(task, 3)
    L, H = model.cfg.n_layers, model.cfg.n_heads
    w = torch.stack([P.selection_weights(adapter.alpha, s, 3) for s in ("top", "bottom", "site")])
    batched = P.patched_last_logits(model, prompts, w, adapter.embedding)
    for i in range(3):
        single = P.patched_last_logits(model, prompts[i : i + 1], w[i], adapter.embedding)
        # other batch shapes, other summation orders: logit_tolerance; weights applied to the
        # wrong rows fail it (test_mutations.py)
        assert_logits_close(batched[i : i + 1], single, model, what=f"per-row weights, row {i}")
    assert w.shape == (3, L, H)


# ----------------------------------------------------------------------------------------------
# head selections


def test_default_ks():
    assert P.default_ks(8) == [1, 2, 4, 8]
    assert P.default_ks(6) == [1, 2, 4, 6]
    assert P.default_ks(270)[-2:] == [256, 270]
    assert P.default_ks(1) == [1]


def test_selection_weights():
    alpha = torch.tensor([[0.1, 0.9, 0.5], [0.7, 0.2, 0.3]])
    top2 = P.selection_weights(alpha, "top", 2)
    assert top2.tolist() == [[0, 1, 0], [1, 0, 0]]
    bottom2 = P.selection_weights(alpha, "bottom", 2)
    assert bottom2.tolist() == [[1, 0, 0], [0, 1, 0]]
    fmt = P.selection_weights(alpha, "full_minus_top", 2)
    # exact: multiplying by 1 or by 0 rounds nothing
    assert torch.equal(fmt, alpha * (1 - top2))
    assert torch.equal(P.selection_weights(alpha, "full_minus_top", 0), alpha)
    assert P.selection_weights(alpha, "full_minus_bottom", 6).abs().sum() == 0
    assert P.selection_weights(alpha, "top", 6).sum() == 6
    # random: k heads, seeded, nested across k, different per seed index
    r2 = P.selection_weights(alpha, "random", 2, seed=0, random_seed=1)
    r4 = P.selection_weights(alpha, "random", 4, seed=0, random_seed=1)
    assert r2.sum() == 2 and r4.sum() == 4 and bool((r4 >= r2).all())
    assert torch.equal(r2, P.selection_weights(alpha, "random", 2, seed=0, random_seed=1))
    masks = {tuple(P.selection_weights(alpha, "random", 3, random_seed=s).flatten().tolist())
             for s in range(6)}
    assert len(masks) > 1
    with pytest.raises(ValueError):
        P.selection_weights(alpha, "top", 7)
    with pytest.raises(ValueError):
        P.selection_weights(alpha, "middle", 1)


# ----------------------------------------------------------------------------------------------
# intra-task patching


@pytest.fixture(scope="module")
def intra(model, task, adapter):
    return P.intra_task(model, task, adapter, limit=6, n_random_seeds=2, n_boot=200, seed=0)


def test_intra_task_rows_and_columns(model, intra, adapter):
    n_total = adapter.alpha.numel()
    ks = P.default_ks(n_total)
    assert {"model", "task", "k", "selection", "seed", "accuracy", "ci_low", "ci_high",
            "answer_prob", "n"} <= set(intra.columns)
    assert len(intra) == 2 + len(ks) * (2 + 2 + 2)
    assert set(intra["selection"]) == set(P.SELECTIONS) | set(P.REFERENCES)
    for sel in P.SELECTIONS:
        assert sorted(intra.loc[intra.selection == sel, "k"].unique()) == ks
    rand = intra[intra.selection == "random"]
    assert sorted(rand["seed"].unique().tolist()) == [0, 1]
    assert intra.loc[intra.selection != "random", "seed"].isna().all()
    assert (intra["n"] == 6).all()
    # The CI ends are float64 means of resampled 0/1 values, the accuracy the mean of the same
    # values: equal means may differ by summation order, ~n·1.1e-16; eps = 1e-12 covers that and
    # stays far below one item's 1/6 step.
    eps = 1e-12
    assert ((intra.ci_low <= intra.accuracy + eps) & (intra.accuracy <= intra.ci_high + eps)).all()
    assert intra["accuracy"].between(0, 1).all() and intra["answer_prob"].between(0, 1).all()


def _row(df, sel, k, seed=None):
    sub = df[(df.selection == sel) & (df.k == k)]
    if seed is not None:
        sub = sub[sub.seed == seed]
    assert len(sub) == 1
    return sub.iloc[0]


def test_intra_task_top_equals_bottom_at_all_heads(model, task, intra, adapter):
    n_total = adapter.alpha.numel()
    top, bottom = _row(intra, "top", n_total), _row(intra, "bottom", n_total)
    rand = _row(intra, "random", n_total, seed=1)
    # The same all-heads mask, run in other rows of the batched passes: answer probabilities
    # within prob_tolerance (|Δp| ≤ |Δ log p|) at these prompts' logit scale; the argmax counts
    # behind the accuracies agree unless a top-2 logit gap falls below that bound.
    assert top.accuracy == bottom.accuracy == rand.accuracy
    scale = _scale(model, _prompts(task, 6)[0], adapter)
    assert_probs_close(bottom.answer_prob, top.answer_prob, model, scale=scale, what="bottom-all")
    assert_probs_close(rand.answer_prob, top.answer_prob, model, scale=scale, what="random-all")
    # switching off every head of SITE is zero-shot
    zs = _row(intra, "zero_shot", 0)
    assert_probs_close(_row(intra, "full_minus_top", n_total).answer_prob, zs.answer_prob, model,
                       scale=scale, what="full minus all heads vs zero-shot")


def test_intra_task_matches_direct_patching(model, task, adapter, intra):
    prompts, outputs = _prompts(task, 6, model)
    # intra_task's batched, cached rows vs direct full passes: mean answer probabilities within
    # prob_tolerance at these prompts' logit scale (|Δp| ≤ |Δ log p|; a mean keeps the bound)
    scale = _scale(model, prompts, adapter)
    zs = _answer_prob(model, P.patched_last_logits(model, prompts, use_cache=False), outputs)
    assert_probs_close(_row(intra, "zero_shot", 0).answer_prob, zs.mean(), model, scale=scale,
                       what="zero-shot answer prob, intra_task vs direct")
    site = P.patched_last_logits(model, prompts, adapter.alpha, adapter.embedding,
                                 use_cache=False)
    assert_probs_close(_row(intra, "site", adapter.alpha.numel()).answer_prob,
                       _answer_prob(model, site, outputs).mean(), model, scale=scale,
                       what="SITE answer prob, intra_task vs direct")
    w = P.selection_weights(adapter.alpha, "top", 2)
    top2 = P.patched_last_logits(model, prompts, w, adapter.embedding, use_cache=False)
    row = _row(intra, "top", 2)
    assert_probs_close(row.answer_prob, _answer_prob(model, top2, outputs).mean(), model,
                       scale=scale, what="top-2 answer prob, intra_task vs direct")
    ans = torch.tensor(answer_token_ids(model, outputs))
    # a fraction of argmax hits out of 6 (agreeing unless a top-2 gap is below the logit bound);
    # approx's default rel 1e-6 only absorbs how the float64 mean is formed
    assert row.accuracy == pytest.approx(float((top2.argmax(-1) == ans).float().mean()))


def test_intra_task_reverse_at_zero_is_site(model, task, adapter):
    df = P.intra_task(model, task, adapter, ks=[0, 1], limit=4, n_random_seeds=1, n_boot=50)
    site = _row(df, "site", adapter.alpha.numel())
    # the same weights in other rows of the batched passes: prob_tolerance (see above)
    scale = _scale(model, _prompts(task, 4)[0], adapter)
    for sel in ("full_minus_top", "full_minus_bottom"):
        assert_probs_close(_row(df, sel, 0).answer_prob, site.answer_prob, model, scale=scale,
                           what=f"{sel} at k = 0 vs SITE")
    assert_probs_close(_row(df, "top", 0).answer_prob, _row(df, "zero_shot", 0).answer_prob,
                       model, scale=scale, what="top at k = 0 vs zero-shot")


def test_intra_task_is_seeded_and_validates(model, task, adapter):
    kw = dict(ks=[1, 2], limit=4, n_random_seeds=2, n_boot=100, seed=3)
    a = P.intra_task(model, task, adapter, **kw)
    b = P.intra_task(model, task, adapter, **kw)
    pd.testing.assert_frame_equal(a, b)
    no_rev = P.intra_task(model, task, adapter, ks=[1], limit=2, reverse=False, references=False,
                          n_boot=0)
    assert set(no_rev.selection) == {"top", "bottom", "random"}
    assert no_rev.ci_low.isna().all()
    with pytest.raises(ValueError):
        P.intra_task(model, task, adapter, ks=[adapter.alpha.numel() + 1], limit=2)
    bad = SiteAdapter(torch.rand(3, 4), torch.zeros(3, 4, 8), {})
    with pytest.raises(AdapterError):
        P.intra_task(model, task, bad, limit=2)


def test_intra_task_exact_match_flag(model, task, adapter):
    df = P.intra_task(model, task, adapter, ks=[1], limit=3, n_random_seeds=1, n_boot=20,
                      exact_match=True, references=False, reverse=False)
    assert {"exact_match", "em_ci_low", "em_ci_high"} <= set(df.columns)
    assert df["exact_match"].between(0, 1).all()


# ----------------------------------------------------------------------------------------------
# inter-task patching and α similarity


@pytest.fixture(scope="module")
def three(model):
    tasks = [load_task(n) for n in ("antonym", "synonym", "english_french")]
    adapters = {t.name: _adapter(model, t, seed=i) for i, t in enumerate(tasks)}
    return tasks, adapters


def test_inter_task_shape_and_diagonal(model, three):
    tasks, adapters = three
    df = P.inter_task(model, tasks, adapters, k=3, limit=4, n_boot=50)
    assert len(df) == 3 * 3 * 2
    assert set(df["mode"]) == {"alpha", "topk"}
    assert {"source_task", "target_task", "accuracy", "ci_low", "ci_high", "answer_prob", "n",
            "zero_shot"} <= set(df.columns)
    assert df.loc[df["mode"] == "topk", "k"].eq(3).all()
    assert df.loc[df["mode"] == "alpha", "k"].isna().all()
    # the diagonal of mode=alpha is SITE itself; zero_shot is the target's zero-shot accuracy
    for t in tasks:
        intra = P.intra_task(model, t, adapters[t.name], ks=[3], limit=4, n_random_seeds=1,
                             n_boot=0)
        d = df[(df.source_task == t.name) & (df.target_task == t.name)].set_index("mode")
        # the same conditions in other batches: prob_tolerance at these prompts' logit scale
        scale = _scale(model, _prompts(t, 4)[0], adapters[t.name])
        assert_probs_close(d.loc["alpha", "answer_prob"], _row(intra, "site", 8).answer_prob,
                           model, scale=scale, what=f"{t.name}: inter alpha vs intra SITE")
        assert_probs_close(d.loc["topk", "answer_prob"], _row(intra, "top", 3).answer_prob,
                           model, scale=scale, what=f"{t.name}: inter top-k vs intra top")
        # a fraction of argmax hits (see test_intra_task_matches_direct_patching)
        assert d.loc["alpha", "zero_shot"] == pytest.approx(_row(intra, "zero_shot", 0).accuracy)
    m = P.transfer_matrix(df, mode="alpha", value="answer_prob")
    assert list(m.index) == list(m.columns) == [t.name for t in tasks]
    rel = P.transfer_matrix(df, mode="alpha", value="answer_prob", normalize="diagonal")
    # x / x is exactly 1 in IEEE arithmetic: the default rtol 1e-7 has nothing to absorb
    np.testing.assert_allclose(np.diag(rel.to_numpy()), 1.0)


def test_inter_task_accepts_adapter_list_and_checks_missing(model, three):
    tasks, adapters = three
    df = P.inter_task(model, tasks[:2], [adapters[t.name] for t in tasks[:2]], limit=2, n_boot=0)
    assert len(df) == 2 * 2 * 2
    with pytest.raises(AdapterError):
        P.inter_task(model, tasks, {tasks[0].name: adapters[tasks[0].name]}, limit=2)


def test_inter_task_sources_and_targets_measure_only_those_pairs(model, three):
    """``sources`` / ``targets`` restrict the pairs; each row equals the full table's (the same
    conditions in other batches: prob_tolerance at these prompts' logit scale), and an unknown
    name is refused."""
    from sitelens.errors import TaskError

    tasks, adapters = three
    a, b = tasks[0].name, tasks[2].name
    full = P.inter_task(model, tasks, adapters, k=3, limit=4, n_boot=0)
    part = P.inter_task(model, tasks, adapters, k=3, limit=4, n_boot=0, sources=[a], targets=[b, a])
    assert sorted(set(zip(part.source_task, part.target_task))) == [(a, a), (a, b)]
    assert len(part) == 2 * 2  # two pairs, alpha and topk
    key = ["source_task", "target_task", "mode"]
    want = full.set_index(key).loc[part.set_index(key).index]
    scale = _scale(model, _prompts(tasks[2], 4)[0], adapters[b])
    for (src, tgt, mode), row in part.set_index(key).iterrows():
        assert row.zero_shot == want.loc[(src, tgt, mode)].zero_shot
        assert_probs_close(row.answer_prob, want.loc[(src, tgt, mode)].answer_prob, model,
                           scale=scale, what=f"{src} -> {tgt} {mode}: restricted vs full")
    with pytest.raises(TaskError, match="not among the tasks"):
        P.inter_task(model, tasks, adapters, limit=2, sources=["nope"])


def test_alpha_similarity():
    g = torch.Generator().manual_seed(0)
    a = torch.rand(3, 4, generator=g)
    maps = {"a": a, "a2": 2 * a, "a_sq": a**2, "b": torch.rand(3, 4, generator=g)}
    sim = P.alpha_similarity(maps, k=3)
    assert set(sim) == {"cosine", "spearman", "jaccard_topk"}
    for name, df in sim.items():
        assert list(df.index) == list(df.columns) == list(maps)
        # the diagonal is set to exactly 1; off the diagonal, (i, j) and (j, i) are the same
        # float64 dot products of 12 terms, possibly summed in another order: ~12·1.1e-16, so
        # atol 1e-12 (and approx's default rel 1e-6 below, on float64 cosines and rank
        # correlations that are exactly ±1 in exact arithmetic) only absorbs rounding
        np.testing.assert_allclose(np.diag(df.to_numpy()), 1.0, err_msg=name)
        np.testing.assert_allclose(df.to_numpy(), df.to_numpy().T, atol=1e-12)
    assert sim["cosine"].loc["a", "a2"] == pytest.approx(1.0)
    assert sim["spearman"].loc["a", "a_sq"] == pytest.approx(1.0)
    assert sim["jaccard_topk"].loc["a", "a_sq"] == pytest.approx(1.0)
    assert sim["spearman"].loc["a", "b"] == pytest.approx(correlation(a, maps["b"], "spearman"))
    # top-3 sets {0,1,2} vs {1,2,3}: |∩| = 2, |∪| = 4
    x = torch.tensor([[4.0, 3.0, 2.0, 0.0]])
    y = torch.tensor([[0.0, 3.0, 2.0, 4.0]])
    assert P.alpha_similarity({"x": x, "y": y}, k=3)["jaccard_topk"].loc["x", "y"] == 0.5


def test_alpha_similarity_takes_adapters(model, three):
    _, adapters = three
    sim = P.alpha_similarity(adapters, k=4)
    np.testing.assert_allclose(np.diag(sim["cosine"].to_numpy()), 1.0)  # set to exactly 1


def _sym(rng, names):
    x = rng.random((len(names), len(names)))
    s = (x + x.T) / 2
    np.fill_diagonal(s, 1.0)
    return pd.DataFrame(s, index=names, columns=names)


def test_transfer_similarity_correlation():
    rng = np.random.default_rng(0)
    names = [f"t{i}" for i in range(7)]
    sim = _sym(rng, names)
    transfer = sim**2  # monotone in similarity
    res = P.transfer_similarity_correlation(sim, transfer, n_perm=200, seed=0)
    # float64 rank correlations, exactly 1 in exact arithmetic: approx's default rel 1e-6
    assert res["rho"] == pytest.approx(1.0)
    assert res["n_pairs"] == 7 * 6 and res["n_tasks"] == 7
    assert res["p_value"] < 0.05
    # long inter_task format
    long = pd.DataFrame(
        [{"source_task": a, "target_task": b, "mode": "alpha", "accuracy": transfer.loc[a, b],
          "zero_shot": 0.0} for a in names for b in names]
    )
    res2 = P.transfer_similarity_correlation(sim, long, n_perm=50)
    assert res2["rho"] == pytest.approx(1.0)
    unrelated = P.transfer_similarity_correlation(sim, _sym(np.random.default_rng(1), names),
                                                  n_perm=200)
    assert unrelated["p_value"] > 0.01 and abs(unrelated["rho"]) < 0.9
    a = P.transfer_similarity_correlation(sim, transfer, n_perm=100, seed=5)
    assert a == P.transfer_similarity_correlation(sim, transfer, n_perm=100, seed=5)


def test_within_between():
    names = ["english_french", "english_german", "first_letter", "last_letter"]
    m = pd.DataFrame(0.1, index=names, columns=names)
    m.loc["english_french", "english_german"] = m.loc["english_german", "english_french"] = 0.9
    m.loc["first_letter", "last_letter"] = m.loc["last_letter", "first_letter"] = 0.7
    res = P.within_between(m)
    # float64 means of a few decimal literals (0.1, 0.7, 0.9 are not exact binary numbers): a few
    # ulp off the decimal answer; approx's default rel 1e-6 absorbs that, any wrong cell (>= 0.1
    # apart) does not
    assert res["within"] == pytest.approx(0.8) and res["between"] == pytest.approx(0.1)
    assert res["n_within"] == 4 and res["n_between"] == 8
    assert res["gap"] == pytest.approx(0.7)


def test_spearman_and_bootstrap():
    x = torch.arange(10.0)
    # float64 rank correlations, exactly ±1 in exact arithmetic: approx's default rel 1e-6
    assert correlation(x, x**3, "spearman") == pytest.approx(1.0)
    assert correlation(x, -x, "spearman") == pytest.approx(-1.0)
    assert np.isnan(correlation(x, torch.ones(10), "spearman"))
    v = np.array([[1, 0, 1, 1, 0, 1, 1, 1], [0, 0, 0, 0, 0, 0, 0, 1]], dtype=float)
    lo, hi = bootstrap_ci(v, n_boot=500, seed=1)
    lo2, hi2 = bootstrap_ci(v, n_boot=500, seed=1)
    assert np.array_equal(lo, lo2) and np.array_equal(hi, hi2)  # exact: same seed, same ops
    assert (lo <= v.mean(1)).all() and (v.mean(1) <= hi).all()
    assert np.isnan(bootstrap_ci(v, n_boot=0)[0]).all()


# ----------------------------------------------------------------------------------------------
# per-head causal effects


def test_batched_head_effects_equal_serial_loop(model, task, adapter):
    kw = dict(n_prompts=3, n_shots=3, seed=1, embedding=adapter.embedding)
    batched, sb = P.head_causal_effects(model, task, batched=True, batch_size=5,
                                        return_stats=True, **kw)
    serial, ss = P.head_causal_effects(model, task, batched=False, return_stats=True, **kw)
    assert batched.shape == (model.cfg.n_layers, model.cfg.n_heads)
    # Effects are differences of two mean probabilities (patched − unpatched), cached batched rows
    # vs full passes: prob_tolerance at the corrupted prompts' logit scale, for the probability
    # mass of both terms (2·baseline + |effect|). Measured: at most 0.02 of the bound; weights on
    # the wrong rows exceed it 6,000-14,000 times (test_mutations.py).
    prompts, _ = P.corrupted_prompts(model, task, n_prompts=3, n_shots=3, seed=1)
    scale = _scale(model, prompts, adapter)
    mass = 2 * sb["baseline_prob"] + float(serial.abs().max())
    assert_probs_close(batched, serial, model, scale=scale, mass=mass,
                       what="head effects, batched vs serial")
    assert batched.abs().max() > 0
    assert sb["mode"] == "batched" and ss["mode"] == "serial"
    assert ss["forward_passes"] == model.cfg.n_layers * model.cfg.n_heads + 1
    assert sb["forward_passes"] < ss["forward_passes"]
    assert sb["seconds"] > 0 and ss["seconds"] > 0
    assert_probs_close(sb["baseline_prob"], ss["baseline_prob"], model, scale=scale,
                       what="baseline answer prob, batched vs serial")
    # The same float32 differences averaged over the same prompts, only the tensor's shape
    # differs ([n, L, H] vs [n, L·H]): the default float32 tolerances (rtol 1.3e-6, atol 1e-5)
    # exceed the n·u rounding of a 3-term mean.
    torch.testing.assert_close(sb["per_prompt"].mean(0), batched)
    # the batch size does not change the result (other batch shapes: the same bound)
    again = P.head_causal_effects(model, task, batch_size=64, **kw)
    assert_probs_close(again, batched, model, scale=scale, mass=mass,
                       what="head effects, batch size 64 vs 5")


def test_cache_selections_are_memory_bounded(model, task, adapter, monkeypatch):
    from sitelens.models import BridgeKVCache, RecomputeCache, cache_rows_per_batch, prefix_cache

    enc = encode(model, ["Q: a b c d e f\nA:", "Q: x\nA:"])
    cache, _ = prefix_cache(model, enc)
    if isinstance(cache, RecomputeCache):  # a bridge that recomputes: nothing is copied
        assert cache_rows_per_batch(cache, 64, budget_bytes=1) == 64
        return
    pairs = (cache.kv() if isinstance(cache, BridgeKVCache)  # the bridge's HF cache
             else [(e.past_keys, e.past_values) for e in cache.entries])
    row = sum(2 * k[:1].numel() * k.element_size() for k, _ in pairs)
    assert cache_rows_per_batch(cache, 64, budget_bytes=10 * row) == 10
    assert cache_rows_per_batch(cache, 4, budget_bytes=10 * row) == 4  # batch_size caps it
    assert cache_rows_per_batch(cache, 64, budget_bytes=1) == 1  # one row always runs
    # effects do not depend on the bounded batches (3 rows per pass here)
    kw = dict(n_prompts=3, n_shots=3, seed=1, embedding=adapter.embedding)
    full, stats = P.head_causal_effects(model, task, batch_size=64, return_stats=True, **kw)
    calls = []

    def three_rows(cache, batch_size, **_):
        calls.append(batch_size)
        return 3

    monkeypatch.setattr(P.engine, "cache_rows_per_batch", three_rows)
    bounded = P.head_causal_effects(model, task, batch_size=64, **kw)
    assert calls == [64]
    # other batch shapes only: prob_tolerance for both terms' probability mass (see above)
    prompts, _ = P.corrupted_prompts(model, task, n_prompts=3, n_shots=3, seed=1)
    assert_probs_close(bounded, full, model, scale=_scale(model, prompts, adapter),
                       mass=2 * stats["baseline_prob"] + float(full.abs().max()),
                       what="head effects, 3 cache rows per pass vs all")


def test_head_effect_matches_hand_written_hook(model, task, adapter):
    """One head's effect from an independent hook: z[:, -1, h] <- mean activation at layer l."""
    layer, head = 1, 2
    effects = P.head_causal_effects(model, task, n_prompts=3, n_shots=3, seed=2,
                                    embedding=adapter.embedding)
    prompts, answers = P.corrupted_prompts(model, task, n_prompts=3, n_shots=3, seed=2)
    enc = encode(model, prompts)
    ans = torch.tensor(answers)

    def fn(z, hook):
        z = z.clone()
        z[:, -1, head] = adapter.embedding[layer, head]
        return z

    with torch.no_grad():
        base = model(enc.tokens, attention_mask=enc.attention_mask)[:, -1].softmax(-1)
        with model.hooks(fwd_hooks=[(z_hook_name(model, layer), fn)]):
            patched = model(enc.tokens, attention_mask=enc.attention_mask)[:, -1].softmax(-1)
    p_patched, p_base = patched.gather(1, ans[:, None]), base.gather(1, ans[:, None])
    ref = (p_patched - p_base).mean()
    # a difference of two mean probabilities, batched cached rows vs full passes: prob_tolerance
    # for the mass of both terms; patching the next layer's head instead exceeds it 9,000-11,000
    # times (test_mutations.py)
    assert_probs_close(effects[layer, head], ref, model, mass=float(p_patched.mean() + p_base.mean()),
                       scale=_scale(model, prompts, adapter), what=f"effect of L{layer}H{head}")


def test_corrupted_prompts_are_shuffled_and_seeded(model, task):
    p1, a1 = P.corrupted_prompts(model, task, n_prompts=4, n_shots=3, seed=0)
    p2, a2 = P.corrupted_prompts(model, task, n_prompts=4, n_shots=3, seed=0)
    assert p1 == p2 and a1 == a2 and len(p1) == 4
    pairs = {(ex.input, ex.output) for ex in task.train}
    shots = [blk for p in p1 for blk in p.split("\n\n")[:-1]]
    demo_pairs = [tuple(s[len("Q: "):].split("\nA: ")) for s in shots]
    assert any(pair not in pairs for pair in demo_pairs)  # labels were permuted


def test_head_effects_default_embedding_is_seeded(model, task):
    a = P.head_causal_effects(model, task, n_prompts=2, n_shots=2, n_mean_prompts=3, seed=0)
    b = P.head_causal_effects(model, task, n_prompts=2, n_shots=2, n_mean_prompts=3, seed=0)
    assert torch.equal(a, b)  # exact: the same seeded computation twice
    with pytest.raises(AdapterError):
        P.head_causal_effects(model, task, n_prompts=2, n_shots=2, embedding=torch.zeros(1, 1, 1))


def test_effect_alpha_correlation():
    e = torch.tensor([[0.1, 0.5], [0.3, -0.2]])
    # rank correlations, exactly ±1 in exact arithmetic: approx's default rel 1e-6
    assert P.effect_alpha_correlation(e, torch.sigmoid(e)) == pytest.approx(1.0)
    assert P.effect_alpha_correlation(e, -e) == pytest.approx(-1.0)
    with pytest.raises(ValueError):
        P.effect_alpha_correlation(e, torch.zeros(3, 2))


@pytest.mark.parametrize("batched", [True, False], ids=["batched", "serial"])
def test_head_effects_count_real_forward_passes(model, task, adapter, batched, monkeypatch):
    calls = []
    forward = model.forward

    def counted(*args, **kwargs):  # observed independently of the count's pre-hook
        calls.append(1)
        return forward(*args, **kwargs)

    ran = []  # the rows of every pass's logits: last-token rows batched, whole prompts serial

    def observed(fn):
        def run(*args, **kwargs):
            out = fn(*args, **kwargs)
            ran.append(out.shape[0])
            return out
        return run

    monkeypatch.setattr(model, "forward", counted)
    monkeypatch.setattr(engine, "last_token_forward", observed(engine.last_token_forward))
    monkeypatch.setattr(engine, "last_logits", observed(engine.last_logits))
    _, st = P.head_causal_effects(model, task, n_prompts=3, n_shots=3, seed=1, batched=batched,
                                  batch_size=5, embedding=adapter.embedding, return_stats=True)
    monkeypatch.undo()
    assert len(calls) > 0
    assert st["forward_passes"] == len(calls)
    n_rows = 3 * (model.cfg.n_layers * model.cfg.n_heads + 1)
    # counted as run, and every (prompt, condition) ran
    assert st["rows"] == sum(ran) == n_rows, (
        "effect rows: counted, run, wanted", st["rows"], sum(ran), n_rows)
    if batched:  # one pass per 5 rows, plus the prefix cache's (none on a bridge: it recomputes)
        assert st["forward_passes"] >= -(-n_rows // 5)
    else:  # one full pass per head plus the unpatched one (3 prompts fit one chunk)
        assert st["forward_passes"] == model.cfg.n_layers * model.cfg.n_heads + 1
