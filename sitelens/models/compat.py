"""Every workaround of a TransformerLens or transformers version, in one place.

The rest of :mod:`sitelens.models` calls the functions here and never tests a version itself. Each
function is one entry of :data:`WORKAROUNDS`, which says what it works around and what lets it go:
``drop_when`` (package, version) where a known release does, checked against the project's own
floor by ``tests/test_compat.py`` (it fails once ``pyproject.toml`` requires that version, naming
the workaround to delete), else ``until``, the upstream change that would. A shim detects the
behaviour it adapts to (an attribute, a keyword of ``forward``) rather than comparing version
numbers, so a backport or a pre-release takes the right branch.

Not here, because they are features rather than shims (each measured, each with its own tests):
the fused attention forward (:mod:`sitelens.models.attention`: TransformerLens 3.9 materializes
every attention score), the fast weight layout (:func:`sitelens.models.prepare.fast_layout`:
TransformerLens 3.9 copies every weight matrix in every forward pass), and the pipeline placement
of :func:`sitelens.models.devices.place_pipeline` (TransformerLens issue #907).
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sitelens.errors import ModelError

if TYPE_CHECKING:
    from torch import Tensor


@dataclass(frozen=True)
class Workaround:
    """One entry of :data:`WORKAROUNDS`: the function here (``name``), what it works around
    (``upstream``), and what lets it go: ``drop_when`` = (distribution, version) when the
    project's floor for that distribution reaches a known release, else ``until``."""

    name: str
    upstream: str
    until: str
    drop_when: tuple[str, str] | None = None


WORKAROUNDS: tuple[Workaround, ...] = (
    Workaround(
        "layer_kv",
        "transformers 4.x's DynamicCache keeps key_cache / value_cache lists; 5.x keeps layers",
        "the transformers floor is 5 (the 4.x branch goes)", ("transformers", "5.0")),
    Workaround(
        "set_layer_kv",
        "as layer_kv, writing", "the transformers floor is 5 (the 4.x branch goes)",
        ("transformers", "5.0")),
    Workaround(
        "cache_keyword",
        "transformers 5.x's models take the KV cache as cache= (past_key_values= is deprecated, to "
        "be removed in 5.40 / 6.0); 4.x's as past_key_values=",
        "the transformers floor has cache= (5.25 does; the past_key_values branch goes)",
        ("transformers", "5.25")),
    Workaround(
        "alias_cache_keyword",
        "TransformerLens 3.9 and 4.x's attention bridges read past_key_values=, where transformers "
        "5.x's decoder layers hand the cache over as cache=: the bridge would neither read nor "
        "extend it",
        "TransformerLens's attention bridges read cache= (kv.drive_hf_cache's probe then passes "
        "without the alias)"),
    Workaround(
        "rope_theta",
        "transformers 5.x keeps rope_theta in rope_parameters (per layer type for Gemma 3); 4.x as "
        "an attribute (rope_local_base_freq for Gemma 3's sliding layers)",
        "the transformers floor is 5 (the attribute branches go)", ("transformers", "5.0")),
    Workaround(
        "rope_scaling",
        "transformers 5.x keeps the rope scaling in rope_parameters; 4.x in rope_scaling",
        "the transformers floor is 5 (the rope_scaling branch goes)", ("transformers", "5.0")),
    Workaround(
        "partial_rotary_factor",
        "transformers 5.x keeps partial_rotary_factor in rope_parameters, where TransformerLens "
        "3.9's Phi entry does not look; 4.x as an attribute",
        "the transformers floor is 5 (the attribute branch goes)", ("transformers", "5.0")),
    Workaround(
        "tl_config_from_local",
        "TransformerLens 3.9's convert_hf_model_config routes a path containing 'llama' or "
        "'gemma' by that name, reads GPT-2's n_ctx (gone in transformers 5) and returns keys "
        "HookedTransformerConfig does not take",
        "the hooked backend leaves TransformerLens 3.x (4.x has no HookedTransformer)",
        ("transformer-lens", "4")),
    Workaround(
        "contiguous_lm_head",
        "with logits_to_keep, transformers hands lm_head the strided slice hidden[:, -1:], and "
        "torch's linear on a non-contiguous 3-D input falls back to a batched matmul against the "
        "broadcast weight (Gemma-3's unembedding of 16 rows: 1.45 s instead of 0.30 s, one thread)",
        "transformers slices contiguously, or torch's linear takes a strided 3-D input at the "
        "contiguous speed"),
)


# ----------------------------------------------------------------------------------------------
# Hugging Face KV caches


def layer_kv(hf_cache) -> list[tuple[Tensor, Tensor]]:
    """Per layer ``(keys, values)`` of a ``DynamicCache``, each ``[batch, n_kv_heads, pos,
    d_head]`` (transformers 5's ``layers`` or 4.x's ``key_cache``/``value_cache`` lists)."""
    layers = getattr(hf_cache, "layers", None)
    if layers is not None:
        return [(layer.keys, layer.values) for layer in layers]
    return list(zip(hf_cache.key_cache, hf_cache.value_cache))


def set_layer_kv(hf_cache, kv: list[tuple[Tensor, Tensor]]) -> None:
    """Set every layer's keys and values of a ``DynamicCache`` (the tensors themselves, no copy)."""
    layers = getattr(hf_cache, "layers", None)
    if layers is not None:
        for layer, (k, v) in zip(layers, kv):
            layer.keys, layer.values = k, v
    else:
        hf_cache.key_cache[:] = [k for k, _ in kv]
        hf_cache.value_cache[:] = [v for _, v in kv]


def cache_keyword(forward_params) -> str:
    """The keyword under which a Hugging Face model's ``forward`` (its parameter names,
    ``forward_params``) takes the KV cache: ``cache`` where it has it, else ``past_key_values``."""
    return "cache" if "cache" in forward_params else "past_key_values"


def _cache_alias(module, args, kwargs):
    """Forward pre-hook on an attention bridge: hand it the cache under the name it reads."""
    if kwargs.get("past_key_values") is None and kwargs.get("cache") is not None:
        kwargs["past_key_values"] = kwargs["cache"]
    return args, kwargs


def alias_cache_keyword(attention_bridge) -> None:
    """Make a TransformerLens attention bridge read the cache that transformers 5 hands over as
    ``cache=`` (a forward pre-hook copying it to ``past_key_values=``; nothing else is patched).
    Once per module."""
    if not getattr(attention_bridge, "_sitelens_cache_alias", False):
        attention_bridge.register_forward_pre_hook(_cache_alias, with_kwargs=True)
        attention_bridge._sitelens_cache_alias = True


def contiguous_lm_head(hf_model) -> None:
    """Make the input of a Hugging Face model's ``lm_head`` contiguous (a forward pre-hook;
    ``.contiguous()`` is free when the input already is)."""
    head = hf_model.get_output_embeddings()
    if head is not None:
        head.register_forward_pre_hook(
            lambda _module, args: (args[0].contiguous(), *args[1:]) if args else None)


# ----------------------------------------------------------------------------------------------
# Hugging Face configs


def rope_theta(c, layer_type: str | None = None, default: float = 10000.0) -> float:
    """``rope_theta`` of a Hugging Face config (transformers 5's ``rope_parameters``, per layer
    type for Gemma 3, or 4.x's attribute), else ``default``."""
    params = getattr(c, "rope_parameters", None) or {}
    if layer_type and isinstance(params.get(layer_type), dict):
        params = params[layer_type]
    if isinstance(params, dict) and "rope_theta" in params:
        return float(params["rope_theta"])
    if layer_type == "sliding_attention" and getattr(c, "rope_local_base_freq", None):
        return float(c.rope_local_base_freq)
    return float(getattr(c, "rope_theta", None) or default)


def rope_scaling(c) -> dict:
    """The rope parameters of a Hugging Face config that name its scaling (``rope_type``; per
    layer type for Gemma 3), or ``{}``."""
    return getattr(c, "rope_parameters", None) or getattr(c, "rope_scaling", None) or {}


def partial_rotary_factor(c) -> float:
    """The fraction of each head's dimensions that rotary positions rotate (1.0 when unset)."""
    rope = getattr(c, "rope_parameters", None) or {}
    return rope.get("partial_rotary_factor", getattr(c, "partial_rotary_factor", 1.0))


_NAME_ROUTED = ("llama", "gemma")  # substrings convert_hf_model_config routes by name


def tl_config_from_local(hf_config, arch: str) -> dict:
    """TransformerLens 3.9's own ``convert_hf_model_config`` on a copy of a local config, written
    into a directory of a neutral name, with architecture ``arch``: ``HookedTransformerConfig``
    fields."""
    from transformer_lens.loading_from_pretrained import convert_hf_model_config

    with tempfile.TemporaryDirectory(prefix="sitelens-config-") as tmp:
        if any(s in tmp.lower() for s in _NAME_ROUTED):  # TMPDIR itself says llama / gemma
            raise ModelError(f"The temporary directory {tmp!r} contains one of {_NAME_ROUTED}, "
                             "which TransformerLens routes by name; set TMPDIR elsewhere.")
        data = hf_config.to_dict()
        data["architectures"] = [arch]
        if arch == "GPT2LMHeadModel":  # TransformerLens 3.9 reads n_ctx, gone in transformers 5
            data.setdefault("n_ctx", data.get("n_positions"))
        (Path(tmp) / "config.json").write_text(json.dumps(data, default=str), encoding="utf-8")
        fields = convert_hf_model_config(tmp)
    for key in ("quantization_method", "tokenizer_name", "trust_remote_code"):
        fields.pop(key, None)  # convert_hf_model_config's, not HookedTransformerConfig's
    return fields


__all__ = [
    "WORKAROUNDS", "Workaround", "alias_cache_keyword", "cache_keyword", "contiguous_lm_head",
    "layer_kv", "partial_rotary_factor", "rope_scaling", "rope_theta", "set_layer_kv",
    "tl_config_from_local",
]
