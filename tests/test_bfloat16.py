"""bfloat16 on the CPU for every entry point: baselines, lenses, patching, atlas (issue 31, "Scaling
claims marked"). Stage 1, stage 2, evaluation and dNTP are in tests/test_devices.py.

Each entry point runs on the tiny random model cast to bfloat16 and is compared with the same
computation on its float32 twin (the same weights), with the same fitted inputs on both sides
(a float32 fit's intervention, adapter or embedding), so that the comparison sees only the
precision of the forward and backward passes. The bounds are the bfloat16 error model of
tests/tolerances.py (``low_*``: unit roundoff 2⁻⁸, about ``√depth · 2u`` relative after
``depth`` blocks, 3x for the largest of many elements), at the scale each quantity has:

- log-probabilities (baselines' interventions): :func:`low_logprob_bound` at the reference's
  largest |logit| ``S``, depth ``n_layers``;
- probabilities and their differences (patching's answer probabilities, causal effects, the
  ablation lens): :func:`low_prob_bound`, the log-prob bound times the probability mass compared;
- gradients (``alpha-grad``, ``atp``, ``atp-star``): :func:`low_activation_bound` at the score's
  own largest magnitude and depth ``2·n_layers`` (the forward pass through every block and the
  backward pass back down);
- a head's write read through the unembedding (``dla``, the atlas's promoted tokens): the
  embedding is float32 and exact on both sides, so only ``W_O``, the final norm's scale and
  ``W_U`` are rounded: depth 1 at the logits' scale.

Fits are compared where their result is a rounding-level function of the activations (validation
losses of the ``alpha`` lens); a trained method's parameters after a few Adam steps are not (Adam's
first steps are ±lr whatever the gradient's size), so a bfloat16 fit is checked to run, keep its
trained state in float32 and give finite log-probabilities. First-token accuracies are discrete (one
flipped argmax moves them by 1/n) and are not compared; the answer probabilities they come from are.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from conftest import BACKENDS
from tolerances import (
    assert_within,
    logit_scale,
    low_activation_bound,
    low_logprob_bound,
    low_prob_bound,
)

import sitelens as sl
from sitelens.baselines import (
    FV,
    I2CL,
    IA3,
    ICL,
    LTV,
    MTV,
    SITE,
    SV,
    TV,
    LoRA,
    LTVValid,
    ZeroShot,
    available_methods,
)
from sitelens.eval.evaluation import evaluate
from sitelens.eval.generation import last_logits
from sitelens.lenses import AblationConfig, AttributionConfig, available_lenses, head_scores
from sitelens.lenses.logit_lens import head_logit_lens
from sitelens.models import encode, fingerprint, has_hooked_transformer, load_model, weights_fingerprint
from sitelens.patching import head_causal_effects, inter_task, intra_task
from sitelens.site import FitConfig, fit_site, site_mix
from sitelens.tasks import zero_shot_prompt

BF16 = torch.bfloat16
SMALL = dict(n_prompts=4, n_shots=2, n_valid=8)
FIT = FitConfig(n_examples=16, batch_size=8, n_valid=8, eval_every=1)
# every method of available_methods(), at sizes a tiny model fits in about a second
METHODS = {
    "zero-shot": lambda: ZeroShot(),
    "icl": lambda: ICL(n_shots=2),
    "site": lambda: SITE(n_prompts=4, n_shots=2, config=FIT),
    "fv": lambda: FV(k=2, n_effect_prompts=1, **SMALL),
    "tv": lambda: TV(**SMALL),
    "ltv": lambda: LTV(n_queries=8, n_shots=2),
    "ltv-valid": lambda: LTVValid(n_queries=8, n_shots=2),
    "sv": lambda: SV(n_shots=6, inner_window=4, momentum_steps=3, n_valid=8),
    "mtv": lambda: MTV(steps=2, **SMALL),
    "i2cl": lambda: I2CL(n_demos=3, n_examples=8, n_valid=8),
    "lora": lambda: LoRA(n_examples=8, n_valid=8),
    "ia3": lambda: IA3(n_examples=8, n_valid=8),
}
ATT = AttributionConfig(n_prompts=4, n_mean_prompts=4, n_shots=2, n_boot=0, n_alpha_items=8)
ABL = AblationConfig(n_prompts=4, n_shots=2, n_boot=0)
hooked_only = pytest.mark.skipif(not has_hooked_transformer(),
                                 reason="HookedTransformer only (TransformerLens 3.x)")


@pytest.fixture(scope="module")
def task():
    return sl.load_task("antonym")


@pytest.fixture(scope="module", params=BACKENDS)
def twins(request):
    """The tiny random model in float32 and in bfloat16 (the same weights, cast)."""
    return (load_model("tiny-random", backend=request.param),
            load_model("tiny-random", backend=request.param, dtype="bfloat16"))


@pytest.fixture(scope="module")
def fitted(twins, task):
    """A float32 SITE adapter, and the same α and embedding keyed to each model (an adapter
    carries its model's weights fingerprint, which includes the dtype)."""
    m32, m16 = twins
    ad = fit_site(m32, task, n_prompts=4, n_shots=2, config=FIT)
    return ad, dataclasses.replace(ad, meta={**ad.meta, "fingerprint": weights_fingerprint(m16),
                                             "dtype": "bfloat16"})


def float_tensors(x):
    """Every floating tensor inside ``x`` (nested dicts, lists, tuples)."""
    if torch.is_tensor(x):
        return [x] if x.is_floating_point() else []
    if isinstance(x, dict):
        x = list(x.values())
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in float_tensors(v)]
    return []


# ----------------------------------------------------------------------------------------------
# baselines


def test_every_method_has_a_bfloat16_case():
    assert set(METHODS) == set(available_methods())


@pytest.mark.parametrize("name", list(METHODS))
def test_baseline_in_bfloat16(twins, task, name):
    """Fit on the bfloat16 model (its stored tensors stay float32) and evaluate; the float32 fit's
    intervention gives the same last-token log-probs on both models within the bfloat16 bound."""
    m32, m16 = twins
    f16 = METHODS[name]().fit(m16, task)
    assert {t.dtype for t in float_tensors(f16.state)} <= {torch.float32}, name
    items = task.test[:8]
    enc16 = encode(m16, f16.prompts(m16, items))
    assert bool(torch.isfinite(last_logits(m16, enc16, f16.intervention)).all())
    inters = {name: f16.intervention} if f16.intervention is not None else {}
    df = evaluate(m16, task, methods=list(inters) or [name], interventions=inters, limit=2, labels=None)
    assert len(df) == 2

    f32 = METHODS[name]().fit(m32, task)
    prompts = f32.prompts(m32, items)
    ref = last_logits(m32, encode(m32, prompts), f32.intervention)
    low = last_logits(m16, encode(m16, prompts), f32.intervention)
    assert low.dtype == torch.float32, f"{name}: logits read in {low.dtype}, not float32"
    scale = float(ref.abs().max())
    assert_within(low.log_softmax(-1), ref.log_softmax(-1),
                  low_logprob_bound(scale, m32.cfg.n_layers), what=f"{name} log-probs", scale=scale)


# ----------------------------------------------------------------------------------------------
# lenses


def lens_bound(model, lens: str, ref, *, scale: float, mass: float) -> float:
    """The bound of one lens's scores (module docstring)."""
    L = model.cfg.n_layers
    top = float(ref.abs().max())
    if lens in ("alpha-grad", "atp", "atp-star"):
        return low_activation_bound(top, 2 * L)
    if lens in ("ablation-mean", "ablation-zero", "effect"):
        return low_prob_bound(scale, L, mass)
    if lens == "dla":
        return low_activation_bound(top, 1)
    raise KeyError(lens)


@pytest.mark.parametrize("lens", [n for n in available_lenses() if n != "alpha"])
def test_lens_in_bfloat16(twins, task, fitted, lens):
    """``head_scores`` with one lens on both models, from the same float32 adapter."""
    m32, m16 = twins
    ad32, ad16 = fitted
    if lens == "dla" and sl.models.is_bridge(m32):
        with pytest.raises(sl.ModelError, match="HookedTransformer"):
            head_scores(m16, task, [lens], adapter=ad16, attribution=ATT, ablation=ABL)
        return
    runs = [head_scores(m, task, [lens], adapter=a, attribution=ATT, ablation=ABL)
            for m, a in ((m32, ad32), (m16, ad16))]
    ref, low = (torch.tensor(r.scores.df.score.to_numpy()) for r in runs)
    # the answer probabilities behind the probability lenses: at most the clean prompts' mean
    # (the stats' baseline) plus the largest score, on each of the two sides of a difference
    _, stats = head_causal_effects(m32, task, embedding=ad32.embedding, n_prompts=ATT.n_prompts,
                                   n_shots=ATT.n_shots, return_stats=True)
    mass = 2 * (stats["baseline_prob"] + float(ref.abs().max()))
    prompts = [zero_shot_prompt(ex.input) for ex in task.train[:8]]
    scale = logit_scale(m32, prompts, (None, ad32.mix()))
    assert_within(low, ref, lens_bound(m32, lens, ref, scale=scale, mass=mass), what=f"{lens} scores",
                  scale=scale)


def test_alpha_lens_in_bfloat16(twins, task):
    """The ``alpha`` lens fits SITE on the bfloat16 model: α float32 in [0, 1], and the fit's
    best validation loss (a mean of −log p; the least of the checks, each within the bound) within
    the log-prob bound of the float32 fit's."""
    m32, m16 = twins
    r32, r16 = (head_scores(m, task, ["alpha"], fit_config=FIT, attribution=ATT) for m in (m32, m16))
    a16 = r16.alpha.adapters[0].alpha
    assert a16.dtype == torch.float32 and bool(((a16 >= 0) & (a16 <= 1)).all())
    v32, v16 = (r.alpha.adapters[0].meta["final_valid_loss"] for r in (r32, r16))
    prompts = [zero_shot_prompt(ex.input) for ex in task.train[:8]]
    scale = logit_scale(m32, prompts, (None, r32.alpha.adapters[0].mix()))
    assert_within(torch.tensor([v16]), torch.tensor([v32]), low_logprob_bound(scale, m32.cfg.n_layers),
                  what="alpha lens validation losses", scale=scale)


# ----------------------------------------------------------------------------------------------
# patching


def answer_prob_check(model, df32, df16, *, scale: float, what: str):
    """``answer_prob`` (a mean probability) of every row within :func:`low_prob_bound`."""
    ref, low = (torch.tensor(d.answer_prob.to_numpy(), dtype=torch.float64) for d in (df32, df16))
    mass = float(ref.max())
    return assert_within(low, ref, low_prob_bound(scale, model.cfg.n_layers, mass), what=what,
                         scale=scale)


def test_intra_task_in_bfloat16(twins, task, fitted):
    m32, m16 = twins
    ad32, ad16 = fitted
    df32, df16 = (intra_task(m, task, a, limit=8, n_boot=0) for m, a in ((m32, ad32), (m16, ad16)))
    assert list(df16.selection) == list(df32.selection) and list(df16.k) == list(df32.k)
    prompts = [zero_shot_prompt(ex.input) for ex in task.test[:8]]
    full = site_mix(torch.ones_like(ad32.alpha), ad32.embedding)
    scale = logit_scale(m32, prompts, (None, ad32.mix(), full))
    answer_prob_check(m32, df32, df16, scale=scale, what="intra-task answer probabilities")


def test_inter_task_in_bfloat16(twins, task, fitted):
    m32, m16 = twins
    ad32, ad16 = fitted
    other = sl.load_task("synonym")
    o32 = fit_site(m32, other, n_prompts=4, n_shots=2, config=FIT)
    o16 = dataclasses.replace(o32, meta={**o32.meta, "fingerprint": weights_fingerprint(m16),
                                          "dtype": "bfloat16"})
    tasks = [task, other]
    df32 = inter_task(m32, tasks, [ad32, o32], limit=8, n_boot=0)
    df16 = inter_task(m16, tasks, [ad16, o16], limit=8, n_boot=0)
    prompts = [zero_shot_prompt(ex.input) for t in tasks for ex in t.test[:8]]
    mixes = [None] + [site_mix(a.alpha, b.embedding) for a in (ad32, o32) for b in (ad32, o32)]
    mixes += [site_mix(torch.ones_like(a.alpha), b.embedding) for a in (ad32, o32) for b in (ad32, o32)]
    scale = logit_scale(m32, prompts, mixes)
    answer_prob_check(m32, df32, df16, scale=scale, what="inter-task answer probabilities")


def check_head_effects(m32, m16, task, embedding) -> None:
    """Causal effects (patched − unpatched answer probability, mean over corrupted prompts) of
    both models within :func:`low_prob_bound` of mass 2·baseline + the largest effect."""
    kw = dict(embedding=embedding, n_prompts=4, n_shots=2, return_stats=True)
    (e32, s32), (e16, _) = (head_causal_effects(m, task, **kw) for m in (m32, m16))
    assert e16.dtype == torch.float32
    mass = 2 * s32["baseline_prob"] + 2 * float(e32.abs().max())
    prompts = [zero_shot_prompt(ex.input) for ex in task.train[:8]]
    scale = logit_scale(m32, prompts, (None, site_mix(torch.ones(e32.shape), embedding)))
    assert_within(e16, e32, low_prob_bound(scale, m32.cfg.n_layers, mass),
                  what="head causal effects", scale=scale)


def test_head_causal_effects_in_bfloat16(twins, task, fitted):
    m32, m16 = twins
    check_head_effects(m32, m16, task, fitted[0].embedding)


# ----------------------------------------------------------------------------------------------
# atlas (HookedTransformer: its DLA and per-head logit lens read W_O, W_U and the norms)


@hooked_only
def test_atlas_in_bfloat16(task, tmp_path):
    """The atlas's data path on the bfloat16 model: every per-task fit and measurement runs and
    its tables are finite; what it measures per task from a fit (the transfer table: inter_task;
    the fast lenses alpha-grad, atp, dla) is compared above; the promoted tokens' logits
    (head_logit_lens of the same float32 embedding) are compared here."""
    from sitelens.atlas import AtlasConfig, build_atlas_data

    m32 = load_model("tiny-random", backend="hooked")
    m16 = load_model("tiny-random", backend="hooked", dtype="bfloat16")
    cfg = AtlasConfig(n_examples=16, n_prompts=4, n_shots=2, transfer_limit=4, n_perm=20)
    tasks = [task, sl.load_task("synonym"), sl.load_task("present_past")]  # 3: its correlations' least
    data = build_atlas_data(m16, tasks, cfg, cache_dir=tmp_path)
    assert data.summary["n_tasks"] == 3 and not data.summary["skipped"]
    assert data.summary["fingerprint"] == fingerprint(m16)
    # the measured columns (intervals over one seed, and k of the α mode, are NaN by design)
    for name, cols in (("alpha", ["alpha"]), ("transfer", ["accuracy", "answer_prob"]),
                       ("lenses", ["score"])):
        values = getattr(data, name)[cols].to_numpy(float)
        assert values.size and bool(torch.isfinite(torch.tensor(values)).all()), name
    # a Spearman ρ of α maps is finite exactly where both tasks' α moved off its constant start
    # (on this random model a fit may keep its initial α: no step improves validation)
    moved = data.alpha.groupby("task").alpha.std() > 0
    sim = data.similarity
    for a in sim.index:
        for b in sim.columns:
            assert math.isfinite(sim.loc[a, b]) == bool((moved[a] and moved[b]) or a == b), (a, b)
    assert moved.sum() >= 2  # at least one finite off-diagonal ρ was checked

    emb = fit_site(m32, task, n_prompts=4, n_shots=2, config=FIT).embedding
    k = m32.cfg.d_vocab  # every token, so both sides list the same ones
    t32, t16 = (head_logit_lens(m, emb, k=k).sort_values(["layer", "head", "token_id"]) for m in (m32, m16))
    ref, low = (torch.tensor(t.logit.to_numpy(float)) for t in (t32, t16))
    assert_within(low, ref, low_activation_bound(float(ref.abs().max()), 1),
                  what="atlas promoted-token logits", scale=float(ref.abs().max()))
