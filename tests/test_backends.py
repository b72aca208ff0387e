"""The two backends: z-hook resolution, the runtime shape check, the self-check, no implicit
compatibility mode, the reserved tiny names, and HookedTransformer == TransformerBridge on the same
weights."""

import copy

import pytest
import torch
from tolerances import assert_activations_close, assert_logits_close

from sitelens import HeadMix, ModelError, encode, load_model, tiny_model, z_hook_name
from sitelens.eval.generation import greedy_generate, last_logits
from sitelens.models import (
    has_hooked_transformer,
    is_bridge,
    kv_forward,
    new_kv_cache,
    resolve_backend,
    self_check,
)
from sitelens.site import last_token_z
from sitelens.site.injection import apply_hooks
from sitelens.testing import tiny_tokenizer


def test_z_hook_fires_with_its_own_name_and_shape(tiny):
    enc = encode(tiny, ["Q: a\nA:"])
    seen = {}

    def grab(z, hook):
        seen[hook.name] = tuple(z.shape)

    names = [z_hook_name(tiny, layer) for layer in range(tiny.cfg.n_layers)]
    with torch.no_grad(), apply_hooks(tiny, [(n, grab) for n in names]):
        tiny(enc.tokens, attention_mask=enc.attention_mask)
    assert list(seen) == names  # hook.name inside the hook is the resolved name
    assert set(seen.values()) == {(1, enc.tokens.shape[1], tiny.cfg.n_heads, tiny.cfg.d_head)}
    if is_bridge(tiny):
        assert names[0] == "blocks.0.attn.o.hook_in"
    else:
        assert names[0] == "blocks.0.attn.hook_z"


def test_canonical_hook_names(tiny_mha):
    from sitelens.models import canonical_hook_name

    enc = encode(tiny_mha, ["Q: a\nA:"])
    seen = []
    with torch.no_grad(), apply_hooks(tiny_mha, [("blocks.1.hook_resid_pre",
                                                  lambda x, hook: seen.append(hook.name))]):
        tiny_mha(enc.tokens, attention_mask=enc.attention_mask)
    assert seen == [canonical_hook_name(tiny_mha, "blocks.1.hook_resid_pre")]
    assert canonical_hook_name(tiny_mha, "blocks.0.attn.hook_z") == z_hook_name(tiny_mha, 0)
    if is_bridge(tiny_mha):
        with pytest.raises(ModelError, match="no hook point 'blocks.0.nope'"):
            canonical_hook_name(tiny_mha, "blocks.0.nope")


def test_z_hook_of_a_missing_layer(tiny_mha):
    if not is_bridge(tiny_mha):
        pytest.skip("HookedTransformer names are fixed strings")
    with pytest.raises(ModelError, match="out of range"):
        z_hook_name(tiny_mha, 99)


def test_runtime_shape_check_names_the_hook(tiny_mha):
    L, H, d = tiny_mha.cfg.n_layers, tiny_mha.cfg.n_heads, tiny_mha.cfg.d_head
    mix = HeadMix(torch.ones(L, H), torch.zeros(L, H, d))
    flat = torch.randn(2, 5, H * d)  # a [batch, pos, d_model] activation, as a flat o_proj input

    class Hook:
        name = "blocks.0.attn.o.hook_in"

    with pytest.raises(ModelError) as e:
        mix.hook_fn(0)(flat, hook=Hook())
    msg = str(e.value)
    assert "blocks.0.attn.o.hook_in" in msg and "[2, 5, 32]" in msg
    assert f"[batch, pos, n_heads={H}, d_head={d}]" in msg


def test_resolver_falls_back_and_reports_unknown_layouts(monkeypatch):
    import sitelens.models.hooks as M

    bridge = tiny_model(backend="bridge")
    monkeypatch.setattr(M, "_BRIDGE_Z_CANDIDATES", ("blocks.{layer}.attn.nothing_here",))
    M._Z_HOOKS.pop(bridge, None)
    with pytest.raises(ModelError, match=r"No per-head z hook found in layer 0 .*blocks.0.attn.hook_z"):
        z_hook_name(bridge, 0)
    # a hook that exists but never fires on a forward pass
    monkeypatch.setattr(M, "_BRIDGE_Z_CANDIDATES", ("blocks.{layer}.attn.hook_hidden_states",))
    M._Z_HOOKS.pop(bridge, None)
    with pytest.raises(ModelError, match="did not fire"):
        self_check(bridge)
    # a hook that fires with another layout
    monkeypatch.setattr(M, "_BRIDGE_Z_CANDIDATES", ("blocks.{layer}.attn.o.hook_out",))
    M._Z_HOOKS.pop(bridge, None)
    with pytest.raises(ModelError, match=r"o.hook_out gave activations of shape \[1, \d+, 32\]"):
        self_check(bridge)
    M._Z_HOOKS.pop(bridge, None)


def test_self_check_detects_a_hook_whose_return_is_ignored(backend, monkeypatch):
    model = tiny_model(backend=backend)
    assert self_check(model)["shape"][2:] == (4, 8)
    real = model.hooks

    def ignoring(fwd_hooks=(), **kw):  # a backend that runs hooks but drops what they return
        return real(fwd_hooks=[(n, lambda z, hook, f=f: (f(z, hook), None)[1]) for n, f in fwd_hooks],
                    **kw)

    monkeypatch.setattr(model, "hooks", ignoring)
    with pytest.raises(ModelError, match="did not change the logits"):
        self_check(model)


def test_bridge_never_enables_compatibility_mode(monkeypatch):
    from transformer_lens.model_bridge import TransformerBridge

    def forbidden(self, *a, **k):
        raise AssertionError("enable_compatibility_mode() was called")

    monkeypatch.setattr(TransformerBridge, "enable_compatibility_mode", forbidden)
    from sitelens import FitConfig, fit_site, load_task
    from sitelens.eval.evaluation import evaluate

    model = tiny_model(backend="bridge")
    task = load_task("antonym")
    ad = fit_site(model, task, n_prompts=2, n_shots=2, config=FitConfig(n_examples=4, batch_size=4))
    evaluate(model, task, adapter=ad, limit=2, n_shots=2)
    assert model.compatibility_mode is False


def test_reserved_tiny_names(backend):
    m = load_model("tiny-random", backend=backend)
    g = load_model("tiny-random-gqa", backend=backend)
    assert is_bridge(m) == (backend == "bridge")
    assert m.cfg.model_name == "tiny-random" and g.cfg.model_name == "tiny-random-gqa"
    assert g.cfg.n_key_value_heads == 2 and m.cfg.n_heads == 4


def test_hooked_backend_needs_tl3(monkeypatch):
    import sitelens.models.spec as M

    monkeypatch.setattr(M, "has_hooked_transformer", lambda: False)
    with pytest.raises(ModelError, match=r"backend='hooked' needs HookedTransformer.*backend='bridge'"):
        resolve_backend("hooked")
    monkeypatch.delenv("SITELENS_BACKEND", raising=False)
    assert resolve_backend(None) == "bridge"
    monkeypatch.setenv("SITELENS_BACKEND", "nope")
    with pytest.raises(ModelError, match="SITELENS_BACKEND='nope' is not a backend"):
        resolve_backend(None)


def test_bridge_cache_stand_in_matches_full_passes(tiny):
    """kv_forward on a fresh cache, then one more token, equals one full pass."""
    enc = encode(tiny, ["Q: ab\nA:", "Q: a longer one\nA:"])
    cache = new_kv_cache(tiny, 2)
    with torch.no_grad():
        first = kv_forward(tiny, enc.tokens, enc.attention_mask, cache)[:, -1]
        nxt = first.argmax(-1)[:, None]
        second = kv_forward(tiny, nxt, torch.ones_like(nxt), cache)[:, -1]
        full = tiny(torch.cat([enc.tokens, nxt], 1),
                    attention_mask=torch.cat([enc.attention_mask, torch.ones_like(nxt)], 1))
    # cached steps vs one full pass: logit_tolerance (depth 2, reduction 64, at the logits'
    # scale); a decode step at the wrong position or a cache that forgets its padding fails it
    assert_logits_close(first, full[:, -2], tiny, what="prefill on a fresh cache vs full pass")
    assert_logits_close(second, full[:, -1], tiny, what="decode step vs full pass")


# ----------------------------------------------------------------------------------------------
# the same weights on both backends


@pytest.fixture(scope="module")
def twins():
    """One tiny random HF Llama as a HookedTransformer and as a TransformerBridge."""
    if not has_hooked_transformer():
        pytest.skip("HookedTransformer only: TransformerLens 4.x removed it")
    from transformer_lens import HookedTransformer
    from transformer_lens.pretrained.weight_conversions import convert_llama_weights
    from transformers import LlamaConfig, LlamaForCausalLM

    from sitelens.models import llama_config_from_hf
    from sitelens.models.bridge import bridge_from_hf
    from sitelens.models.prepare import prepare_model

    tok = tiny_tokenizer()
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                      max_position_embeddings=256, initializer_range=0.15, tie_word_embeddings=False,
                      bos_token_id=1, eos_token_id=2, pad_token_id=0)
    cfg._attn_implementation = "eager"
    torch.manual_seed(11)
    hf = LlamaForCausalLM(cfg).eval()
    # as sitelens.models.gguf._from_llama_hf does for SmolLM2, with the tokenizer attached directly
    ht_cfg = llama_config_from_hf(hf.config, n_ctx=256, prepend_bos=True)
    hooked = HookedTransformer(ht_cfg, tokenizer=None)
    hooked.load_and_process_state_dict(convert_llama_weights(copy.deepcopy(hf), ht_cfg), fold_ln=True,
                                       center_writing_weights=False, center_unembed=False)
    hooked.tokenizer = tok
    hooked = prepare_model(hooked)
    bridge = prepare_model(bridge_from_hf(hf, tiny_tokenizer(), name="twin", prepend_bos=True, n_ctx=256))
    return hooked, bridge


def test_backends_agree_on_the_same_weights(twins):
    hooked, bridge = twins
    prompts = ["Q: hot\nA:", "Q: a longer prompt\nA:", "Q: x\nA:"]
    enc = encode(hooked, prompts)
    assert torch.equal(enc.tokens, encode(bridge, prompts).tokens)  # integer token ids
    # Hugging Face attention and unfolded norms vs fused attention and folded norms: float32
    # rounding only, so logit_tolerance (depth 2, reduction 64, at the logits' scale) and per-layer
    # activation_tolerance for hook_z [prompt, layer, head, d_head] (layer l: depth l + 1)
    assert_logits_close(last_logits(bridge, enc), last_logits(hooked, enc), hooked,
                        what="bridge vs hooked logits")
    zh = last_token_z(hooked, prompts, reduce="none")
    zb = last_token_z(bridge, prompts, reduce="none")
    assert_activations_close(zb, zh, hooked, layer_dim=1, what="bridge vs hooked last-token z")
    torch.manual_seed(0)
    mix = HeadMix(torch.rand(2, 4), torch.randn(2, 4, 8) * 3)
    assert_logits_close(last_logits(bridge, enc, mix), last_logits(hooked, enc, mix), hooked,
                        what="bridge vs hooked logits under a HeadMix")
    gh, _ = greedy_generate(hooked, enc, intervention=mix, max_new_tokens=5, stop_at_newline=False)
    gb, _ = greedy_generate(bridge, enc, intervention=mix, max_new_tokens=5, stop_at_newline=False)
    # integer tokens, argmax of logits that agree within the bound: equal unless a top-2 logit
    # gap at some step falls below that bound (~2e-5)
    assert torch.equal(gb, gh)


def _baseline_interventions(model):
    """One intervention of each hook-based baseline with fixed, non-trivial parameters (the
    same numbers on both twins: they share n_layers, n_heads, d_head, d_model)."""
    from sitelens.baselines.base import HookIntervention
    from sitelens.baselines.fv import fv_intervention
    from sitelens.baselines.i2cl import i2cl_hooks, init_i2cl
    from sitelens.baselines.ia3 import ia3_hooks, init_ia3
    from sitelens.baselines.lora import init_lora, lora_hooks
    from sitelens.baselines.ltv import ltv_intervention
    from sitelens.baselines.tv import tv_intervention

    g = torch.Generator().manual_seed(3)
    L, d = model.cfg.n_layers, model.cfg.d_model
    lora = {k: torch.randn(v.shape, generator=g) * 0.3 for k, v in init_lora(model, rank=2).items()}
    ia3 = {k: 1 + torch.randn(v.shape, generator=g) * 0.3 for k, v in init_ia3(model).items()}
    i2cl = {k: torch.randn(v.shape, generator=g) * 0.3 for k, v in init_i2cl(model).items()}
    vectors = torch.randn(L, 2, d, generator=g)
    return {
        "tv": tv_intervention(torch.randn(d, generator=g) * 2, 1),
        "fv": fv_intervention(torch.randn(d, generator=g) * 2, 1),
        "ltv": ltv_intervention(torch.randn(d, d, generator=g) * 0.2, L - 1),
        "lora": HookIntervention(lambda m, s: lora_hooks(m, lora, 2.0), scope="all"),
        "ia3": HookIntervention(lambda m, s: ia3_hooks(m, ia3), scope="all"),
        "i2cl": HookIntervention(lambda m, s: i2cl_hooks(m, vectors, i2cl), scope="all"),
    }


@pytest.mark.parametrize("method", ["tv", "fv", "ltv", "lora", "ia3", "i2cl"])
def test_baselines_agree_across_backends(twins, method):
    """Each baseline's hooks (HookedTransformer names) act the same on a TransformerBridge:
    the same logits at the answer position and the same greedy continuation."""
    hooked, bridge = twins
    enc = encode(hooked, ["Q: hot\nA:", "Q: a longer prompt\nA:", "Q: x\nA:"])
    inter_h = _baseline_interventions(hooked)[method]
    inter_b = _baseline_interventions(bridge)[method]
    base = last_logits(hooked, enc)
    lh = last_logits(hooked, enc, inter_h)
    with pytest.raises(AssertionError):  # the intervention does something: more than rounding
        assert_logits_close(lh, base, hooked, what="intervention vs none")
    # same weights, same hooks, two backends: logit_tolerance (as in the test above)
    assert_logits_close(last_logits(bridge, enc, inter_b), lh, hooked,
                        what=f"{method}: bridge vs hooked logits")
    gh, fh = greedy_generate(hooked, enc, intervention=inter_h, max_new_tokens=5, stop_at_newline=False)
    gb, fb = greedy_generate(bridge, enc, intervention=inter_b, max_new_tokens=5, stop_at_newline=False)
    assert_logits_close(fb, fh, hooked, what=f"{method}: bridge vs hooked first-step logits")
    assert torch.equal(gb, gh)  # integer tokens: as in the test above


def test_kv_forward_last_only_equals_the_last_column(tiny):
    """The prefill can unembed only its last position (Gemma's 262k-vocab logits of every
    position would take gigabytes) and still fill the cache for the decode steps."""
    enc = encode(tiny, ["Q: ab\nA:", "Q: a longer one\nA:"])
    with torch.no_grad():
        c1, c2 = new_kv_cache(tiny, 2), new_kv_cache(tiny, 2)
        full = kv_forward(tiny, enc.tokens, enc.attention_mask, c1)
        last = kv_forward(tiny, enc.tokens, enc.attention_mask, c2, last_only=True)
        assert last.shape[1] == 1
        # the unembedding of one column vs of all columns (other GEMM shapes): logit_tolerance;
        # unembedding the wrong column fails it (test_mutations.py)
        assert_logits_close(last[:, 0], full[:, -1], tiny, what="last-only prefill vs full")
        nxt = full[:, -1].argmax(-1)[:, None]
        assert_logits_close(kv_forward(tiny, nxt, torch.ones_like(nxt), c2),
                            kv_forward(tiny, nxt, torch.ones_like(nxt), c1), tiny,
                            what="decode step after a last-only vs full prefill")
