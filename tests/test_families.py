"""Conformance over architecture families (issue 35): sitelens end to end on a tiny random-weight
``HookedTransformer`` of every family TransformerLens 3.9 builds (sitelens.models.families).

Each check compares a sitelens computation with an independent one on the same model, with the
derived bounds of tests/tolerances.py (float32 rounding at the compared quantity's own scale;
bfloat16 against float32 with the ``low_*`` model):

- hooks: the z-hook self-check, ``hook_z`` ``[batch, pos, n_heads, d_head]`` on every layer, the
  other hook points sitelens reads;
- attention: the fused path (sitelens.models.attention) against TransformerLens's own attention
  on a left-padded batch, or, where the family has a feature the fused path does not compute
  (named: the support table shows it), the fallback against the Hugging Face model's own forward
  (the family's tiny model of tests/hf_families.py, loaded from its folder);
- injection: a HeadMix at the last token writes exactly ``(1 − w)·z + w·t`` there and nothing
  elsewhere, and sitelens's last-position logits equal a full pass with a hand-written hook;
- KV cache: greedy generation on the KV cache (injected in the prefill, or not) equals
  generation by full passes with no cache;
- SITE: a short fit, an evaluation, and the adapter's save / load round trip;
- patching: per-head causal effects (prefix cache, batched rows) equal a reference built on
  TransformerLens's ``patching.generic_activation_patch``, one full pass per head and prompt;
- lenses: the α-gradient equals a central finite difference (float64: exact to ~1e-9), AtP equals
  the autograd gradient of the patched probability, and the AtP / α-grad lenses run;
- bfloat16: log-probs with and without an injection within the bfloat16 bounds of float32.

``scripts/families_table.py`` runs this file with ``--junitxml`` and writes the support table of
docs/models.md from the results (each test here is one column). Planted per-family bugs that these
checks catch: tests/test_family_mutations.py.
"""

from __future__ import annotations

import functools

import pytest
import test_attention as TA
import torch
from hf_families import save_family_dir
from tolerances import (
    assert_logits_close,
    assert_probs_close,
    assert_within,
    logit_scale,
    low_logprob_bound,
)

from sitelens.eval.evaluation import evaluate
from sitelens.eval.generation import greedy_generate, last_logits
from sitelens.models import act_name, encode, has_hooked_transformer, load_model, self_check, z_hook_name
from sitelens.models.attention import slow_path_features
from sitelens.models.families import FAMILIES, SUPPORTED_FAMILIES
from sitelens.site import FitConfig, SiteAdapter, fit_site, task_embedding
from sitelens.site.injection import HeadMix, apply_hooks
from sitelens.site.training import LastTokenSet
from sitelens.tasks import Task, load_task
from sitelens.testing import family_model

pytestmark = [
    pytest.mark.skipif(not has_hooked_transformer(), reason="HookedTransformer only (TL 3.x)"),
    pytest.mark.parametrize("family", SUPPORTED_FAMILIES),
]

PROMPTS = TA.PROMPTS  # left-padded; longer than the families' 8-token windows
N_PROMPTS, N_SHOTS = 3, 2  # effects / lenses: corrupted prompts and their demonstrations


@functools.cache
def model_of(family: str, dtype: torch.dtype = torch.float32):
    return family_model(family, dtype=None if dtype == torch.float32 else dtype)


@functools.cache
def task():
    return load_task("antonym")


@functools.cache
def embedding_of(family: str) -> torch.Tensor:
    """A task-mean embedding ``[n_layers, n_heads, d_head]``, scaled so that patching a head moves
    the answer probability of a random-weight model measurably."""
    return task_embedding(model_of(family), task(), n_prompts=4, n_shots=N_SHOTS) * 3


def _mix(model, seed=0) -> HeadMix:
    L, H, d = model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_head
    g = torch.Generator().manual_seed(seed)
    w = torch.rand(L, H, generator=g)
    w[:, 0] = 1.0  # head 0 of every layer fully replaced
    return HeadMix(w, 3 * torch.randn(L, H, d, generator=g))


# ----------------------------------------------------------------------------------------------
# hooks, attention


def test_hooks_and_z_shapes(family):
    model = model_of(family)
    c = model.cfg
    report = self_check(model)
    assert report["shape"][2:] == (c.n_heads, c.d_head)
    enc = encode(model, PROMPTS)
    with torch.no_grad():
        _, cache = model.run_with_cache(enc.tokens, attention_mask=enc.attention_mask,
                                        names_filter=lambda n: n.endswith("hook_z"))
    for layer in range(c.n_layers):
        z = cache[z_hook_name(model, layer)]
        assert tuple(z.shape) == (*enc.tokens.shape, c.n_heads, c.d_head)
    needed = [act_name(k, layer) for layer in range(c.n_layers) for k in ("attn_out", "mlp_out")]
    needed.append(act_name("ln_final.scale"))
    assert not [n for n in needed if n not in model.hook_dict]


def test_fused_attention_equals_transformerlens_or_falls_back(family, record_property, tmp_path):
    model = model_of(family)
    enc = encode(model, PROMPTS)
    slow = sorted({f for block in model.blocks for f in slow_path_features(block.attn)})
    record_property("attention", "slow path: " + ", ".join(slow) if slow else "fused")
    if not slow:
        TA.attention_paths_agree(model, enc)  # bounds: tests/test_attention.py
        return
    # The slow path is TransformerLens's own attention, so it is checked against what it stands
    # for: the Hugging Face model's forward. The family's tiny Hugging Face model
    # (tests/hf_families.py) loaded from its folder, fused attention on (so falling back), on the
    # left-padded batch; Hugging Face is given the positions counted from each row's first token,
    # TransformerLens's rule for left padding.
    hf = save_family_dir(family, tmp_path)
    loaded = load_model(str(tmp_path), backend="hooked")
    assert sorted({f for block in loaded.blocks for f in slow_path_features(block.attn)}) == slow
    enc = encode(loaded, PROMPTS)
    mask = enc.attention_mask  # [batch, pos]
    with torch.no_grad():
        ours = loaded(enc.tokens, attention_mask=mask)
        ref = hf(enc.tokens, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits
    # two float32 computations of one function through n_layers blocks: logit_tolerance at the
    # logits' scale and the model's depth (measured ~2e-6 at a scale ~3; the bound ~2e-5), on the
    # positions that hold text
    assert_logits_close(ours, ref, loaded, what=f"{family}: slow-path logits vs Hugging Face",
                        mask=mask.bool())


# ----------------------------------------------------------------------------------------------
# injection, KV cache


def test_injection_at_the_last_token(family):
    model = model_of(family)
    enc = encode(model, PROMPTS)
    mix = _mix(model)
    L, H = model.cfg.n_layers, model.cfg.n_heads
    names = [z_hook_name(model, layer) for layer in range(L)]
    seen: dict[str, dict[str, torch.Tensor]] = {"pre": {}, "post": {}}

    def grab(where):
        def fn(z, hook):
            seen[where][hook.name] = z.clone()
        return fn

    hooks = ([(n, grab("pre")) for n in names] + mix.hooks(model) + [(n, grab("post")) for n in names])
    with torch.no_grad(), apply_hooks(model, hooks):
        model(enc.tokens, attention_mask=enc.attention_mask)
    for layer, n in enumerate(names):
        pre, post = seen["pre"][n], seen["post"][n]  # [batch, pos, n_heads, d_head]
        assert torch.equal(post[:, :-1], pre[:, :-1])  # only the last position is touched
        w, t = mix.weights[layer][:, None], mix.targets[layer]  # [H, 1], [H, d_head]
        assert torch.equal(post[:, -1, 0], t[0].expand_as(post[:, -1, 0]))  # w = 1: t exactly
        # (1 − w)·z + w·t for the other heads: the same float ops, up to the order of two terms
        assert_within(post[:, -1], (1 - w) * pre[:, -1] + w * t, 4 * torch.finfo().eps
                      * float(pre[:, -1].abs().max() + t.abs().max()), what=f"mix at layer {layer}")
    # sitelens's last-position logits (stop at the last block, unembed one column) vs a full pass
    # with the same hooks: logit_tolerance at their scale
    with torch.no_grad(), apply_hooks(model, mix.hooks(model)):
        full = model(enc.tokens, attention_mask=enc.attention_mask)[:, -1]
    assert_logits_close(last_logits(model, enc, mix), full, model, what="injected last logits")
    assert H == mix.weights.shape[1]


@pytest.mark.parametrize("inject", [False, True], ids=["plain", "injected"])
def test_kv_cached_generation_equals_uncached(family, inject):
    model = model_of(family)
    enc = encode(model, PROMPTS)
    mix = _mix(model, seed=1) if inject else None
    n_new = 5
    gen, first = greedy_generate(model, enc, intervention=mix, max_new_tokens=n_new,
                                 stop_at_newline=False)
    # by full passes, no cache: the mix acts on the last PROMPT position on every pass
    S = enc.tokens.shape[1]
    hooks = []
    if mix is not None:
        def at_prompt(layer):
            f = mix.hook_fn(layer)
            return lambda z, hook: torch.cat([f(z[:, :S], hook), z[:, S:]], dim=1)
        hooks = [(z_hook_name(model, layer), at_prompt(layer)) for layer in range(model.cfg.n_layers)]
    tokens, mask, out = enc.tokens, enc.attention_mask, []
    with torch.no_grad(), apply_hooks(model, hooks):
        lg = model(tokens, attention_mask=mask)[:, -1]
        assert_logits_close(first, lg, model, what="first-step logits, prefill vs full pass")
        for _ in range(n_new):
            out.append(lg.argmax(-1))
            tokens = torch.cat([tokens, out[-1][:, None]], 1)
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
            lg = model(tokens, attention_mask=mask)[:, -1]
    # integer tokens: the argmax of logits that agree within logit_tolerance (equal unless a top-2
    # gap falls below it, ~1e-5)
    assert torch.equal(gen, torch.stack(out, 1))


# ----------------------------------------------------------------------------------------------
# SITE, patching


def test_site_fit_evaluate_and_adapter_round_trip(family, tmp_path):
    model = model_of(family)
    # 32 training items (8 steps of 4), validated on the same 32: the α kept is the checked one
    # that lowers their loss most (validated on 8 other items, a fit of a random model can keep
    # its initial α: no step improves those)
    items = task().train[:32]
    cfg = FitConfig(n_examples=len(items), batch_size=4, eval_every=2, n_valid=len(items))
    ad = fit_site(model, Task(task().name, items, items, task().test), n_prompts=4, n_shots=N_SHOTS,
                  config=cfg)
    assert ad.alpha.shape == (model.cfg.n_layers, model.cfg.n_heads)
    assert torch.isfinite(ad.alpha).all() and torch.isfinite(ad.embedding).all()
    # it learned: the training loss, recomputed here (the answer token's cross-entropy under the
    # mix toward the embedding, at the initial α and at the fitted one), falls, and the answer
    # logits move. Float32 rounding of either is ~1e-6 (logits of scale ~3, a loss ~6); over the
    # families on both backends the smallest fall measured is 7e-3 and the smallest move 0.08 (bloom)
    train = LastTokenSet.build(model, items)
    start = HeadMix(torch.full_like(ad.alpha, torch.sigmoid(torch.tensor(cfg.init)).item()), ad.embedding)
    with torch.no_grad():
        before, after = train.logits(model, start.hooks(model)), train.logits(model, ad.mix().hooks(model))
    loss_before = float(torch.nn.functional.cross_entropy(before, train.answers))
    loss_after = float(torch.nn.functional.cross_entropy(after, train.answers))
    assert ad.meta["best_step"] > 0, f"{family}: the fit kept its initial α"
    assert loss_after < loss_before - 1e-3, (f"{family}: the training loss did not fall", loss_before,
                                             loss_after)
    assert float((after - before).abs().max()) > 1e-2, f"{family}: the fit left the predictions as they were"
    df = evaluate(model, task(), adapter=ad, limit=3, n_shots=N_SHOTS, methods=("zero-shot", "site"))
    assert set(df.method) == {"zero-shot", "site"} and len(df) == 6
    ad.save(tmp_path / "ad")
    back = SiteAdapter.load(tmp_path / "ad")
    assert torch.equal(back.alpha, ad.alpha) and torch.equal(back.embedding, ad.embedding)
    back.check_model(model)
    # the adapter applies after the round trip: the same last logits (the same float ops)
    enc = encode(model, PROMPTS)
    assert torch.equal(last_logits(model, enc, back.mix()), last_logits(model, enc, ad.mix()))


def _reference_effects(model, prompts, answers, emb) -> torch.Tensor:
    """Per-head effects from TransformerLens's generic_activation_patch: one prompt at a time (it
    passes no attention mask, so no padding), z[:, -1, h] of layer l <- emb[l, h]; mean over
    prompts of P(answer | patched) − P(answer)."""
    from transformer_lens.patching import generic_activation_patch

    clean = {z_hook_name(model, layer): emb[layer] for layer in range(model.cfg.n_layers)}

    def setter(z, index, clean_z):
        _, head = index
        z = z.clone()
        z[:, -1, head] = clean_z[head]
        return z

    per_prompt = []
    for prompt, ans in zip(prompts, answers, strict=True):
        tokens = encode(model, [prompt]).tokens
        with torch.no_grad():
            base = model(tokens)[0, -1].softmax(-1)[ans]

        def metric(logits, ans=ans, base=base):
            return logits[0, -1].softmax(-1)[ans] - base

        with torch.no_grad():
            per_prompt.append(generic_activation_patch(
                model, tokens, clean, metric, setter, "z", index_axis_names=("layer", "head")))
    return torch.stack(per_prompt).mean(0)  # [n_layers, n_heads]


def test_head_effects_equal_a_generic_activation_patch_reference(family):
    from sitelens.patching import corrupted_prompts, head_causal_effects

    model, emb = model_of(family), embedding_of(family)
    kw = dict(n_prompts=N_PROMPTS, n_shots=N_SHOTS, seed=3)
    effects, stats = head_causal_effects(model, task(), embedding=emb, return_stats=True, **kw)
    prompts, answers = corrupted_prompts(model, task(), **kw)
    ref = _reference_effects(model, prompts, answers, emb)
    assert float(ref.abs().max()) > 1e-6  # patching a head changes something
    # differences of two mean probabilities, cached batched rows vs full unpadded passes:
    # prob_tolerance at the prompts' logit scale for the mass of both terms (tests/test_patching.py)
    L, H = model.cfg.n_layers, model.cfg.n_heads
    scale = logit_scale(model, prompts, (None, HeadMix(torch.ones(L, H), emb)))
    assert_probs_close(effects, ref, model, scale=scale,
                       mass=2 * stats["baseline_prob"] + float(ref.abs().max()),
                       what=f"{family}: head effects vs generic_activation_patch")


# ----------------------------------------------------------------------------------------------
# lenses


def test_alpha_gradient_is_exact_and_lenses_run(family):
    """The α-gradient (mix_gradients at w = 0) against a central finite difference, in float64
    (rounding ~1e-16, truncation ε²/6·|f'''| ~ 1e-9 at ε = 1e-4: the 1e-6 relative bound of
    tests/test_lenses.py is 1000x that and far below a wrong gradient); AtP against the autograd
    gradient of the patched probability; the atp and alpha-grad lenses run, finite."""
    check_alpha_gradient_by_finite_differences(family)
    check_atp_and_lenses(family)


def check_alpha_gradient_by_finite_differences(family):
    """The α-gradient's float64 check of :func:`test_alpha_gradient_is_exact_and_lenses_run`."""
    from sitelens.lenses import mix_gradients

    m64 = model_of(family, torch.float64)
    t = embedding_of(family).double()  # [L, H, d_head]
    data = LastTokenSet.build(m64, task().train[:4])
    g = mix_gradients(m64, data, t, metric="logprob")[0].double()  # [n, L, H]
    L, H = m64.cfg.n_layers, m64.cfg.n_heads
    eps, fd = 1e-4, torch.empty_like(g)
    for j in range(L * H):
        w = torch.zeros(L * H, dtype=torch.float64)
        w[j] = eps
        f = []
        for sign in (1, -1):
            with torch.no_grad():
                lg = data.logits(m64, HeadMix(weights=(sign * w).reshape(L, H), targets=t).hooks(m64))
            f.append(torch.log_softmax(lg, -1).gather(1, data.answers[:, None])[:, 0])
        fd[:, j // H, j % H] = (f[0] - f[1]) / (2 * eps)
    scale = float(fd.abs().max())
    assert scale > 1e-3
    assert_within(g, fd, 1e-6 * scale, what=f"{family}: α-gradient vs central difference", scale=scale)


def check_atp_and_lenses(family):
    """AtP against autograd and the lenses' run of :func:`test_alpha_gradient_is_exact_and_lenses_run`
    (float32)."""
    from sitelens.lenses import AttributionConfig, alpha_gradient, attribution_patching
    from sitelens.patching import corrupted_prompts

    model, t32 = model_of(family), embedding_of(family)
    L, H = model.cfg.n_layers, model.cfg.n_heads
    cfg = AttributionConfig(n_prompts=N_PROMPTS, n_shots=N_SHOTS, n_boot=20, n_alpha_items=4)
    atp = attribution_patching(model, task(), t32, cfg)
    prompts, answers = corrupted_prompts(model, task(), n_prompts=cfg.n_prompts, n_shots=cfg.n_shots,
                                         split=cfg.split, seed=cfg.seed, template=cfg.template)
    cset = LastTokenSet.from_prompts(model, prompts, answers)
    w = torch.zeros(len(cset), L, H, requires_grad=True)  # [n, L, H]
    with torch.enable_grad():
        p = cset.logits(model, HeadMix(weights=w, targets=t32).hooks(model)).softmax(-1)
        (grad,) = torch.autograd.grad(p.gather(1, cset.answers[:, None]).sum(), w)
    ref = grad.mean(0)  # [L, H]
    # the same gradient, batched differently (tests/test_lenses.py's AtP bound)
    s = float(ref.abs().max())
    assert s > 1e-8
    assert_within(atp.map(), ref, 1e-4 * s, what=f"{family}: AtP vs autograd", scale=s)
    ag = alpha_gradient(model, task(), t32, cfg).map()
    assert ag.shape == (L, H) and torch.isfinite(ag).all() and ag.abs().max() > 0


# ----------------------------------------------------------------------------------------------
# bfloat16


def test_bfloat16_within_bounds_of_float32(family):
    m32, m16 = model_of(family), model_of(family, torch.bfloat16)
    mix = _mix(m32, seed=2)
    enc32, enc16 = encode(m32, PROMPTS), encode(m16, PROMPTS)
    assert torch.equal(enc32.tokens, enc16.tokens)
    for inter in (None, mix):
        ref = last_logits(m32, enc32, inter)  # [batch, d_vocab]
        low = last_logits(m16, enc16, inter).float()
        scale = float(ref.abs().max())
        assert_within(low.log_softmax(-1), ref.log_softmax(-1),
                      low_logprob_bound(scale, m32.cfg.n_layers),
                      what=f"{family}: bfloat16 log-probs ({'injected' if inter else 'plain'})",
                      scale=scale)


def test_every_family_is_built_or_says_why_not(family):
    """The table's rows: a supported family builds with the features it names (checked on the
    config), an unsupported one is really absent from TransformerLens 3.9's conversions."""
    import inspect

    from transformer_lens import loading_from_pretrained as lfp

    converted = inspect.getsource(lfp.get_pretrained_state_dict)
    fam = FAMILIES[family]
    assert f'"{fam.architecture}"' in converted
    assert model_of(family).cfg.original_architecture == fam.architecture
    for other in FAMILIES.values():
        if not other.supported:
            assert f'"{other.architecture}"' not in converted, other.name
