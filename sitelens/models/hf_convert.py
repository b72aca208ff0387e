"""A loaded Hugging Face causal LM of any family sitelens maps
(:mod:`sitelens.models.hf_arch`) to a ``HookedTransformer``: its ``HookedTransformerConfig`` from
the model's own config as the family's record says
(:attr:`sitelens.models.families.Family.hooked_config`: TransformerLens 3.9's own
``convert_hf_model_config`` through :func:`~sitelens.models.compat.tl_config_from_local`, the Llama
path of :mod:`sitelens.models.gguf`, or the record's own function), its weights through
TransformerLens's own state-dict converter (``loading_from_pretrained.get_pretrained_state_dict``,
which dispatches on the architecture).
"""

from __future__ import annotations

import torch

from sitelens.errors import ModelError
from sitelens.models.compat import tl_config_from_local
from sitelens.models.families import BY_ARCHITECTURE, LLAMA, TRANSFORMER_LENS


def hooked_config_dict(hf_config, arch: str) -> dict:
    """``HookedTransformerConfig`` fields for the Hugging Face config of architecture ``arch``, as
    its family's record says (:attr:`~sitelens.models.families.Family.hooked_config`)."""
    fam = BY_ARCHITECTURE.get(arch)
    how = fam.hooked_config if fam is not None else None
    if how == TRANSFORMER_LENS:
        return tl_config_from_local(hf_config, arch)
    if callable(how):
        return {**how(hf_config), "original_architecture": arch}
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
    fam = BY_ARCHITECTURE.get(arch)
    if fam is not None and fam.hooked_config == LLAMA:
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
