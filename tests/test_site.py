import pytest
import torch

from sitelens import (
    AdapterError,
    FitConfig,
    FitError,
    HeadMix,
    SiteAdapter,
    apply_hooks,
    encode,
    fit_alpha,
    fit_site,
    head_mask,
    load_task,
    task_embedding,
    tiny_model,
    z_hook_name,
)
from sitelens.eval.generation import greedy_generate, last_logits
from sitelens.models import Encoded
from sitelens.site import last_token_z


@pytest.fixture(scope="module")
def task():
    return load_task("antonym")


def _z_at_last(model, prompts, mix=None):
    enc = encode(model, prompts)
    zs = {}

    def grab(z, hook):
        zs[hook.name] = z[:, -1].clone()

    hooks = (mix.hooks(model) if mix else []) + [
        (z_hook_name(model, layer), grab) for layer in range(model.cfg.n_layers)
    ]
    with torch.no_grad(), apply_hooks(model, hooks):
        logits = model(enc.tokens, attention_mask=enc.attention_mask)
    return logits, zs


def test_alpha_zero_is_bit_identical(tiny):
    L, H, d = tiny.cfg.n_layers, tiny.cfg.n_heads, tiny.cfg.d_head
    prompts = ["Q: hot\nA:", "Q: longer one\nA:"]
    enc = encode(tiny, prompts)
    mix = HeadMix(torch.zeros(L, H), torch.randn(L, H, d))
    base = last_logits(tiny, enc)
    mixed = last_logits(tiny, enc, mix)
    # exact: w = 0 gives (1 − 0)·z + 0·t = z bit for bit; every other op is the same
    assert torch.equal(base, mixed)
    # also with gradients on alpha (all layers hooked, nothing skipped)
    a = torch.full((L, H), -torch.inf, requires_grad=True)
    with torch.no_grad():
        full = tiny(enc.tokens, attention_mask=enc.attention_mask)[:, -1]  # [batch, d_vocab]
    with apply_hooks(tiny, HeadMix(torch.sigmoid(a), torch.randn(L, H, d)).hooks(tiny)):
        lg = tiny(enc.tokens, attention_mask=enc.attention_mask)[:, -1]
    assert torch.equal(lg.detach(), full)  # exact: sigmoid(-inf) = 0, as above


def test_alpha_one_replaces_exactly_one_head(tiny):
    L, H, d = tiny.cfg.n_layers, tiny.cfg.n_heads, tiny.cfg.d_head
    t = torch.randn(L, H, d)
    mix = HeadMix(head_mask([(1, 2)], L, H), t)
    _, clean = _z_at_last(tiny, ["Q: hot\nA:"])
    _, patched = _z_at_last(tiny, ["Q: hot\nA:"], mix)
    z1 = patched[z_hook_name(tiny, 1)]
    # exact: w = 1 gives 0·z + 1·t = t; other heads and layer 0 keep their bits (same ops)
    assert torch.equal(z1[0, 2], t[1, 2])
    other = [h for h in range(H) if h != 2]
    assert torch.equal(z1[0, other], clean[z_hook_name(tiny, 1)][0, other])
    assert torch.equal(patched[z_hook_name(tiny, 0)], clean[z_hook_name(tiny, 0)])


def test_per_row_weights_patch_different_heads(tiny_mha):
    L, H, d = tiny_mha.cfg.n_layers, tiny_mha.cfg.n_heads, tiny_mha.cfg.d_head
    t = torch.randn(L, H, d)
    w = torch.stack([head_mask([(0, 1)], L, H), head_mask([(1, 3)], L, H)])  # [2, L, H]
    prompts = ["Q: hot\nA:", "Q: hot\nA:"]
    both = last_logits(tiny_mha, encode(tiny_mha, prompts), HeadMix(w, t))
    for row in range(2):
        single = last_logits(tiny_mha, encode(tiny_mha, prompts[:1]), HeadMix(w[row], t))
        # other batch shapes: float32 rounding only (tests/tolerances.py's logit_tolerance for this
        # model is ~1.5e-5 at logit scale ~2.5; equivalent comparisons measure <= 1.3e-6), so
        # 1e-5 covers it, and a head patched on the wrong row moves the logits by O(0.1-1).
        torch.testing.assert_close(both[row], single[0], atol=1e-5, rtol=1e-5)


def test_task_embedding_shape_and_batch_invariance(tiny, task):
    emb = task_embedding(tiny, task, n_prompts=6, n_shots=3, batch_size=4)
    assert emb.shape == (tiny.cfg.n_layers, tiny.cfg.n_heads, tiny.cfg.d_head)
    emb1 = task_embedding(tiny, task, n_prompts=6, n_shots=3, batch_size=1)
    # mean last-token hook_z (|z| ~ 1), batched vs alone: float32 rounding of a 2-layer pass
    # (activation_tolerance ~2e-6 per layer at scale ~1; measured <= 6e-8); 1e-5 is well above
    # it and far below padding read as text (~0.06)
    torch.testing.assert_close(emb, emb1, atol=1e-5, rtol=1e-5)


def test_last_token_z_matches_run_with_cache(tiny_mha, task):
    from sitelens.tasks import embedding_prompts

    prompts = embedding_prompts(task, 3, 2)
    zs = last_token_z(tiny_mha, prompts, reduce="none", batch_size=2)
    for i, p in enumerate(prompts):
        enc = encode(tiny_mha, [p])
        _, cache = tiny_mha.run_with_cache(enc.tokens, attention_mask=enc.attention_mask)
        for layer in range(tiny_mha.cfg.n_layers):
            # the same prompt in another batch (forward_until vs run_with_cache): float32
            # rounding only, ~1e-6 at |z| ~ 1 (activation_tolerance); 1e-5 covers it
            torch.testing.assert_close(
                zs[i, layer], cache[z_hook_name(tiny_mha, layer)][0, -1], atol=1e-5, rtol=1e-5
            )


def test_only_a_receives_gradients(tiny_mha, task):
    emb = task_embedding(tiny_mha, task, n_prompts=4, n_shots=2)
    before = {n: p.clone() for n, p in tiny_mha.named_parameters()}
    res = fit_alpha(tiny_mha, task, emb, FitConfig(n_examples=8, batch_size=4, eval_every=1))
    assert all(not p.requires_grad for p in tiny_mha.parameters())
    for n, p in tiny_mha.named_parameters():
        assert torch.equal(p, before[n]), n  # exact: frozen weights are never written
    assert res.alpha.shape == (tiny_mha.cfg.n_layers, tiny_mha.cfg.n_heads)
    assert not torch.allclose(res.logits, torch.zeros_like(res.logits))  # a moved
    assert len(res.history) == 3


def test_fit_is_deterministic(tiny_mha, task):
    cfg = FitConfig(n_examples=12, batch_size=4, eval_every=1, seed=3)
    a = fit_site(tiny_mha, task, n_prompts=4, n_shots=2, config=cfg)
    b = fit_site(tiny_mha, task, n_prompts=4, n_shots=2, config=cfg)
    # exact: the same seed, ops and thread count on one machine give the same bits
    assert torch.equal(a.alpha, b.alpha) and torch.equal(a.embedding, b.embedding)


def test_fit_with_a_precomputed_embedding(tiny_mha, task):
    cfg = FitConfig(n_examples=12, batch_size=4, eval_every=1, seed=3)
    a = fit_site(tiny_mha, task, n_prompts=4, n_shots=2, config=cfg)
    emb = task_embedding(tiny_mha, task, n_prompts=4, n_shots=2, seed=3)
    b = fit_site(tiny_mha, task, n_prompts=4, n_shots=2, config=cfg, embedding=emb,
                 stage1_seconds=1.5)
    assert torch.equal(a.alpha, b.alpha) and b.embedding is emb
    # recovered as t1 − (t1 − 1.5) from perf_counter floats: rounding only (~1e-12); abs 0.05
    assert b.meta["stage1_seconds"] == pytest.approx(1.5, abs=0.05)
    assert b.meta["hyperparameters"] == a.meta["hyperparameters"]
    with pytest.raises(FitError, match=r"task embedding has shape \[2, 4\]"):
        fit_site(tiny_mha, task, config=cfg, embedding=emb[:, :, 0])


def test_inject_once_generation_equals_manual_prefill(tiny):
    L, H, d = tiny.cfg.n_layers, tiny.cfg.n_heads, tiny.cfg.d_head
    torch.manual_seed(0)
    mix = HeadMix(torch.rand(L, H), torch.randn(L, H, d) * 3)
    enc = encode(tiny, ["Q: hot\nA:", "Q: much longer\nA:"])
    gen, first = greedy_generate(tiny, enc, intervention=mix, max_new_tokens=6, stop_at_newline=False)
    # manual, independent of any KV cache: recompute the whole sequence each step, with the mix
    # applied at the last PROMPT position on every pass (the injected prompt state is kept, and
    # generated positions are never injected). Raw model.hooks: no sitelens hook wrapping.
    tokens, mask = enc.tokens, enc.attention_mask
    S = tokens.shape[1]

    def at_prompt(layer):
        f = mix.hook_fn(layer)

        def fn(z, hook):
            return torch.cat([f(z[:, :S], hook), z[:, S:]], dim=1)

        return fn

    hooks = [(z_hook_name(tiny, layer), at_prompt(layer)) for layer in range(L)]
    manual = []
    with torch.no_grad(), tiny.hooks(fwd_hooks=hooks):
        lg = tiny(tokens, attention_mask=mask)[:, -1]
        torch.testing.assert_close(first, lg, atol=1e-5, rtol=1e-5)
        for _ in range(6):
            nxt = lg.argmax(-1)
            manual.append(nxt)
            tokens = torch.cat([tokens, nxt[:, None]], 1)
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
            lg = tiny(tokens, attention_mask=mask)[:, -1]
    assert torch.equal(gen, torch.stack(manual, 1))


def test_pinned_hook_does_not_fire_on_decode_steps(tiny_mha):
    L, H, d = tiny_mha.cfg.n_layers, tiny_mha.cfg.n_heads, tiny_mha.cfg.d_head
    mix = HeadMix(torch.ones(L, H), torch.randn(L, H, d), seq_len=7)
    z = torch.randn(2, 1, H, d)
    assert mix.hook_fn(0)(z) is z  # one position != prompt length: untouched
    z7 = torch.randn(2, 7, H, d)
    assert not torch.equal(mix.hook_fn(0)(z7), z7)


def test_generation_with_cache_equals_without(tiny_mha):
    enc = encode(tiny_mha, ["Q: abc\nA:", "Q: a\nA:"])
    gen, _ = greedy_generate(tiny_mha, enc, max_new_tokens=5, stop_at_newline=False)
    tokens, mask = enc.tokens, enc.attention_mask
    with torch.no_grad():
        for step in range(5):
            nxt = tiny_mha(tokens, attention_mask=mask)[:, -1].argmax(-1)
            assert torch.equal(nxt, gen[:, step])
            tokens = torch.cat([tokens, nxt[:, None]], 1)
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)


def test_generation_stops_when_the_context_is_full(tiny_mha):
    # A prompt that fits must not overrun the positional tables while decoding (it raised an
    # IndexError on 10-shot squad_val prompts near SmolLM2's 2048 tokens).
    n_ctx = tiny_mha.cfg.n_ctx
    g = torch.Generator().manual_seed(0)
    for prompt_len, n_new in [(n_ctx - 3, 4), (n_ctx, 1), (n_ctx - 20, 10)]:
        tokens = torch.randint(0, tiny_mha.cfg.d_vocab, (2, prompt_len), generator=g)
        enc = Encoded(tokens, torch.ones_like(tokens))
        gen, _ = greedy_generate(tiny_mha, enc, max_new_tokens=10, stop_at_newline=False)
        assert gen.shape == (2, n_new)


def test_adapter_round_trip_and_mismatch(tmp_path, tiny_mha, task):
    ad = fit_site(tiny_mha, task, n_prompts=4, n_shots=2,
                  config=FitConfig(n_examples=8, batch_size=4, eval_every=2))
    ad.save(tmp_path / "ad")
    back = SiteAdapter.load(tmp_path / "ad")
    assert torch.equal(back.alpha, ad.alpha) and torch.equal(back.embedding, ad.embedding)
    assert back.meta["task"] == "antonym" and back.meta["model"] == ad.meta["model"]
    back.check_model(tiny_mha)
    with pytest.raises(AdapterError, match="weights"):
        back.check_model(tiny_model(seed=5))
    with pytest.raises(AdapterError, match="does not match"):
        back.check_model(tiny_model(n_layers=3))
    # the runners' cache check: the saved adapter for its own model, None (and why) otherwise
    assert torch.equal(SiteAdapter.load_matching(tmp_path / "ad", tiny_mha).alpha, ad.alpha)
    errors = []
    assert SiteAdapter.load_matching(tmp_path / "ad", tiny_model(seed=5), errors.append) is None
    assert SiteAdapter.load_matching(tmp_path / "none", tiny_mha, errors.append) is None
    assert len(errors) == 1 and "weights" in str(errors[0])


def test_corrupted_adapter_file_is_detected(tmp_path, tiny_mha, task):
    ad = fit_site(tiny_mha, task, n_prompts=4, n_shots=2,
                  config=FitConfig(n_examples=4, batch_size=4, eval_every=1))
    ad.save(tmp_path / "ad")
    f = tmp_path / "ad" / "adapter.safetensors"
    f.write_bytes(f.read_bytes()[:-10])
    with pytest.raises(AdapterError, match="checksum"):
        SiteAdapter.load(tmp_path / "ad")
    with pytest.raises(AdapterError, match="not an adapter directory"):
        SiteAdapter.load(tmp_path / "nothing")
