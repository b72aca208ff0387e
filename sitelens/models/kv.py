"""KV caches: prefix caches, cached forward passes, last-position logits, on both backends.

HookedTransformer: TransformerLens's own KV cache. TransformerBridge: the Hugging Face model's own
cache (a ``transformers`` ``DynamicCache``, keys/values ``[batch, n_kv_heads, pos, d_head]`` per
layer) in a :class:`BridgeKVCache`, which also remembers the attention mask so far (the bridge
derives left-padded position ids from it). Since transformers 5 the decoder layers hand the cache
to the attention module as ``cache=`` where TransformerLens's attention bridges (3.9 and 4.x) read
``past_key_values=``: they then neither extend the cache nor read it, and every step would attend
to its own tokens only. :func:`drive_hf_cache` installs a keyword alias on each attention bridge
(:func:`sitelens.models.compat.alias_cache_keyword`), and a once-per-model probe checks that the cache is
extended by exactly the tokens fed; where it is not (an architecture or version where the alias
does not take), a :class:`RecomputeCache` (the tokens seen so far) stands in and every
:func:`kv_forward` is a full forward pass over the cached tokens. Hooks added through
:func:`sitelens.site.injection.apply_hooks` (wrapped by :func:`~sitelens.models.hooks.wrap_hook`) see
exactly the positions they would see on a HookedTransformer (the prompt, then one position per
decode step; never the frozen prefix) on every path, so every intervention gives the same result
on both backends.
"""

from __future__ import annotations

import inspect
import warnings
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from sitelens.errors import ModelError
from sitelens.models.compat import (
    alias_cache_keyword,
    cache_keyword,
    contiguous_lm_head,
    layer_kv,
    set_layer_kv,
)
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


@dataclass
class BridgeKVCache:
    """A TransformerBridge's KV cache: the Hugging Face cache (``hf``, a ``DynamicCache``: keys and
    values ``[batch, n_kv_heads, pos, d_head]`` per layer) and the attention mask of every position
    it holds (``[batch, pos]``; padded positions are 0). ``frozen``: a prefix that
    :func:`kv_forward` reads but never extends (like a frozen TransformerLens cache): each call
    sees the prefix plus its own tokens, and the cache is left as it was."""

    hf: Any
    attention_mask: Int[Tensor, "batch pos"]
    frozen: bool = False

    def kv(self) -> list[tuple[Tensor, Tensor]]:
        """Per layer ``(keys, values)``, each ``[batch, n_kv_heads, pos, d_head]``."""
        return layer_kv(self.hf)

    def select(self, idx) -> BridgeKVCache:
        idx = torch.as_tensor(idx, dtype=torch.long, device=self.attention_mask.device)
        kv = [(k[idx.to(k.device)], v[idx.to(v.device)]) for k, v in self.kv()]
        return BridgeKVCache(_hf_cache_from(kv), self.attention_mask[idx], frozen=True)


# ----------------------------------------------------------------------------------------------
# driving the Hugging Face cache through a TransformerBridge

_DRIVEN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # bridge -> bool (probe result)


def _attention_bridges(model) -> list:
    return [m for m in model.modules() if callable(getattr(m, "_update_kv_cache", None))]


_HF_PARAMS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # bridge -> parameter names


def _hf_params(model) -> frozenset[str]:
    """The keyword parameters of the wrapped Hugging Face model's ``forward`` (once per model)."""
    params = _HF_PARAMS.get(model)
    if params is None:
        try:
            params = frozenset(inspect.signature(model.original_model.forward).parameters)
        except (TypeError, ValueError, AttributeError):
            params = frozenset()
        _HF_PARAMS[model] = params
    return params


def _cache_kwargs(model, hf_cache) -> dict:
    """The keyword arguments that hand ``hf_cache`` to the bridge's Hugging Face model
    (:func:`~sitelens.models.compat.cache_keyword`)."""
    return {cache_keyword(_hf_params(model)): hf_cache, "use_cache": True}


def _new_hf_cache():
    from transformers import DynamicCache

    return DynamicCache()  # no config: every layer keeps all positions (sliding layers by mask)


def _hf_cache_from(kv: list[tuple[Tensor, Tensor]]):
    """A ``DynamicCache`` holding these per-layer keys/values (the tensors themselves, no copy:
    each layer is initialized with zero positions, then given them)."""
    cache = _new_hf_cache()
    for layer, (k, v) in enumerate(kv):
        cache.update(k[..., :0, :], v[..., :0, :], layer)
    set_layer_kv(cache, kv)
    return cache


def hf_seq_length(hf_cache) -> int:
    """Positions held by a Hugging Face cache (every layer must agree; -1 where they do not)."""
    lengths = {int(k.shape[-2]) for k, _ in layer_kv(hf_cache)}
    return lengths.pop() if len(lengths) == 1 else (0 if not lengths else -1)


def drive_hf_cache(model) -> bool:
    """Make ``model`` (a TransformerBridge) extend and read a Hugging Face KV cache, and check
    that it does: the keyword alias of :func:`~sitelens.models.compat.alias_cache_keyword` on
    every attention bridge, then a probe (a 3-token prefill and a 1-token step on a fresh cache
    must leave every layer holding 3, then 4 positions). Cached per model; ``False`` means
    :func:`kv_forward` falls back to full passes (:class:`RecomputeCache`), with a warning."""
    ok = _DRIVEN.get(model)
    if ok is not None:
        return ok
    attn = _attention_bridges(model)
    for m in attn:
        alias_cache_keyword(m)
    ok = bool(attn) and len(attn) == model.cfg.n_layers
    if ok:
        dev = model.cfg.device
        tok = model.tokenizer
        ids = [i for i in (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) if i is not None]
        probe = torch.tensor([[(ids or [0])[0]] * 4], dtype=torch.long, device=dev)  # [1, 4]
        hf = _new_hf_cache()
        try:
            with torch.no_grad():
                model(probe[:, :3], attention_mask=torch.ones_like(probe[:, :3]),
                      **_cache_kwargs(model, hf))
                ok = hf_seq_length(hf) == 3
                if ok:
                    model(probe[:, 3:], attention_mask=torch.ones_like(probe),
                          **_cache_kwargs(model, hf))
                    ok = hf_seq_length(hf) == 4
        except (TypeError, ValueError, RuntimeError, AttributeError):
            ok = False
    if not ok:
        warnings.warn(
            f"This TransformerBridge ({getattr(model.cfg, 'model_name', '?')}) does not extend a "
            "Hugging Face KV cache; sitelens recomputes the full sequence at every cached step "
            "instead (same results, slower).",
            stacklevel=2,
        )
    _DRIVEN[model] = ok
    return ok


def _uses_hf_cache(model) -> bool:
    return is_bridge(model) and drive_hf_cache(model)


def new_kv_cache(model, batch_size: int):
    """An empty KV cache for ``batch_size`` rows (TransformerLens's; a :class:`BridgeKVCache` on a
    bridge, or a :class:`RecomputeCache` where :func:`drive_hf_cache` fails). Run the model on it
    with :func:`kv_forward`."""
    if is_bridge(model):
        dev = model.cfg.device
        empty = torch.zeros(batch_size, 0, dtype=torch.long, device=dev)
        if drive_hf_cache(model):
            return BridgeKVCache(_new_hf_cache(), empty)
        return RecomputeCache(empty, empty.clone())
    from transformer_lens import TransformerLensKeyValueCache

    return TransformerLensKeyValueCache.init_cache(model.cfg, model.cfg.device, batch_size)


def unembed_last(model, resid: Float[Tensor, "batch pos d_model"], *,
                 rows: int | None = None) -> Float[Tensor, "batch 1 d_vocab"]:
    """A HookedTransformer's logits of the last position only, from the final residual stream
    (``stop_at_layer=n_layers``): the same numbers as the full unembedding's last column (final
    norm, unembedding, logit soft-cap). ``rows``: unembed that many rows at a time (a chunk's
    ``[rows, 1, d_vocab]`` logits are the largest tensor; a row's logits may round their last
    bit differently than in one call, as a matmul over other rows does)."""
    from transformer_lens.utilities.activation_functions import apply_softcap

    resid = resid[:, -1:]  # [batch, 1, d_model]
    if model.cfg.normalization_type is not None:
        resid = model.ln_final(resid)
    cap = model.cfg.output_logits_soft_cap
    if rows is None:
        return apply_softcap(model.unembed(resid), cap)
    return torch.cat([apply_softcap(model.unembed(resid[s: s + rows]), cap)
                      for s in range(0, len(resid), rows)])  # [batch, 1, d_vocab]


def block_forward(model, layer: int, resid: Float[Tensor, "batch pos d_model"], *, cache_entry=None,
                  attention_mask: Int[Tensor, "batch kv_pos"] | None = None
                  ) -> Float[Tensor, "batch pos d_model"]:
    """Block ``layer`` of a HookedTransformer on ``resid``, its input residual stream
    (``hook_resid_pre``), on the block's device: the residual after the block. ``cache_entry``:
    that layer's KV cache entry (e.g. :func:`select_entry` of a frozen prefix cache), which the
    new positions attend to; ``attention_mask`` covers the cached and the new positions. The
    block's hooks fire as in a full pass. With the final norm and the unembedding of
    :func:`unembed_last`, a forward pass that starts at any layer (rows that share the residual
    below it run once)."""
    if is_bridge(model):
        raise ModelError("block_forward runs one HookedTransformer block; a TransformerBridge runs "
                         "whole forward passes only (kv_forward).")
    block = model.blocks[layer]
    return block(resid.to(next(block.parameters()).device), past_kv_cache_entry=cache_entry,
                 attention_mask=attention_mask)


_CONTIGUOUS_HEAD: weakref.WeakSet = weakref.WeakSet()  # bridges whose lm_head has the pre-hook


def _contiguous_head(model) -> None:
    """Make the input of the bridge's ``lm_head`` contiguous, once per model
    (:func:`~sitelens.models.compat.contiguous_lm_head`: with ``logits_to_keep`` it is a strided
    slice, which a linear layer multiplies ~5x slower)."""
    if model in _CONTIGUOUS_HEAD:
        return
    contiguous_lm_head(model.original_model)
    _CONTIGUOUS_HEAD.add(model)


def _last_only_kwargs(model) -> dict:
    """``logits_to_keep=1`` where the bridge's Hugging Face model takes it (unembed only the last
    position: Gemma-3's 262k-token vocabulary makes the full logits the largest tensor of a pass)."""
    if "logits_to_keep" not in _hf_params(model):
        return {}
    _contiguous_head(model)
    return {"logits_to_keep": 1}


def last_position_logits(model, enc: Encoded) -> Float[Tensor, "batch d_vocab"]:
    """Logits at the last prompt position of a full forward pass, unembedding only that position
    (same numbers as ``model(...)[:, -1]``, without the ``[batch, pos, d_vocab]`` tensor)."""
    if is_bridge(model):  # a bridge's stop_at_layer still unembeds: ask HF for the last column
        out = model(enc.tokens, attention_mask=enc.attention_mask,
                    **_last_only_kwargs(model))  # [batch, 1 or pos, d_vocab]
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
    if isinstance(cache, BridgeKVCache):
        return _bridge_kv_forward(model, tokens, attention_mask, cache, last_only=last_only)
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


def _bridge_kv_forward(model, tokens, attention_mask, cache: BridgeKVCache, *, last_only: bool):
    """One bridge pass over ``tokens`` reading (and, unless frozen, extending) the HF cache."""
    n_old = cache.attention_mask.shape[1]
    full_mask = torch.cat([cache.attention_mask, attention_mask.to(cache.attention_mask)],
                          dim=1)  # [batch, old + new]
    kw = _cache_kwargs(model, cache.hf)
    if last_only:
        kw.update(_last_only_kwargs(model))
    saved = cache.kv() if cache.frozen else None
    try:
        logits = model(tokens, attention_mask=full_mask, **kw)  # [batch, new or 1, d_vocab]
        held = hf_seq_length(cache.hf)
    finally:
        if saved is not None:  # a frozen prefix: drop what this call appended (no copy)
            set_layer_kv(cache.hf, saved)
    if held != full_mask.shape[1]:
        raise ModelError(
            f"The TransformerBridge's KV cache holds {held} positions after a step over "
            f"{n_old} + {tokens.shape[1]}: the attention bridges did not extend it."
        )
    if not cache.frozen:
        cache.attention_mask = full_mask
    return logits[:, -1:] if last_only else logits


def prefix_cache(model, enc: Encoded, *, batch_size: int = 64):
    """A frozen KV cache of every position but the last of a left-padded batch.

    An intervention at the last prompt token cannot change earlier positions (causal attention),
    so the prefix is computed once without gradients and only the last token is re-run per step
    (on a bridge: a frozen :class:`RecomputeCache`; each call is a full pass whose hooks see only
    the last token). Returns ``(cache, last_tokens [batch, 1])``.
    """
    if is_bridge(model) and not drive_hf_cache(model):
        cache = RecomputeCache(enc.tokens[:, :-1], enc.attention_mask[:, :-1],
                               [(0, enc.tokens.shape[1] - 1)], frozen=True)
        return cache, enc.tokens[:, -1:]
    width = enc.tokens.shape[1] - 1  # the prefix: every column but the last
    lengths = enc.attention_mask[:, :-1].sum(1)  # [batch] real prefix tokens per row
    # similar lengths share a batch (less padding), memory-bounded for long prompts
    batches = budget_batches(lengths.tolist(), batch_size, model.cfg.n_heads)
    if is_bridge(model):
        return _bridge_prefix_cache(model, enc, batches, width, lengths), enc.tokens[:, -1:]
    from transformer_lens import TransformerLensKeyValueCache, TransformerLensKeyValueCacheEntry

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


def _bridge_prefix_cache(model, enc: Encoded, batches, width: int, lengths) -> BridgeKVCache:
    """:func:`prefix_cache` on a bridge: each length batch fills a fresh HF cache (the pass ends
    at the last layer's z hook, after its K/V are cached), written right-aligned into one
    ``[batch, n_kv_heads, width, d_head]`` K and V per layer (zeros = the left padding)."""
    full: list[tuple[Tensor, Tensor]] | None = None
    with torch.no_grad():
        for idx in map(torch.tensor, batches):
            w = max(int(lengths[idx].max()), 1)  # this batch's own padded width
            hf = _new_hf_cache()
            forward_until(
                model,
                [(z_hook_name(model, model.cfg.n_layers - 1), lambda z, hook=None: None)],
                enc.tokens[idx, width - w : width],
                attention_mask=enc.attention_mask[idx, width - w : width],
                **_cache_kwargs(model, hf),
            )
            kv = layer_kv(hf)
            if len(kv) != model.cfg.n_layers or hf_seq_length(hf) != w:
                raise ModelError(
                    f"The TransformerBridge's KV cache holds {hf_seq_length(hf)} positions in "
                    f"{len(kv)} layers after a {w}-token prefix pass over {model.cfg.n_layers} "
                    "layers: the attention bridges did not extend it."
                )
            if full is None:  # [batch, n_kv_heads, width, d_head] per layer
                full = [(k.new_zeros(len(lengths), k.shape[1], width, k.shape[3]),
                         v.new_zeros(len(lengths), v.shape[1], width, v.shape[3])) for k, v in kv]
            for (fk, fv), (k, v) in zip(full, kv):  # right-aligned: columns width - w ..
                fk[idx, :, width - w :] = k
                fv[idx, :, width - w :] = v
            del hf, kv
    return BridgeKVCache(_hf_cache_from(full), enc.attention_mask[:, :-1].clone(), frozen=True)


def select_cache(cache, idx):
    """Rows ``idx`` of a KV cache, as a new frozen cache (the original is untouched)."""
    if isinstance(cache, (RecomputeCache, BridgeKVCache)):
        return cache.select(idx)
    from transformer_lens import TransformerLensKeyValueCache

    idx = torch.as_tensor(idx, dtype=torch.long)
    entries = [select_entry(e, idx) for e in cache.entries]
    return TransformerLensKeyValueCache(entries, cache.previous_attention_mask[idx], frozen=True)


def concat_caches(caches: list) -> Any:
    """Frozen prefix caches of the same model joined row-wise into one frozen cache, in order
    (rows of ``caches[0]`` first), each left-padded to the widest prefix with zero keys and values
    and 0 in the attention mask: the layout :func:`prefix_cache` gives a batch of prompts of
    different lengths, so a row attends to exactly its own positions (padding is masked out and
    positions come from the mask) and its logits equal those of its own cache up to the float
    rounding of a wider softmax. A :class:`RecomputeCache` pads its tokens with token id 0
    (masked out like the rest of the padding); every cache must be of one kind."""
    if not caches:
        raise ValueError("concat_caches needs at least one cache.")
    if all(isinstance(c, BridgeKVCache) for c in caches):
        width = max(c.attention_mask.shape[1] for c in caches)
        per = [c.kv() for c in caches]
        kv = [(torch.cat([_left_pad(p[layer][0], width, -2) for p in per]),
               torch.cat([_left_pad(p[layer][1], width, -2) for p in per]))
              for layer in range(len(per[0]))]  # [rows, n_kv_heads, width, d_head] per layer
        mask = torch.cat([_left_pad(c.attention_mask, width, -1) for c in caches])
        return BridgeKVCache(_hf_cache_from(kv), mask, frozen=True)
    if all(isinstance(c, RecomputeCache) for c in caches):
        if not all(c.frozen for c in caches):
            raise ValueError("concat_caches joins frozen prefix caches only.")
        width = max(c.tokens.shape[1] for c in caches)
        tokens = torch.cat([_left_pad(c.tokens, width, -1) for c in caches])  # [rows, width]
        mask = torch.cat([_left_pad(c.attention_mask, width, -1) for c in caches])
        return RecomputeCache(tokens, mask, [(0, width)] if width else [], frozen=True)
    if any(isinstance(c, (BridgeKVCache, RecomputeCache)) for c in caches):
        raise ValueError("concat_caches joins caches of one kind only.")
    from transformer_lens import TransformerLensKeyValueCache, TransformerLensKeyValueCacheEntry

    width = max(c.previous_attention_mask.shape[1] for c in caches)
    entries = [
        TransformerLensKeyValueCacheEntry(
            torch.cat([_left_pad(c.entries[layer].past_keys, width, 1) for c in caches]),
            torch.cat([_left_pad(c.entries[layer].past_values, width, 1) for c in caches]),
            frozen=True,
        )  # [rows, width, n_kv_heads, d_head]
        for layer in range(len(caches[0].entries))
    ]
    mask = torch.cat([_left_pad(c.previous_attention_mask, width, -1) for c in caches])
    return TransformerLensKeyValueCache(entries, mask, frozen=True)


def _left_pad(x: Tensor, width: int, dim: int) -> Tensor:
    """``x`` with zeros prepended along ``dim`` up to ``width`` (``x`` itself when already that wide)."""
    n = x.shape[dim]
    if n == width:
        return x
    shape = list(x.shape)
    shape[dim] = width - n
    return torch.cat([x.new_zeros(shape), x], dim=dim)


def select_entry(entry, idx):
    """Rows ``idx`` of one layer's HookedTransformer KV cache entry, as a new frozen entry (on the
    entry's device)."""
    from transformer_lens import TransformerLensKeyValueCacheEntry

    idx = torch.as_tensor(idx, dtype=torch.long).to(entry.past_keys.device)
    return TransformerLensKeyValueCacheEntry(entry.past_keys[idx], entry.past_values[idx], frozen=True)


SELECT_BUDGET_BYTES = 1 << 30


def cache_rows_per_batch(cache, batch_size: int, *, budget_bytes: int = SELECT_BUDGET_BYTES) -> int:
    """How many rows of ``cache`` one :func:`select_cache` call may copy: at most ``batch_size``,
    and few enough that the copy (every layer's K and V of the selected rows) fits in
    ``budget_bytes`` (at least 1). A 2,460-token prefix of SmolLM2 holds 113 MB per row, so 64
    rows of a 10-shot squad_val prompt would copy 7 GB; the budget keeps that at 1 GiB."""
    if isinstance(cache, BridgeKVCache):
        pairs = cache.kv()
    elif isinstance(cache, RecomputeCache) or not getattr(cache, "entries", None):
        return max(1, batch_size)
    else:
        pairs = [(e.past_keys, e.past_values) for e in cache.entries]
    row = sum(k[:1].numel() * k.element_size() + v[:1].numel() * v.element_size() for k, v in pairs)
    return max(1, min(batch_size, budget_bytes // max(row, 1)))


def last_token_forward(model, cache, last_tokens: Int[Tensor, "batch 1"]):
    """Logits ``[batch, 1, d_vocab]`` of the last prompt token given a frozen prefix cache."""
    return kv_forward(model, last_tokens, torch.ones_like(last_tokens), cache)


__all__ = [
    "SELECT_BUDGET_BYTES", "BridgeKVCache", "RecomputeCache", "block_forward", "cache_rows_per_batch",
    "concat_caches",
    "drive_hf_cache", "hf_seq_length", "kv_forward",
    "last_position_logits", "last_token_forward", "new_kv_cache", "prefix_cache", "select_cache",
    "select_entry", "unembed_last",
]
