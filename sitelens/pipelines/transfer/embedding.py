"""SITE's task embedding carried between models through a layer's write (α = 1): the write
(:func:`layer_write`), the per-head ``z`` that reproduces a write (:func:`solve_z`) and the
layer-by-layer transfer (:func:`transfer_embedding`). Why a layer's write and not each head:
:mod:`sitelens.pipelines.transfer`."""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from sitelens.errors import ModelError
from sitelens.models import is_bridge
from sitelens.pipelines.transfer.maps import HiddenMap


def _needs_hooked(model, what: str) -> None:
    if is_bridge(model):
        raise ModelError(f"{what} reads W_O, b_O and the post-attention norm of a HookedTransformer; "
                         "load the model with the hooked backend.")


def _post_norm(model, layer: int):
    """The norm applied to the attention output before the residual stream (Gemma 2/3:
    ``ln1_post``), or None."""
    if not model.cfg.use_normalization_before_and_after:
        return None
    return model.blocks[layer].ln1_post


def layer_write(
    model, layer: int, z: Float[Tensor, "n_heads d_head"]
) -> Float[Tensor, " d_model"]:
    """What block ``layer``'s attention adds to the residual stream when every head's ``z`` at a
    position is ``z``: ``Σ_h z_h W_O[h] + b_O``, through the post-attention norm where the model
    has one (Gemma 3's ``ln1_post``); equal to ``hook_attn_out`` there."""
    _needs_hooked(model, "layer_write")
    W_O = model.W_O[layer].detach().float().cpu()  # [n_heads, d_head, d_model]
    out = torch.einsum("hd,hdm->m", z.float().cpu(), W_O) + model.b_O[layer].detach().float().cpu()
    norm = _post_norm(model, layer)
    if norm is not None:
        with torch.no_grad():
            dev = next(norm.parameters()).device
            out = norm(out.to(dev)[None, None])[0, 0].float().cpu()  # [d_model]
    return out  # [d_model]


def solve_z(
    model, layer: int, write: Float[Tensor, " d_model"]
) -> tuple[Float[Tensor, "n_heads d_head"], float]:
    """Per-head ``z`` whose :func:`layer_write` is ``write``, by least squares through the stacked
    ``W_O [n_heads·d_head, d_model]`` (minimum norm where it is not unique), and the relative
    residual ``‖layer_write(z) − write‖ / ‖write‖``. Where the model normalizes the attention
    output (``ln1_post``, RMSNorm with gain g), only the direction of ``write / g`` can be
    reached; the pre-norm target is ``write / g`` and the residual says what the norm rescaled."""
    _needs_hooked(model, "solve_z")
    H, d = model.cfg.n_heads, model.cfg.d_head
    W = model.W_O[layer].detach().double().cpu().reshape(H * d, -1)  # [n_heads·d_head, d_model]
    target = write.double().cpu()
    norm = _post_norm(model, layer)
    if norm is not None:
        gain = next(norm.parameters()).detach().double().cpu()  # [d_model]
        target = target / torch.where(gain.abs() > 1e-12, gain, torch.ones_like(gain))
    target = target - model.b_O[layer].detach().double().cpu()
    z = torch.linalg.lstsq(W.T, target[:, None], driver="gelsd").solution[:, 0]  # [H·d]
    z = z.reshape(H, d).float()
    got = layer_write(model, layer, z)
    rel = float((got.double() - write.double().cpu()).norm() / write.double().norm().clamp_min(1e-30))
    return z, rel


def transfer_embedding(
    src_model,
    dst_model,
    embedding: Float[Tensor, "n_layers_src n_heads_src d_head_src"],
    maps: Mapping[int, tuple[int, HiddenMap]],
) -> tuple[Float[Tensor, "n_layers_dst n_heads_dst d_head_dst"], pd.DataFrame]:
    """SITE's task embedding carried across, layer by layer (module docstring: why the layer's
    write and not each head). ``maps[dst_layer] = (src_layer, map)``: destination block
    ``dst_layer`` gets the write of source block ``src_layer`` at α = 1
    (:func:`layer_write`), carried by ``map.write`` and solved into per-head ``z``
    (:func:`solve_z`). Layers missing from ``maps`` get zeros (inject them with α = 0). Returns
    the destination embedding and a table per layer: dst_layer, src_layer, write_norm,
    mapped_norm, rel_residual."""
    c = dst_model.cfg
    out = torch.zeros(c.n_layers, c.n_heads, c.d_head)  # [n_layers, n_heads, d_head]
    rows = []
    for dst_layer, (src_layer, m) in sorted(maps.items()):
        w = layer_write(src_model, src_layer, embedding[src_layer])  # [d_src]
        target = m.write(w.double()).float()  # [d_dst]
        z, rel = solve_z(dst_model, dst_layer, target)
        out[dst_layer] = z
        rows.append({"dst_layer": dst_layer, "src_layer": src_layer, "write_norm": float(w.norm()),
                     "mapped_norm": float(target.norm()), "rel_residual": rel})
    return out, pd.DataFrame(rows)
