"""Each baseline's defining property, on a tiny random model (seconds in total)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from tolerances import (
    activation_tolerance,
    assert_activations_close,
    assert_logits_close,
    assert_probs_close,
    assert_within,
    logit_scale,
    logit_tolerance,
    reduction_tolerance,
    unit_roundoff,
)

from sitelens.baselines import (
    FV,
    I2CL,
    IA3,
    ICL,
    LTV,
    MTV,
    SITE,
    TV,
    Fitted,
    HookIntervention,
    LoRA,
    LTVValid,
    ZeroShot,
    available_methods,
    function_vector,
    get_method,
    head_outputs,
    ridge_closed_form,
)
from sitelens.baselines.base import sample_items
from sitelens.baselines.i2cl import i2cl_hooks, init_i2cl
from sitelens.baselines.ia3 import ia3_hooks, init_ia3
from sitelens.baselines.lora import init_lora, lora_hooks
from sitelens.errors import FitError
from sitelens.eval.evaluation import evaluate
from sitelens.models import encode
from sitelens.patching import corrupted_prompts, head_causal_effects
from sitelens.site import FitConfig, last_token_z, task_embedding
from sitelens.site.injection import HeadMix, apply_hooks, head_mask
from sitelens.tasks import (
    DEFAULT_TEMPLATE,
    few_shot_prompts,
    task_from_pairs,
    zero_shot_prompt,
    zero_shot_prompts,
)
from sitelens.testing import tiny_model

N_KV = 2  # grouped-query tiny model: 4 query heads, 2 key/value heads


@pytest.fixture(scope="module")
def model(backend):
    torch.manual_seed(0)
    return tiny_model(n_key_value_heads=N_KV, backend=backend)


@pytest.fixture(scope="module")
def task():
    rng = random.Random(0)
    words = list(dict.fromkeys("".join(rng.choice("abcdefgh") for _ in range(3))
                               for _ in range(80)))
    return task_from_pairs("reverse", [(w, w[::-1]) for w in words])


def _state(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _assert_model_untouched(model, before):
    after = model.state_dict()
    assert before.keys() == after.keys()
    for k in before:
        assert torch.equal(before[k], after[k]), k  # exact: a frozen weight is never written
    assert not any(p.requires_grad for p in model.parameters())


def _logits(model, prompts, hooks=()):
    enc = encode(model, prompts)
    with torch.no_grad(), apply_hooks(model, list(hooks)):
        return model(enc.tokens, attention_mask=enc.attention_mask)  # [batch, pos, d_vocab]


def _capture(model, prompts, names, hooks=()):
    """Values of ``names`` after ``hooks`` acted (capture hooks are registered last)."""
    enc = encode(model, prompts)
    got = {}

    def grabber(name):  # keyed by the requested name (a bridge's hook.name is the canonical one)
        def grab(x, hook=None):
            got[name] = x.detach().clone()

        return grab

    with torch.no_grad(), apply_hooks(model, list(hooks) + [(n, grabber(n)) for n in names]):
        model(enc.tokens, attention_mask=enc.attention_mask)
    return got, enc


PROMPTS = [zero_shot_prompt("abc"), zero_shot_prompt("hgfed")]


# ----------------------------------------------------------------------------------------------
# interface


def test_registry_and_names():
    assert available_methods() == ["zero-shot", "icl", "site", "fv", "tv", "ltv", "ltv-valid",
                                   "sv", "mtv", "i2cl", "lora", "ia3"]
    assert get_method("lora", rank=4, name="lora-r4").name == "lora-r4"
    m = TV()
    assert get_method(m) is m
    with pytest.raises(ValueError, match="Unknown method"):
        get_method("nope")


def test_zero_shot_and_icl(model, task):
    zs = ZeroShot().fit(model, task)
    assert zs.intervention is None and zs.n_params == 0 and zs.scope == "none"
    items = task.test[:3]
    assert zs.prompts(model, items) == zero_shot_prompts(model, items)
    icl = ICL(n_shots=2).fit(model, task, seed=3)
    assert icl.intervention is None and icl.n_params == 0
    assert icl.prompts(model, items) == few_shot_prompts(task, list(items), 2, seed=3, model=model)


def test_site_wrapper(model, task):
    f = SITE(n_prompts=4, n_shots=2, config=FitConfig(n_examples=16, n_valid=8)).fit(model, task)
    L, H = model.cfg.n_layers, model.cfg.n_heads
    assert isinstance(f.intervention, HeadMix) and f.scope == "prefill"
    assert f.n_params == L * H and f.fit_seconds > 0


# ----------------------------------------------------------------------------------------------
# LTV


def test_ltv_w_is_the_ridge_closed_form(model, task):
    lam = 5.0
    f = LTV(n_queries=12, n_shots=2, lam=lam).fit(model, task, seed=1)
    L, d = model.cfg.n_layers, model.cfg.d_model
    name = f"blocks.{L - 1}.hook_resid_post"
    assert f.state["layer"] == L - 1 and f.n_params == d * d
    # X and Y are the last-token states of zero-shot and few-shot prompts of the same queries
    queries = sample_items(task.train, 12, 1)
    zs = zero_shot_prompts(model, queries)
    icl = few_shot_prompts(task, queries, 2, seed=2, model=model)
    hz, _ = _capture(model, zs, [name])
    hi, _ = _capture(model, icl, [name])
    X = hz[name][:, -1]
    # the final block's residual stream (depth L) captured in other batches: activation_tolerance;
    # Y = h_icl − h_zs inherits the bounds of both terms
    assert_activations_close(f.state["X"], X, model, depth=L, what="LTV X")
    h_icl = hi[name][:, -1]
    bound_y = (activation_tolerance(model, float(h_icl.abs().max()), depth=L)
               + activation_tolerance(model, float(X.abs().max()), depth=L))
    assert_within(f.state["Y"], h_icl - X, bound_y, what="LTV Y")
    # W solves min ‖X Wᵀ − Y‖² + λ‖W‖²: least squares on the augmented system [X; √λ I]
    Xa = np.vstack([f.state["X"].double().numpy(), np.sqrt(lam) * np.eye(d)])
    Ya = np.vstack([f.state["Y"].double().numpy(), np.zeros((d, d))])
    Wt, *_ = np.linalg.lstsq(Xa, Ya, rcond=None)
    # Both sides solve in float64 from the same float32 X, Y: they differ by the float32 rounding
    # of the returned W (round to nearest: at most u32·|W|, a hard bound, so measured ratios up
    # to ~0.8 are expected and safe) plus the float64 solvers' forward errors, ≲ κ(XᵀX + λI)·u64·|W|
    # each (normal equations; κ is 23-43 here, so that part is ~1e-14 of |W|). Measured: max |ΔW|
    # 1.3e-8 vs bound 1.7e-8 (W up to 0.29); a penalty scaled by the sample count (λ·n) moves W by
    # 0.22 (test_mutations.py).
    kappa = np.linalg.cond(Xa.T @ Xa)
    w_max = float(np.abs(Wt).max())
    bound_w = (unit_roundoff(torch.float32) + 4 * kappa * unit_roundoff(torch.float64)) * w_max
    assert_within(f.state["W"].double(), torch.from_numpy(Wt.T), bound_w, what="LTV W vs lstsq")
    assert_within(ridge_closed_form(f.state["X"], f.state["Y"], lam).double(), torch.from_numpy(Wt.T),
                  bound_w, what="ridge_closed_form vs lstsq")


def test_ltv_adds_w_h_at_the_last_token_only(model, task):
    f = LTV(n_queries=12, n_shots=2).fit(model, task)
    L = model.cfg.n_layers
    name = f"blocks.{L - 1}.hook_resid_post"
    base, enc = _capture(model, PROMPTS, [name])
    seq = enc.tokens.shape[1]
    got, _ = _capture(model, PROMPTS, [name], f.intervention(model, seq))
    h = base[name][:, -1]
    # the hook computes h + h Wᵀ from the same h (same ops before it); only the length-d_model
    # reduction h Wᵀ may be summed in another order: reduction_tolerance
    expect = h + h @ f.state["W"].T
    assert_within(got[name][:, -1], expect,
                  reduction_tolerance(model.cfg.d_model, float(expect.abs().max())),
                  what="LTV h + W h at the last token")
    # exact: the other positions are copied untouched, and nothing before the hook changed
    assert torch.equal(got[name][:, :-1], base[name][:, :-1])
    # decode steps (a different length) are left alone: the hook returns x itself
    got2, _ = _capture(model, PROMPTS, [name], f.intervention(model, seq + 1))
    assert torch.equal(got2[name], base[name])


def test_ltv_default_keeps_its_cell_key():
    from sitelens.provenance import canonical

    # the bench keys a cell on this JSON: the layer sweep must not change the default's
    assert canonical(LTV()) == {"__type__": "LTV", "lam": 5.0, "layer": None, "n_queries": 256,
                                "n_shots": 10, "name": "ltv"}
    assert canonical(LTV(layer="sweep"))["layer"] == "sweep"


def test_ltv_sweep_keeps_the_block_best_on_valid(model, task):
    from sitelens.baselines.ltv import SWEEP_N_VALID

    f = LTV(n_queries=12, n_shots=2, layer="sweep").fit(model, task, seed=1)
    L = model.cfg.n_layers
    table = f.meta["layer_table"]
    assert [r["layer"] for r in table] == list(range(L))
    # each block's map, fitted alone, scored on the valid items by full forward passes (not the
    # sweep's prefix-cache path): the table must hold these accuracies and losses
    valid = task.valid[:SWEEP_N_VALID]
    prompts = zero_shot_prompts(model, valid)  # each ends with the space the answer's tokens split off
    answers = torch.tensor([model.tokenizer(ex.output, add_special_tokens=False)["input_ids"][0]
                            for ex in valid])  # the byte-level tokenizer: the output's first byte
    seq = encode(model, prompts).tokens.shape[1]
    maps = {}
    for r in table:
        g = LTV(n_queries=12, n_shots=2, layer=r["layer"]).fit(model, task, seed=1)
        maps[r["layer"]] = g.state["W"]
        logits = _logits(model, prompts, g.intervention(model, seq))[:, -1]  # [n, d_vocab]
        acc = float((logits.argmax(-1) == answers).float().mean())
        loss = float(torch.nn.functional.cross_entropy(logits, answers))
        assert r["valid_acc"] == acc, r  # exact: argmaxes of logits that agree to ~1e-6
        # the same logits on two paths (prefix KV cache vs one pass): logit_tolerance bounds each
        # logit, and a mean cross-entropy moves by at most twice that
        scale = float(logits.abs().max())
        assert abs(r["valid_loss"] - loss) <= 2 * logit_tolerance(model, scale), (r, loss)
    best = min(table, key=lambda r: (-r["valid_acc"], r["valid_loss"], r["layer"]))
    assert f.state["layer"] == best["layer"]
    # the kept map is that block's own map: captured in passes that hook every block instead of
    # one (same batches, same ops), so equal up to the solve's float32 rounding of W
    assert_within(f.state["W"], maps[best["layer"]],
                  4 * unit_roundoff(torch.float32) * float(maps[best["layer"]].abs().max()),
                  what="sweep W vs the block's own W")
    with pytest.raises(ValueError, match="layer must be"):
        LTV(layer="middle").fit(model, task)


def test_gram_scale_is_the_mean_eigenvalue():
    from sitelens.baselines.ltv_valid import gram_scale

    X = torch.randn(12, 8, generator=torch.Generator().manual_seed(0))
    eig = torch.linalg.eigvalsh(X.double().T @ X.double())
    # tr(XᵀX)/d vs the mean of the eigenvalues, both float64 over 8 numbers: a few ulps of the sum
    assert abs(gram_scale(X) - float(eig.mean())) <= 64 * unit_roundoff(torch.float64) * float(eig.sum())


def test_ltv_valid_keeps_the_block_and_penalty_best_on_valid(model, task):
    from sitelens.baselines.ltv import SWEEP_N_VALID
    from sitelens.baselines.ltv_valid import gram_scale

    rels = (1e-3, 1.0)
    f = LTVValid(n_queries=12, n_shots=2, rel_lams=rels).fit(model, task, seed=1)
    L = model.cfg.n_layers
    table = f.meta["lam_table"]
    assert [(r["layer"], r["rel_lam"]) for r in table] == [(L - 1, rel) for rel in rels]
    # the penalty is rel_lam in units of the queries' Gram scale: the same X as LTV's
    X, Y = f.state["X"], f.state["Y"]
    for r in table:
        assert r["lam"] == r["rel_lam"] * gram_scale(X)
    # each candidate map scored on the valid items by a full forward pass (not the prefix-cache
    # path the fit uses): the table must hold these accuracies and losses
    valid = task.valid[:SWEEP_N_VALID]
    prompts = zero_shot_prompts(model, valid)  # each ends with the space the answer's tokens split off
    answers = torch.tensor([model.tokenizer(ex.output, add_special_tokens=False)["input_ids"][0]
                            for ex in valid])  # the byte-level tokenizer: the output's first byte
    seq = encode(model, prompts).tokens.shape[1]
    from sitelens.baselines.ltv import ltv_intervention

    for r in table:
        W = ridge_closed_form(X, Y, r["lam"])
        logits = _logits(model, prompts, ltv_intervention(W, L - 1)(model, seq))[:, -1]
        acc = float((logits.argmax(-1) == answers).float().mean())
        loss = float(torch.nn.functional.cross_entropy(logits, answers))
        assert r["valid_acc"] == acc, r  # exact: argmaxes of logits that agree to ~1e-6
        # the same logits on two paths (prefix KV cache vs one pass): logit_tolerance bounds each
        # logit, and a mean cross-entropy moves by at most twice that
        assert abs(r["valid_loss"] - loss) <= 2 * logit_tolerance(model, float(logits.abs().max())), r
    best = min(table, key=lambda r: (-r["valid_acc"], r["valid_loss"], r["layer"], -r["rel_lam"]))
    assert f.meta["rel_lam"] == best["rel_lam"] and f.meta["lam"] == best["lam"]
    # the kept map is the chosen penalty's ridge solution (the same float64 solve of the same X, Y)
    assert torch.equal(f.state["W"], ridge_closed_form(X, Y, best["lam"]))
    # the two penalties give different maps: a choice that ignored rel_lam would fail above
    W0, W1 = (ridge_closed_form(X, Y, r["lam"]) for r in table)
    assert float((W0 - W1).abs().max()) > 1e-3 * float(W0.abs().max())
    with pytest.raises(ValueError, match="rel_lams"):
        LTVValid(rel_lams=(0.1, -1.0)).fit(model, task)


# ----------------------------------------------------------------------------------------------
# FV


def test_fv_adds_exactly_the_summed_head_outputs(model, task):
    L, H = model.cfg.n_layers, model.cfg.n_heads
    effects = torch.randn(L, H, generator=torch.Generator().manual_seed(0))
    f = FV(k=3, n_prompts=4, n_shots=2, effects=effects, n_valid=8).fit(model, task)
    top = torch.argsort(effects.flatten(), descending=True)[:3]
    assert f.state["heads"] == [(int(i) // H, int(i) % H) for i in top]
    mean_z = task_embedding(model, task, n_prompts=4, n_shots=2)
    terms = [mean_z[lay, h] @ model.W_O[lay, h] for lay, h in f.state["heads"]]
    expected = sum(terms)
    # FV averages z·W_O over prompts, the reference multiplies the averaged z (other batches,
    # other order): activation_tolerance after all L blocks, at the scale of the summed terms
    # (they may cancel, so Σ max|term|, not max|sum|)
    scale = float(sum(t.detach().abs().max() for t in terms))
    bound = activation_tolerance(model, scale, depth=model.cfg.n_layers)
    assert_within(f.state["vector"], expected, bound, what="FV vector vs Σ mean z W_O")
    assert_within(function_vector(f.state["head_outputs"], f.state["heads"]), expected, bound,
                  what="function_vector vs Σ mean z W_O")
    assert f.n_params == 0 and f.scope == "prefill"
    name = f"blocks.{f.state['layer']}.hook_resid_pre"
    base, enc = _capture(model, PROMPTS, [name])
    got, _ = _capture(model, PROMPTS, [name], f.intervention(model, enc.tokens.shape[1]))
    # the hook adds the fitted vector v: (x + v) − x − v is float32 rounding of the sum and of
    # the difference, at most u·|x + v| + u·|v| (round to nearest); 2u·(…) leaves room
    added = got[name][:, -1] - base[name][:, -1]
    vector = f.state["vector"]
    room = float(got[name][:, -1].abs().max() + vector.abs().max())
    assert_within(added, vector.expand(len(PROMPTS), -1), reduction_tolerance(2, room),
                  what="FV vector added at the last token", scale=room)
    # exact: other positions copied untouched, nothing before the hook changed
    assert torch.equal(got[name][:, :-1], base[name][:, :-1])


def test_fv_head_outputs_pass_through_the_post_attention_norm(backend, task):
    """On a Gemma-style block (attention output normalized before it joins the residual stream),
    each head's write is taken through that norm at each prompt's scale: the heads of a layer sum
    to the layer's mean ``hook_attn_out``, which plain ``mean_z @ W_O`` does not."""
    model = tiny_model(post_norm=True, backend=backend)
    L, H = model.cfg.n_layers, model.cfg.n_heads
    assert "blocks.0.ln1_post.hook_scale" in model.hook_dict
    try:  # no output bias, so the heads sum to the whole attention output
        assert torch.count_nonzero(model.b_O) == 0
    except (TypeError, AttributeError):  # a bridge without o_proj bias has no b_O at all
        pass
    prompts = [zero_shot_prompt(w) for w in ("abc", "hgfed", "ba", "cdefgh", "eee")]
    mean_z, out = head_outputs(model, prompts, batch_size=3)
    assert mean_z.shape == (L, H, model.cfg.d_head) and out.shape == (L, H, model.cfg.d_model)
    # the same per-layer means of hook_z in other batches: activation_tolerance per layer
    assert_activations_close(mean_z, last_token_z(model, prompts), model, layer_dim=0,
                             what="head_outputs mean z vs last_token_z")
    names = [f"blocks.{layer}.hook_attn_out" for layer in range(L)]
    acts, _ = _capture(model, prompts, names)
    for layer in range(L):
        attn_out = acts[names[layer]][:, -1].mean(0)  # [d_model]
        # per-head writes through the post-norm, summed, vs the layer's output (depth layer + 1)
        assert_activations_close(out[layer].sum(0), attn_out, model, depth=layer + 1,
                                 what=f"layer {layer}: Σ head outputs vs hook_attn_out")
        plain = (mean_z[layer, :, :, None] * model.W_O[layer].detach()).sum((0, 1))  # [d_model]
        with pytest.raises(AssertionError):  # without the norm's scale: far outside that bound
            assert_activations_close(plain, attn_out, model, depth=layer + 1, what="no norm")
    # the fitted FV of a whole layer's heads is that layer's mean attention output
    effects = torch.zeros(L, H)
    effects[1] = 1.0
    f = FV(k=H, n_prompts=4, n_shots=2, effects=effects, n_valid=8).fit(model, task)
    assert sorted(f.state["heads"]) == [(1, h) for h in range(H)]
    # the same H float32 vectors summed in head order vs by .sum(0): a length-H reduction
    parts = f.state["head_outputs"][1]
    assert_within(f.state["vector"], parts.sum(0),
                  reduction_tolerance(H, float(parts.abs().sum(0).max())), what="FV of layer 1")


def test_fv_causal_effects_are_patchings_and_match_single_head_patching(model, task):
    L, H = model.cfg.n_layers, model.cfg.n_heads
    f = FV(n_prompts=4, n_shots=2, n_effect_prompts=2, n_valid=8).fit(model, task, seed=5)
    eff = head_causal_effects(model, task, n_prompts=2, n_shots=2, seed=5,
                              embedding=f.state["mean_z"])
    # exact: FV calls this very function with its own mean z, prompt count, shots and seed
    assert torch.equal(f.state["effects"], eff) and f.meta["effects_source"] == "sitelens.patching"
    assert eff.shape == (L, H) and torch.isfinite(eff).all()
    mean_z = f.state["mean_z"]
    prompts, answers = corrupted_prompts(model, task, n_prompts=2, n_shots=2, seed=5)
    ans = torch.tensor(answers)
    p0 = _logits(model, prompts)[:, -1].softmax(-1)[torch.arange(2), ans]
    for layer, head in [(0, 1), (L - 1, H - 1)]:
        mix = HeadMix(head_mask([(layer, head)], L, H), mean_z)
        p = _logits(model, prompts, mix.hooks(model))[:, -1].softmax(-1)[torch.arange(2), ans]
        # a difference of two mean probabilities, cached batched rows vs full passes:
        # prob_tolerance at these prompts' logit scale for the mass of both terms; weights on
        # the wrong rows fail it
        assert_probs_close(eff[layer, head], (p - p0).mean(), model, mass=float(p.mean() + p0.mean()),
                           scale=logit_scale(model, prompts, (None, mix)),
                           what=f"causal effect of L{layer}H{head}")


def test_tv_replaces_exactly_one_state(model, task):
    f = TV(n_prompts=4, n_shots=2, n_valid=8).fit(model, task)
    L = model.cfg.n_layers
    layer = f.state["layer"]
    names = [f"blocks.{i}.hook_resid_pre" for i in range(L)]
    base, enc = _capture(model, PROMPTS, names)
    got, _ = _capture(model, PROMPTS, names, f.intervention(model, enc.tokens.shape[1]))
    target = names[layer]
    # exact: the hook assigns the vector (a copy), leaves other positions untouched, and nothing
    # before it changed
    assert torch.equal(got[target][:, -1], f.state["vector"].expand(len(PROMPTS), -1))
    assert torch.equal(got[target][:, :-1], base[target][:, :-1])
    for i in range(layer):
        assert torch.equal(got[names[i]], base[names[i]])
    assert f.n_params == 0 and f.scope == "prefill"


# ----------------------------------------------------------------------------------------------
# trained methods: only their own parameters


def test_mtv_trains_only_its_policy(model, task):
    before = _state(model)
    f = MTV(n_prompts=4, n_shots=2, steps=6, eval_every=2, n_valid=8).fit(model, task)
    _assert_model_untouched(model, before)
    L, H = model.cfg.n_layers, model.cfg.n_heads
    assert f.n_params == L * H
    assert isinstance(f.intervention, HeadMix)
    w = f.intervention.weights
    assert set(w.unique().tolist()) <= {0.0, 1.0}
    assert not torch.equal(f.state["theta"], torch.zeros(L, H))  # the policy moved (at all)


def test_i2cl_trains_only_its_scalars(model, task):
    before = _state(model)
    f = I2CL(n_demos=4, n_examples=16, eval_every=1, n_valid=8, lr=0.05).fit(model, task)
    _assert_model_untouched(model, before)
    L = model.cfg.n_layers
    assert f.n_params == 4 * L and f.scope == "all"
    assert set(f.state["params"]) == {"lam", "beta"}
    # identity coefficients leave the model unchanged, exactly: 1·x + 0·v = x bit for bit
    ident = init_i2cl(model, lam_init=0.0, beta_init=1.0)
    base = _logits(model, PROMPTS)
    assert torch.equal(_logits(model, PROMPTS, i2cl_hooks(model, f.state["vectors"], ident)), base)
    # the injection acts at every position, one-position decode steps included: more than rounding
    one = _logits(model, ["a"])
    with pytest.raises(AssertionError):
        assert_logits_close(_logits(model, ["a"], f.intervention(model, 5)), one, model, what="I2CL")


def test_lora_zero_init_is_identity_and_counts_params(model, task):
    c = model.cfg
    params = init_lora(model, rank=4, targets=("q", "v"))
    assert torch.count_nonzero(params["B_q"]) == 0
    base = _logits(model, PROMPTS)
    # exact: B = 0 makes the update x A B exactly 0, and x + 0 = x
    assert torch.equal(_logits(model, PROMPTS, lora_hooks(model, params, 2.0)), base)
    before = _state(model)
    f = LoRA(rank=4, n_examples=24, eval_every=1, n_valid=8, lr=0.05).fit(model, task)
    _assert_model_untouched(model, before)
    expected = c.n_layers * 4 * ((c.d_model + c.n_heads * c.d_head) + (c.d_model + N_KV * c.d_head))
    assert f.n_params == expected and f.scope == "all"
    assert set(f.state["params"]) == {"A_q", "B_q", "A_v", "B_v"}
    assert torch.count_nonzero(f.state["params"]["B_q"]) > 0  # trained
    assert f.state["best_step"] > 0
    with pytest.raises(AssertionError):  # the trained update moves the logits beyond rounding
        assert_logits_close(_logits(model, PROMPTS, f.intervention(model, None)), base, model,
                            what="trained LoRA")


def test_lr_grid_keeps_the_run_with_the_lowest_validation_loss(model, task):
    kw = dict(rank=4, n_examples=16, eval_every=2, n_valid=8)
    f = LoRA(lr=(1e-4, 0.05), **kw).fit(model, task)
    search = f.state["lr_search"]
    assert [r["lr"] for r in search] == [1e-4, 0.05]
    chosen = min(search, key=lambda r: r["valid_loss"])
    assert f.state["lr"] == chosen["lr"] == f.meta["lr"]
    assert search[0]["valid_loss"] != search[1]["valid_loss"]  # the grid really ran twice
    # the kept run is exactly the single-lr fit at the chosen rate (same seed, same batches)
    alone = LoRA(lr=chosen["lr"], **kw).fit(model, task)
    for k, v in alone.state["params"].items():
        assert torch.equal(f.state["params"][k], v)  # exact: the same seeded steps on one machine
    assert f.state["best_step"] == alone.state["best_step"] == chosen["best_step"]


def test_lr_grid_skips_a_diverging_rate_and_fails_only_when_all_do(model, task, monkeypatch):
    import sitelens.baselines.base as base

    real = base.train_hook_params

    def fake(*args, lr, **kw):  # a rate of 1 or more "diverges" (non-finite loss)
        if lr >= 1:
            raise FitError(f"Non-finite loss at lr={lr}")
        return real(*args, lr=lr, **kw)

    monkeypatch.setattr(base, "train_hook_params", fake)
    kw = dict(rank=4, n_examples=8, eval_every=2, n_valid=8)
    f = LoRA(lr=(10.0, 0.05), **kw).fit(model, task)
    assert f.state["lr"] == 0.05 and [r["lr"] for r in f.state["lr_search"]] == [0.05]
    with pytest.raises(FitError, match=r"Every learning rate in \(10\.0, 20\.0\) diverged"):
        LoRA(lr=(10.0, 20.0), **kw).fit(model, task)
    with pytest.raises(FitError, match="Non-finite loss at lr=10.0"):  # a single rate: its own error
        LoRA(lr=10.0, **kw).fit(model, task)


@pytest.mark.parametrize("lr", [(), 0.0, -1e-3, float("nan"), (1e-3, float("inf"))])
def test_bad_lr_is_a_fit_error_naming_the_method(model, task, lr):
    with pytest.raises(FitError, match=r"LoRA\.lr must be a positive finite number"):
        LoRA(rank=4, n_examples=8, lr=lr).fit(model, task)


def test_ia3_unit_init_is_identity_and_counts_params(model, task):
    c = model.cfg
    base = _logits(model, PROMPTS)
    # exact: unit scales multiply by 1
    assert torch.equal(_logits(model, PROMPTS, ia3_hooks(model, init_ia3(model))), base)
    before = _state(model)
    f = IA3(n_examples=24, eval_every=1, n_valid=8, lr=0.05).fit(model, task)
    _assert_model_untouched(model, before)
    assert f.n_params == c.n_layers * (2 * N_KV * c.d_head + c.d_mlp) and f.scope == "all"
    assert f.state["params"]["k"].shape == (c.n_layers, N_KV, c.d_head)
    assert not torch.equal(f.state["params"]["ff"], torch.ones(c.n_layers, c.d_mlp))


# ----------------------------------------------------------------------------------------------
# evaluate() accepts every intervention


def test_evaluate_runs_every_baseline(model, task):
    small = dict(n_prompts=4, n_shots=2, n_valid=8)
    methods = [
        SITE(n_prompts=4, n_shots=2, config=FitConfig(n_examples=8, n_valid=8)),
        FV(k=2, n_effect_prompts=1, **small), TV(**small), LTV(n_queries=8, n_shots=2),
        MTV(steps=2, **small), I2CL(n_demos=3, n_examples=8, n_valid=8),
        LoRA(n_examples=8, n_valid=8), IA3(n_examples=8, n_valid=8),
    ]
    fitted = {m.name: m.fit(model, task) for m in methods}
    assert all(isinstance(f, Fitted) for f in fitted.values())
    assert all(isinstance(f.intervention, (HeadMix, HookIntervention)) for f in fitted.values())
    inters = {f"{k}-baseline": f.intervention for k, f in fitted.items()}
    df = evaluate(model, task, methods=list(inters), interventions=inters, limit=3,
                  template=DEFAULT_TEMPLATE)
    assert set(df["method"]) == set(inters) and len(df) == 3 * len(inters)
