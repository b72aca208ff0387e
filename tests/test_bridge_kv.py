"""The TransformerBridge's KV cache: the Hugging Face cache driven through the bridge
(:class:`sitelens.models.BridgeKVCache`) gives what full passes give — the non-cached bridge path
(:class:`sitelens.models.RecomputeCache`, or one forward pass over the whole sequence) — for
generation, frozen prefix caches (stage 2 of a fit, patching) with gradients, row selections, and
sliding-window layers; a cache that is not extended, or steps at the wrong positions, fail.

Tolerances: a cached step runs other matrix shapes than a full pass (1 query row against the
cached keys instead of every row), so float32 sums are ordered differently and the logits agree
to :func:`tolerances.logit_tolerance` (depth = n_layers, the longest reduction, at the logits'
own scale); gradients retrace every block backwards (depth 2·n_layers) at the gradient's own
scale. Wrong positions or padding read as text move the tiny models' logits by O(1) — 10^3 to
10^5 times these bounds (the mutation tests below check that they fail).
"""

from __future__ import annotations

import pytest
import torch
from conftest import BACKENDS
from tolerances import assert_activations_close, assert_logits_close

import sitelens.models.compat as C
import sitelens.models.kv as KV
from sitelens import HeadMix, ModelError
from sitelens.eval.generation import greedy_generate
from sitelens.models import (
    BridgeKVCache,
    RecomputeCache,
    encode,
    kv_forward,
    last_position_logits,
    last_token_forward,
    new_kv_cache,
    prefix_cache,
    select_cache,
)
from sitelens.models.kv import hf_seq_length
from sitelens.site.injection import apply_hooks
from sitelens.testing import tiny_model

pytestmark = pytest.mark.skipif("bridge" not in BACKENDS, reason="TransformerBridge only")

PROMPTS = ["Q: hot\nA:", "Q: a much longer prompt\nA:", "Q: xy\nA:"]  # left padding: 3 widths


def _tiny_gemma3_sliding():
    """A tiny Gemma-3 bridge whose first layer sees a 4-token sliding window (the prompts here
    are 8 to 25 tokens): the cached path must apply the window as the full pass does."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    from sitelens.models.bridge import bridge_from_hf
    from sitelens.models.prepare import prepare_model
    from sitelens.testing import tiny_tokenizer

    tok = tiny_tokenizer()
    cfg = Gemma3TextConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=1, head_dim=8, max_position_embeddings=256,
        sliding_window=4, layer_types=["sliding_attention", "full_attention"],
        initializer_range=0.8 / 32**0.5, tie_word_embeddings=False,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )
    cfg._attn_implementation = "eager"
    cfg.architectures = ["Gemma3ForCausalLM"]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(5)
        hf = Gemma3ForCausalLM(cfg).eval()
    return prepare_model(bridge_from_hf(hf, tok, name="tiny-gemma3-sliding", prepend_bos=True,
                                     n_ctx=256))


@pytest.fixture(scope="module", params=["llama-gqa", "gemma3-sliding"])
def bridge(request):
    if request.param == "llama-gqa":
        return tiny_model(n_layers=2, n_heads=4, d_head=8, n_key_value_heads=2, seed=0,
                          backend="bridge")
    return _tiny_gemma3_sliding()


def _recompute(monkeypatch, model):
    """The non-cached bridge path: every cached step a full forward pass."""
    monkeypatch.setitem(KV._DRIVEN, model, False)


def _fed_tokens(model, n: int, steps: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    return torch.randint(3, model.cfg.d_vocab, (n, steps), generator=g)  # [batch, steps]


def _decode_steps(model, enc, fed):
    """Prefill the prompts, then feed ``fed`` one column per step: last logits of each step."""
    cache = new_kv_cache(model, enc.tokens.shape[0])
    ones = torch.ones_like(fed[:, :1])
    with torch.no_grad():
        out = [kv_forward(model, enc.tokens, enc.attention_mask, cache, last_only=True)[:, -1]]
        for s in range(fed.shape[1]):
            out.append(kv_forward(model, fed[:, s : s + 1], ones, cache)[:, -1])
    return cache, torch.stack(out, dim=1)  # [batch, 1 + steps, d_vocab]


# ----------------------------------------------------------------------------------------------
# the cache is driven, extended and frozen as it should be


def test_the_bridge_drives_the_hugging_face_cache(bridge):
    enc = encode(bridge, PROMPTS)
    P = enc.tokens.shape[1]
    cache, _ = _decode_steps(bridge, enc, _fed_tokens(bridge, 3, 2))
    assert isinstance(cache, BridgeKVCache) and not cache.frozen
    assert hf_seq_length(cache.hf) == P + 2  # every layer extended by each call, exactly once
    assert cache.attention_mask.shape == (3, P + 2)
    k, v = cache.kv()[0]
    assert k.shape == (3, bridge.cfg.n_key_value_heads or bridge.cfg.n_heads, P + 2, bridge.cfg.d_head)

    pre, last = prefix_cache(bridge, enc, batch_size=2)
    assert isinstance(pre, BridgeKVCache) and pre.frozen
    before = [t.clone() for kv in pre.kv() for t in kv]
    with torch.no_grad():
        a = last_token_forward(bridge, pre, last)
        b = last_token_forward(bridge, pre, last)

        def boom(z, hook=None):
            raise RuntimeError("a hook that fails mid-pass")

        with pytest.raises(RuntimeError, match="mid-pass"), \
                bridge.hooks(fwd_hooks=[(KV.z_hook_name(bridge, 1), boom)]):
            last_token_forward(bridge, pre, last)
    # frozen: the prefix is read, never extended, also when a pass fails half-way
    assert hf_seq_length(pre.hf) == P - 1
    assert all(torch.equal(x, y) for x, y in zip(before, [t for kv in pre.kv() for t in kv]))
    assert torch.equal(a, b)  # the same ops on the same inputs: bit-identical


# ----------------------------------------------------------------------------------------------
# cached results equal the non-cached bridge path


def test_cached_decode_steps_equal_full_passes(bridge, monkeypatch):
    enc = encode(bridge, PROMPTS)
    fed = _fed_tokens(bridge, 3, 4)
    _, cached = _decode_steps(bridge, enc, fed)
    tokens = torch.cat([enc.tokens, fed], dim=1)  # [batch, P + 4]
    mask = torch.cat([enc.attention_mask, torch.ones_like(fed)], dim=1)
    with torch.no_grad():
        full = bridge(tokens, attention_mask=mask)[:, enc.tokens.shape[1] - 1 :]  # [3, 5, V]
    # logit_tolerance (module docstring); steps at the wrong position or padding read as text fail
    assert_logits_close(cached, full, bridge, what="cached prefill + 4 steps vs one full pass")
    # ... and greedy decoding, under a prefill injection, gives the recompute path's tokens
    torch.manual_seed(0)
    mix = HeadMix(torch.rand(2, 4), torch.randn(2, 4, 8) * 3)
    g_hf, f_hf = greedy_generate(bridge, enc, intervention=mix, max_new_tokens=6,
                                 stop_at_newline=False)
    _recompute(monkeypatch, bridge)
    assert isinstance(new_kv_cache(bridge, 1), RecomputeCache)
    g_re, f_re = greedy_generate(bridge, enc, intervention=mix, max_new_tokens=6,
                                 stop_at_newline=False)
    assert_logits_close(f_hf, f_re, bridge, what="first-step logits, HF cache vs recompute")
    # integer tokens: argmax of logits within the bound, equal unless a top-2 gap falls below it
    assert torch.equal(g_hf, g_re)


def test_prefix_cache_logits_and_gradients_equal_full_passes(bridge):
    """Stage 2 and patching: the last token on a frozen prefix under a HeadMix, forward and
    backward, as a full pass over the prompt computes them."""
    enc = encode(bridge, PROMPTS)
    cache, last = prefix_cache(bridge, enc, batch_size=2)
    g = torch.Generator().manual_seed(2)
    targets = torch.randn(2, 4, 8, generator=g) * 3  # [n_layers, n_heads, d_head]
    results = {}
    for path in ("cached", "full"):
        a = torch.zeros(2, 4, requires_grad=True)  # [n_layers, n_heads] logits of α
        mix = HeadMix(torch.sigmoid(a), targets, positions=(-1,))
        with apply_hooks(bridge, mix.hooks(bridge)):
            if path == "cached":
                logits = last_token_forward(bridge, cache, last)[:, -1]  # [batch, d_vocab]
            else:
                logits = bridge(enc.tokens, attention_mask=enc.attention_mask)[:, -1]
        logits.logsumexp(-1).sum().backward()
        results[path] = (logits.detach(), a.grad.clone())
    assert_logits_close(results["cached"][0], results["full"][0], bridge,
                        what="last token on a prefix cache vs full pass, under a HeadMix")
    assert results["full"][1].abs().max() > 0  # the mix reaches the logits
    assert_activations_close(results["cached"][1], results["full"][1], bridge,
                             depth=2 * bridge.cfg.n_layers, what="d(logsumexp)/d(a), cached vs full")
    # rows of the frozen cache (repeats allowed), as patching and training batches select them
    rows = [2, 0, 2]
    with torch.no_grad():
        sub = last_token_forward(bridge, select_cache(cache, rows), last[rows])[:, -1]
        full = bridge(enc.tokens, attention_mask=enc.attention_mask)[:, -1]  # [batch, d_vocab]
    assert_logits_close(sub, full[rows], bridge, what="selected rows vs full pass")


def test_last_position_logits_unembed_one_column(bridge):
    enc = encode(bridge, PROMPTS)
    seen = []
    hook = bridge.original_model.lm_head.register_forward_hook(
        lambda m, i, o: seen.append((tuple(o.shape), i[0].is_contiguous())))
    try:
        with torch.no_grad():
            last = last_position_logits(bridge, enc)
    finally:
        hook.remove()
    # Gemma's 262k vocabulary: one column, not all; and a contiguous input (HF's strided slice
    # hidden[:, -1:] makes the linear layer a batched matmul over the broadcast weight, ~5x slower)
    assert seen == [((3, 1, bridge.cfg.d_vocab), True)]
    with torch.no_grad():
        full = bridge(enc.tokens, attention_mask=enc.attention_mask)[:, -1]
    # the same rows of the same matrix product: one column vs all columns, logit_tolerance
    assert_logits_close(last, full, bridge, what="last-position logits, one column vs all")


# ----------------------------------------------------------------------------------------------
# broken caches fail


def test_a_cache_the_bridge_does_not_extend_is_refused(bridge, monkeypatch):
    enc = encode(bridge, PROMPTS)
    cache = new_kv_cache(bridge, 3)
    real = KV._cache_kwargs
    # the bridge gets another cache object than the one sitelens keeps: ours stays empty
    monkeypatch.setattr(KV, "_cache_kwargs", lambda model, hf: real(model, KV._new_hf_cache()))
    with torch.no_grad(), pytest.raises(ModelError, match="did not extend it"):
        kv_forward(bridge, enc.tokens, enc.attention_mask, cache)
    with torch.no_grad(), pytest.raises(ModelError, match="did not extend it"):
        prefix_cache(bridge, enc)


def test_without_the_keyword_alias_the_probe_falls_back_to_full_passes(monkeypatch):
    """Where the attention bridges ignore the cache (the alias does not take), drive_hf_cache
    says so, warns, and the recompute path gives the same results."""
    monkeypatch.setattr(C, "_cache_alias", lambda module, args, kwargs: (args, kwargs))
    fresh = tiny_model(n_layers=2, n_heads=4, d_head=8, seed=3, backend="bridge")
    with pytest.warns(UserWarning, match="recomputes the full sequence"):
        assert KV.drive_hf_cache(fresh) is False
    enc = encode(fresh, PROMPTS)
    assert isinstance(new_kv_cache(fresh, 3), RecomputeCache)
    assert isinstance(prefix_cache(fresh, enc)[0], RecomputeCache)
    fed = _fed_tokens(fresh, 3, 2)
    _, cached = _decode_steps(fresh, enc, fed)
    with torch.no_grad():
        full = fresh(torch.cat([enc.tokens, fed], 1),
                     attention_mask=torch.cat([enc.attention_mask, torch.ones_like(fed)], 1))
    assert_logits_close(cached, full[:, enc.tokens.shape[1] - 1 :], fresh,
                        what="recompute fallback vs one full pass")


@pytest.mark.parametrize("bug", ["positions-from-zero", "padding-as-text", "cache-dropped"])
def test_the_comparisons_catch_a_broken_cache(bridge, monkeypatch, bug):
    """Realistic bugs of a driven cache make the comparisons above fail: every step's positions
    counted from 0 (position ids from the new tokens only), the cached prefix's padding attended
    to (an all-ones mask), and a cache emptied before each step (the tokens attend to themselves
    only)."""
    if bug == "positions-from-zero":
        real_kwargs = KV._cache_kwargs

        def kwargs(model, hf):
            kw = real_kwargs(model, hf)
            if hf_seq_length(hf) > 0:  # a decode step (one token per row) placed at position 0
                batch = C.layer_kv(hf)[0][0].shape[0]
                kw["position_ids"] = torch.zeros(batch, 1, dtype=torch.long)
            return kw

        monkeypatch.setattr(KV, "_cache_kwargs", kwargs)
    real = KV._bridge_kv_forward

    def broken(model, tokens, attention_mask, cache, *, last_only):
        if bug == "padding-as-text":
            cache.attention_mask = torch.ones_like(cache.attention_mask)
        if bug == "cache-dropped" and cache.attention_mask.shape[1]:
            n = cache.attention_mask.shape[1]
            kv = [(k[..., n:, :], v[..., n:, :]) for k, v in cache.kv()]
            cache = BridgeKVCache(KV._hf_cache_from(kv), cache.attention_mask[:, n:], cache.frozen)
        return real(model, tokens, attention_mask, cache, last_only=last_only)

    monkeypatch.setattr(KV, "_bridge_kv_forward", broken)
    with pytest.raises(AssertionError, match="more than float rounding"):
        test_cached_decode_steps_equal_full_passes(bridge, monkeypatch)
