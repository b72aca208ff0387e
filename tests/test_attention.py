"""The fused attention fast path (sitelens.models.attention) against TransformerLens's own attention."""

import pytest
import torch
from tolerances import assert_activations_close, assert_logits_close, assert_logprobs_close

from sitelens.eval.generation import greedy_generate
from sitelens.models import encode, has_hooked_transformer, is_bridge, last_token_forward, prefix_cache
from sitelens.models.attention import enable_fast_attention, fast_attention_enabled, supports_fast_path
from sitelens.testing import tiny_model

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
    """Logits and every layer's hook_z on a left-padded batch, on one attention path."""
    enable_fast_attention(model, fast)
    names = lambda n: n.endswith("hook_z")  # noqa: E731
    with torch.no_grad():
        logits, cache = model.run_with_cache(enc.tokens, attention_mask=enc.attention_mask,
                                             names_filter=names)
    z = torch.stack([cache[f"blocks.{i}.attn.hook_z"] for i in range(model.cfg.n_layers)])
    return logits, z  # [batch, pos, d_vocab], [n_layers, batch, pos, n_heads, d_head]


def attention_paths_agree(model, enc):
    """TransformerLens's attention vs the fused path (left on afterwards) on one batch: log-probs
    at every real position and every layer's hook_z (left-pad positions included, where
    TransformerLens gives 0), within the float32 rounding bounds of tests/tolerances.py (log-probs:
    logprob_tolerance at the batch's logit scale; hook_z of layer l: depth l + 1 at that layer's
    own scale). Returns the two checks. tests/test_mutations.py runs this same comparison on
    deliberately broken fused paths and expects it to fail."""
    try:
        slow_logits, slow_z = _run(model, enc, fast=False)
        fast_logits, fast_z = _run(model, enc, fast=True)
    finally:
        enable_fast_attention(model, True)
    keep = enc.attention_mask.bool()
    lp = assert_logprobs_close(fast_logits, slow_logits, model, mask=keep,
                               what=f"{model.cfg.model_name}: fused vs TransformerLens log-probs")
    z = assert_activations_close(fast_z, slow_z, model, layer_dim=0,
                                 what=f"{model.cfg.model_name}: fused vs TransformerLens hook_z")
    assert not torch.isnan(fast_logits).any()
    return lp, z


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_fast_attention_matches_transformerlens_on_a_padded_batch(variant):
    model = _hooked_tiny(**VARIANTS[variant])
    assert fast_attention_enabled(model)  # on by default
    enc = encode(model, PROMPTS)
    assert not bool(enc.attention_mask.all())  # the batch is really padded
    # Bounds from dtype, depth and reduction sizes (tests/tolerances.py). Measured here: log-probs
    # 1.2-2.9e-6 vs bounds 1.8-2.2e-5 (at most 0.14 of the bound), hook_z at most 0.07 of its
    # per-layer bound. Broken fused paths move the log-probs by 0.58-2.6 (one head sees one future
    # token), 2.2-3.6 (one head misses its own position), 3-4.9 (padding visible), 5.0 (GQA
    # groups miswired): test_mutations.py.
    attention_paths_agree(model, enc)


def test_fast_attention_matches_with_sliding_window_layers():
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    from sitelens.testing import tiny_tokenizer

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
    attention_paths_agree(model, enc)  # bounds as in the padded-batch test above


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
    # first-step logits (prefill) and the last token on a prefix KV cache: logit_tolerance at
    # their own scale (depth n_layers)
    assert_logits_close(out[True][1], out[False][1], model, what="greedy first-step logits")
    assert_logits_close(out[True][2], out[False][2], model, what="last token on a prefix cache")
    # Greedy tokens are integers, the argmax of logits that agree within that bound: equal unless
    # a top-2 logit gap at some step falls below it (~2e-5).
    assert torch.equal(out[False][0], out[True][0])


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
    # The gradient retraces every block backwards after the forward pass (depth 2·n_layers) and
    # sums over the batch's positions; bound at the gradient's own scale.
    assert_activations_close(grads[True], grads[False], model, depth=2 * model.cfg.n_layers,
                             what="d(sum logsumexp)/d(resid_pre 0), fused vs TransformerLens")


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
    # layer 1 ran TransformerLens's attention with the hooked pattern on both paths (layer 0
    # fused): logits within logit_tolerance
    keep = enc.attention_mask.bool()
    assert_logits_close(results[True], results[False], model, mask=keep,
                        what="pattern-hooked logits, layer 0 fused vs not")
    with torch.no_grad():
        plain = model(enc.tokens, attention_mask=enc.attention_mask)
    with pytest.raises(AssertionError):  # the ablation did something: far outside that bound
        assert_logits_close(plain, results[True], model, mask=keep, what="ablation")


def test_unsupported_configurations_fall_back_exactly():
    model = _hooked_tiny()
    attn = model.blocks[0].attn
    assert supports_fast_path(attn)
    enc = encode(model, PROMPTS)
    old = model.cfg.attn_scores_soft_cap
    model.cfg.attn_scores_soft_cap = 5.0  # Gemma-2 style soft-capping: not fused
    try:
        assert not supports_fast_path(attn)
        # exact: both calls run TransformerLens's own forward, the same ops on the same inputs
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
    bridge = tiny_model(backend="bridge")  # every TransformerLens this project supports has it
    assert is_bridge(bridge)
    assert enable_fast_attention(bridge) is bridge
    assert not fast_attention_enabled(bridge)




def test_cached_last_token_pass_traces_as_one_graph():
    """SITE's stage-2 step on a frozen prefix cache (the α-mix at the last token, then the loss)
    never reads the padding mask on the host, so ``torch.compile`` traces the pass whole, with no
    graph break (``benchmarks/compile_step.py`` times it on SmolLM2). Reading
    ``attention_mask.all()`` before the cache offset decided the kernel broke the graph in every
    layer. The targets are one row per layer, as stage 2 places them."""
    from sitelens.site.alpha import alpha_logit_rows, first_token_loss, site_mix
    from sitelens.site.training import LastTokenSet

    model = _hooked_tiny(n_key_value_heads=2)
    rows = LastTokenSet.from_prompts(model, PROMPTS, [5, 6, 7])  # left-padded: the masked kernel
    L, H, D = model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_head
    target = list(torch.randn(L, H, D, generator=torch.Generator().manual_seed(0)))  # L × [H, D]
    a = alpha_logit_rows(model, 0.0)

    def loss_of(a):
        return first_token_loss(model, rows.cache, rows.last, rows.answers,
                                site_mix([torch.sigmoid(r) for r in a], target))

    torch._dynamo.reset()
    explained = torch._dynamo.explain(loss_of)(a)
    torch._dynamo.reset()
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
