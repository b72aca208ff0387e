"""Mutation checks: each class of tolerance comparison in the suite still fails on a realistic bug.

A tolerance that grew loose enough to pass everywhere could also pass a broken computation. Each
test here breaks one path with ``monkeypatch`` (library code is never edited), runs the SAME
comparison the suite runs (the same test function, or the same check function it calls) and
requires the check that compares the broken quantity to raise ``AssertionError`` with that check's
own message: the tolerance helper's of tests/tolerances.py ("more than float rounding can explain",
or the non-finite one), or the message the compared assert carries (an assertion elsewhere in the
same test does not count as the catch). The bugs are ones that
happen in practice, far from a 1-ulp nudge:

- fused attention: one head whose causal mask is off by one (it sees one future token, or misses
  its own position), in every layer or only in the last; grouped-query heads wired to the wrong
  key/value head (``repeat`` instead of ``repeat_interleave``); left padding left visible;
- KV cache: a decode step whose query is rotated at the previous position; a cache that forgets
  which prefix columns are padding (bridge); the prefill unembedding the wrong column;
- left-padded batches: an all-ones attention mask (padding read as text);
- bridge vs HookedTransformer: broken attention on one side; an injection one position early on one;
- injection / HeadMix: an injection one position early; per-row weights on the wrong rows; the
  z hook of the next layer;
- baselines: the ridge penalty scaled by the sample count; LTV / FV vectors added one position
  early;
- float64 metrics: dNTP computed in float32;
- bfloat16: the last-position logits left in the model's dtype.

The bundled-model checks are marked ``integration``; the differences the bugs produce there are
recorded next to the comparisons in tests/test_integration.py.
"""

from __future__ import annotations

import dataclasses
import importlib
import os

import numpy as np
import pytest
import test_attention as TA
import test_backends as TB
import test_baselines as TBL
import test_metrics as TME
import test_models as TM
import test_patching as TP
import torch
import torch.nn.functional as torch_F
from test_backends import twins  # noqa: F401  (the module-scoped fixture, reused)
from tolerances import assert_activations_close, assert_logprobs_close

import sitelens.models.attention as attention_module
from sitelens.models import default_backend, encode, has_hooked_transformer, is_bridge
from sitelens.site.injection import HeadMix
from sitelens.tasks import load_task
from sitelens.testing import tiny_model

pytest_plugins = ["pytester"]  # the CI skip rule's cases run a throwaway suite

CAUGHT = r"more than float rounding can explain|non-finite"
hooked_only = pytest.mark.skipif(not has_hooked_transformer(), reason="HookedTransformer only")


# ----------------------------------------------------------------------------------------------
# broken paths


class _BrokenFunctional:
    """Stands in for ``torch.nn.functional`` inside sitelens.models.attention: every function is the real
    one except ``scaled_dot_product_attention``."""

    def __init__(self, sdpa):
        self.scaled_dot_product_attention = sdpa

    def __getattr__(self, name):
        return getattr(torch_F, name)


def break_fused_attention(monkeypatch, kind: str, *, head: int = 0, last_layer_of: int | None = None):
    """Break the fused attention path (the SDPA call of sitelens.models.attention) in one way:

    - ``sees_future``: query head ``head`` also sees the key one position ahead of each visible one
      (its causal mask is off by one: one future token);
    - ``misses_diagonal``: query head ``head`` cannot see its own position (a row left with no key
      keeps it, so no NaN hides the bug);
    - ``gqa_groups``: query head h reads key/value head ``h % n_kv`` instead of ``h // group``;
    - ``padding_visible``: the padding mask is dropped (causal only).

    ``last_layer_of=n_layers``: only every ``n_layers``-th call is broken (the last layer, when
    every layer takes the fused path)."""
    real = torch_F.scaled_dot_product_attention
    calls = [0]

    def sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        calls[0] += 1
        if last_layer_of is not None and calls[0] % last_layer_of:
            return real(q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale,
                        enable_gqa=enable_gqa)
        b, n_q_heads, nq, _ = q.shape
        nk, n_kv = k.shape[-2], k.shape[1]
        if n_kv != n_q_heads:
            group = n_q_heads // n_kv
            expand = (lambda t: t.repeat(1, group, 1, 1)) if kind == "gqa_groups" else \
                (lambda t: t.repeat_interleave(group, 1))
            k, v = expand(k), expand(v)  # [b, n_q_heads, kv_pos, d_head]
        offset = nk - nq
        q_pos = torch.arange(nq, device=q.device)[:, None] + offset  # [q, 1]
        k_pos = torch.arange(nk, device=q.device)[None, :]  # [1, k]
        causal = k_pos <= q_pos  # [q, k]
        if attn_mask is None or kind == "padding_visible":
            mask = causal[None, None]
        else:
            mask = attn_mask
        mask = mask.expand(b, n_q_heads, nq, nk).clone()  # [b, h, q, k]
        m = mask[:, head]
        if kind == "sees_future":
            m[..., 1:] |= m[..., :-1].clone()
        elif kind == "misses_diagonal":
            fewer = m & (k_pos != q_pos)
            m = torch.where(fewer.any(-1, keepdim=True), fewer, m)
        mask[:, head] = m
        return real(q, k, v, attn_mask=mask, scale=scale)  # [b, h, q, d_head]

    monkeypatch.setattr(attention_module, "F", _BrokenFunctional(sdpa))


def rotate_decode_queries_one_position_back(monkeypatch, model):
    """A KV-cached step whose query is rotated at the previous position (``offset − 1``)."""
    for block in model.blocks:
        real = block.attn.apply_rotary

        def shifted(x, past_kv_pos_offset=0, attention_mask=None, real=real):
            if past_kv_pos_offset == 0:  # a prefill, or the keys (always rotated from 0)
                return real(x, 0, attention_mask)
            if attention_mask is None:
                return real(x, past_kv_pos_offset - 1, None)
            # positions are counted from the mask: count the query one token short
            short = attention_mask.clone()
            short[:, past_kv_pos_offset - 1] = 0
            return real(x, past_kv_pos_offset, short)

        monkeypatch.setattr(block.attn, "apply_rotary", shifted)


def forget_cache_padding(monkeypatch):
    """The bridge's cache (the driven Hugging Face cache, or the recompute stand-in) forgets
    which prefix columns are padding (all ones)."""
    from sitelens.models import BridgeKVCache, RecomputeCache

    def get(self):
        return torch.ones_like(self.__dict__["attention_mask"])

    def put(self, value):
        self.__dict__["attention_mask"] = value

    for cls in (BridgeKVCache, RecomputeCache):
        monkeypatch.setattr(cls, "attention_mask", property(get, put), raising=False)


def break_kv_cache(monkeypatch, model):
    if is_bridge(model):
        forget_cache_padding(monkeypatch)
    else:
        rotate_decode_queries_one_position_back(monkeypatch, model)


def read_padding_as_text(monkeypatch, model):
    """Every forward pass gets an all-ones attention mask: left padding is attended to."""
    real = model.forward

    def forward(*args, **kwargs):
        if kwargs.get("attention_mask") is not None:
            kwargs["attention_mask"] = torch.ones_like(kwargs["attention_mask"])
        return real(*args, **kwargs)

    monkeypatch.setattr(model, "forward", forward)


def inject_one_position_early(monkeypatch, *, bridge_only: bool = False):
    """A HeadMix run through sitelens.eval.generation (last_logits, greedy_generate: the full-pass
    path) injects at -2 instead of -1 (on a TransformerBridge only, with ``bridge_only``)."""
    E = importlib.import_module("sitelens.eval.generation")

    real = E.intervention_hooks

    def hooks_for(model, intervention, seq_len):
        if isinstance(intervention, HeadMix) and (is_bridge(model) or not bridge_only):
            early = tuple(p - 1 if p < 0 else p for p in intervention.positions)
            return HeadMix(intervention.weights, intervention.targets, early, seq_len).hooks(model)
        return real(model, intervention, seq_len)

    monkeypatch.setattr(E, "intervention_hooks", hooks_for)


class _RowShiftedMix(HeadMix):
    """Per-row weights applied to the wrong rows (rolled by one along the batch)."""

    def hook_fn(self, layer: int):
        if self.weights.dim() == 3 and self.weights.shape[0] > 1:
            shifted = dataclasses.replace(self, weights=self.weights.roll(1, 0))
            return HeadMix.hook_fn(shifted, layer)
        return super().hook_fn(layer)


# ----------------------------------------------------------------------------------------------
# fused attention vs TransformerLens attention (tiny models)

KINDS = ["sees_future", "misses_diagonal", "padding_visible", "sees_future_last_layer"]


# wrong key/value groups only exist in variants with grouped-query attention (> 1 key/value head)
FUSED_CASES = [(variant, kind) for variant, v in TA.VARIANTS.items() for kind in KINDS + ["gqa_groups"]
               if kind != "gqa_groups" or v.get("n_key_value_heads") not in (None, 1)]


@hooked_only
@pytest.mark.parametrize("variant, kind", FUSED_CASES, ids=[f"{v}-{k}" for v, k in FUSED_CASES])
def test_fused_attention_comparisons_catch_a_broken_mask(variant, kind, monkeypatch):
    """Both comparisons of attention_paths_agree (log-probs and per-layer hook_z) fail alone."""
    model = TA._hooked_tiny(**TA.VARIANTS[variant])
    enc = encode(model, TA.PROMPTS)
    slow = TA._run(model, enc, fast=False)
    last = model.cfg.n_layers if kind.endswith("_last_layer") else None
    break_fused_attention(monkeypatch, kind.removesuffix("_last_layer"), last_layer_of=last)
    fast = TA._run(model, enc, fast=True)
    keep = enc.attention_mask.bool()
    with pytest.raises(AssertionError, match=CAUGHT):
        assert_logprobs_close(fast[0], slow[0], model, mask=keep, what="log-probs")
    with pytest.raises(AssertionError, match=CAUGHT):
        assert_activations_close(fast[1], slow[1], model, layer_dim=0, what="hook_z")
    with pytest.raises(AssertionError, match=CAUGHT):
        TA.attention_paths_agree(model, enc)


@hooked_only
@pytest.mark.parametrize("kind", ["misses_diagonal", "sees_future"])
def test_fused_kv_cached_comparison_catches_a_broken_mask(kind, monkeypatch):
    """test_attention's KV-cached comparison (greedy first-step logits, last token on a prefix
    cache): a decode query that misses itself; a prefill head that sees the future."""
    break_fused_attention(monkeypatch, kind)
    with pytest.raises(AssertionError, match=CAUGHT):
        TA.test_fast_attention_kv_cached_paths_match("gqa")


@hooked_only
def test_gradient_comparison_catches_a_broken_mask(monkeypatch):
    break_fused_attention(monkeypatch, "sees_future")
    with pytest.raises(AssertionError, match=CAUGHT):
        TA.test_gradients_through_a_padded_batch_match_and_are_finite()


# ----------------------------------------------------------------------------------------------
# KV cache vs full forward


def test_prefix_cache_comparison_catches_a_step_at_the_wrong_position(tiny, monkeypatch):
    break_kv_cache(monkeypatch, tiny)
    with pytest.raises(AssertionError, match=CAUGHT):
        TM.test_prefix_cache_matches_full_forward(tiny)


def test_cached_patching_comparison_catches_a_step_at_the_wrong_position(tiny, monkeypatch):
    break_kv_cache(monkeypatch, tiny)
    with pytest.raises(AssertionError, match=CAUGHT):
        TP.test_zero_shot_full_pass_matches_cached_pass(tiny, load_task("antonym"))


def test_kv_forward_comparison_catches_a_step_at_the_wrong_position(tiny, monkeypatch):
    break_kv_cache(monkeypatch, tiny)
    with pytest.raises(AssertionError, match=CAUGHT):
        TB.test_bridge_cache_stand_in_matches_full_passes(tiny)


def test_last_only_prefill_comparison_catches_the_wrong_column(tiny, monkeypatch):
    import sitelens.models.kv as M

    if is_bridge(tiny):  # Hugging Face unembeds the position logits_to_keep names: the one before
        monkeypatch.setattr(M, "_last_only_kwargs", lambda model: {"logits_to_keep": torch.tensor([-2])})
    else:
        real = M.unembed_last
        monkeypatch.setattr(M, "unembed_last", lambda model, resid: real(model, resid[:, :-1]))
    with pytest.raises(AssertionError, match=CAUGHT):
        TB.test_kv_forward_last_only_equals_the_last_column(tiny)


# ----------------------------------------------------------------------------------------------
# left-padded batches vs single prompts


def test_batched_comparison_catches_padding_read_as_text(tiny, monkeypatch):
    read_padding_as_text(monkeypatch, tiny)
    with pytest.raises(AssertionError, match=CAUGHT):
        TM.test_batched_equals_unbatched(tiny)


def test_memory_bounded_embedding_comparison_catches_padding_read_as_text(tiny_mha, monkeypatch):
    read_padding_as_text(monkeypatch, tiny_mha)
    with pytest.raises(AssertionError, match=CAUGHT):
        TM.test_memory_bounded_batches_give_the_same_results(tiny_mha, monkeypatch)


# ----------------------------------------------------------------------------------------------
# bridge vs HookedTransformer on the same weights


def test_backend_comparison_catches_broken_attention_on_one_side(twins, monkeypatch):  # noqa: F811
    break_fused_attention(monkeypatch, "misses_diagonal")  # the HookedTransformer's attention only
    with pytest.raises(AssertionError, match=CAUGHT):
        TB.test_backends_agree_on_the_same_weights(twins)
    with pytest.raises(AssertionError, match=CAUGHT):
        TB.test_baselines_agree_across_backends(twins, "tv")


def test_backend_comparison_catches_an_injection_one_position_early(twins, monkeypatch):  # noqa: F811
    inject_one_position_early(monkeypatch, bridge_only=True)
    with pytest.raises(AssertionError, match=CAUGHT):
        TB.test_backends_agree_on_the_same_weights(twins)


# ----------------------------------------------------------------------------------------------
# injection / HeadMix and the patching experiments


@pytest.fixture(scope="module")
def patching_setup(backend):
    model = tiny_model(n_layers=2, n_heads=4, d_head=8, n_key_value_heads=2, seed=0, backend=backend)
    task = load_task("antonym")
    return model, task, TP._adapter(model, task)


def test_full_vs_cached_patching_catches_an_injection_one_position_early(patching_setup, monkeypatch):
    model, task, adapter = patching_setup
    inject_one_position_early(monkeypatch)  # the full-pass path only
    with pytest.raises(AssertionError, match=CAUGHT):
        TP.test_patching_all_heads_alpha_one_equals_full_replacement(model, task, adapter)


def test_intra_task_vs_direct_patching_catches_an_injection_one_position_early(patching_setup,
                                                                             monkeypatch):
    from sitelens.patching import core as P

    model, task, adapter = patching_setup
    intra = P.intra_task(model, task, adapter, limit=6, n_random_seeds=1, n_boot=0, seed=0)
    inject_one_position_early(monkeypatch)  # the direct (full-pass) reference only
    with pytest.raises(AssertionError, match=CAUGHT):
        TP.test_intra_task_matches_direct_patching(model, task, adapter, intra)


def test_per_row_comparisons_catch_weights_on_the_wrong_rows(patching_setup, monkeypatch):
    from sitelens.patching import engine as P

    model, task, adapter = patching_setup
    monkeypatch.setattr(P, "HeadMix", _RowShiftedMix)
    with pytest.raises(AssertionError, match=CAUGHT):
        TP.test_per_row_weights_equal_separate_runs(model, task, adapter)
    with pytest.raises(AssertionError, match=CAUGHT):
        TP.test_batched_head_effects_equal_serial_loop(model, task, adapter)


def test_head_effect_comparison_catches_the_next_layers_hook(patching_setup, monkeypatch):
    import sitelens.site.injection as I

    model, task, adapter = patching_setup
    real = I.z_hook_name
    monkeypatch.setattr(I, "z_hook_name", lambda m, layer: real(m, (layer + 1) % m.cfg.n_layers))
    with pytest.raises(AssertionError, match=CAUGHT):
        TP.test_head_effect_matches_hand_written_hook(model, task, adapter)


# ----------------------------------------------------------------------------------------------
# baselines


@pytest.fixture(scope="module")
def baseline_setup(backend):
    """test_baselines.py's model and task (its fixtures, rebuilt the same way)."""
    import random

    from sitelens.tasks import task_from_pairs

    torch.manual_seed(0)
    model = tiny_model(n_key_value_heads=TBL.N_KV, backend=backend)
    rng = random.Random(0)
    words = list(dict.fromkeys("".join(rng.choice("abcdefgh") for _ in range(3)) for _ in range(80)))
    return model, task_from_pairs("reverse", [(w, w[::-1]) for w in words])


def test_ridge_comparison_catches_a_penalty_scaled_by_the_sample_count(baseline_setup, monkeypatch):
    import sitelens.baselines.ltv as ltv

    model, task = baseline_setup
    real = ltv.ridge_closed_form
    monkeypatch.setattr(ltv, "ridge_closed_form", lambda X, Y, lam: real(X, Y, lam * X.shape[0]))
    with pytest.raises(AssertionError, match=r"Not equal to tolerance|" + CAUGHT):
        TBL.test_ltv_w_is_the_ridge_closed_form(model, task)


def test_ltv_hook_comparison_catches_the_shift_one_position_early(baseline_setup, monkeypatch):
    import sitelens.baselines.ltv as ltv

    model, task = baseline_setup

    def early(W, seq_len):
        def fn(x, hook=None):
            if seq_len is not None and x.shape[1] != seq_len:
                return x
            x, at = x.clone(), -2 if x.shape[1] > 1 else -1
            x[:, at] = x[:, at] + x[:, at] @ W.to(x.dtype).T
            return x

        return fn

    monkeypatch.setattr(ltv, "ltv_hook", early)
    with pytest.raises(AssertionError, match=CAUGHT):
        TBL.test_ltv_adds_w_h_at_the_last_token_only(model, task)


def test_fv_comparison_catches_the_vector_added_one_position_early(baseline_setup, monkeypatch):
    import sitelens.baselines.fv as fv

    model, task = baseline_setup

    def early(vector, seq_len):
        def fn(x, hook=None):
            if seq_len is not None and x.shape[1] != seq_len:
                return x
            x, at = x.clone(), -2 if x.shape[1] > 1 else -1
            x[:, at] = x[:, at] + vector.to(x.dtype)
            return x

        return fn

    monkeypatch.setattr(fv, "last_add_hook", early)
    with pytest.raises(AssertionError, match=CAUGHT):
        TBL.test_fv_adds_exactly_the_summed_head_outputs(model, task)


def test_fv_effects_comparison_catches_weights_on_the_wrong_rows(baseline_setup, monkeypatch):
    # FV's causal effects come from sitelens.patching (its own fallback is gone): shifting the
    # rows of patching's batched HeadMix must break the single-head comparison of test_baselines
    from sitelens.patching import engine as P

    model, task = baseline_setup
    monkeypatch.setattr(P, "HeadMix", _RowShiftedMix)
    with pytest.raises(AssertionError, match=CAUGHT):
        TBL.test_fv_causal_effects_are_patchings_and_match_single_head_patching(model, task)


# ----------------------------------------------------------------------------------------------
# float64 metrics


def test_dntp_comparison_catches_a_float32_computation(monkeypatch):
    import sitelens.eval.metrics as metrics

    def float32_kl(a, b):
        log_p, log_q = torch.log_softmax(a.float(), -1), torch.log_softmax(b.float(), -1)
        return (log_p.exp() * (log_p - log_q)).sum(-1).double()

    monkeypatch.setattr(metrics, "dntp_per_item", float32_kl)
    with pytest.raises(AssertionError, match="dntp vs the float64 manual KL"):
        TME.test_dntp_matches_a_manual_kl_in_the_right_direction()


# ----------------------------------------------------------------------------------------------
# bfloat16


def test_bfloat16_baseline_check_catches_logits_left_in_bfloat16(monkeypatch):
    """The float32 cast of the last-position logits dropped: every softmax, loss and probability
    downstream would run in bfloat16. tests/test_bfloat16.py's baseline check requires float32
    logits from the bfloat16 model."""
    import test_bfloat16 as TBF

    import sitelens.eval.generation as generation
    from sitelens.models import load_model

    real = generation.last_position_logits
    monkeypatch.setattr(generation, "last_position_logits",
                        lambda model, enc: real(model, enc).to(model.cfg.dtype))  # cast dropped
    backend = TBF.BACKENDS[0]
    models = (load_model("tiny-random", backend=backend),
              load_model("tiny-random", backend=backend, dtype="bfloat16"))
    with pytest.raises(AssertionError, match="zero-shot: logits read in torch.bfloat16"):
        TBF.test_baseline_in_bfloat16(models, load_task("antonym"), "zero-shot")


# ----------------------------------------------------------------------------------------------
# the bundled models


# The GQA-group break needs more than one key/value head: SmolLM2 has 3, Gemma-3-270M has 1 (MQA),
# so that case is parametrized on SmolLM2 only (a skip fails under CI).
BUNDLED_FUSED_CASES = [(fixture, kind) for fixture in ("smollm2", "gemma")
                       for kind in ("sees_future", "misses_diagonal", "sees_future_last_layer", "gqa_groups")
                       if kind != "gqa_groups" or fixture == "smollm2"]


@pytest.mark.integration
@pytest.mark.parametrize("fixture,kind", BUNDLED_FUSED_CASES)
def test_bundled_fused_attention_comparison_catches_a_broken_mask(fixture, kind, request, monkeypatch):
    from test_integration import PROMPTS

    if default_backend() == "bridge":  # the fixture would load a bridge: skip before the load
        pytest.skip("HookedTransformer only")
    model = request.getfixturevalue(fixture)
    n_kv = model.cfg.n_key_value_heads
    assert kind != "gqa_groups" or 1 < n_kv < model.cfg.n_heads, \
        f"the gqa_groups case needs grouped-query attention; {fixture} has {n_kv} key/value heads"
    last = model.cfg.n_layers if kind.endswith("_last_layer") else None
    break_fused_attention(monkeypatch, kind.removesuffix("_last_layer"), last_layer_of=last)
    with pytest.raises(AssertionError, match=CAUGHT):
        TA.attention_paths_agree(model, encode(model, PROMPTS))


@pytest.mark.integration
@pytest.mark.parametrize("fixture", ["smollm2", "gemma"])
def test_bundled_huggingface_comparison_catches_a_broken_mask(fixture, request, monkeypatch):
    from test_integration import hf_logprobs_agree

    from sitelens.models import load_hf_reference

    if default_backend() == "bridge":  # the fixture would load a bridge: skip before the load
        pytest.skip("breaks sitelens's fused attention: HookedTransformer only")
    model = request.getfixturevalue(fixture)
    hf, _ = load_hf_reference("gemma-3-270m" if fixture == "gemma" else "smollm2-135m-instruct")
    break_fused_attention(monkeypatch, "misses_diagonal")
    with pytest.raises(AssertionError, match=CAUGHT):
        hf_logprobs_agree(model, hf)


@pytest.mark.integration
@pytest.mark.parametrize("fixture", ["smollm2", "gemma"])
def test_bundled_padded_batch_comparison_catches_visible_padding(fixture, request, monkeypatch):
    from test_integration import padded_batch_agrees

    if default_backend() == "bridge":  # the fixture would load a bridge: skip before the load
        pytest.skip("breaks sitelens's fused attention: HookedTransformer only")
    model = request.getfixturevalue(fixture)
    break_fused_attention(monkeypatch, "padding_visible")
    with pytest.raises(AssertionError, match=CAUGHT):
        padded_batch_agrees(model)


@hooked_only
@pytest.mark.integration
def test_bundled_bridge_comparison_catches_broken_attention_on_one_side(smollm2, monkeypatch):
    from test_integration import bridge_logprobs_agree

    from sitelens.models import load_model

    bridge = load_model("smollm2-135m-instruct", backend="bridge")
    break_fused_attention(monkeypatch, "misses_diagonal")  # the HookedTransformer side only
    with pytest.raises(AssertionError, match=CAUGHT):
        bridge_logprobs_agree(bridge, smollm2)


# ----------------------------------------------------------------------------------------------
# tests that check a value: each fails on the bug it guards (issue 31)


class _NumpyWithout:
    """``numpy`` with one function replaced (inside one library module)."""

    def __init__(self, **swap):
        self.__dict__.update(swap)

    def __getattr__(self, name):
        return getattr(np, name)


def _lens_task():
    return load_task("antonym")


def test_atp_star_test_catches_signed_terms(tiny_mha, monkeypatch):
    """AtP* summing the GradDrop terms with their signs instead of their magnitudes."""
    import test_lenses as TL

    import sitelens.lenses.attribution as attribution

    monkeypatch.setattr(attribution, "np", _NumpyWithout(abs=lambda x: x))
    with pytest.raises(AssertionError, match=CAUGHT):
        TL.test_grad_drop_zeroes_own_layer_and_atp_star_formula(tiny_mha, _lens_task())


def test_atp_star_test_catches_a_backward_count_that_is_not_counted(tiny_mha, monkeypatch):
    """Backward passes reported from a counter that counts the model's calls instead."""
    import test_lenses as TL

    import sitelens.lenses.attribution as attribution
    from sitelens.patching.engine import ForwardPassCounter

    monkeypatch.setattr(attribution, "BackwardPassCounter", ForwardPassCounter)
    with pytest.raises(AssertionError, match="backward passes counted"):
        TL.test_grad_drop_zeroes_own_layer_and_atp_star_formula(tiny_mha, _lens_task())


def test_alpha_over_seeds_test_catches_a_seed_left_out(tiny_mha, monkeypatch):
    """Every seed fitted with the config's own seed (the seed not passed on)."""
    import test_lenses as TL

    import sitelens.lenses.alpha as alpha

    monkeypatch.setattr(alpha, "replace", lambda obj, **kw: obj)
    with pytest.raises(AssertionError, match="alpha_over_seeds: the α of each seed is not its single fit"):
        TL.test_alpha_over_seeds_matches_single_fits_and_reports_stability(tiny_mha, _lens_task())


def test_effect_lens_test_catches_effects_on_the_wrong_heads(tiny_mha, monkeypatch):
    """Head j's patched probabilities reported for head j + 1."""
    import test_lenses as TL

    import sitelens.patching.effects as effects

    real = effects.batched_answer_probs

    def shifted(*a, **k):
        base, patched = real(*a, **k)
        return base, patched.roll(1, dims=1)

    monkeypatch.setattr(effects, "batched_answer_probs", shifted)
    with pytest.raises(AssertionError, match=CAUGHT):
        TL.test_exact_effects_lens_measures_each_heads_patch(tiny_mha, _lens_task())


def test_shared_inputs_test_catches_lenses_on_another_embedding(tiny_mha, monkeypatch):
    """head_scores handing the lenses an embedding other than the first fit's."""
    import test_lenses as TL

    import sitelens.lenses.registry as registry

    real = registry.LensInputs

    def other(model, task, embedding, *a, **k):
        return real(model, task, embedding * 0.5, *a, **k)

    monkeypatch.setattr(registry, "LensInputs", other)
    with pytest.raises(AssertionError, match="head_scores: (atp|effect) is not on the first fit's embedding"):
        TL.test_head_scores_runs_every_lens_with_shared_inputs(tiny_mha, _lens_task())


def _sv_task():
    """tests/test_sv.py's task fixture: three-letter words and their reversals."""
    import random

    from sitelens.tasks import task_from_pairs

    rng = random.Random(0)
    words = list(dict.fromkeys("".join(rng.choice("abcdefgh") for _ in range(3)) for _ in range(80)))
    return task_from_pairs("reverse", [(w, w[::-1]) for w in words])


def test_sv_evaluate_test_catches_a_dropped_intervention(monkeypatch):
    """evaluate() running the SV rows without their hooks."""
    import test_sv as TS

    model = tiny_model(n_key_value_heads=2, backend="hooked" if has_hooked_transformer() else "bridge")
    real = TS.evaluate

    def without_sv(model, task, *, interventions=None, **k):
        return real(model, task, interventions={m: None for m in interventions or {}}, **k)

    monkeypatch.setattr(TS, "evaluate", without_sv)
    with pytest.raises(AssertionError, match="evaluate's sv predictions are not SV's greedy generations"):
        TS.test_evaluate_runs_sv(model, _sv_task())


def test_depth_profile_test_catches_bins_at_the_layer_start(monkeypatch):
    """Relative depth taken as layer / n_layers (the layer's start) instead of its middle."""
    if not has_hooked_transformer():
        pytest.skip("HookedTransformer only: tests/test_atlas.py needs it")
    import test_atlas as TAT

    real = TAT.depth_profile

    def at_start(data, bins=10):
        shifted = data.alpha.assign(layer=data.alpha.layer - 0.5)
        return real(dataclasses.replace(data, alpha=shifted), bins)

    monkeypatch.setattr(TAT, "depth_profile", at_start)
    with pytest.raises(AssertionError, match="depth_profile: α mass in the wrong deciles"):
        TAT.test_depth_profile_bins_alpha_mass_by_relative_depth()


@pytest.fixture(scope="module")
def small_atlas(tmp_path_factory):
    """tests/test_atlas.py's fixture at its smallest (one layer of two heads; three tasks, the fewest
    a similarity correlation takes): the cache test reads only its model, tasks, tables and cache."""
    if not has_hooked_transformer():
        pytest.skip("HookedTransformer only: tests/test_atlas.py needs it")
    import test_atlas as TAT

    from sitelens.atlas import build_atlas_data

    model = tiny_model(n_layers=1, n_heads=2, d_head=8, seed=0, backend="hooked")
    tasks = [load_task(t) for t in TAT.TASKS[:3]]
    cache = tmp_path_factory.mktemp("atlas_cache")
    return model, tasks, build_atlas_data(model, tasks, TAT.SMALL, cache_dir=cache), None, cache


def test_atlas_cache_test_catches_a_key_that_always_misses(small_atlas, monkeypatch):
    """Cell keys that hash the time they were made: every rebuild misses its cache and refits."""
    import time

    import test_atlas as TAT

    from sitelens.pipelines.store import CellStore

    real = CellStore.key
    monkeypatch.setattr(CellStore, "key", lambda self, params: real(self, {**params, "at": time.time_ns()}))
    with pytest.raises(AssertionError, match="instead of reading its cache"):
        TAT.test_atlas_fits_are_cached(small_atlas, monkeypatch)


def test_atlas_cache_test_catches_fits_never_read_back(small_atlas, monkeypatch):
    """A saved adapter that never matches the model it was fitted on (always refitted)."""
    import test_atlas as TAT

    from sitelens.site import SiteAdapter

    monkeypatch.setattr(SiteAdapter, "load_matching", classmethod(lambda cls, *a, **k: None))
    with pytest.raises(AssertionError, match="recomputed a fit"):
        TAT.test_atlas_fits_are_cached(small_atlas, monkeypatch)


def _tiny_shape() -> tuple[int, int]:
    from sitelens.models import load_model

    cfg = load_model("tiny-random").cfg
    return cfg.n_layers, cfg.n_heads


def test_heads_costs_test_catches_a_counter_on_another_model(tmp_path, capsys, monkeypatch):
    """The ablation lens counting the calls of another module than the model: 0 forward passes."""
    import test_cli_heads as TCH

    import sitelens.lenses.ablation as ablation
    from sitelens.patching.engine import ForwardPassCounter

    class OnAnotherModule(ForwardPassCounter):
        def __init__(self, model):
            super().__init__(torch.nn.Identity())

    monkeypatch.setattr(ablation, "ForwardPassCounter", OnAnotherModule)
    with pytest.raises(AssertionError, match="ablation"):
        TCH.test_heads_every_lens_json(tmp_path, capsys, _tiny_shape())


def test_heads_costs_test_catches_costs_of_the_wrong_lens(tmp_path, capsys, monkeypatch):
    """``--json`` reporting every lens with the first lens's costs (the alpha fits': no passes)."""
    import test_cli_heads as TCH

    import sitelens.cli.heads as heads

    real = heads.heads_summary

    def first_costs(*a, **k):
        obj = real(*a, **k)
        first = next(iter(obj["lenses"].values()))
        for d in obj["lenses"].values():
            d.update({c: first[c] for c in ("forward_passes", "backward_passes", "seconds")})
        return obj

    monkeypatch.setattr(heads, "heads_summary", first_costs)
    with pytest.raises(AssertionError, match="the --json costs are not the table's"):
        TCH.test_heads_every_lens_json(tmp_path, capsys, _tiny_shape())


def test_regression_mse_test_catches_the_fallback_left_out(monkeypatch):
    """An answer without a number scored as 0 instead of the fallback (the train mean)."""
    import test_regression as TR

    real = TR.regression_mse
    monkeypatch.setattr(TR, "regression_mse", lambda p, t, *, fallback: real(p, t, fallback=0.0))
    with pytest.raises(AssertionError, match="the model's MSE vs the sum by hand"):
        TR.test_evaluate_then_mse_on_a_tiny_model()


def test_regression_mse_test_catches_the_last_number_of_the_line(monkeypatch):
    """Parsing that takes the last number of the first line (``"0.5, 0.41"`` → 0.41)."""
    import test_regression as TR

    import sitelens.tasks.regression as regression

    def last_number(text):
        line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
        found = regression._NUMBER.findall(line)
        return float(found[-1].replace("\u2212", "-")) if found else None

    monkeypatch.setattr(regression, "parse_number", last_number)
    with pytest.raises(AssertionError, match="the written answers' MSE vs the numbers read by hand"):
        TR.test_evaluate_then_mse_on_a_tiny_model()


def test_bad_value_test_catches_a_loader_message_without_what_it_loads(monkeypatch):
    """The model check's message naming the value and the choices but not that it is a model."""
    import test_cli_bad_input as TBI

    import sitelens.models as models
    from sitelens.errors import ModelError

    real = models.check_model_available

    def vague(name, backend=None):
        try:
            real(name, backend)
        except ModelError:
            raise ModelError(f"{name!r} cannot be loaded; use one of "
                             f"{', '.join(models.BUNDLED_MODELS)}.") from None

    monkeypatch.setattr(models, "check_model_available", vague)
    with pytest.raises(AssertionError, match="the error does not say it is a model"):
        TBI.test_bad_value("fit", "--model", "model")


def test_base_commands_test_catches_a_valid_line_refused(monkeypatch):
    """An output check that refuses a CSV path which does not exist yet (every new ``--items``)."""
    import test_cli_bad_input as TBI

    from sitelens.errors import OutputError, SitelensError

    validate = importlib.import_module("sitelens.cli.validate")  # the module, not sitelens.cli.validate()
    real = validate.check_output

    def existing_only(path, kind, **k):
        if not os.path.exists(path):
            raise OutputError(f"{path} does not exist")
        return real(path, kind, **k)

    monkeypatch.setattr(validate, "check_output", existing_only)
    with pytest.raises(SitelensError):
        TBI.test_every_base_command_passes_validation("eval")


def test_ci_skip_test_catches_setup_skips_let_through(pytester, monkeypatch):
    """The CI rule applied to the call phase only: skips by a mark or a fixture (setup) pass."""
    import conftest
    import test_ci_skips as TCS

    real = conftest._fail_a_ci_skip
    monkeypatch.setattr(conftest, "_fail_a_ci_skip",
                        lambda report: real(report) if report.when in ("call", "collect") else None)
    with pytest.raises(AssertionError, match="under CI these skips must fail"):
        TCS.test_under_ci_only_a_gpu_or_backend_skip_passes(pytester, monkeypatch)


def test_ci_skip_test_catches_a_rule_that_allows_every_reason(pytester, monkeypatch):
    """An allowed-reason pattern that matches any reason."""
    import conftest
    import test_ci_skips as TCS

    monkeypatch.setattr(conftest, "ci_skip_allowed", lambda reason: True)
    with pytest.raises(AssertionError, match="under CI these skips must fail"):
        TCS.test_under_ci_only_a_gpu_or_backend_skip_passes(pytester, monkeypatch)


def test_effect_rows_test_catches_a_dropped_last_batch(patching_setup, monkeypatch):
    """run_rows leaving out the last partial batch (its rows given the batch before's values): the
    rows counted fall short of the rows the effects stand for."""
    import sitelens.patching.engine as engine

    real = engine.run_rows

    def short(model, cache, last, answers, item_idx, cond_idx, *a, batch_size=128, **k):
        keep = len(item_idx) - (len(item_idx) % batch_size or batch_size)
        correct, prob = real(model, cache, last, answers, item_idx[:keep], cond_idx[:keep], *a,
                             batch_size=batch_size, **k)
        pad = len(item_idx) - keep
        return torch.cat([correct, correct[-pad:]]), torch.cat([prob, prob[-pad:]])

    monkeypatch.setattr(engine, "run_rows", short)
    with pytest.raises(AssertionError, match="effect rows: counted, run, wanted"):
        TP.test_head_effects_count_real_forward_passes(*patching_setup, True, monkeypatch)


def test_certified_rows_test_catches_a_row_left_out(tiny_mha, monkeypatch):
    """certified_top_k's rows run without the last one (its value copied from the row before)."""
    import test_lenses as TL

    import sitelens.lenses.compare as compare

    real = compare.run_rows

    def one_short(model, cache, last, answers, item_idx, cond_idx, *a, **k):
        correct, prob = real(model, cache, last, answers, item_idx[:-1], cond_idx[:-1], *a, **k)
        return torch.cat([correct, correct[-1:]]), torch.cat([prob, prob[-1:]])

    monkeypatch.setattr(compare, "run_rows", one_short)
    with pytest.raises(AssertionError, match="certified_top_k: rows counted ≠ rows run"):
        TL.test_certified_top_k_verifies_with_exact_values(tiny_mha, _lens_task())
