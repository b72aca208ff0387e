"""A loaded model's identity: its name, its backend and two fingerprints.

- :func:`fingerprint`: of the weights as this backend holds them (a ``HookedTransformer``'s
  folded LayerNorm, a bridge's raw Hugging Face tensors). Results are keyed on it (bench rows,
  figure and atlas cells, golden files): the two backends compute the same model to float rounding,
  not bit for bit, so a result of one is never reused for the other.
- :func:`weights_fingerprint`: of the weights themselves, the same on both backends. Adapters
  record and check it, so an adapter fitted on one backend loads on the other.
"""

from __future__ import annotations

import hashlib

import torch
from torch import Tensor

from sitelens.models.hooks import is_bridge


def model_name(model) -> str:
    return getattr(model.cfg, "model_name", None) or "unknown"


def _model_dtype(model) -> torch.dtype:
    for p in model.parameters():
        if p.is_floating_point():
            return p.dtype
    return torch.float32


def dtype_of(model) -> str:
    """The model's dtype by name (``"float32"``, ``"bfloat16"``, ...)."""
    return str(_model_dtype(model)).removeprefix("torch.")


def backend_of(model) -> str:
    """``"bridge"`` for a ``TransformerBridge``, ``"hooked"`` for a ``HookedTransformer``."""
    return "bridge" if is_bridge(model) else "hooked"


def _sample_hash(h, t: Tensor) -> None:
    """Feed up to 4096 evenly spaced values of ``t`` (flattened, float32, rounded to 5 decimals)
    to the hash ``h``: a few thousand values tell weights apart, and sampling keeps the cost of a
    fingerprint independent of the model's size."""
    t = t.detach().float().flatten()
    steps = min(4096, t.numel())
    idx = torch.arange(steps) * (t.numel() - 1) // max(1, steps - 1)
    h.update(t[idx].cpu().numpy().round(5).tobytes())


def fingerprint(model) -> str:
    """A short hash of the model's config and a sample of its weights as this backend holds them
    (and, for a model not in float32, its dtype). Bench rows, figure and atlas cells and golden
    files are keyed on it, so a bfloat16 run never reuses a float32 one, nor a bridge run a
    ``HookedTransformer`` one. Adapters check :func:`weights_fingerprint` instead."""
    h = hashlib.sha256()
    c = model.cfg
    h.update(f"{c.n_layers}|{c.n_heads}|{c.d_head}|{c.d_model}|{c.d_vocab}".encode())
    dtype = _model_dtype(model)
    if dtype != torch.float32:  # float32 leaves the dtype out: the keys of float32 results
        h.update(f"|{dtype}".encode())
    if is_bridge(model):  # HF parameter names: first, middle and last tensors
        params = list(model.original_model.named_parameters())
        tensors = [params[i][1] for i in sorted({0, len(params) // 2, len(params) - 1})]
    else:
        sd = model.state_dict()
        keys = ("embed.W_E", "blocks.0.attn.W_Q", f"blocks.{c.n_layers - 1}.attn.W_O", "unembed.W_U")
        tensors = [sd[k] for k in keys if k in sd]
    for t in tensors:
        _sample_hash(h, t)
    return h.hexdigest()[:16]


def weights_fingerprint(model) -> str:
    """A short hash of the weights themselves, the same for the same weights on either backend: the
    config's sizes (n_layers, n_heads, d_head, d_model, d_vocab), the dtype when not float32, and
    a sample of every layer's attention output weight ``W_O`` in TransformerLens's layout
    [n_heads, d_head, d_model].

    ``W_O`` is the attention weight that neither backend changes: a ``HookedTransformer`` folds
    LayerNorm into W_Q, W_K, W_V and W_U (and scales Gemma's W_E by sqrt(d_model)), a bridge keeps
    the Hugging Face tensors, and both give ``blocks[l].attn.W_O`` as the same numbers (writing
    weights are never centred). Every layer is sampled, so a fine-tune that moved any layer's
    attention output is told apart. Adapters record it (:meth:`sitelens.site.SiteAdapter.check_model`)."""
    h = hashlib.sha256(b"weights-v1|")
    c = model.cfg
    h.update(f"{c.n_layers}|{c.n_heads}|{c.d_head}|{c.d_model}|{c.d_vocab}".encode())
    dtype = _model_dtype(model)
    if dtype != torch.float32:
        h.update(f"|{dtype}".encode())
    for block in model.blocks:
        _sample_hash(h, block.attn.W_O)  # [n_heads, d_head, d_model]
    return h.hexdigest()[:16]


__all__ = ["backend_of", "dtype_of", "fingerprint", "model_name", "weights_fingerprint"]
