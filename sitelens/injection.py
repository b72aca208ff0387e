"""The one intervention primitive: mix per-head ``z`` toward target vectors.

At layer ``l`` and the chosen prompt positions,

    z[:, pos, h] ← (1 − w[l, h]) · z[:, pos, h] + w[l, h] · t[l, h]

with ``w`` soft weights (SITE's α) or a binary mask (patching). ``w`` and ``t`` may carry a leading
batch dimension, so that each row of one forward pass patches different heads. ``w = 0`` leaves ``z``
bit-identical; ``w = 1`` gives exactly ``t``.

With ``seq_len`` set (generation pins it to the prompt's length), the hook acts only on a forward pass
that sees the whole prompt, so a hook left in place during KV-cached decoding (one position per
step) never re-injects; without it, the hook acts on every pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor

from sitelens.models import check_z_shape, wrap_hook, z_hook_name


@dataclass
class HeadMix:
    """Per-head mixing weights and targets.

    weights: ``[n_layers, n_heads]`` or ``[batch, n_layers, n_heads]``
    targets: ``[n_layers, n_heads, d_head]`` or ``[batch, n_layers, n_heads, d_head]``
    positions: prompt positions to act on (``-1`` = the last prompt token; left padding puts
    every row's last token in the last column).
    seq_len: if set, act only on forward passes with exactly this many positions (prefill).
    """

    weights: Float[Tensor, "... n_layers n_heads"]
    targets: Float[Tensor, "... n_layers n_heads d_head"]
    positions: Sequence[int] = (-1,)
    seq_len: int | None = None

    def layers(self) -> list[int]:
        """Layers with any non-zero weight (others are skipped: no hook, no cost); every layer
        while ``weights`` requires grad (training must reach all of them)."""
        w = self.weights.detach()
        per_layer = w.abs().reshape(-1, w.shape[-2], w.shape[-1]).amax(dim=(0, 2))  # [n_layers]
        if self.weights.requires_grad:
            return list(range(w.shape[-2]))
        return [int(i) for i in torch.nonzero(per_layer > 0).flatten()]

    def hook_fn(self, layer: int):
        def fn(z: Float[Tensor, "batch pos n_heads d_head"], hook=None):
            check_z_shape(z, self.targets.shape[-2], self.targets.shape[-1], getattr(hook, "name", None))
            if self.seq_len is not None and z.shape[1] != self.seq_len:
                return z  # a KV-cached decode step: leave it alone
            w = self.weights[..., layer, :].to(z.dtype)  # [(batch,) n_heads]
            t = self.targets[..., layer, :, :].to(z.dtype)  # [(batch,) n_heads, d_head]
            w = (w[None] if w.dim() == 1 else w)[:, None, :, None]  # [batch|1, 1, n_heads, 1]
            t = (t[None] if t.dim() == 2 else t)[:, None]  # [batch|1, 1, n_heads, d_head]
            pos_mask = torch.zeros(z.shape[1], dtype=torch.bool, device=z.device)  # [pos]
            pos_mask[list(self.positions)] = True
            mixed = (1 - w) * z + w * t  # [batch, pos, n_heads, d_head]
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
    """A binary ``[n_layers, n_heads]`` mask with ones at the given ``(layer, head)`` pairs."""
    m = torch.zeros(n_layers, n_heads, device=device)  # [n_layers, n_heads]
    for layer, head in heads:
        m[layer, head] = 1.0
    return m
