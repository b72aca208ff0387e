"""Integration tests on the bundled real models (no network). CI runs them."""

import json
import subprocess
import sys

import pytest
import torch
from tolerances import assert_logits_close, assert_logprobs_close

from sitelens import FitConfig, encode, fit_site, load_task
from sitelens.baselines import TV
from sitelens.eval.evaluation import first_token_accuracy
from sitelens.eval.generation import last_logits
from sitelens.models import (
    default_backend,
    has_hooked_transformer,
    is_bridge,
    load_hf_reference,
    load_model,
    self_check,
)
from sitelens.tasks import answer_token_ids, zero_shot_prompt

pytestmark = pytest.mark.integration

PROMPTS = ["Q: hot\nA:", "The capital of France is", "Q: big\nA: small\n\nQ: fast\nA:"]


def hf_logprobs_agree(model, hf):
    """sitelens (folded norms, re-strided weights, fused attention) vs the Hugging Face model on
    the same GGUF weights: log-probs at every real position of a left-padded batch, within
    logprob_tolerance (tests/tolerances.py: float32, depth n_layers, the MLP's reduction, the
    vocabulary's log-sum-exp, at the batch's logit scale)."""
    enc = encode(model, PROMPTS)
    with torch.no_grad():
        ours = model(enc.tokens, attention_mask=enc.attention_mask)  # [batch, pos, d_vocab]
        ref = hf(enc.tokens, attention_mask=enc.attention_mask).logits  # [batch, pos, d_vocab]
    return assert_logprobs_close(ours, ref, model, mask=enc.attention_mask.bool(),
                                 what=f"{model.cfg.model_name}: sitelens vs Hugging Face log-probs")


@pytest.mark.parametrize("name", ["smollm2-135m-instruct", "gemma-3-270m"])
def test_logprobs_match_huggingface(name, request):
    # Measured here (max |Δ log p| / bound; the same on 2 threads and on 1 thread under
    # taskset -c 0; ATen's AVX2 kernels instead of AVX-512 in brackets):
    #   SmolLM2 5.1e-5 / 1.45e-3 [5.1e-5] (logit scale 34.7);  Gemma 1.26e-4 / 1.1e-3 [8.4e-5] (32.7).
    # One head of sitelens's fused attention that misses its own position, in every layer: 4.5
    # (SmolLM2) and 14.2 (Gemma); in the last layer only: 2.0 and 0.61 (test_mutations.py).
    model = request.getfixturevalue("smollm2" if name.startswith("smol") else "gemma")
    hf, _ = load_hf_reference(name)
    hf_logprobs_agree(model, hf)
    del hf


@pytest.mark.parametrize("fixture", ["smollm2", "gemma"])
def test_fast_attention_matches_transformerlens_attention(fixture, request):
    """The fused attention path (on by default) against TransformerLens's own, on a padded batch:
    log-probs and every layer's hook_z (Gemma: sliding-window and global layers, QK norm), with the
    comparison of tests/test_attention.py (attention_paths_agree).

    Measured here (the same on 2 threads and on 1 thread under ``taskset -c 0``; ATen's AVX2
    kernels instead of AVX-512 in brackets; the generic SSE kernels in braces):
    SmolLM2 max |Δ log p| 4.2e-5 [3.8e-5] {5.7e-5}, bound 1.45e-3; hook_z: worst layer at 0.13
    [0.12] {0.19} of its bound.
    Gemma 1.37e-4 [9.3e-5] {9.7e-5} (the value that failed the old fixed ``<= 1e-4`` on another
    machine), bound 1.1e-3; hook_z: worst layer at 0.20 [0.17] {0.26} of its bound.
    Broken fused paths (test_mutations.py), max |Δ log p| SmolLM2 / Gemma: one head that sees one
    future token, every layer 7.4 / 11.9, last layer only 0.42 / 0.86; one head missing its own
    position 4.5 / 14.2; key/value groups miswired (SmolLM2's GQA) 30.2."""
    from test_attention import attention_paths_agree

    from sitelens.models.attention import fast_attention_enabled

    if default_backend() == "bridge":  # the fixture would load a bridge: skip before the load
        pytest.skip("HookedTransformer only")
    model = request.getfixturevalue(fixture)
    assert fast_attention_enabled(model)
    attention_paths_agree(model, encode(model, PROMPTS))


def padded_batch_agrees(model, prompts=PROMPTS):
    """Last-position log-probs of a left-padded batch vs each prompt alone, within
    logprob_tolerance (other GEMM shapes and masks give other summation orders)."""
    enc = encode(model, prompts)
    with torch.no_grad():
        batched = model(enc.tokens, attention_mask=enc.attention_mask)[:, -1]  # [batch, d_vocab]
        single = torch.stack([model(e.tokens, attention_mask=e.attention_mask)[0, -1]
                              for e in (encode(model, [p]) for p in prompts)])  # [batch, d_vocab]
    return assert_logprobs_close(batched, single, model,
                                 what=f"{model.cfg.model_name}: padded batch vs single prompts")


@pytest.mark.parametrize("fixture", ["smollm2", "gemma"])
def test_left_padded_batch_equals_single_prompts(fixture, request):
    # Measured here (max |Δ log p| on 2 threads / 1 thread under taskset -c 0, bound): SmolLM2
    # 3.8e-5 / 3.2e-5, bound 1.04e-3 (scale 24.9); Gemma 5.0e-5 / 2.5e-5, bound 7.6e-4 (scale 22.4).
    # Left padding visible to the fused attention: 19.3 / 24.3 (test_mutations.py).
    padded_batch_agrees(request.getfixturevalue(fixture))


def test_bos_conventions(smollm2, gemma):
    s = encode(smollm2, ["Q: hot\nA:"]).tokens[0].tolist()
    assert s[0] != smollm2.tokenizer.bos_token_id  # SmolLM2: no <|im_start|> prepended
    assert smollm2.tokenizer.decode(s) == "Q: hot\nA:"
    g = encode(gemma, ["Q: hot\nA:"]).tokens[0].tolist()
    assert g[0] == gemma.tokenizer.bos_token_id  # Gemma: <bos> prepended
    assert gemma.tokenizer.decode(g[1:]) == "Q: hot\nA:"


def test_second_load_uses_the_weight_cache(smollm2):
    from conftest import needs_hooked

    from sitelens.models import cache_dir, load_model

    needs_hooked(smollm2, "the processed-weight cache is the hooked backend's")
    from sitelens.models.cache import _weights_key

    target = cache_dir() / "models" / f"smollm2-135m-instruct-{_weights_key('smollm2-135m-instruct', 2048)}"
    assert (target / "weights.safetensors").exists()
    again = load_model("smollm2-135m-instruct")
    enc = encode(again, PROMPTS[:1])
    with torch.no_grad():
        # The cache stores the processed float32 weights, but the fixture may have been built by
        # the GGUF conversion (other tensor layouts, so possibly other GEMM kernels): compared
        # within logit_tolerance (1.3e-3 at scale 30.8; measured 0 here), which a float16- or
        # bfloat16-rounded cache (relative 5e-4 / 4e-3 per weight) would exceed.
        assert_logits_close(again(enc.tokens, attention_mask=enc.attention_mask),
                            smollm2(enc.tokens, attention_mask=enc.attention_mask), again,
                            what="SmolLM2 logits, cached vs first load")


def _site_vs_zero_shot(model, task):
    """First-token accuracy on the test split: (zero-shot, SITE, a scorer for interventions)."""
    adapter = fit_site(
        model, task, n_prompts=16, n_shots=5,
        config=FitConfig(n_examples=96, batch_size=8, eval_every=4),
    )
    prompts = [zero_shot_prompt(ex.input) for ex in task.test]
    answers = answer_token_ids(model, [ex.output for ex in task.test])

    def score(intervention=None):
        return first_token_accuracy(model, prompts, answers, intervention)

    return score(), score(adapter.mix()), score


def test_site_beats_zero_shot_on_smollm2(smollm2):
    zs, site, _ = _site_vs_zero_shot(smollm2, load_task("country_capital"))
    assert site > zs + 0.1, (zs, site)


def test_bundled_smollm2_on_the_bridge(request):
    """SmolLM2 as a TransformerBridge (the only backend on TransformerLens 4.x): the z hook is found
    and acts, the next-token log-probs agree with the HookedTransformer (on TL 3.9), and SITE and a
    baseline (TV) fitted on the bridge beat zero-shot. The TL 4 CI job runs this test."""
    bridge = load_model("smollm2-135m-instruct", backend="bridge")
    assert is_bridge(bridge)
    again = load_model("smollm2-135m-instruct", backend="bridge")  # from the dequantized cache
    enc = encode(bridge, PROMPTS)
    # exact: the same dequantized weights and the same forward, on the same inputs
    assert torch.equal(last_logits(again, enc), last_logits(bridge, enc))
    del again
    assert self_check(bridge)["shape"][2:] == (9, 64)  # query heads, d_head
    # Measured here (TL 4.3, 1 thread): max |Δ logit| 4.8e-5, bound 1.29e-3 (scale 31.2); the same
    # helper on Gemma-3-270M's bridge (not run here: a second bridge load) 3.3e-4 vs 3.7e-3.
    bridge_kv_cache_matches_full_pass(bridge)
    if has_hooked_transformer():
        hooked = request.getfixturevalue("smollm2")
        # Measured here: max |Δ log p| 4.2e-5 (1 and 2 threads; 3.8e-5 on AVX2 kernels), bound
        # 1.04e-3 (logprob_tolerance, scale 24.9). One head missing its own position on the
        # HookedTransformer side: 2.9 in every layer, 1.5 in the last only (test_mutations.py).
        bridge_logprobs_agree(bridge, hooked)
    task = load_task("country_capital")
    zs, site, score = _site_vs_zero_shot(bridge, task)
    assert site > zs + 0.1, (zs, site)
    tv = TV(n_prompts=16, n_shots=5, n_valid=16).fit(bridge, task)
    assert score(tv.intervention) > zs


@pytest.mark.skipif(not has_hooked_transformer(), reason="HookedTransformer only (TL 3.x): an "
                    "adapter crossing between the hooked backend and the bridge")
def test_an_adapter_moves_between_backends_on_smollm2(smollm2, tmp_path):
    """The bundled SmolLM2 (its GGUF converted to a HookedTransformer, and dequantized into a
    bridge): the weights fingerprint is the same, an adapter fitted on either backend and saved
    passes the other's check, and the hooked-fitted α and t applied on the bridge give the same
    first-token accuracy as on the HookedTransformer but for a float-rounding near-tie (at most one
    test item: the two backends compute the same model to float rounding)."""
    from sitelens.models import weights_fingerprint
    from sitelens.site import SiteAdapter

    bridge = load_model("smollm2-135m-instruct", backend="bridge")
    assert weights_fingerprint(smollm2) == weights_fingerprint(bridge)
    task = load_task("antonym")
    cfg = FitConfig(n_examples=16, batch_size=8, eval_every=2, n_valid=8)
    for fit_on, other in ((smollm2, bridge), (bridge, smollm2)):
        fit_site(fit_on, task, n_prompts=4, n_shots=3, config=cfg).save(tmp_path / "ad")
        SiteAdapter.load(tmp_path / "ad").check_model(other)
    hooked_fit = fit_site(smollm2, task, n_prompts=4, n_shots=3, config=cfg)
    prompts = [zero_shot_prompt(ex.input) for ex in task.test]
    answers = answer_token_ids(smollm2, [ex.output for ex in task.test])
    on = {m: first_token_accuracy(m, prompts, answers, hooked_fit.mix()) for m in (smollm2, bridge)}
    assert abs(on[smollm2] - on[bridge]) <= 1 / len(prompts) + 1e-9, on


def bridge_kv_cache_matches_full_pass(bridge, prompts=PROMPTS, steps: int = 3):
    """The driven Hugging Face KV cache on the real model (tests/test_bridge_kv.py does it on tiny
    ones): a left-padded prefill and ``steps`` one-token steps give one full pass's logits, within
    logit_tolerance (depth n_layers, the MLP's reduction, at the logits' scale)."""
    from sitelens.models import BridgeKVCache, kv_forward, new_kv_cache

    enc = encode(bridge, prompts)
    cache = new_kv_cache(bridge, len(prompts))
    assert isinstance(cache, BridgeKVCache)  # driven, not the recompute fallback
    fed = torch.tensor([[28, 29, 30]] * len(prompts))[:, :steps]  # [batch, steps]
    with torch.no_grad():
        out = [kv_forward(bridge, enc.tokens, enc.attention_mask, cache, last_only=True)[:, -1]]
        for s in range(steps):
            out.append(kv_forward(bridge, fed[:, s : s + 1], torch.ones_like(fed[:, :1]), cache)[:, -1])
        full = bridge(torch.cat([enc.tokens, fed], 1),
                      attention_mask=torch.cat([enc.attention_mask, torch.ones_like(fed)], 1))
    return assert_logits_close(torch.stack(out, 1), full[:, enc.tokens.shape[1] - 1 :], bridge,
                               what=f"{bridge.cfg.model_name} bridge: cached steps vs one full pass")


def bridge_logprobs_agree(bridge, hooked, prompts=PROMPTS):
    """Next-token log-probs of the TransformerBridge (Hugging Face attention, unfolded norms) vs
    the HookedTransformer on the same weights, within logprob_tolerance."""
    enc = encode(hooked, prompts)
    return assert_logprobs_close(last_logits(bridge, enc), last_logits(hooked, enc), hooked,
                                 what="SmolLM2 bridge vs HookedTransformer log-probs")


def test_cli_fit_and_eval_json(tmp_path):
    out = tmp_path / "ad"
    base = [sys.executable, "-m", "sitelens.cli"]
    r = subprocess.run(
        base + ["fit", "--task", "antonym", "--out", str(out), "--n-prompts", "8", "--n-shots", "4",
                "--n-examples", "32"],
        capture_output=True, text=True,
    )
    assert r.returncode == 0, r.stderr
    assert (out / "adapter.json").exists()
    r = subprocess.run(
        base + ["eval", "--task", "antonym", "--adapter", str(out), "--limit", "6", "--n-shots", "3",
                "--json"],
        capture_output=True, text=True,
    )
    assert r.returncode == 0, r.stderr
    obj = json.loads(r.stdout)
    assert set(obj) == {"zero-shot", "icl", "site"}
    assert obj["site"]["n"] == 6 and 0 <= obj["site"]["exact_match"] <= 1


def test_cli_errors_are_clean(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "sitelens.cli", "eval", "--task", "antonymm", "--methods", "zero-shot"],
        capture_output=True, text=True,
    )
    assert r.returncode == 2
    assert "Traceback" not in r.stderr and "antonym" in r.stderr
