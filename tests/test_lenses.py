"""Unit tests of the head-importance lenses (sitelens.lenses) on tiny random models.

Tolerances: exact identities (AtP on a model linear in the patched head, DLA summing to the direct
effect) are compared with bounds from tests/tolerances.py (float32 rounding of a forward pass at
the reference's scale); the finite-difference check runs in float64, where rounding is ~1e-16 and
the central difference's truncation error is ε²/6·|f'''| with ε = 1e-4 (~1e-9 for these
logits), so a 1e-6 relative bound is 1000× the expected error and still far below a wrong
gradient (a wrong target or sign changes it by O(1))."""

import json
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import torch
from tolerances import assert_logits_close, assert_probs_close, assert_within, logit_scale

from sitelens import FitConfig, fit_site, load_task
from sitelens.errors import LensError, OutputError
from sitelens.lazy import resolve
from sitelens.lenses import (
    ALIASES,
    LENSES,
    REGISTRY,
    AblationConfig,
    AttributionConfig,
    HeadScores,
    alpha_gradient,
    alpha_over_seeds,
    attribution_patching,
    available_lenses,
    direct_logit_attribution,
    exact_effects,
    get_lens,
    head_ablation,
    head_logit_lens,
    head_scores,
    mix_gradients,
    parse_lenses,
    rank_stability,
)
from sitelens.models import has_hooked_transformer
from sitelens.site import task_embedding
from sitelens.site.injection import HeadMix
from sitelens.site.training import LastTokenSet
from sitelens.tasks import zero_shot_prompts
from sitelens.testing import tiny_model

hooked_only = pytest.mark.skipif(
    not has_hooked_transformer(),
    reason="needs HookedTransformer (attention-only / norm-free / float64 tiny models); "
           "TransformerLens 4 has only the bridge",
)

SMALL = AttributionConfig(n_prompts=4, n_shots=2, n_mean_prompts=4, n_boot=50, n_alpha_items=6)


@pytest.fixture(scope="module")
def task():
    return load_task("antonym")


def _zero_shot_set(model, task, n=5):
    return LastTokenSet.build(model, task.train[:n])


# ----------------------------------------------------------------------------------------------
# HeadScores


def test_head_scores_roundtrip_top_and_groups(tmp_path):
    m = torch.arange(12, dtype=torch.float32).reshape(3, 4)  # [n_layers, n_heads]
    s = HeadScores.from_map(m, model="m", task="t", lens="x", ci_low=m - 1, ci_high=m + 1,
                            forward_passes=2, backward_passes=1, seconds=0.5, meta={"a": 1})
    assert len(s) == 12 and s.shape == (3, 4)
    assert torch.equal(s.map(), m) and torch.equal(s.map(column="ci_low"), m - 1)
    assert s.top(2) == [(2, 3, 11.0), (2, 2, 10.0)]
    g = s.by_kv_group(2)  # query heads 0,1 -> group 0; 2,3 -> group 1
    assert g.loc[(g.layer == 1) & (g.kv_group == 1), "score"].item() == 6 + 7
    assert g.loc[(g.layer == 0) & (g.kv_group == 0), "score"].item() == 0 + 1
    path = s.to_csv(tmp_path / "s.csv")
    back = HeadScores.read_csv(path)
    assert torch.equal(back.map(), m) and json.loads(back.df.meta[0]) == {"a": 1}
    both = HeadScores.concat([s, HeadScores.from_map(-m, model="m", task="t", lens="y")])
    assert both.lenses == ["x", "y"] and torch.equal(both.map("y"), -m)
    with pytest.raises(ValueError, match="Name the lens"):
        both.map()
    with pytest.raises(ValueError, match="does not divide"):
        s.by_kv_group(3)
    pd.DataFrame({"a": [1]}).to_csv(tmp_path / "bad.csv")
    with pytest.raises(OutputError, match="not a HeadScores table"):
        HeadScores.read_csv(tmp_path / "bad.csv")


def test_parse_lenses():
    assert parse_lenses(["atp", "ablation"]) == ["atp", "ablation-mean", "ablation-zero"]
    with pytest.raises(ValueError, match="Unknown lens 'atq'"):
        parse_lenses(["atq"])


def test_registry_is_the_one_list_of_lenses():
    """Every lens head_scores and `sitelens heads --lenses` accept is in the registry, once."""
    assert available_lenses() == list(REGISTRY) == list(LENSES)
    assert LENSES == ("alpha", "alpha-grad", "atp", "atp-star", "ablation-mean", "ablation-zero",
                      "effect", "dla")
    for name in LENSES:
        lens = get_lens(name)
        assert lens.name == name and lens is REGISTRY[name] and callable(resolve(lens.impl))
    assert all(set(names) <= set(LENSES) for names in ALIASES.values())
    assert [n for n in LENSES if REGISTRY[n].needs_adapter] == ["dla"]


@pytest.mark.parametrize("typo, closest", [("atq", "atp"), ("alpha_grad", "alpha-grad"),
                                           ("effects", "effect"), ("ablation-max", "ablation-mean")])
def test_unknown_lens_names_the_closest(typo, closest):
    with pytest.raises(LensError, match=f"Unknown lens '{typo}'.*Did you mean: {closest}"):
        get_lens(typo)
    with pytest.raises(LensError, match=f"Did you mean: {closest}"):
        parse_lenses(["alpha", typo])
    with pytest.raises(LensError, match="Unknown lens"):
        get_lens(["unhashable"])
    with pytest.raises(LensError, match="stands for several lenses"):
        get_lens("ablation")


@pytest.mark.parametrize("name", [*LENSES, *ALIASES])
def test_cli_accepts_every_registered_lens(name):
    """The CLI's --lenses check (the parser's type) accepts every registry name and alias."""
    from sitelens.cli.parser import build_parser

    args = build_parser().parse_args(["heads", "--model", "tiny-random", "--task", "antonym",
                                      "--lenses", name, "--out", "x.csv"])
    assert parse_lenses(args.lenses.split(",")) == list(ALIASES.get(name, (name,)))


# ----------------------------------------------------------------------------------------------
# gradient lenses


@hooked_only
def test_mix_gradient_equals_central_finite_difference(task):
    """∂ log p / ∂w[l, h] at w = 0 (the α-gradient) against (f(+ε) − f(−ε)) / 2ε, per prompt and
    head, in float64 on a two-layer model with MLPs and norms (a fully nonlinear path)."""
    model = tiny_model(n_layers=2, n_heads=4, d_head=8, seed=1, dtype=torch.float64, backend="hooked")
    t = task_embedding(model, task, n_prompts=4, n_shots=2).double() * 3  # [L, H, d_head]
    data = _zero_shot_set(model, task)
    g = mix_gradients(model, data, t, metric="logprob")[0].double()  # [n, L, H]
    L, H = model.cfg.n_layers, model.cfg.n_heads
    eps = 1e-4
    fd = torch.empty_like(g)
    for j in range(L * H):
        w = torch.zeros(L * H, dtype=torch.float64)
        w[j] = eps
        f = []
        for sign in (1, -1):
            mix = HeadMix(weights=(sign * w).reshape(L, H), targets=t)
            with torch.no_grad():
                logits = data.logits(model, mix.hooks(model))  # [n, d_vocab]
            f.append(torch.log_softmax(logits, -1).gather(1, data.answers[:, None])[:, 0])
        fd[:, j // H, j % H] = (f[0] - f[1]) / (2 * eps)
    scale = float(fd.abs().max())
    assert scale > 1e-3  # the check is not vacuous
    assert_within(g, fd, 1e-6 * scale, what="mix gradient vs central difference", scale=scale)
    # a wrong target (the gradient toward 0 instead of t) is caught
    wrong = mix_gradients(model, data, torch.zeros_like(t), metric="logprob")[0].double()
    assert (wrong - fd).abs().max() > 100 * 1e-6 * scale


@hooked_only
def test_atp_equals_exact_patching_on_a_model_linear_in_the_head(task):
    """One attention-only layer without norms: the answer logit is linear in each head's
    last-token z (z → W_O → residual → W_U), so the first-order estimate is exact: AtP of the
    logit equals the logit change of patching that head alone."""
    model = tiny_model(n_layers=1, n_heads=4, d_head=8, seed=2, attn_only=True,
                       normalization=None, backend="hooked")
    t = torch.randn(1, 4, 8, generator=torch.Generator().manual_seed(0))  # [L, H, d_head]
    data = _zero_shot_set(model, task)
    atp = mix_gradients(model, data, t, metric="logit")[0]  # [n, 1, H]
    with torch.no_grad():
        base = data.logits(model, []).gather(1, data.answers[:, None])[:, 0]  # [n]
        exact = []
        for h in range(4):
            w = torch.zeros(1, 4)
            w[0, h] = 1
            lg = data.logits(model, HeadMix(weights=w, targets=t).hooks(model))
            exact.append(lg.gather(1, data.answers[:, None])[:, 0] - base)
    exact = torch.stack(exact, 1)[:, None]  # [n, 1, H]
    assert float(exact.abs().max()) > 1e-3
    assert_logits_close(atp, exact, model, what="AtP vs exact patching (linear model)", depth=1)
    # on a nonlinear model (norms, MLPs, softmax metric) they differ: the test can fail
    nonlin = tiny_model(n_layers=2, n_heads=4, d_head=8, seed=2, backend="hooked")
    d2 = _zero_shot_set(nonlin, task)
    t2 = torch.randn(2, 4, 8, generator=torch.Generator().manual_seed(0)) * 5
    g2 = mix_gradients(nonlin, d2, t2, metric="logprob")[0]
    with torch.no_grad():
        w = torch.zeros(2, 4)
        w[1, 0] = 1
        lp = torch.log_softmax(d2.logits(nonlin, HeadMix(weights=w, targets=t2).hooks(nonlin)), -1)
        lp0 = torch.log_softmax(d2.logits(nonlin, []), -1)
    ex = (lp - lp0).gather(1, d2.answers[:, None])[:, 0]
    assert (g2[:, 1, 0] - ex).abs().max() > 1e-4


def _dropped_prob_gradients(model, data, t, drop: int | None):
    """∂P(answer)/∂w[l, h] at w = 0 per prompt, the gradient through layer ``drop``'s residual
    writes cut: written here from hooks and autograd, independently of mix_gradients."""
    from sitelens.models import act_name

    L, H = model.cfg.n_layers, model.cfg.n_heads
    w = torch.zeros(len(data), L, H, requires_grad=True)  # [n, L, H]
    hooks = HeadMix(weights=w, targets=t).hooks(model)
    if drop is not None:
        hooks += [(act_name(k, drop, model), lambda x, hook=None: x.detach())
                  for k in ("attn_out", "mlp_out")]
    with torch.enable_grad():
        p = torch.softmax(data.logits(model, hooks), -1).gather(1, data.answers[:, None])[:, 0]
        (g,) = torch.autograd.grad(p.sum(), w)
    return g  # [n, L, H]


def test_grad_drop_zeroes_own_layer_and_atp_star_formula(tiny_mha, task):
    from sitelens.patching import corrupted_prompts

    t = task_embedding(tiny_mha, task, n_prompts=4, n_shots=2)
    data = _zero_shot_set(tiny_mha, task)
    g = mix_gradients(tiny_mha, data, t, metric="prob", drop_layers=[None, 0, 1])  # [3, n, L, H]
    assert torch.all(g[1, :, 0] == 0) and torch.all(g[2, :, 1] == 0)  # own layer dropped
    # the last layer's heads write straight to the logits: dropping layer 0 leaves them alone
    assert torch.equal(g[1, :, 1], g[0, :, 1])
    assert not torch.equal(g[1, :, 0], g[0, :, 0])  # ... and layer 0's heads lose their paths

    # AtP* = sign(AtP) · (1/(L − 1)) Σ_ℓ |AtP with layer ℓ's writes cut|, recomputed from hooks
    cfg = replace(SMALL, grad_batch_size=3)  # 4 prompts: 2 batches
    s = attribution_patching(tiny_mha, task, t, cfg, grad_drop=True)
    p = attribution_patching(tiny_mha, task, t, cfg)
    prompts, answers = corrupted_prompts(tiny_mha, task, n_prompts=cfg.n_prompts, n_shots=cfg.n_shots,
                                         split=cfg.split, seed=cfg.seed, template=cfg.template)
    cset = LastTokenSet.from_prompts(tiny_mha, prompts, answers)
    L = tiny_mha.cfg.n_layers
    plain = _dropped_prob_gradients(tiny_mha, cset, t, None).mean(0)  # [L, H]
    cut = torch.stack([_dropped_prob_gradients(tiny_mha, cset, t, ell).mean(0) for ell in range(L)])
    star = torch.sign(plain) * cut.abs().sum(0) / (L - 1)  # [L, H]
    scale = float(plain.abs().max())
    assert scale > 1e-6 and not torch.allclose(star.abs(), plain.abs(), atol=1e-3 * scale)
    assert_within(p.map(), plain, 1e-4 * scale, what="AtP vs hook gradients", scale=scale)
    assert_within(s.map(), star, 1e-4 * scale, what="AtP* vs its formula", scale=scale)
    # costs counted by hooks: one backward per batch, L + 1 of them per batch with GradDrop
    counted = (int(p.df.backward_passes[0]), int(s.df.backward_passes[0]))
    assert counted == (2, 2 * (L + 1)), f"backward passes counted: {counted}"


def test_atp_costs_at_most_three_passes_per_batch(tiny, task):
    # on the bridge backend the first forward of a model probes, once per model, how the Hugging
    # Face KV cache is driven (two extra passes, counted by the same hook): a one-time set-up cost,
    # not the lens's, so the model is warmed first
    attribution_patching(tiny, task, None, SMALL)
    s = attribution_patching(tiny, task, None, SMALL)
    assert len(s) == tiny.cfg.n_layers * tiny.cfg.n_heads
    # one prefix pass + one last-token forward, one backward (all prompts in one batch)
    assert s.df.forward_passes[0] + s.df.backward_passes[0] <= 3
    assert (s.df.ci_low <= s.df.score + 1e-12).all() and (s.df.score <= s.df.ci_high + 1e-12).all()


def test_alpha_gradient_sign_matches_the_fitted_direction(tiny_mha, task):
    """The α-gradient is −∂CE/∂α at α = 0: one small step of α along it lowers the loss."""
    t = task_embedding(tiny_mha, task, n_prompts=4, n_shots=2)
    s = alpha_gradient(tiny_mha, task, t, SMALL)
    g = s.map()  # [L, H]
    data = LastTokenSet.build(tiny_mha, task.train[: SMALL.n_alpha_items])

    def ce(alpha):
        with torch.no_grad():
            lg = data.logits(tiny_mha, HeadMix(weights=alpha, targets=t).hooks(tiny_mha))
        return float(torch.nn.functional.cross_entropy(lg, data.answers))

    step = 1e-2 * g / g.abs().max()
    assert ce(step.clamp(min=0)) < ce(torch.zeros_like(g))


# ----------------------------------------------------------------------------------------------
# ablation, effect, DLA


def test_ablation_batched_equals_serial_loop(tiny, task):
    cfg = AblationConfig(n_prompts=3, n_shots=2, n_boot=20)
    scale = logit_scale(tiny, ["a:b\nc:"])
    for ref in ("mean", "zero"):
        a, pa = head_ablation(tiny, task, cfg, reference=ref, return_per_prompt=True)
        b, pb = head_ablation(tiny, task, cfg, reference=ref, return_per_prompt=True, batched=False)
        assert a.lenses == [f"ablation-{ref}"]
        # differences of two probabilities each ≤ the clean one: mass = 2·max p
        mass = 2 * float(json.loads(a.df.meta[0])["baseline_prob"]) + float(pa.abs().max())
        assert_probs_close(pa, pb, tiny, what=f"ablation-{ref} batched vs serial",
                           scale=max(scale, 1.0), mass=mass)
        assert float(pa.abs().max()) > 0  # ablating a head changes something


def test_exact_effects_lens_measures_each_heads_patch(tiny_mha, task):
    """The ``effect`` lens of head (l, h) is P(answer | z[l, h] ← t[l, h] at the last token) −
    P(answer) on the corrupted prompts, averaged over prompts: recomputed here for two heads with
    a full forward pass each (no prefix cache, no batching of heads), and its interval holds it."""
    from sitelens.patching import corrupted_prompts

    t = task_embedding(tiny_mha, task, n_prompts=4, n_shots=2)
    prompts, answers = corrupted_prompts(tiny_mha, task, n_prompts=SMALL.n_prompts, n_shots=SMALL.n_shots,
                                         split=SMALL.split, seed=SMALL.seed, template=SMALL.template)
    data = LastTokenSet.from_prompts(tiny_mha, prompts, answers)
    L, H = tiny_mha.cfg.n_layers, tiny_mha.cfg.n_heads

    def prob(w):
        with torch.no_grad():
            lg = data.logits(tiny_mha, HeadMix(weights=w, targets=t).hooks(tiny_mha) if w is not None else [])
        return torch.softmax(lg, -1).gather(1, data.answers[:, None])[:, 0]  # [n]

    base = prob(None)  # (on the bridge, the first forward of a model also probes its KV cache)
    s = exact_effects(tiny_mha, task, t, SMALL)
    scale = logit_scale(tiny_mha, ["a:b\nc:"])
    for layer, head in ((0, 1), (L - 1, H - 1)):
        w = torch.zeros(L, H)
        w[layer, head] = 1
        want = (prob(w) - base).mean()
        assert_probs_close(s.map()[layer, head], want, tiny_mha, what=f"effect lens L{layer}H{head}",
                           scale=max(scale, 1.0), mass=2 * float(base.max()))
    assert float(s.map().abs().max()) > 1e-6  # patching a head changes something
    assert (s.df.ci_low <= s.df.score + 1e-12).all() and (s.df.score <= s.df.ci_high + 1e-12).all()
    # one prefix pass and one batch of (1 + L·H) × n single-token rows at this size, counted
    assert s.df.forward_passes[0] == 2


@hooked_only
def test_dla_sums_to_the_direct_effect_of_the_injection(task):
    """One attention-only layer with an RMS final norm: the injection changes the final residual
    stream only through the heads' writes, so Σ_heads DLA equals the change of the final residual
    stream, through the injected run's frozen final-norm scale, read by W_U at the answer."""
    model = tiny_model(n_layers=1, n_heads=4, d_head=8, n_key_value_heads=2, seed=3,
                       attn_only=True, backend="hooked")
    ad = fit_site(model, task, n_prompts=4, n_shots=2, config=FitConfig(n_examples=8))
    ad.alpha = torch.full_like(ad.alpha, 0.7)
    s, per = direct_logit_attribution(model, task, ad, limit=6, n_boot=20, return_per_item=True)
    items = task.test[:6]
    prompts = zero_shot_prompts(model, items, ad.template)
    data = LastTokenSet.build(model, items, ad.template)
    caches = {}
    for name, hooks in (("clean", []), ("inj", ad.mix().hooks(model))):
        store = {}

        def grab(key, store=store):
            def fn(x, hook=None):
                store[key] = x[:, -1].detach()
            return fn

        with torch.no_grad():
            data.logits(model, hooks + [("ln_final.hook_scale", grab("scale")),
                                        ("blocks.0.hook_resid_post", grab("resid"))])
        caches[name] = store
    d_resid = caches["inj"]["resid"] - caches["clean"]["resid"]  # [n, d_model]
    direct = ((d_resid / caches["inj"]["scale"]) @ model.W_U)  # [n, d_vocab]
    direct = direct.gather(1, data.answers[:, None])[:, 0]  # [n]
    assert len(prompts) == 6 and float(direct.abs().max()) > 1e-3
    assert_logits_close(per.sum((1, 2)), direct, model, what="Σ DLA vs direct effect", depth=1)
    # a DLA that forgot α (the whole write t − z) would not sum to it
    assert (per.sum((1, 2)) / 0.7 - direct).abs().max() > 1e-3
    lens = head_logit_lens(model, ad.embedding, k=3)
    assert len(lens) == 1 * 4 * 3 and set(lens["rank"]) == {0, 1, 2}


# ----------------------------------------------------------------------------------------------
# α over seeds and the driver


def test_alpha_over_seeds_matches_single_fits_and_reports_stability(tiny_mha, task):
    """Each seed's α is the single fit of that seed; the score and its pairwise stability are
    recomputed from those independent fits (mean, t-interval, scipy's Spearman)."""
    from scipy import stats

    # 16 examples (2 steps): on the random tiny model a fit of 8 can keep its initial α (no step
    # improves validation), and constant α has no rank correlation to check
    cfg = FitConfig(n_examples=16)
    run = alpha_over_seeds(tiny_mha, task, seeds=(0, 1, 2), config=cfg, n_prompts=4, n_shots=2)
    fits = torch.stack([fit_site(tiny_mha, task, n_prompts=4, n_shots=2,
                                 config=FitConfig(n_examples=16, seed=s)).alpha.float() for s in (0, 1, 2)])
    assert not torch.equal(fits[0], fits[1])  # the seeds differ, so the check below can fail
    assert torch.equal(run.alphas, fits), "alpha_over_seeds: the α of each seed is not its single fit"
    assert torch.allclose(run.scores.map(), fits.mean(0))  # a mean of 3: float32 rounding
    x = fits.double().numpy()
    half = stats.t.ppf(0.975, 2) * x.std(0, ddof=1) / np.sqrt(3)
    lo, hi = run.scores.map(column="ci_low"), run.scores.map(column="ci_high")
    assert np.allclose(lo, np.clip(x.mean(0) - half, 0, 1), atol=1e-6)
    assert np.allclose(hi, np.clip(x.mean(0) + half, 0, 1), atol=1e-6)
    want = [stats.spearmanr(x[i].ravel(), x[j].ravel())[0] for i, j in ((0, 1), (0, 2), (1, 2))]
    assert run.stability.spearman.to_numpy() == pytest.approx(want, abs=1e-9)
    st = rank_stability([torch.arange(6.0).reshape(2, 3)] * 2, k=2)
    assert st.spearman[0] == pytest.approx(1.0) and st.top2_jaccard[0] == 1.0
    assert torch.equal(run.uncertain(), (lo <= 0.5) & (hi >= 0.5))


def test_head_scores_runs_every_lens_with_shared_inputs(tiny_mha, task):
    run = head_scores(
        tiny_mha, task, seeds=(0, 1), fit_config=FitConfig(n_examples=8), attribution=SMALL,
        ablation=AblationConfig(n_prompts=3, n_shots=2, n_boot=20),
        lenses=["alpha", "alpha-grad", "atp", "effect", "ablation"],
    )
    s = run.scores
    assert s.lenses == ["alpha", "alpha-grad", "atp", "effect", "ablation-mean", "ablation-zero"]
    n = tiny_mha.cfg.n_layers * tiny_mha.cfg.n_heads
    assert (s.df.groupby("lens").size() == n).all()
    assert np.isfinite(s.df.score).all()
    # the shared inputs: α of each seed's fit, and atp / effect on the first fit's embedding
    emb = fit_site(tiny_mha, task, n_prompts=SMALL.n_mean_prompts, n_shots=SMALL.n_shots,
                   config=FitConfig(n_examples=8, seed=0)).embedding
    assert torch.equal(run.embedding, emb)
    off = "head_scores: {} is not on the first fit's embedding"
    atp, effect = attribution_patching(tiny_mha, task, emb, SMALL), exact_effects(tiny_mha, task, emb, SMALL)
    assert torch.equal(s.map("atp"), atp.map()), off.format("atp")
    assert torch.equal(s.map("effect"), effect.map()), off.format("effect")
    other = task_embedding(tiny_mha, task, n_prompts=SMALL.n_mean_prompts, n_shots=SMALL.n_shots, seed=7)
    assert not torch.equal(s.map("atp"), attribution_patching(tiny_mha, task, other, SMALL).map())


# ----------------------------------------------------------------------------------------------
# comparing lenses, plots


def test_certify_top_k_logic():
    from sitelens.lenses.compare import certify_top_k

    exact = np.arange(100, dtype=float)[::-1].copy()  # head 0 best
    calls = []

    def exact_of(idx):
        calls.append(list(idx))
        return exact[np.asarray(idx)]

    good = certify_top_k(exact + 0.01, exact_of, k=10, budget=0.3)
    assert good["certified"] and good["rounds"] == 1 and sorted(good["top"]) == list(range(10))
    # a fast lens that ranks the true top-10 last never certifies within the budget
    calls.clear()
    bad = certify_top_k(-exact, exact_of, k=10, budget=0.3, step=5)
    assert not bad["certified"] and len(bad["verified"]) == 30 and not set(bad["top"]) & set(range(10))
    assert [len(c) for c in calls] == [10, 5, 5, 5, 5]  # k first, then step at a time
    # errors proportional to the effect: the relative rule certifies where the absolute one,
    # bounding every head by the largest absolute residual, cannot
    decay = 0.7 ** np.arange(100)  # effects spread over orders of magnitude

    def decay_of(idx):
        return decay[np.asarray(idx)]

    prop = decay * (1 + 0.1 * (-1) ** np.arange(100))  # ±10% error
    assert certify_top_k(prop, decay_of, k=10, budget=0.3, rule="relative")["certified"]
    assert not certify_top_k(prop, decay_of, k=10, budget=0.3, rule="absolute")["certified"]
    with pytest.raises(ValueError, match="rule"):
        certify_top_k(prop, decay_of, rule="loose")


def test_certified_top_k_verifies_with_exact_values(tiny_mha, task):
    from sitelens.lenses.compare import certified_top_k

    emb = task_embedding(tiny_mha, task, n_prompts=4, n_shots=2)
    fast = attribution_patching(tiny_mha, task, emb, SMALL)
    full = exact_effects(tiny_mha, task, emb, SMALL).map().flatten()
    out = certified_top_k(tiny_mha, task, fast, emb, SMALL, k=3, budget=0.5, step=1)
    # one unpatched row per prompt, then one per verified head and prompt, counted as run
    assert 3 <= len(out["verified"]) <= 4
    rows = (len(out["verified"]) + 1) * SMALL.n_prompts
    assert out["rows"] == rows, "certified_top_k: rows counted ≠ rows run"
    scale = logit_scale(tiny_mha, ["a:b\nc:"])
    assert_probs_close(torch.tensor(out["exact"]), full[out["verified"]], tiny_mha,
                       what="certified exact vs full exact", scale=max(scale, 1.0),
                       mass=2 * float(full.abs().max()) + 1e-3)


def test_fast_vs_exact_replays_certification_on_the_exact_run():
    from sitelens.lenses.compare import certify_top_k, fast_vs_exact

    exact = torch.arange(40, dtype=torch.float32).reshape(4, 10).flip(0)  # [n_layers, n_heads]
    meta = {"rows": 41 * 2, "n_prompts": 2}
    s = HeadScores.concat([
        HeadScores.from_map(exact, model="m", task="t", lens="effect", forward_passes=9, meta=meta),
        HeadScores.from_map(exact + 0.01, model="m", task="t", lens="atp", forward_passes=2),
        HeadScores.from_map(-exact, model="m", task="t", lens="alpha"),
    ])
    rows, cert = fast_vs_exact(s, k=3)
    r = rows.set_index("lens")
    assert r.loc["atp", "spearman"] == pytest.approx(1.0) and r.loc["atp", "top3_recall"] == 1.0
    assert r.loc["alpha", "top3_recall"] == 0.0 and r.loc["atp", "exact_rows"] == 82
    assert list(cert.rule) == ["absolute", "relative"] and cert.certified.all()
    flat = exact.flatten().numpy()
    want = certify_top_k(flat + 0.01, lambda idx: flat[idx], k=3, budget=5 / 40)
    assert cert.verified.iloc[0] == len(want["verified"])
    assert cert.rows.iloc[0] == (len(want["verified"]) + 1) * 2 and cert.recall.iloc[0] == 1.0


def test_lens_agreement_and_plots():
    from sitelens.lenses.compare import lens_agreement
    from sitelens.lenses.plots import agreement_matrix, alpha_uncertainty, lens_maps

    m = torch.rand(3, 4, generator=torch.Generator().manual_seed(0))
    s = HeadScores.concat([
        HeadScores.from_map(m, model="m", task="t", lens="a", ci_low=m - 0.1, ci_high=m + 0.1),
        HeadScores.from_map(2 * m + 1, model="m", task="t", lens="b"),
        HeadScores.from_map(-m, model="m", task="t", lens="c"),
    ])
    ag = lens_agreement(s, k=3)
    row = ag.set_index(["lens_a", "lens_b"])
    assert row.loc[("a", "b"), "spearman"] == pytest.approx(1.0)
    assert row.loc[("a", "b"), "top3_jaccard"] == 1.0
    assert row.loc[("a", "c"), "spearman"] == pytest.approx(-1.0)
    fig, frame = agreement_matrix(ag, ["a", "b", "c"])
    assert len(fig.data) == 1 and frame.shape[0] == 9
    assert len(lens_maps(s).data) == 3
    unc = alpha_uncertainty(s, lens="a")
    masked = np.asarray(unc.data[0].z, dtype=float)
    assert np.isnan(masked).sum() == int(((m - 0.1 <= 0.5) & (m + 0.1 >= 0.5)).sum())


def test_alpha_over_seeds_bootstrap_items_resamples_training_items(tiny_mha, task):
    """bootstrap_items: each seed trains on its own seeded resample of the training items, so the
    fits differ from the plain ones and repeat exactly."""
    cfg = FitConfig(n_examples=16)  # 2 steps: α moves on the random model
    plain = alpha_over_seeds(tiny_mha, task, seeds=(0,), config=cfg, n_prompts=4, n_shots=2)
    boot = alpha_over_seeds(tiny_mha, task, seeds=(0,), config=cfg, n_prompts=4, n_shots=2,
                            bootstrap_items=True)
    again = alpha_over_seeds(tiny_mha, task, seeds=(0,), config=cfg, n_prompts=4, n_shots=2,
                             bootstrap_items=True)
    assert not torch.equal(plain.alphas, boot.alphas)
    assert torch.equal(boot.alphas, again.alphas)
    assert json.loads(boot.scores.df.meta[0])["bootstrap_items"] is True
