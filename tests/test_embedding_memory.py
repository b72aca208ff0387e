"""Stage 1 keeps only the last position of each hooked activation, never the whole pass.

``x[:, -1]`` of a float32 activation is a view of its whole ``[batch, pos, ...]`` storage; kept in
the per-batch list until the end it held every position of every batch alive: a pooled sweep's
stage 1 (:func:`sitelens.site.joint.task_embeddings` over the prompts of many tasks) grew by gigabytes
and was killed for memory. Each kept part must own a storage of its own size.
"""

from __future__ import annotations

import torch

import sitelens.site.embedding as emb
from sitelens.testing import tiny_model


def test_kept_last_positions_do_not_hold_the_batch(monkeypatch):
    model = tiny_model(n_layers=2, n_heads=2, d_head=4, seed=0)
    prompts = ["Q: a long prompt with many positions\nA:", "Q: another one, longer than it\nA:",
               "Q: x\nA:"]
    names = [emb.z_hook_name(model, layer) for layer in range(model.cfg.n_layers)]
    seen: list[torch.Tensor] = []
    real_cat = torch.cat

    def spy(parts, *a, **k):
        seen.extend(parts)
        return real_cat(parts, *a, **k)

    monkeypatch.setattr(emb.torch, "cat", spy)
    out = emb.capture_last(model, prompts, names, batch_size=2)
    H, d = model.cfg.n_heads, model.cfg.d_head
    kept = [p for p in seen if p.dim() == 3 and tuple(p.shape[1:]) == (H, d)]  # not the model's own
    assert len(kept) == 2 * len(names)  # two batches of at most 2 prompts, one part per hook each
    for part in kept:  # [batch, n_heads, d_head] in a storage of exactly that size
        assert part.untyped_storage().nbytes() == part.numel() * part.element_size(), part.shape
    assert all(out[n].shape == (len(prompts), model.cfg.n_heads, model.cfg.d_head) for n in names)
