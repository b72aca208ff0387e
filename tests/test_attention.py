"""The fused attention fast path (sitelens.attention) against TransformerLens's own attention."""

import pytest
import torch

from sitelens.attention import enable_fast_attention, fast_attention_enabled, supports_fast_path
from sitelens.evaluate import greedy_generate
from sitelens.models import (
    encode,
    has_hooked_transformer,
    is_bridge,
    last_token_forward,
    prefix_cache,
    tiny_model,
)

pytestmark = pytest.mark.skipif(not has_hooked_transformer(), reason="HookedTransformer only")

PROMPTS = ["Q: a b c\nA:", "Q: hello there friend how are you today\nA:", "Q: x\nA: y\n\nQ: z\nA:"]
VARIANTS = {
    "mha": {},
    "gqa": {"n_key_value_heads": 2},
    "mqa": {"n_key_value_heads": 1},
    "post_norm": {"post_norm": True},
    "standard_pos": {"positional": "standard"},
}


def _hooked_tiny(**kw):
    return tiny_model(backend="hooked", **kw)


def _run(model, enc, fast: bool):
    """Log-probs and every layer's hook_z on a left-padded batch, on one attention path."""
    enable_fast_attention(model, fast)
    names = lambda n: n.endswith("hook_z")  # noqa: E731
    with torch.no_grad():
        logits, cache = model.run_with_cache(enc.tokens, attention_mask=enc.attention_mask,
                                             names_filter=names)
    z = torch.stack([cache[f"blocks.{i}.attn.hook_z"] for i in range(model.cfg.n_layers)])
    return logits.log_softmax(-1), z


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_fast_attention_matches_transformerlens_on_a_padded_batch(variant):
    model = _hooked_tiny(**VARIANTS[variant])
    assert fast_attention_enabled(model)  # on by default
    enc = encode(model, PROMPTS)
    assert not bool(enc.attention_mask.all())  # the batch is really padded
    slow_lp, slow_z = _run(model, enc, fast=False)
    fast_lp, fast_z = _run(model, enc, fast=True)
    keep = enc.attention_mask.bool()
    assert (slow_lp - fast_lp)[keep].abs().max().item() < 1e-5
    # hook_z everywhere, the left-pad positions included (TransformerLens gives them 0)
    assert torch.allclose(slow_z, fast_z, atol=1e-5)
    assert not torch.isnan(fast_lp).any()


def test_fast_attention_matches_with_sliding_window_layers():
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    from sitelens.models import tiny_tokenizer

    tok = tiny_tokenizer()
    cfg = HookedTransformerConfig(
        n_layers=2, d_model=32, d_head=8, n_heads=4, d_mlp=64, n_ctx=64, d_vocab=len(tok),
        act_fn="silu", normalization_type="RMS", positional_embedding_type="rotary",
        gated_mlp=True, use_local_attn=True, attn_types=["local", "global"], window_size=3, seed=1,
        init_weights=True,
    )
    model = HookedTransformer(cfg, tokenizer=None)
    model.tokenizer = tok
    tok.padding_side = "left"
    assert model.blocks[0].attn.attn_type == "local"
    enc = encode(model, PROMPTS)
    slow_lp, slow_z = _run(model, enc, fast=False)
    fast_lp, fast_z = _run(model, enc, fast=True)
    keep = enc.attention_mask.bool()
    assert (slow_lp - fast_lp)[keep].abs().max().item() < 1e-5
    assert torch.allclose(slow_z, fast_z, atol=1e-5)


@pytest.mark.parametrize("variant", ["mha", "gqa"])
def test_fast_attention_kv_cached_paths_match(variant):
    model = _hooked_tiny(**VARIANTS[variant])
    enc = encode(model, PROMPTS)
    out = {}
    for fast in (False, True):
        enable_fast_attention(model, fast)
        gen, first = greedy_generate(model, enc, max_new_tokens=6, stop_at_newline=False)
        cache, last = prefix_cache(model, enc)
        with torch.no_grad():
            lt = last_token_forward(model, cache, last)[:, -1]
        out[fast] = (gen, first, lt)
    assert torch.equal(out[False][0], out[True][0])
    assert torch.allclose(out[False][1], out[True][1], atol=1e-5)
    assert torch.allclose(out[False][2], out[True][2], atol=1e-5)


def test_gradients_through_a_padded_batch_match_and_are_finite():
    model = _hooked_tiny(n_key_value_heads=2)
    enc = encode(model, PROMPTS)
    grads = {}
    for fast in (False, True):
        enable_fast_attention(model, fast)
        delta = torch.zeros(model.cfg.d_model, requires_grad=True)  # [d_model]

        def add(x, hook=None, delta=delta):
            return x + delta  # [batch, pos, d_model]

        with model.hooks(fwd_hooks=[("blocks.0.hook_resid_pre", add)]):
            logits = model(enc.tokens, attention_mask=enc.attention_mask)
        logits[enc.attention_mask.bool()].logsumexp(-1).sum().backward()
        grads[fast] = delta.grad.clone()
    assert torch.isfinite(grads[True]).all()
    assert torch.allclose(grads[False], grads[True], atol=1e-4, rtol=1e-4)


def test_a_pattern_hook_takes_the_transformerlens_path():
    model = _hooked_tiny()
    enc = encode(model, PROMPTS)
    seen = []

    def zero_head0(pattern, hook):
        seen.append(pattern.shape)
        pattern = pattern.clone()
        pattern[:, 0] = 0.0  # ablate head 0's attention
        return pattern

    hooks = [("blocks.1.attn.hook_pattern", zero_head0)]
    results = {}
    for fast in (False, True):
        enable_fast_attention(model, fast)
        with torch.no_grad():
            results[fast] = model.run_with_hooks(enc.tokens, attention_mask=enc.attention_mask,
                                                 fwd_hooks=hooks)
    assert len(seen) == 2 and seen[0] == seen[1]  # fired on both paths, full patterns
    # layer 1 ran TransformerLens's attention with the hooked pattern on both paths (layer 0 fused)
    assert torch.allclose(results[False], results[True], atol=1e-5)
    with torch.no_grad():
        plain = model(enc.tokens, attention_mask=enc.attention_mask)
    assert not torch.allclose(plain, results[True])  # the ablation did something


def test_unsupported_configurations_fall_back_exactly():
    model = _hooked_tiny()
    attn = model.blocks[0].attn
    assert supports_fast_path(attn)
    enc = encode(model, PROMPTS)
    old = model.cfg.attn_scores_soft_cap
    model.cfg.attn_scores_soft_cap = 5.0  # Gemma-2 style soft-capping: not fused
    try:
        assert not supports_fast_path(attn)
        enable_fast_attention(model, False)
        with torch.no_grad():
            slow = model(enc.tokens, attention_mask=enc.attention_mask)
        enable_fast_attention(model, True)
        with torch.no_grad():
            fast = model(enc.tokens, attention_mask=enc.attention_mask)
        assert torch.equal(slow, fast)
    finally:
        model.cfg.attn_scores_soft_cap = old


def test_toggle_and_load_model_option():
    from sitelens.models import load_model

    model = load_model("tiny-random", backend="hooked")
    assert fast_attention_enabled(model)
    enable_fast_attention(model, False)
    assert not fast_attention_enabled(model)
    assert "forward" not in vars(model.blocks[0].attn)  # the class's own forward again
    enable_fast_attention(model, True)
    enable_fast_attention(model, True)  # idempotent
    assert fast_attention_enabled(model)
    off = load_model("tiny-random", backend="hooked", fast_attention=False)
    assert not fast_attention_enabled(off)


def test_bridge_is_left_alone():
    try:
        bridge = tiny_model(backend="bridge")
    except Exception as e:  # pragma: no cover - a TransformerLens without the bridge
        pytest.skip(f"no TransformerBridge: {e}")
    assert is_bridge(bridge)
    assert enable_fast_attention(bridge) is bridge
    assert not fast_attention_enabled(bridge)
