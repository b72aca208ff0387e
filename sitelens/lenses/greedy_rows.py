"""Greedy's candidate rows, branched at the candidate's layer (HookedTransformer).

One greedy step scores ``chosen + {j}`` for every candidate head j on the valid items. Adding head
j at layer l changes nothing below layer l, so every candidate of layer l starts from the same
residual stream: :func:`branched_scores` runs the chosen set once (``n`` rows, the residual at the
input of every layer kept), then each layer's candidates from that layer only
(``model(resid, start_at_layer=l, past_kv_cache=...)`` on the same frozen prefix cache). On average
half the layers run per candidate row instead of all of them. The result is the same forward pass
cut in two: the candidate rows' residual below layer l is computed in a batch of ``n`` rows instead
of ``n × candidates``, which may round the last float32 bit differently (``benchmarks/greedy_speed.py``
reports the largest probability difference against one full patched pass per candidate;
``tests/test_frontier_speed.py`` checks picks and probabilities against
:func:`sitelens.patching.engine.run_rows`). A TransformerBridge takes the unbranched rows."""

from __future__ import annotations

import torch
from torch import Tensor

from sitelens.models import (
    SELECT_BUDGET_BYTES,
    cache_rows_per_batch,
    last_token_forward,
    memory_budget,
    place_layer_rows,
    select_cache,
)
from sitelens.site.injection import HeadMix, apply_hooks
from sitelens.site.training import LastTokenSet


def branched_scores(model, items: LastTokenSet, chosen: Tensor, candidates: list[int], embedding: Tensor,
                    *, batch_size: int = 512) -> tuple[Tensor, Tensor]:
    """Per (candidate, item), candidate-major: is the answer's first token the argmax with
    ``chosen`` ``[L, H]`` (0/1) plus the candidate at α = 1, and its probability. Returns
    ``(correct [n_cand * n] bool, prob [n_cand * n] float32)`` on the CPU."""
    L, H = model.cfg.n_layers, model.cfg.n_heads
    n, dev = len(items), model.cfg.device
    target = place_layer_rows(embedding, model)  # L × [n_heads, d_head]
    resid: dict[int, Tensor] = {}

    def keep(layer):
        def fn(x, hook=None):
            resid[layer] = x.detach()  # [n, 1, d_model]
        return fn

    base = HeadMix(weights=chosen.to(dev), targets=target, positions=(-1,))
    keeps = [(f"blocks.{i}.hook_resid_pre", keep(i)) for i in range(L)]
    with torch.no_grad(), apply_hooks(model, base.hooks(model) + keeps):
        last_token_forward(model, items.cache, items.last)
    rows = cache_rows_per_batch(items.cache, batch_size,
                                budget_bytes=memory_budget(model, SELECT_BUDGET_BYTES))
    correct = torch.zeros(len(candidates), n, dtype=torch.bool)
    prob = torch.zeros(len(candidates), n)
    order = sorted(range(len(candidates)), key=lambda i: candidates[i])
    for layer in sorted({candidates[i] // H for i in order}):
        idx = [i for i in order if candidates[i] // H == layer]  # this layer's candidates
        cond = torch.tensor(idx).repeat_interleave(n)  # [len(idx) * n]
        item = torch.arange(n).repeat(len(idx))
        for s in range(0, len(cond), rows):
            c, it = cond[s: s + rows], item[s: s + rows]
            w = chosen.flatten().repeat(len(c), 1)  # [b, L * H]
            w[torch.arange(len(c)), torch.tensor([candidates[i] for i in c.tolist()])] = 1.0
            mix = HeadMix(weights=w.reshape(-1, L, H).to(dev), targets=target, positions=(-1,))
            sub = select_cache(items.cache, it)
            mask = torch.cat([sub.previous_attention_mask,
                              torch.ones(len(c), 1, dtype=sub.previous_attention_mask.dtype,
                                         device=sub.previous_attention_mask.device)], dim=1)
            with torch.no_grad(), apply_hooks(model, mix.hooks(model)):
                logits = model(resid[layer][it], start_at_layer=layer, past_kv_cache=sub,
                               attention_mask=mask)[:, -1].float()  # [b, d_vocab]
            ans = items.answers[it.to(items.answers.device)].to(logits.device)
            logp = torch.log_softmax(logits, -1).gather(1, ans[:, None])[:, 0]
            correct[c, it] = (logits.argmax(-1) == ans).cpu()
            prob[c, it] = logp.exp().float().cpu()
    return correct.flatten(), prob.flatten()


__all__ = ["branched_scores"]
