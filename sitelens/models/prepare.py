"""Making a loaded model ready for sitelens: placed (:mod:`sitelens.models.devices`), eval mode,
no gradients, the fast weight layout and fused attention on a ``HookedTransformer``, left padding,
and the z-hook self-check (:func:`prepare_model`). Every loader
(:func:`~sitelens.models.load.load_model`, :func:`~sitelens.models.bridge.prepare_bridge`, the test
models of :mod:`sitelens.testing`) ends here.
"""

from __future__ import annotations

from sitelens.models.attention import enable_fast_attention
from sitelens.models.devices import _place, warn_slow_cpu_dtype
from sitelens.models.hooks import is_bridge, self_check


def prepare_model(model, *, device=None, dtype=None, n_devices: int = 1, fast_attention: bool = True):
    """Make a ``HookedTransformer`` or ``TransformerBridge`` built in code ready for sitelens, as
    every load does: placed (``device``, ``dtype``, ``n_devices``), eval mode, no gradients; on a
    ``HookedTransformer`` the fast weight layout and fused attention (``fast_attention``); left
    padding (the EOS token pads where there is no pad token); the z-hook self-check. Returns
    ``model``."""
    _place(model, bridge=is_bridge(model), device=device, dtype=dtype, n_devices=n_devices)
    warn_slow_cpu_dtype(model)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    if not is_bridge(model):
        fast_layout(model)
        enable_fast_attention(model, fast_attention)
    if model.tokenizer is not None:
        model.tokenizer.padding_side = "left"
        if model.tokenizer.pad_token_id is None:
            model.tokenizer.pad_token = model.tokenizer.eos_token
    self_check(model)
    return model


# leaf parameter name -> (its number of dimensions, the permutation that puts its fast layout's
# memory order first): the parameter is stored as ``w.permute(order).contiguous()`` and used as the
# inverse permutation of that, a view whose transposed form is contiguous
FAST_LAYOUT: dict[str, tuple[int, tuple[int, ...]]] = {
    **{leaf: (3, (0, 2, 1)) for leaf in ("W_Q", "W_K", "W_V", "_W_K", "_W_V")},  # [H, d_head, d_model]
    "W_O": (3, (2, 0, 1)),  # [d_model, H, d_head]
    **{leaf: (2, (1, 0)) for leaf in ("W_in", "W_gate", "W_out", "W_U")},  # W.T
}


def _fast_order(name: str, w) -> tuple[int, ...] | None:
    rule = FAST_LAYOUT.get(name.rsplit(".", 1)[-1])
    return rule[1] if rule is not None and w.dim() == rule[0] else None


def _inverse(order: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(order.index(i) for i in range(len(order)))


def fast_memory(name: str, w):
    """``w`` (parameter ``name`` of a ``HookedTransformer``) as the contiguous tensor that holds
    its :func:`fast_layout` memory (``w`` itself, contiguous, for other parameters): what the
    processed-weight cache stores, read back by :func:`from_fast_memory` without a copy."""
    order = _fast_order(name, w)
    return (w if order is None else w.permute(order)).contiguous()


def from_fast_memory(name: str, stored):
    """The parameter ``name`` in its :func:`fast_layout` strides, a view of ``stored`` (written by
    :func:`fast_memory`; its shape is the permuted one)."""
    order = _fast_order(name, stored)
    return stored if order is None else stored.permute(_inverse(order))


def fast_layout(model) -> None:
    """Store weights in the memory layout that TransformerLens's forward pass asks for.

    TransformerLens 3.9 calls ``W.T.contiguous()`` / ``rearrange(...)`` on every weight matrix in
    every forward pass (gated MLP, unembedding, Q/K/V/O projections), which copies the whole model
    each call (for Gemma-3's 262k-token unembedding, 670 MB per call). Re-striding each parameter so
    that the transposed view is already contiguous turns those copies into no-ops; values and shapes
    are unchanged (:data:`FAST_LAYOUT`). A parameter already in that layout (a model read from the
    processed-weight cache) is left as it is, without a copy. Measured in ``benchmarks/``.
    """
    for name, p in model.named_parameters():
        order = _fast_order(name, p.data)
        if order is not None:
            p.data = from_fast_memory(name, p.data.permute(order).contiguous())


__all__ = ["FAST_LAYOUT", "fast_layout", "fast_memory", "from_fast_memory", "prepare_model"]
