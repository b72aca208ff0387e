"""Models for tests, built in code: no files, no network, well under a second each.

- :func:`tiny_tokenizer`: a byte-level tokenizer (one token per byte plus ``<bos>``, ``<eos>``,
  ``<pad>``).
- :func:`tiny_model`: a tiny randomly initialised ``HookedTransformer`` or ``TransformerBridge``;
  ``load_model("tiny-random")`` / ``"tiny-random-gqa"`` load it by name
  (:data:`~sitelens.models.registry.TINY_MODELS`).
- :func:`family_model`: a tiny random-weight ``HookedTransformer`` of one architecture family
  (:data:`sitelens.models.families.FAMILIES`); ``tests/test_families.py`` runs sitelens end to end
  on each.

Every model is readied as every sitelens load is (:mod:`sitelens.models.prepare`: eval mode, no
gradients, the fast weight layout, fused attention, left padding, the z-hook self-check), so a test
or a benchmark on it takes the library's own paths.
"""

from __future__ import annotations

import torch

from sitelens.errors import ModelError
from sitelens.models.bridge import bridge_from_hf
from sitelens.models.families import FAMILIES
from sitelens.models.prepare import prepare_model
from sitelens.models.spec import resolve_backend


def tiny_tokenizer():
    """A byte-level tokenizer with no merges (one token per byte) plus ``<bos>``, ``<eos>``,
    ``<pad>`` — built in code, no files, no network."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {"<pad>": 0, "<bos>": 1, "<eos>": 2}
    for ch in alphabet:
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        padding_side="left",
    )


def tiny_model(
    *,
    n_layers: int = 2,
    n_heads: int = 4,
    d_head: int = 8,
    n_key_value_heads: int | None = None,
    d_mlp: int = 64,
    n_ctx: int = 256,
    seed: int = 0,
    positional: str = "rotary",
    post_norm: bool = False,
    backend: str | None = None,
    attn_only: bool = False,
    normalization: str | None = "RMS",
    dtype: torch.dtype = torch.float32,
):
    """A tiny randomly initialised model with :func:`tiny_tokenizer`, built in code (no files, no
    network): a ``HookedTransformer`` (``backend="hooked"``) or a ``TransformerBridge`` around a
    tiny Hugging Face ``LlamaForCausalLM`` (``backend="bridge"``, rotary only). Default backend:
    :func:`~sitelens.models.spec.default_backend`.

    ``n_key_value_heads`` < ``n_heads`` gives a grouped-query (GQA) variant; 1 gives MQA.
    ``post_norm=True`` normalizes the attention and MLP outputs before they join the residual
    stream (``ln1_post`` / ``ln2_post``, as in Gemma 2/3); on the bridge it is a tiny
    ``Gemma3ForCausalLM``.

    ``HookedTransformer`` only (tests of exact identities): ``attn_only=True`` drops the MLPs,
    ``normalization=None`` the norms (then the logits are linear in each head's ``z`` in a
    one-layer model), ``dtype=torch.float64`` for finite differences.
    """
    backend = resolve_backend(backend)
    if backend == "bridge" and (attn_only or normalization != "RMS" or dtype != torch.float32):
        raise ModelError("attn_only, normalization and dtype are HookedTransformer-only options "
                         "of tiny_model; pass backend='hooked'.")
    if backend == "bridge":
        return _tiny_bridge(
            n_layers=n_layers, n_heads=n_heads, d_head=d_head, n_key_value_heads=n_key_value_heads,
            d_mlp=d_mlp, n_ctx=n_ctx, seed=seed, positional=positional, post_norm=post_norm,
        )
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    tokenizer = tiny_tokenizer()
    cfg = HookedTransformerConfig(
        n_layers=n_layers,
        d_model=n_heads * d_head,
        d_head=d_head,
        n_heads=n_heads,
        d_mlp=d_mlp,
        n_ctx=n_ctx,
        d_vocab=len(tokenizer),
        act_fn="silu",
        normalization_type=normalization,
        attn_only=attn_only,
        positional_embedding_type=positional,
        gated_mlp=True,
        n_key_value_heads=n_key_value_heads,
        use_normalization_before_and_after=post_norm,
        seed=seed,
        default_prepend_bos=True,
        tokenizer_prepends_bos=False,
        init_weights=True,
        dtype=dtype,
    )
    model = HookedTransformer(cfg, tokenizer=None)
    model.tokenizer = tokenizer  # set_tokenizer would try to reload it from a hub name
    kind = ("-postnorm" if post_norm else "") + ("-attnonly" if attn_only else "")
    kind += "" if normalization == "RMS" else f"-{normalization or 'nonorm'}"
    kind += "" if dtype == torch.float32 else f"-{str(dtype).removeprefix('torch.')}"
    model.cfg.model_name = f"tiny-{n_layers}l{n_heads}h{n_key_value_heads or n_heads}kv{kind}-s{seed}"
    return prepare_model(model)


def _tiny_bridge(
    *, n_layers, n_heads, d_head, n_key_value_heads, d_mlp, n_ctx, seed, positional, post_norm
):
    if positional != "rotary":
        raise ModelError(
            f"The tiny bridge model is a Llama (rotary positions); positional={positional!r} "
            "needs backend='hooked'."
        )
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM

    tokenizer = tiny_tokenizer()
    d_model = n_heads * d_head
    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=d_model,
        intermediate_size=d_mlp,
        num_hidden_layers=n_layers,
        num_attention_heads=n_heads,
        num_key_value_heads=n_key_value_heads or n_heads,
        head_dim=d_head,
        max_position_embeddings=n_ctx,
        initializer_range=0.8 / d_model**0.5,  # the HookedTransformer tiny model's scale
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    if post_norm:
        cfg, cls = Gemma3TextConfig(sliding_window=n_ctx, **common), Gemma3ForCausalLM
    else:
        cfg, cls = LlamaConfig(hidden_act="silu", **common), LlamaForCausalLM
    cfg._attn_implementation = "eager"
    cfg.architectures = [cls.__name__]
    with torch.random.fork_rng(devices=[]):  # seeded, and the caller's RNG is left alone
        torch.manual_seed(seed)
        hf = cls(cfg).to(torch.float32).eval()
    kind = "-postnorm" if post_norm else ""
    name = f"tiny-{n_layers}l{n_heads}h{n_key_value_heads or n_heads}kv{kind}-s{seed}-bridge"
    bridge = bridge_from_hf(hf, tokenizer, name=name, prepend_bos=True, n_ctx=n_ctx)
    return prepare_model(bridge)


def family_model(name: str, *, seed: int = 0, n_ctx: int = 256, dtype=None, fast_attention: bool = True):
    """A tiny random-weight ``HookedTransformer`` of family ``name``
    (:data:`~sitelens.models.families.FAMILIES`) with the byte tokenizer of :func:`tiny_tokenizer`,
    built in code (no files, no network), readied as every sitelens load is (eval, no gradients,
    fast layout, fused attention unless ``fast_attention=False``, left padding, the z-hook
    self-check). ``dtype``: e.g. ``torch.bfloat16`` (default float32). The biases the family
    really has (``Family.biases``) are drawn at random (seeded): TransformerLens initialises every
    bias to zero, and a path that carries zeros tests nothing."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    fam = FAMILIES.get(name)
    if fam is None:
        raise ModelError(f"Unknown family {name!r}; the families: {', '.join(FAMILIES)}.")
    if not fam.supported:
        raise ModelError(f"Family {name!r} ({fam.architecture}): {fam.unsupported}.")
    tokenizer = tiny_tokenizer()
    fields = fam.config()
    fields.setdefault("default_prepend_bos", True)
    cfg = HookedTransformerConfig(
        **fields, n_ctx=n_ctx, d_vocab=len(tokenizer), seed=seed, init_weights=True,
        tokenizer_prepends_bos=False, dtype=torch.float32, model_name=f"family-{name}-s{seed}",
    )
    model = HookedTransformer(cfg, tokenizer=None)
    model.tokenizer = tokenizer  # set_tokenizer would look the name up on a hub
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.rsplit(".", 1)[-1] in fam.biases:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
    if dtype is not None:
        model.to(dtype)
        model.cfg.dtype = dtype
    return prepare_model(model, fast_attention=fast_attention)


__all__ = ["family_model", "tiny_model", "tiny_tokenizer"]
