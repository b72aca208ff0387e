"""Making a loaded model ready for sitelens: placed (:mod:`sitelens.models.devices`), eval mode,
no gradients, the fast weight layout and fused attention on a ``HookedTransformer``, left padding,
and the z-hook self-check. Every loader (:func:`~sitelens.models.load.load_model`,
:func:`~sitelens.models.tiny.tiny_model`, :func:`~sitelens.models.bridge.prepare_bridge`) ends here.
"""

from __future__ import annotations

from sitelens.models.attention import enable_fast_attention
from sitelens.models.devices import _place
from sitelens.models.hooks import is_bridge, self_check


def _finalize(model, *, device=None, dtype=None, n_devices: int = 1, fast_attention: bool = True):
    _place(model, bridge=is_bridge(model), device=device, dtype=dtype, n_devices=n_devices)
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


def fast_layout(model) -> None:
    """Store weights in the memory layout that TransformerLens's forward pass asks for.

    TransformerLens 3.9 calls ``W.T.contiguous()`` / ``rearrange(...)`` on every weight matrix in
    every forward pass (gated MLP, unembedding, Q/K/V/O projections), which copies the whole model
    each call (for Gemma-3's 262k-token unembedding, 670 MB per call). Re-striding each parameter so
    that the transposed view is already contiguous turns those copies into no-ops; values and shapes
    are unchanged. Measured in ``benchmarks/``.
    """
    for name, p in model.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        w = p.data
        if leaf in ("W_Q", "W_K", "W_V", "_W_K", "_W_V") and w.dim() == 3:
            p.data = w.transpose(1, 2).contiguous().transpose(1, 2)  # [H, d_head, d_model] in memory
        elif leaf == "W_O" and w.dim() == 3:
            p.data = w.permute(2, 0, 1).contiguous().permute(1, 2, 0)  # [d_model, H, d_head]
        elif leaf in ("W_in", "W_gate", "W_out", "W_U") and w.dim() == 2:
            p.data = w.T.contiguous().T


__all__ = ["fast_layout"]
