"""A loaded model's identity: its name and the fingerprint of its weights, which adapters check
and results are keyed on."""

from __future__ import annotations

import hashlib

import torch

from sitelens.models.hooks import is_bridge


def model_name(model) -> str:
    return getattr(model.cfg, "model_name", None) or "unknown"


def _model_dtype(model) -> torch.dtype:
    for p in model.parameters():
        if p.is_floating_point():
            return p.dtype
    return torch.float32


def fingerprint(model) -> str:
    """A short hash of the model's config and a sample of its weights (and, for a model not in
    float32, its dtype): adapters check it, and bench rows and figure cells are keyed on it, so a
    bfloat16 run never reuses a float32 one."""
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
        t = t.detach().float().flatten()
        steps = min(4096, t.numel())
        idx = torch.arange(steps) * (t.numel() - 1) // max(1, steps - 1)
        h.update(t[idx].cpu().numpy().round(5).tobytes())
    return h.hexdigest()[:16]


__all__ = ["fingerprint", "model_name"]
