"""GGUF files to models: dequantize a bundled model's GGUF with transformers, convert it to a
``HookedTransformer`` (Llama weights through TransformerLens's ``convert_llama_weights``; Gemma-3
through ``HookedTransformer.from_pretrained`` with the local Hugging Face model), and the
``HookedTransformerConfig`` of a Llama-architecture Hugging Face config.

LayerNorm is folded into the following weights (``fold_ln=True``); writing weights are not centred.
"""

from __future__ import annotations

from pathlib import Path

import torch

from sitelens.models.cache import _gguf_path
from sitelens.models.compat import rope_theta
from sitelens.models.registry import BUNDLED


def _hf_load(path: Path):
    """``(hf_model, tokenizer)`` of a GGUF file, dequantized to float32 by transformers."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    hf = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    )
    if hasattr(hf.config, "quantization_config"):
        del hf.config.quantization_config
    hf.eval()
    return hf, tokenizer


def load_hf_reference(name: str):
    """The Hugging Face model and tokenizer of a bundled model (for cross-checks against TL)."""
    return _hf_load(_gguf_path(name))


def _convert_bundled(name: str, *, n_ctx: int):
    """``(HookedTransformer, tokenizer)`` of a bundled model, converted from its GGUF file as its
    record says (:data:`~sitelens.models.registry.BUNDLED`: a Llama directly, others through
    TransformerLens's conversion of their official name)."""
    record = BUNDLED[name]
    hf, tokenizer = _hf_load(_gguf_path(name))
    if record.architecture is not None:  # a GGUF-loaded config lacks it
        hf.config.architectures = [record.architecture]
    if record.tl_name is None:
        model = _from_llama_hf(hf, tokenizer, n_ctx=n_ctx, prepend_bos=record.prepend_bos)
    else:
        from transformer_lens import HookedTransformer

        model = HookedTransformer.from_pretrained(
            record.tl_name,
            hf_model=hf,
            tokenizer=tokenizer,
            n_ctx=n_ctx,
            fold_ln=True,
            center_writing_weights=False,
            center_unembed=False,
            default_prepend_bos=record.prepend_bos,
            default_padding_side="left",
        )
    del hf
    return model, tokenizer


def llama_config_from_hf(hf_config, *, n_ctx: int, prepend_bos: bool):
    """A ``HookedTransformerConfig`` for a Llama-architecture HF config (e.g. SmolLM2)."""
    from transformer_lens import HookedTransformerConfig

    c = hf_config
    d_head = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return HookedTransformerConfig(
        d_model=c.hidden_size,
        d_head=d_head,
        n_heads=c.num_attention_heads,
        d_mlp=c.intermediate_size,
        n_layers=c.num_hidden_layers,
        n_ctx=min(n_ctx, c.max_position_embeddings),
        eps=c.rms_norm_eps,
        d_vocab=c.vocab_size,
        act_fn=c.hidden_act,
        n_key_value_heads=c.num_key_value_heads,
        normalization_type="RMS",
        positional_embedding_type="rotary",
        rotary_adjacent_pairs=False,
        rotary_dim=d_head,
        rotary_base=rope_theta(c),
        final_rms=True,
        gated_mlp=True,
        original_architecture="LlamaForCausalLM",
        tokenizer_prepends_bos=False,
        default_prepend_bos=prepend_bos,
        dtype=torch.float32,
    )


def _from_llama_hf(hf, tokenizer, *, n_ctx: int, prepend_bos: bool):
    """A ``HookedTransformer`` with the weights of a Hugging Face Llama model (LayerNorm folded)."""
    from transformer_lens import HookedTransformer
    from transformer_lens.pretrained.weight_conversions import convert_llama_weights

    cfg = llama_config_from_hf(hf.config, n_ctx=n_ctx, prepend_bos=prepend_bos)
    state_dict = convert_llama_weights(hf, cfg)
    model = HookedTransformer(cfg, tokenizer=tokenizer, default_padding_side="left")
    model.load_and_process_state_dict(
        state_dict,
        fold_ln=True,
        center_writing_weights=False,
        center_unembed=False,
        fold_value_biases=True,
    )
    return model


__all__ = ["llama_config_from_hf", "load_hf_reference"]
