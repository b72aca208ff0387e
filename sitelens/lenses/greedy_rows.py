"""Greedy's candidate rows, branched at the candidate's layer (HookedTransformer).

One greedy step scores ``chosen + {j}`` for every candidate head j on the valid items. Adding head j
at layer l changes nothing below layer l, so every candidate of layer l starts from the same
residual stream: :func:`branched_scores` runs the chosen set once (``n`` rows, the residual at the
input of every layer kept), then the candidates in waves of at most ``batch_size`` rows, each wave
one pass up the blocks in which a candidate's ``n`` rows join at its own layer (the rows of layer l
enter as layer l's block runs: :func:`~sitelens.models.kv.block_forward` on the same frozen prefix
cache, then :func:`~sitelens.models.kv.unembed_last`). On average half the layers run per candidate
row instead of all of them, and the products keep many rows (a wave's rows, not one layer's ``n ×
n_heads``), which the matmul kernels need to run near the machine's rate
(``benchmarks/greedy_speed.py``). The result is the same forward pass cut in two: the candidate
rows' residual below layer l is computed in a batch of ``n`` rows instead of ``n × candidates``, and
a product's rows share a batch with other candidates', which may round the last float32 bit
differently (``benchmarks/greedy_speed.py`` reports the largest probability difference against one
full patched pass per candidate; ``tests/test_frontier_speed.py`` checks picks and probabilities
against :func:`sitelens.patching.engine.run_rows`). A TransformerBridge takes the unbranched rows."""

from __future__ import annotations

import torch
from torch import Tensor

from sitelens.models import (
    SELECT_BUDGET_BYTES,
    act_name,
    block_forward,
    cache_rows_per_batch,
    last_token_forward,
    memory_budget,
    place_layer_rows,
    select_entry,
    unembed_last,
    z_hook_name,
)
from sitelens.patching.engine import ForwardPassCounter
from sitelens.site.injection import HeadMix, apply_hooks
from sitelens.site.training import LastTokenSet


def branched_scores(model, items: LastTokenSet, chosen: Tensor, candidates: list[int], embedding: Tensor,
                    *, batch_size: int = 512) -> tuple[Tensor, Tensor]:
    """Per (candidate, item), candidate-major: is the answer's first token the argmax with
    ``chosen`` ``[L, H]`` (0/1) plus the candidate at α = 1, and its probability. Returns
    ``(correct [n_cand * n] bool, prob [n_cand * n] float32)`` on the CPU."""
    L, n = model.cfg.n_layers, len(items)
    target = place_layer_rows(embedding, model)  # L × [n_heads, d_head]
    resid: dict[int, Tensor] = {}

    def keep(layer):
        def fn(x, hook=None):
            resid[layer] = x.detach()  # [n, 1, d_model]
        return fn

    base = HeadMix(weights=chosen.to(model.cfg.device), targets=target, positions=(-1,))
    keeps = [(act_name("resid_pre", i), keep(i)) for i in range(L)]
    with torch.no_grad(), apply_hooks(model, base.hooks(model) + keeps):
        last_token_forward(model, items.cache, items.last)
    rows = cache_rows_per_batch(items.cache, batch_size,
                                budget_bytes=memory_budget(model, SELECT_BUDGET_BYTES))
    per_wave = max(1, rows // n)  # candidates per wave
    correct = torch.zeros(len(candidates), n, dtype=torch.bool)
    prob = torch.zeros(len(candidates), n)
    order = sorted(range(len(candidates)), key=lambda i: candidates[i])  # by layer, then head
    for s in range(0, len(order), per_wave):
        wave = order[s: s + per_wave]
        logits, cond, item = _wave_logits(model, items, chosen, [candidates[i] for i in wave], wave,
                                          resid, target, rows)  # [b, d_vocab], [b], [b]
        ans = items.answers[item.to(items.answers.device)].to(logits.device)
        logp = torch.log_softmax(logits, -1).gather(1, ans[:, None])[:, 0]
        correct[cond, item] = (logits.argmax(-1) == ans).cpu()
        prob[cond, item] = logp.exp().float().cpu()
    return correct.flatten(), prob.flatten()


def _wave_logits(model, items: LastTokenSet, chosen: Tensor, heads: list[int], slots: list[int],
                 resid: dict[int, Tensor], target, rows: int) -> tuple[Tensor, Tensor, Tensor]:
    """Last-token logits ``[b, d_vocab]`` (float32) of one wave: candidate ``heads[i]`` (its slot
    ``slots[i]``) on every item, its rows joining at the head's layer; with each row's slot and
    item. The unembedding runs ``rows`` rows at a time."""
    L, H = model.cfg.n_layers, model.cfg.n_heads
    n, cache = len(items), items.cache
    x, cond, item, w = None, [], [], []
    for layer in range(heads[0] // H, L):
        new = [(slot, head) for slot, head in zip(slots, heads) if head // H == layer]
        if new:  # this layer's candidates join: the wave's rows, mask and weights change
            it = torch.arange(n).repeat(len(new))  # [len(new) * n]
            wl = chosen.flatten().repeat(len(it), 1)  # [len(new) * n, L * H]
            wl[torch.arange(len(it)), torch.tensor([h for _, h in new]).repeat_interleave(n)] = 1.0
            x_new = resid[layer][it.to(resid[layer].device)]  # [len(new) * n, 1, d_model]
            x = x_new if x is None else torch.cat([x.to(x_new.device), x_new])
            cond.append(torch.tensor([c for c, _ in new]).repeat_interleave(n))
            item.append(it)
            w.append(wl)
            rows_item = torch.cat(item)  # [b]
            prev = cache.previous_attention_mask[rows_item.to(cache.previous_attention_mask.device)]
            mask = torch.cat([prev, prev.new_ones(len(rows_item), 1)], 1)  # [b, prefix + 1]
            mix = HeadMix(weights=torch.cat(w).reshape(-1, L, H), targets=target, positions=(-1,))
        with torch.no_grad(), apply_hooks(model, [(z_hook_name(model, layer), mix.hook_fn(layer))]):
            x = block_forward(model, layer, x, cache_entry=select_entry(cache.entries[layer], rows_item),
                              attention_mask=mask)  # [b, 1, d_model]
    ForwardPassCounter.ran(model)  # one pass up the blocks, not a call of ``model``
    with torch.no_grad():
        logits = unembed_last(model, x, rows=rows)[:, 0].float()  # [b, d_vocab]
    return logits, torch.cat(cond), torch.cat(item)


__all__ = ["branched_scores"]
