"""Wrapping a Hugging Face causal LM in a TransformerLens ``TransformerBridge``, offline
(:func:`bridge_from_hf`), and making a bridge built elsewhere ready (:func:`prepare_bridge`).
Sitelens works on the bridge's raw Hugging Face numerics: ``enable_compatibility_mode()`` is never
called.
"""

from __future__ import annotations

from sitelens.errors import ModelError
from sitelens.models.hooks import is_bridge
from sitelens.models.prepare import prepare_model


def bridge_from_hf(hf, tokenizer, *, name: str, prepend_bos: bool, n_ctx: int | None = None):
    """Wrap a loaded Hugging Face causal LM in a ``TransformerBridge`` offline (no hub call), not
    yet readied (:func:`prepare_bridge` or :func:`~sitelens.models.prepare.prepare_model` does).

    The tokenizer is attached as is (TransformerLens's ``setup_tokenizer`` would reload it by name);
    sitelens tokenizes with :func:`encode` and never lets the tokenizer add special tokens."""
    from transformer_lens.model_bridge.sources._bridge_builder import build_bridge_from_module

    arch = (getattr(hf.config, "architectures", None) or [type(hf).__name__])[0]
    if hasattr(hf, "set_attn_implementation"):
        try:
            hf.set_attn_implementation("eager")  # the bridge's hooks need the eager path
        except (ValueError, ImportError):
            pass
    try:
        bridge = build_bridge_from_module(
            hf, arch, hf_config=hf.config, tokenizer=None, model_name=name
        )
    except (ValueError, KeyError, NotImplementedError) as e:
        raise ModelError(
            f"TransformerBridge cannot wrap {name!r} (architecture {arch}): {e}. Use "
            "backend='hooked' on TransformerLens 3.9."
        ) from e
    bridge.tokenizer = tokenizer  # first assignment: attached without a reload
    bridge.cfg.default_prepend_bos = prepend_bos
    bridge.cfg.tokenizer_prepends_bos = False
    bridge.cfg.model_name = name
    if n_ctx is not None:
        bridge.cfg.n_ctx = min(int(n_ctx), int(bridge.cfg.n_ctx or n_ctx))
    return bridge


def prepare_bridge(bridge, *, prepend_bos: bool | None = None, name: str | None = None):
    """Make a ``TransformerBridge`` you built yourself (e.g. ``TransformerBridge.boot_transformers``)
    ready for sitelens: eval mode, grads off, left padding, BOS convention, :func:`self_check`.
    It never calls ``enable_compatibility_mode()`` (sitelens works on raw HF numerics)."""
    if not is_bridge(bridge):
        raise ModelError(f"prepare_bridge expects a TransformerBridge, got {type(bridge).__name__}.")
    if prepend_bos is not None:
        bridge.cfg.default_prepend_bos = prepend_bos
    if name is not None:
        bridge.cfg.model_name = name
    return prepare_model(bridge)


__all__ = ["bridge_from_hf", "prepare_bridge"]
