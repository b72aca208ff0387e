"""A loaded Hugging Face causal LM of any family sitelens maps
(:mod:`sitelens.models.hf_arch`) to a ``HookedTransformer``: its ``HookedTransformerConfig`` from
the model's own config, its weights through TransformerLens's own state-dict converter
(``loading_from_pretrained.get_pretrained_state_dict``, which dispatches on the architecture).

The config: TransformerLens 3.9's ``convert_hf_model_config`` reads a local ``config.json`` for
every family whose branch is keyed by the architecture (GPT-2, GPT-Neo, GPT-J, GPT-NeoX/Pythia,
OPT, BLOOM, Mistral, Qwen2, Qwen3, Phi-3), through
:func:`~sitelens.models.compat.tl_config_from_local`. Llama keeps
:func:`~sitelens.models.gguf.llama_config_from_hf` (it honours ``head_dim``). Gemma, Gemma 2,
Gemma 3 and OLMo 2 TransformerLens maps by official model name only, and its Phi entry reads
``partial_rotary_factor`` where transformers 5 no longer keeps it: those configs are built here
with the keys of TransformerLens's own entries (e.g. ``google/gemma-2-2b``), valued from the
model's config.
"""

from __future__ import annotations

import torch

from sitelens.errors import ModelError
from sitelens.models.compat import (
    partial_rotary_factor,
    rope_scaling,
    rope_theta,
    tl_config_from_local,
)

_BY_TL = ("GPT2LMHeadModel", "GPTNeoForCausalLM", "GPTJForCausalLM", "GPTNeoXForCausalLM",
          "OPTForCausalLM", "BloomForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
          "Qwen3ForCausalLM", "Phi3ForCausalLM")


def _check_plain_rope(c, arch: str, *kinds) -> None:
    """Refuse a rope scaling sitelens does not map (it would be silently dropped)."""
    params = rope_scaling(c)
    groups = [params[k] for k in kinds if isinstance(params.get(k), dict)] or [params]
    for p in groups:
        kind = (p.get("rope_type") or p.get("type") or "default") if isinstance(p, dict) else "default"
        if kind != "default":
            raise ModelError(f"{arch} with rope scaling {kind!r}: sitelens maps only unscaled "
                             "rotary for this family; use backend='bridge'.")


def _attn_types(c) -> list[str]:
    """``["local" | "global"]`` per layer from ``layer_types`` (HF's ``sliding_attention`` /
    ``full_attention``), else Gemma 2's default (even layers sliding)."""
    types = getattr(c, "layer_types", None)
    if types:
        return ["local" if t == "sliding_attention" else "global" for t in types]
    return ["local" if i % 2 == 0 else "global" for i in range(c.num_hidden_layers)]


def _gemma_dict(c, arch: str) -> dict:
    d_head = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    out = {
        "d_model": c.hidden_size, "d_head": d_head, "n_heads": c.num_attention_heads,
        "d_mlp": c.intermediate_size, "n_layers": c.num_hidden_layers,
        "n_ctx": c.max_position_embeddings, "eps": c.rms_norm_eps, "d_vocab": c.vocab_size,
        "act_fn": getattr(c, "hidden_activation", None) or c.hidden_act,
        "initializer_range": c.initializer_range, "normalization_type": "RMS",
        "positional_embedding_type": "rotary", "rotary_dim": d_head, "use_attn_scale": True,
        "n_key_value_heads": c.num_key_value_heads, "gated_mlp": True, "final_rms": True,
    }
    if arch == "GemmaForCausalLM":
        _check_plain_rope(c, arch)
        return {**out, "rotary_base": rope_theta(c)}
    scalar = getattr(c, "query_pre_attn_scalar", None)
    out.update({
        "attn_scale": float(scalar) ** 0.5 if scalar else float(d_head) ** 0.5,
        "use_normalization_before_and_after": True, "use_local_attn": True,
        "window_size": c.sliding_window, "attn_types": _attn_types(c),
    })
    if arch == "Gemma2ForCausalLM":
        _check_plain_rope(c, arch)
        return {**out, "rotary_base": rope_theta(c),
                "attn_scores_soft_cap": float(c.attn_logit_softcapping or -1.0),
                "output_logits_soft_cap": float(c.final_logit_softcapping or -1.0)}
    _check_plain_rope(c, arch, "full_attention", "sliding_attention")
    return {**out, "use_qk_norm": True, "rotary_base": rope_theta(c, "full_attention", 1e6),
            "rotary_base_local": rope_theta(c, "sliding_attention", 1e4)}


def _olmo2_dict(c) -> dict:
    _check_plain_rope(c, "Olmo2ForCausalLM")
    d_head = c.hidden_size // c.num_attention_heads
    kv = c.num_key_value_heads
    return {
        "d_model": c.hidden_size, "d_head": d_head, "n_heads": c.num_attention_heads,
        "n_key_value_heads": kv if kv != c.num_attention_heads else None,
        "d_mlp": c.intermediate_size, "n_layers": c.num_hidden_layers,
        "n_ctx": c.max_position_embeddings, "eps": c.rms_norm_eps, "d_vocab": c.vocab_size,
        "act_fn": c.hidden_act, "initializer_range": c.initializer_range,
        "normalization_type": "RMS", "rotary_base": rope_theta(c), "rotary_dim": d_head,
        "attn_types": ["global"] * c.num_hidden_layers, "positional_embedding_type": "rotary",
        "gated_mlp": True,
    }


def _phi_dict(c) -> dict:
    """TransformerLens's PhiForCausalLM entry; transformers 5 keeps ``partial_rotary_factor`` in
    ``rope_parameters``, where TransformerLens 3.9 does not look."""
    d_head = c.hidden_size // c.num_attention_heads
    factor = partial_rotary_factor(c)
    return {
        "d_model": c.hidden_size, "d_head": d_head, "n_heads": c.num_attention_heads,
        "d_mlp": c.intermediate_size, "n_layers": c.num_hidden_layers,
        "n_ctx": c.max_position_embeddings, "eps": c.layer_norm_eps, "d_vocab": c.vocab_size,
        "act_fn": c.hidden_act, "initializer_range": c.initializer_range,
        "normalization_type": "LN", "positional_embedding_type": "rotary", "rotary_base": rope_theta(c),
        "use_attn_scale": True, "parallel_attn_mlp": True, "default_prepend_bos": False,
        "rotary_dim": round(float(factor) * d_head),
    }


def hooked_config_dict(hf_config, arch: str) -> dict:
    """``HookedTransformerConfig`` fields for the Hugging Face config of architecture ``arch``."""
    if arch in _BY_TL:
        return tl_config_from_local(hf_config, arch)
    if arch in ("GemmaForCausalLM", "Gemma2ForCausalLM", "Gemma3ForCausalLM"):
        return {**_gemma_dict(hf_config, arch), "original_architecture": arch}
    if arch == "Olmo2ForCausalLM":
        return {**_olmo2_dict(hf_config), "original_architecture": arch}
    if arch == "PhiForCausalLM":
        _check_plain_rope(hf_config, arch)
        return {**_phi_dict(hf_config), "original_architecture": arch}
    raise ModelError(f"No HookedTransformer config mapping for {arch}.")


def hooked_from_hf(hf, tokenizer, *, arch: str, n_ctx: int, name: str):
    """A ``HookedTransformer`` with the weights of the loaded Hugging Face model ``hf`` (float32)
    of architecture ``arch`` (LayerNorm folded except for post-norm families, as TransformerLens's
    ``from_pretrained`` does; writing weights not centred)."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig
    from transformer_lens.loading_from_pretrained import (
        POST_NORM_ARCHITECTURES,
        get_pretrained_state_dict,
    )

    bos = tokenizer.bos_token is not None
    if arch == "LlamaForCausalLM":
        from sitelens.models.gguf import _from_llama_hf

        return _from_llama_hf(hf, tokenizer, n_ctx=n_ctx, prepend_bos=bos)
    d = hooked_config_dict(hf.config, arch)
    d.update(
        d_vocab=hf.config.vocab_size, n_ctx=min(int(n_ctx), int(d.get("n_ctx") or n_ctx)),
        dtype=torch.float32, model_name=name, tokenizer_prepends_bos=False,
        default_prepend_bos=bool(d.get("default_prepend_bos", True)) and bos,
    )
    fold = arch not in POST_NORM_ARCHITECTURES
    if fold:
        d["normalization_type"] = {"LN": "LNPre", "RMS": "RMSPre"}.get(d["normalization_type"],
                                                                     d["normalization_type"])
    cfg = HookedTransformerConfig.from_dict(d)
    try:
        state_dict = get_pretrained_state_dict(name, cfg, hf_model=hf)
    except (KeyError, AttributeError, ValueError, RuntimeError) as e:
        raise ModelError(f"TransformerLens cannot convert the weights of {name!r} ({arch}): "
                         f"{type(e).__name__}: {e}") from e
    model = HookedTransformer(cfg, tokenizer=tokenizer, default_padding_side="left")
    try:
        model.load_and_process_state_dict(state_dict, fold_ln=fold, center_writing_weights=False,
                                          center_unembed=False, fold_value_biases=True)
    except RuntimeError as e:  # shapes the mapped config does not match
        raise ModelError(f"The weights of {name!r} ({arch}) do not fit the HookedTransformer "
                         f"config sitelens mapped from its config.json: {e}") from e
    return model


__all__ = ["hooked_config_dict", "hooked_from_hf"]
