"""Planted per-family bugs that tests/test_families.py must catch (issue 35), in the style of
tests/test_mutations.py: each case builds a fresh tiny model of the family, breaks one path with
``monkeypatch`` (library code is never edited), runs the SAME check of test_families.py on it and
requires it to fail with the tolerance helpers' "more than float rounding can explain" message.

The bugs are the ones a family's features invite, and each family gets every bug its
configuration can have (read from the config, not listed by hand):

- ``rotary fraction ignored``: the fused attention rotates the whole head where the family rotates
  a fraction (GPT-J, Pythia, Phi) — caught by the fused-vs-TransformerLens attention check;
- ``attention soft-cap skipped``: the fused path accepts a soft-capped model and computes it
  without the cap (Gemma 2) — the attention check;
- ``logit soft-cap skipped``: the last-position unembedding (sitelens.models.kv.unembed_last)
  drops the final logit soft-cap (Gemma 2) — the injection check's last logits;
- ``parallel block run serially``: a KV-cached pass runs a parallel attention + MLP block as
  attention then MLP (GPT-J, Pythia, Phi) — the KV-cached generation check;
- ``sliding window ignored``: the fused path attends past the window (GPT-Neo, Mistral, Phi-3,
  Gemma 3) — the attention check;
- ``GQA groups miswired``: query head h reads key/value head ``h % n_kv`` (Llama, Mistral, Qwen2,
  Qwen3) — the attention check;
- ``injection one position early``: every family — the injection check;
- ``effects patched at the next layer``: the per-head effects patch layer l + 1's head (every
  family) — the check against ``generic_activation_patch``;
- ``gradient of the wrong metric``: the lenses differentiate the answer's probability where its
  log-probability is asked (every family) — the α-gradient's finite-difference check.

``scripts/families_table.py`` lists, per family, the bugs caught from this file's results.

On the TransformerBridge (tests/test_families_bridge.py, both TransformerLens versions),
``test_planted_bug_fails_the_bridge_family_suite`` plants the bugs that touch sitelens's code (not
the model's) into that suite's checks on the bridge model: every family only the bridge builds
(those ``SUPPORTED_FAMILIES`` lacks: Falcon, StarCoder 2) gets all of them, and Llama (Hugging
Face computes its RMSNorm and attention softmax in float32: its α-gradient is checked against
autograd in float32, Falcon's in float64 by finite differences) the lens bugs:

- ``injection one position early`` (above) — the bridge's injection check;
- ``effects patched at the next layer`` (above) — the bridge's check against
  ``generic_activation_patch`` (``test_head_effects_equal_a_generic_activation_patch_reference``);
- ``gradient of the wrong metric`` (above) — the bridge's α-gradient check;
- ``AtP of the wrong metric``: AtP differentiates the answer's log-probability where its
  probability is asked — the AtP-vs-autograd check.

``scripts/families_table.py`` runs it with the bridge suite on TransformerLens 4 and lists its
results in the planted-bugs cell of the bridge-only families, marked "(bridge)".
"""

from __future__ import annotations

import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import test_families as TF
import torch
from test_mutations import CAUGHT, break_fused_attention, inject_one_position_early

import sitelens.models.attention as attention_module
import sitelens.models.kv as kv_module
from sitelens.models import has_hooked_transformer
from sitelens.models.attention import enable_fast_attention
from sitelens.models.families import FAMILIES, SUPPORTED_FAMILIES
from sitelens.testing import family_model

hooked_only = pytest.mark.skipif(not has_hooked_transformer(), reason="HookedTransformer only (TL 3.x)")


# ----------------------------------------------------------------------------------------------
# the bugs


def _in_fused_calls(monkeypatch, model, during):
    """Run every fused attention call of ``model`` inside the context manager ``during(attn)``
    (TransformerLens's own forward, the reference, is left alone)."""
    real = attention_module._fast_forward

    def fast(self, *args, **kwargs):
        if not attention_module.supports_fast_path(self):
            return real(self, *args, **kwargs)
        with during(self):
            return real(self, *args, **kwargs)

    monkeypatch.setattr(attention_module, "_fast_forward", fast)
    enable_fast_attention(model, False)
    enable_fast_attention(model, True)  # rebinds the patched forward


@contextmanager
def _whole_head_rotary(attn):
    cfg = attn.cfg
    sin, cos = attn.calculate_sin_cos_rotary(cfg.d_head, cfg.n_ctx, base=cfg.rotary_base,
                                             dtype=attn.rotary_sin.dtype)
    saved = cfg.rotary_dim, attn.rotary_sin, attn.rotary_cos
    cfg.rotary_dim, attn.rotary_sin, attn.rotary_cos = cfg.d_head, sin, cos
    try:
        yield
    finally:
        cfg.rotary_dim, attn.rotary_sin, attn.rotary_cos = saved


@contextmanager
def _global_attention(attn):
    saved, attn.attn_type = attn.attn_type, "global"
    try:
        yield
    finally:
        attn.attn_type = saved


def ignore_rotary_fraction(monkeypatch, model):
    _in_fused_calls(monkeypatch, model, _whole_head_rotary)


def ignore_sliding_window(monkeypatch, model):
    _in_fused_calls(monkeypatch, model, _global_attention)


def skip_attention_soft_cap(monkeypatch, model):
    real = attention_module.slow_path_features

    def features(attn):
        return [f for f in real(attn) if f != "attention score soft-capping"]

    monkeypatch.setattr(attention_module, "slow_path_features", features)
    monkeypatch.setattr(TF, "slow_path_features", features)


def skip_logit_soft_cap(monkeypatch, model):
    def unembed_last(model, resid):
        resid = resid[:, -1:]  # [batch, 1, d_model]
        if model.cfg.normalization_type is not None:
            resid = model.ln_final(resid)
        return model.unembed(resid)  # no apply_softcap

    monkeypatch.setattr(kv_module, "unembed_last", unembed_last)


def run_parallel_block_serially(monkeypatch, model):
    """On a KV-cached pass (prefill or decode step) each block runs attention, then the MLP on
    the residual stream after attention."""
    from transformer_lens.hook_points import HookPoint

    for block in model.blocks:
        block.hook_resid_mid = HookPoint()  # a parallel block has none; the fresh model is dropped
        def forward(*args, real=block.forward, cfg=block.cfg, **kwargs):
            if kwargs.get("past_kv_cache_entry") is None:
                return real(*args, **kwargs)
            cfg.parallel_attn_mlp = False
            try:
                return real(*args, **kwargs)
            finally:
                cfg.parallel_attn_mlp = True

        monkeypatch.setattr(block, "forward", forward)


def miswire_gqa_groups(monkeypatch, model):
    break_fused_attention(monkeypatch, "gqa_groups")


def inject_early(monkeypatch, model):
    inject_one_position_early(monkeypatch)


def patch_the_next_layer(monkeypatch, model):
    """HeadMix (the patching engine's per-row interventions) hooks layer l + 1's z for layer l."""
    import sitelens.site.injection as injection

    real = injection.z_hook_name
    monkeypatch.setattr(injection, "z_hook_name",
                        lambda m, layer: real(m, (layer + 1) % m.cfg.n_layers))


def differentiate_the_wrong_metric(monkeypatch, model):
    """The lenses differentiate the answer's probability where its log-probability is asked."""
    import sitelens.lenses.attribution as attribution

    real = attribution._metric
    monkeypatch.setattr(attribution, "_metric", lambda logits, answers, metric: real(
        logits, answers, "prob" if metric == "logprob" else metric))


def differentiate_atp_the_wrong_metric(monkeypatch, model):
    """AtP (the lenses' "prob" metric) differentiates the answer's log-probability."""
    import sitelens.lenses.attribution as attribution

    real = attribution._metric
    monkeypatch.setattr(attribution, "_metric", lambda logits, answers, metric: real(
        logits, answers, "logprob" if metric == "prob" else metric))


# ----------------------------------------------------------------------------------------------
# which family can have which bug, and which check catches it


def _cfg(family: str) -> dict:
    return FAMILIES[family].config()


def _rotary_fraction(c):
    return c.get("positional_embedding_type") == "rotary" and c.get("rotary_dim", c["d_head"]) < c["d_head"]


def _fused(c):
    return c.get("positional_embedding_type") in ("rotary", "standard") and not c.get(
        "attn_scores_soft_cap") and c["original_architecture"] != "Olmo2ForCausalLM"


@dataclass(frozen=True)
class Bug:
    plant: object  # (monkeypatch, model) -> None
    applies: object  # config dict -> bool
    check: str  # the test of test_families.py that must catch it


def _attention(family):
    folder = Path(tempfile.mkdtemp(prefix="sitelens-family-"))  # the slow path's Hugging Face folder
    TF.test_fused_attention_equals_transformerlens_or_falls_back(family, lambda *_: None, folder)


def _injection(family):
    TF.test_injection_at_the_last_token(family)


def _kv(family):
    TF.test_kv_cached_generation_equals_uncached(family, False)


def _patching(family):
    TF.test_head_effects_equal_a_generic_activation_patch_reference(family)


def _lenses(family):
    TF.test_alpha_gradient_is_exact_and_lenses_run(family)


CHECKS = {"attention": _attention, "injection": _injection, "KV cache": _kv,  # table columns
          "patching": _patching, "lenses": _lenses}

BUGS: dict[str, Bug] = {
    "rotary fraction ignored": Bug(ignore_rotary_fraction, lambda c: _rotary_fraction(c) and _fused(c),
                                   "attention"),
    "attention soft-cap skipped": Bug(skip_attention_soft_cap,
                                      lambda c: bool(c.get("attn_scores_soft_cap")), "attention"),
    "logit soft-cap skipped": Bug(skip_logit_soft_cap, lambda c: bool(c.get("output_logits_soft_cap")),
                                  "injection"),
    "parallel block run serially": Bug(run_parallel_block_serially,
                                       lambda c: bool(c.get("parallel_attn_mlp")), "KV cache"),
    "sliding window ignored": Bug(ignore_sliding_window,
                                  lambda c: "local" in (c.get("attn_types") or ()) and _fused(c),
                                  "attention"),
    "GQA groups miswired": Bug(miswire_gqa_groups,
                               lambda c: 1 < (c.get("n_key_value_heads") or c["n_heads"]) < c["n_heads"]
                               and _fused(c), "attention"),
    "injection one position early": Bug(inject_early, lambda c: True, "injection"),
    "effects patched at the next layer": Bug(patch_the_next_layer, lambda c: True, "patching"),
    "gradient of the wrong metric": Bug(differentiate_the_wrong_metric, lambda c: True, "lenses"),
}

CASES = [(bug, fam) for fam in SUPPORTED_FAMILIES for bug, b in BUGS.items() if b.applies(_cfg(fam))]


@hooked_only
@pytest.mark.parametrize("bug, family", CASES, ids=[f"{f}-{b.replace(' ', '_')}" for b, f in CASES])
def test_planted_bug_fails_the_family_suite(bug, family, monkeypatch, record_property):
    record_property("caught_by", BUGS[bug].check)  # the support table names the catching check
    model = family_model(family)
    monkeypatch.setattr(TF, "model_of", lambda f, dtype=torch.float32:
                        model if dtype == torch.float32 else family_model(f, dtype=dtype))
    CHECKS[BUGS[bug].check](family)  # the unbroken model passes the check ...
    BUGS[bug].plant(monkeypatch, model)
    with pytest.raises(AssertionError, match=CAUGHT):  # ... and the broken one fails it
        CHECKS[BUGS[bug].check](family)


@hooked_only
def test_every_family_has_a_planted_bug_and_the_named_ones_are_planted():
    assert {f for _, f in CASES} == set(SUPPORTED_FAMILIES)
    named = {"rotary fraction ignored": {"gpt-j", "pythia", "phi"},
             "attention soft-cap skipped": {"gemma2"}, "parallel block run serially":
             {"gpt-j", "pythia", "phi"}, "sliding window ignored": {"gpt-neo", "mistral", "phi3", "gemma3"}}
    for bug, families in named.items():
        assert {f for b, f in CASES if b == bug} == families, bug


# the bridge: every family TransformerLens 3.9 builds no HookedTransformer for (only the bridge
# builds it) gets the bugs above that touch sitelens's code, not the model's (so the bridge suite's
# cached models serve), each run through the bridge suite's own check; Llama keeps the lens bugs
# (its α-gradient is checked against autograd in float32, Falcon's by float64 finite differences)
BRIDGE_ONLY_FAMILIES = tuple(f for f in FAMILIES if f not in SUPPORTED_FAMILIES)


def _bridge_injection(family):
    TF.test_injection_at_the_last_token(family)


def _bridge_patching(family):
    TF.test_head_effects_equal_a_generic_activation_patch_reference(family)


def _bridge_lenses(family):
    import test_families_bridge as TFB

    TFB.check_lenses(family)


BRIDGE_CHECKS = {"injection": _bridge_injection, "patching": _bridge_patching,  # table columns
                 "lenses": _bridge_lenses}
BRIDGE_BUGS: dict[str, Bug] = {
    "injection one position early": BUGS["injection one position early"],
    "effects patched at the next layer": BUGS["effects patched at the next layer"],
    "gradient of the wrong metric": BUGS["gradient of the wrong metric"],
    "AtP of the wrong metric": Bug(differentiate_atp_the_wrong_metric, lambda c: True, "lenses"),
}
LENS_BUGS = ("gradient of the wrong metric", "AtP of the wrong metric")
BRIDGE_CASES = ([(bug, fam) for fam in BRIDGE_ONLY_FAMILIES for bug in BRIDGE_BUGS]
                + [(bug, "llama") for bug in LENS_BUGS])


@pytest.mark.parametrize("bug, family", BRIDGE_CASES,
                         ids=[f"{f}-{b.replace(' ', '_')}" for b, f in BRIDGE_CASES])
def test_planted_bug_fails_the_bridge_family_suite(bug, family, monkeypatch, record_property):
    import test_families_bridge as TFB

    check = BRIDGE_BUGS[bug].check
    record_property("caught_by", check)  # the support table names the catching check
    TFB.use_bridge(monkeypatch)
    BRIDGE_CHECKS[check](family)  # the unbroken bridge passes the check ...
    BRIDGE_BUGS[bug].plant(monkeypatch, TFB.bridge_of(family))
    with pytest.raises(AssertionError, match=CAUGHT):  # ... and the broken one fails it
        BRIDGE_CHECKS[check](family)


def test_every_bridge_only_family_has_the_bridge_bugs():
    assert {"falcon", "starcoder2"} <= set(BRIDGE_ONLY_FAMILIES)  # families.py's unsupported ones
    for fam in BRIDGE_ONLY_FAMILIES:
        assert {b for b, f in BRIDGE_CASES if f == fam} == set(BRIDGE_BUGS), fam
    assert {BRIDGE_BUGS[b].check for b in BRIDGE_BUGS} == set(BRIDGE_CHECKS)
