"""KV caches: prefix caches, cached forward passes, last-position logits, on both backends.

HookedTransformer: TransformerLens's own KV cache. TransformerBridge: there is no TransformerLens
KV cache that sitelens can drive (and the HF cache the bridge forwards is not updated by TL 3.9's
attention bridge under transformers 5.x), so a :class:`RecomputeCache` (the tokens seen so far)
stands in for it and every :func:`kv_forward` is a full forward pass over the cached tokens. Hooks
added through :func:`sitelens.injection.apply_hooks` (wrapped by
:func:`~sitelens.models.hooks.wrap_hook`) see exactly the positions they would see with a KV cache
(the prompt, then one position per decode step; never the frozen prefix), so every intervention
gives the same result on both backends.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from jaxtyping import Float, Int
from torch import Tensor

from sitelens.models.hooks import _segment_view, forward_until, is_bridge, z_hook_name
from sitelens.models.tokens import Encoded, budget_batches


@dataclass
class RecomputeCache:
    """The bridge's stand-in for a KV cache: the tokens and attention mask seen so far and the
    lengths of the forward calls that added them (``segments``: ``(start, end)``). ``frozen``: a
    prefix that later calls read but never extend (like a frozen TL cache); hooks never see it."""

    tokens: Int[Tensor, "batch pos"]
    attention_mask: Int[Tensor, "batch pos"]
    segments: list[tuple[int, int]] = field(default_factory=list)
    frozen: bool = False

    def select(self, idx) -> RecomputeCache:
        idx = torch.as_tensor(idx, dtype=torch.long, device=self.tokens.device)
        return RecomputeCache(self.tokens[idx], self.attention_mask[idx], list(self.segments),
                              self.frozen)


def new_kv_cache(model, batch_size: int):
    """An empty KV cache for ``batch_size`` rows (TransformerLens's, or a :class:`RecomputeCache`
    on a bridge). Run the model on it with :func:`kv_forward`."""
    if is_bridge(model):
        dev = model.cfg.device
        empty = torch.zeros(batch_size, 0, dtype=torch.long, device=dev)
        return RecomputeCache(empty, empty.clone())
    from transformer_lens import TransformerLensKeyValueCache

    return TransformerLensKeyValueCache.init_cache(model.cfg, model.cfg.device, batch_size)


def unembed_last(model, resid: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch 1 d_vocab"]:
    """A HookedTransformer's logits of the last position only, from the final residual stream
    (``stop_at_layer=n_layers``): the same numbers as the full unembedding's last column."""
    from transformer_lens.utilities.activation_functions import apply_softcap

    resid = resid[:, -1:]  # [batch, 1, d_model]
    if model.cfg.normalization_type is not None:
        resid = model.ln_final(resid)
    return apply_softcap(model.unembed(resid), model.cfg.output_logits_soft_cap)


def last_position_logits(model, enc: Encoded) -> Float[Tensor, "batch d_vocab"]:
    """Logits at the last prompt position of a full forward pass, unembedding only that position
    (same numbers as ``model(...)[:, -1]``, without the ``[batch, pos, d_vocab]`` tensor)."""
    if is_bridge(model):  # a bridge's stop_at_layer still unembeds: take the full logits
        out = model(enc.tokens, attention_mask=enc.attention_mask)  # [batch, pos, d_vocab]
        return out[:, -1].float()
    resid = model(
        enc.tokens, attention_mask=enc.attention_mask, stop_at_layer=model.cfg.n_layers
    )  # [batch, pos, d_model]
    return unembed_last(model, resid)[:, 0].float()  # [batch, d_vocab]


def kv_forward(
    model,
    tokens: Int[Tensor, "batch new"],
    attention_mask: Int[Tensor, "batch new"],
    cache,
    *,
    last_only: bool = False,
) -> Float[Tensor, "batch new d_vocab"]:
    """Logits of ``tokens`` given (and appended to, unless frozen) ``cache``. ``attention_mask``
    covers the new tokens only (the cache remembers the earlier mask). ``last_only``: unembed
    only the last position (``[batch, 1, d_vocab]``), e.g. for a prefill, whose full logits
    would be ``batch × pos × d_vocab`` floats (gigabytes for Gemma's 262k vocabulary)."""
    if not is_bridge(model):
        if not last_only or tokens.shape[1] == 1:
            return model(tokens, attention_mask=attention_mask, past_kv_cache=cache)
        resid = model(tokens, attention_mask=attention_mask, past_kv_cache=cache,
                      stop_at_layer=model.cfg.n_layers)  # [batch, pos, d_model]
        return unembed_last(model, resid)
    n_old, n_new = cache.tokens.shape[1], tokens.shape[1]
    full_tokens = torch.cat([cache.tokens, tokens], dim=1)  # [batch, old + new]
    full_mask = torch.cat([cache.attention_mask, attention_mask.to(cache.attention_mask)], dim=1)
    if cache.frozen:
        segs = ([(0, n_old, False)] if n_old else []) + [(n_old, n_old + n_new, True)]
    else:
        segs = [(s, e, True) for s, e in cache.segments] + [(n_old, n_old + n_new, True)]
    with _segment_view(model, segs):
        logits = model(full_tokens, attention_mask=full_mask)  # [batch, old + new, d_vocab]
    if not cache.frozen:
        cache.tokens, cache.attention_mask = full_tokens, full_mask
        cache.segments = [(s, e) for s, e, _ in segs]
    return logits[:, -1:] if last_only else logits[:, n_old:]


def prefix_cache(model, enc: Encoded, *, batch_size: int = 64):
    """A frozen KV cache of every position but the last of a left-padded batch.

    An intervention at the last prompt token cannot change earlier positions (causal attention),
    so the prefix is computed once without gradients and only the last token is re-run per step
    (on a bridge: a frozen :class:`RecomputeCache`; each call is a full pass whose hooks see only
    the last token). Returns ``(cache, last_tokens [batch, 1])``.
    """
    if is_bridge(model):
        cache = RecomputeCache(enc.tokens[:, :-1], enc.attention_mask[:, :-1],
                               [(0, enc.tokens.shape[1] - 1)], frozen=True)
        return cache, enc.tokens[:, -1:]
    from transformer_lens import TransformerLensKeyValueCache, TransformerLensKeyValueCacheEntry

    width = enc.tokens.shape[1] - 1  # the prefix: every column but the last
    lengths = enc.attention_mask[:, :-1].sum(1)  # [batch] real prefix tokens per row
    # similar lengths share a batch (less padding), memory-bounded for long prompts
    batches = budget_batches(lengths.tolist(), batch_size, model.cfg.n_heads)
    entries = None  # allocated from the first batch's dtype; each batch writes its rows in place
    with torch.no_grad():
        for idx in map(torch.tensor, batches):
            w = max(int(lengths[idx].max()), 1)  # this batch's own padded width
            cache = new_kv_cache(model, len(idx))
            forward_until(  # the last layer appends its K/V before hook_z: stop there
                model,
                [(z_hook_name(model, model.cfg.n_layers - 1), lambda z, hook=None: None)],
                enc.tokens[idx, width - w : width],
                attention_mask=enc.attention_mask[idx, width - w : width],
                past_kv_cache=cache,
            )
            if entries is None:  # zeros = the left padding: [batch, width, n_kv_heads, d_head]
                shape = (len(lengths), width, *cache.entries[0].past_keys.shape[2:])
                entries = [
                    TransformerLensKeyValueCacheEntry(
                        e.past_keys.new_zeros(shape), e.past_values.new_zeros(shape), frozen=True
                    )
                    for e in cache.entries
                ]
            for full, e in zip(entries, cache.entries):  # right-aligned: columns width - w ..
                full.past_keys[idx, width - w :] = e.past_keys
                full.past_values[idx, width - w :] = e.past_values
            del cache
    return TransformerLensKeyValueCache(entries, enc.attention_mask[:, :-1].clone(), frozen=True), \
        enc.tokens[:, -1:]


def select_cache(cache, idx):
    """Rows ``idx`` of a KV cache, as a new frozen cache (the original is untouched)."""
    if isinstance(cache, RecomputeCache):
        return cache.select(idx)
    from transformer_lens import TransformerLensKeyValueCache, TransformerLensKeyValueCacheEntry

    idx = torch.as_tensor(idx, dtype=torch.long)
    entries = [
        TransformerLensKeyValueCacheEntry(e.past_keys[idx], e.past_values[idx], frozen=True)
        for e in cache.entries
    ]
    return TransformerLensKeyValueCache(entries, cache.previous_attention_mask[idx], frozen=True)


SELECT_BUDGET_BYTES = 1 << 30


def cache_rows_per_batch(cache, batch_size: int, *, budget_bytes: int = SELECT_BUDGET_BYTES) -> int:
    """How many rows of ``cache`` one :func:`select_cache` call may copy: at most ``batch_size``,
    and few enough that the copy (every layer's K and V of the selected rows) fits in
    ``budget_bytes`` (at least 1). A 2,460-token prefix of SmolLM2 holds 113 MB per row, so 64
    rows of a 10-shot squad_val prompt would copy 7 GB; the budget keeps that at 1 GiB."""
    if isinstance(cache, RecomputeCache) or not getattr(cache, "entries", None):
        return max(1, batch_size)
    row = sum(
        e.past_keys[:1].numel() * e.past_keys.element_size()
        + e.past_values[:1].numel() * e.past_values.element_size()
        for e in cache.entries
    )
    return max(1, min(batch_size, budget_bytes // max(row, 1)))


def last_token_forward(model, cache, last_tokens: Int[Tensor, "batch 1"]):
    """Logits ``[batch, 1, d_vocab]`` of the last prompt token given a frozen prefix cache."""
    return kv_forward(model, last_tokens, torch.ones_like(last_tokens), cache)


__all__ = [
    "SELECT_BUDGET_BYTES", "RecomputeCache", "cache_rows_per_batch", "kv_forward",
    "last_position_logits", "last_token_forward", "new_kv_cache", "prefix_cache", "select_cache",
    "unembed_last",
]
