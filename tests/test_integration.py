"""Integration tests on the bundled real models (no network). CI runs them."""

import json
import subprocess
import sys

import pytest
import torch

from sitelens import FitConfig, encode, fit_site, load_task
from sitelens.baselines import TV
from sitelens.evaluate import first_token_accuracy, last_logits
from sitelens.models import has_hooked_transformer, is_bridge, load_hf_reference, load_model, self_check
from sitelens.tasks import answer_token_ids, zero_shot_prompt

pytestmark = pytest.mark.integration

PROMPTS = ["Q: hot\nA:", "The capital of France is", "Q: big\nA: small\n\nQ: fast\nA:"]


@pytest.mark.parametrize("name", ["smollm2-135m-instruct", "gemma-3-270m"])
def test_logprobs_match_huggingface(name, request):
    model = request.getfixturevalue("smollm2" if name.startswith("smol") else "gemma")
    hf, _ = load_hf_reference(name)
    enc = encode(model, PROMPTS)
    with torch.no_grad():
        ours = model(enc.tokens, attention_mask=enc.attention_mask).log_softmax(-1)
        ref = hf(enc.tokens, attention_mask=enc.attention_mask).logits.log_softmax(-1)
    keep = enc.attention_mask.bool()
    assert (ours - ref)[keep].abs().max().item() <= 1e-3
    del hf


@pytest.mark.parametrize("fixture", ["smollm2", "gemma"])
def test_fast_attention_matches_transformerlens_attention(fixture, request):
    """The fused attention path (on by default) against TransformerLens's own, on a padded batch:
    log-probs and the last-token hook_z of every layer (Gemma: sliding-window and global layers,
    QK norm)."""
    from sitelens.attention import enable_fast_attention, fast_attention_enabled

    model = request.getfixturevalue(fixture)
    if is_bridge(model):
        pytest.skip("HookedTransformer only")
    assert fast_attention_enabled(model)
    enc = encode(model, PROMPTS)
    names = [f"blocks.{i}.attn.hook_z" for i in range(model.cfg.n_layers)]
    out = {}
    try:
        for fast in (False, True):
            enable_fast_attention(model, fast)
            with torch.no_grad():
                logits, cache = model.run_with_cache(enc.tokens, attention_mask=enc.attention_mask,
                                                     names_filter=names)
            out[fast] = (logits.log_softmax(-1), torch.stack([cache[n][:, -1] for n in names]))
    finally:
        enable_fast_attention(model, True)
    keep = enc.attention_mask.bool()
    assert (out[False][0] - out[True][0])[keep].abs().max().item() <= 1e-4
    assert torch.allclose(out[False][1], out[True][1], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("fixture", ["smollm2", "gemma"])
def test_left_padded_batch_equals_single_prompts(fixture, request):
    model = request.getfixturevalue(fixture)
    enc = encode(model, PROMPTS)
    with torch.no_grad():
        batched = model(enc.tokens, attention_mask=enc.attention_mask)[:, -1].log_softmax(-1)
        for i, p in enumerate(PROMPTS):
            e = encode(model, [p])
            single = model(e.tokens, attention_mask=e.attention_mask)[0, -1].log_softmax(-1)
            assert (batched[i] - single).abs().max().item() <= 1e-3


def test_bos_conventions(smollm2, gemma):
    s = encode(smollm2, ["Q: hot\nA:"]).tokens[0].tolist()
    assert s[0] != smollm2.tokenizer.bos_token_id  # SmolLM2: no <|im_start|> prepended
    assert smollm2.tokenizer.decode(s) == "Q: hot\nA:"
    g = encode(gemma, ["Q: hot\nA:"]).tokens[0].tolist()
    assert g[0] == gemma.tokenizer.bos_token_id  # Gemma: <bos> prepended
    assert gemma.tokenizer.decode(g[1:]) == "Q: hot\nA:"


def test_second_load_uses_the_weight_cache(smollm2):
    from sitelens.models import _weights_key, cache_dir, load_model

    target = cache_dir() / "models" / f"smollm2-135m-instruct-{_weights_key('smollm2-135m-instruct', 2048)}"
    assert (target / "weights.safetensors").exists()
    again = load_model("smollm2-135m-instruct")
    enc = encode(again, PROMPTS[:1])
    with torch.no_grad():
        torch.testing.assert_close(
            again(enc.tokens, attention_mask=enc.attention_mask),
            smollm2(enc.tokens, attention_mask=enc.attention_mask),
        )


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
    assert torch.equal(last_logits(again, enc), last_logits(bridge, enc))
    del again
    assert self_check(bridge)["shape"][2:] == (9, 64)  # query heads, d_head
    if has_hooked_transformer():
        hooked = request.getfixturevalue("smollm2")
        enc = encode(hooked, PROMPTS)
        diff = last_logits(bridge, enc).log_softmax(-1) - last_logits(hooked, enc).log_softmax(-1)
        assert diff.abs().max() < 1e-3
    task = load_task("country_capital")
    zs, site, score = _site_vs_zero_shot(bridge, task)
    assert site > zs + 0.1, (zs, site)
    tv = TV(n_prompts=16, n_shots=5, n_valid=16).fit(bridge, task)
    assert score(tv.intervention) > zs


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
