"""The one intervention primitive: mix per-head ``z`` toward target vectors.

At layer ``l`` and the chosen prompt positions,

    z[:, pos, h] ← (1 − w[l, h]) · z[:, pos, h] + w[l, h] · t[l, h]

with ``w`` soft weights (SITE's α) or a binary mask (patching). ``w`` and ``t`` may carry a leading
batch dimension, so that each row of one forward pass patches different heads. ``w = 0`` leaves ``z``
bit-identical; ``w = 1`` gives exactly ``t``.

With ``seq_len`` set (generation pins it to the prompt's length), the hook acts only on a forward pass
that sees the whole prompt, so a hook left in place during KV-cached decoding (one position per
step) never re-injects; without it, the hook acts on every pass.

Devices and dtypes: ``w`` and ``t`` may be one tensor or one row per layer (a list of ``[..., n_heads]``
/ ``[..., n_heads, d_head]`` tensors); :meth:`HeadMix.placed` puts each layer's row on that layer's
device (:func:`sitelens.models.layer_devices`: one device, or a pipeline over several GPUs), which
is what SITE's stage 2 trains (each α row is a parameter on its layer's device). A row elsewhere is
moved to ``z``'s device in the hook (correct, at the cost of a copy per call). The mix is computed
in float32 (:func:`sitelens.models.accumulation_dtype`) and rounded to ``z``'s dtype once, so a
bfloat16 model gets one rounding instead of three and α's gradient (a sum over ``d_head``) is a
float32 sum; for a float32 model nothing changes.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from jaxtyping import Float
from torch import Tensor

from sitelens.format import array_summary
from sitelens.heads import HeadSet
from sitelens.models import (
    accumulation_dtype,
    check_z_shape,
    layer_devices,
    place_layer_rows,
    wrap_hook,
    z_hook_name,
)


@dataclass
class HeadMix:
    """Per-head mixing weights and targets.

    weights: ``[n_layers, n_heads]`` or ``[batch, n_layers, n_heads]``, or one row per layer
    (``[(batch,) n_heads]`` each, e.g. on that layer's device: :meth:`placed`)
    targets: ``[n_layers, n_heads, d_head]`` or ``[batch, n_layers, n_heads, d_head]``, or one row
    per layer (``[(batch,) n_heads, d_head]`` each)
    positions: prompt positions to act on (``-1`` = the last prompt token; left padding puts
    every row's last token in the last column).
    seq_len: if set, act only on forward passes with exactly this many positions (prefill).
    """

    weights: Float[Tensor, "... n_layers n_heads"] | Sequence[Tensor]
    targets: Float[Tensor, "... n_layers n_heads d_head"] | Sequence[Tensor]
    positions: Sequence[int] = (-1,)
    seq_len: int | None = None
    _active: list[int] | None = field(default=None, repr=False, compare=False)

    def __repr__(self) -> str:
        return (f"HeadMix(weights={array_summary(self.weights)}, "
                f"targets={array_summary(self.targets)}, positions={tuple(self.positions)}, "
                f"seq_len={self.seq_len})")

    def weight(self, layer: int) -> Float[Tensor, "... n_heads"]:
        """Layer ``layer``'s weights ``[(batch,) n_heads]``."""
        if isinstance(self.weights, Tensor):
            return self.weights[..., layer, :]
        return self.weights[layer]

    def target(self, layer: int) -> Float[Tensor, "... n_heads d_head"]:
        """Layer ``layer``'s targets ``[(batch,) n_heads, d_head]``."""
        if isinstance(self.targets, Tensor):
            return self.targets[..., layer, :, :]
        return self.targets[layer]

    def n_layers(self) -> int:
        return self.weights.shape[-2] if isinstance(self.weights, Tensor) else len(self.weights)

    def _requires_grad(self) -> bool:
        if isinstance(self.weights, Tensor):
            return self.weights.requires_grad
        return any(w.requires_grad for w in self.weights)

    def layers(self) -> list[int]:
        """Layers with any non-zero weight (others are skipped: no hook, no cost); every layer
        while ``weights`` requires grad (training must reach all of them)."""
        if self._requires_grad():
            return list(range(self.n_layers()))
        if self._active is not None:  # worked out once by placed()
            return list(self._active)
        if isinstance(self.weights, Tensor):
            w = self.weights.detach()
            per_layer = w.abs().reshape(-1, w.shape[-2], w.shape[-1]).amax(dim=(0, 2))  # [n_layers]
            return [int(i) for i in torch.nonzero(per_layer > 0).flatten()]
        return [i for i, w in enumerate(self.weights) if bool(w.detach().abs().amax() > 0)]

    def placed(self, model) -> HeadMix:
        """The same mix with each layer's weight and target rows on that layer's device
        (:func:`sitelens.models.layer_devices`), in their own (float) dtype. Rows already there are
        not copied; a mix whose rows are all in place is returned as is."""
        devs = layer_devices(model)
        if self._rows_on(devs):
            return self
        active = None if self._requires_grad() else self.layers()  # read once, here
        return HeadMix(place_layer_rows(self.weights, model, layer_dim=-2),
                       place_layer_rows(self.targets, model, layer_dim=-3),
                       self.positions, self.seq_len, _active=active)

    def _rows_on(self, devs: list[torch.device]) -> bool:
        if isinstance(self.weights, Tensor) or isinstance(self.targets, Tensor):
            return False
        return all(w.device == d and t.device == d
                   for w, t, d in zip(self.weights, self.targets, devs))

    def hook_fn(self, layer: int):
        w_row, t_row = self.weight(layer), self.target(layer)  # [(batch,) n_heads(, d_head)]
        n_heads, d_head = t_row.shape[-2], t_row.shape[-1]

        def fn(z: Float[Tensor, "batch pos n_heads d_head"], hook=None):
            check_z_shape(z, n_heads, d_head, getattr(hook, "name", None))
            if self.seq_len is not None and z.shape[1] != self.seq_len:
                return z  # a KV-cached decode step: leave it alone
            acc = accumulation_dtype(z.dtype)  # float32 (float64 for a float64 model)
            w = w_row.to(device=z.device, dtype=acc)  # [(batch,) n_heads]; no copy when in place
            t = t_row.to(device=z.device, dtype=acc)  # [(batch,) n_heads, d_head]
            w = (w[None] if w.dim() == 1 else w)[:, None, :, None]  # [batch|1, 1, n_heads, 1]
            t = (t[None] if t.dim() == 2 else t)[:, None]  # [batch|1, 1, n_heads, d_head]
            pos_mask = torch.zeros(z.shape[1], dtype=torch.bool, device=z.device)  # [pos]
            pos_mask[list(self.positions)] = True
            mixed = ((1 - w) * z.to(acc) + w * t).to(z.dtype)  # [batch, pos, n_heads, d_head]
            return torch.where(pos_mask[None, :, None, None], mixed, z)  # [batch, pos, n_heads, d_head]

        return fn

    def hooks(self, model) -> list[tuple[str, callable]]:
        """``(hook_name, fn)`` pairs for :func:`apply_hooks`: one per layer of :meth:`layers`, on
        that layer's per-head ``z`` hook (:func:`sitelens.models.z_hook_name`)."""
        return [(z_hook_name(model, layer), self.hook_fn(layer)) for layer in self.layers()]


@contextmanager
def apply_hooks(model, hooks: list):
    """Run the model with ``(hook_name, fn)`` forward hooks, removed on exit (even on errors).

    On a TransformerBridge each ``fn`` is wrapped (:func:`sitelens.models.wrap_hook`) so that it sees
    the positions a KV-cached pass would show it."""
    with model.hooks(fwd_hooks=[(name, wrap_hook(model, fn)) for name, fn in hooks]):
        yield model


def head_mask(
    heads: Sequence[tuple[int, int]], n_layers: int, n_heads: int, device=None
) -> Float[Tensor, "n_layers n_heads"]:
    """A binary ``[n_layers, n_heads]`` mask with ones at the given ``(layer, head)`` pairs
    (:meth:`sitelens.heads.HeadSet.mask`)."""
    return HeadSet.from_pairs(heads, n_layers, n_heads).mask(device=device)
