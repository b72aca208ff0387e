"""A fused attention fast path for ``HookedTransformer``: the same numbers, ~4x faster on long prompts.

TransformerLens 3.9 materializes every attention score: a ``[batch, n_heads, pos, pos]`` tensor per
layer that is scaled, masked with ``torch.where``, softmaxed and NaN-scrubbed before it meets V.
On a 2,460-token 10-shot squad_val prompt that is 30 x 54M floats: SmolLM2's forward pass took
49.7 s with it and 13.2 s fused (one CPU thread; ``benchmarks/results/attention_speed.md``).
sitelens never reads ``hook_attn_scores`` or ``hook_pattern``, so :func:`enable_fast_attention`
swaps each attention module's forward for one that computes

    q, k, v   = the module's own projections (``hook_q/k/v``, Q/K norms)  -> [batch, pos, heads, d_head]
    q, k      = the module's own rotary (``hook_rot_q/k``), KV-cache append as TransformerLens does
    z         = softmax(q kᵀ / attn_scale + causal/padding/window mask) v, by
                ``torch.nn.functional.scaled_dot_product_attention``      -> [batch, pos, n_heads, d_head]
    z         = hook_z(z)     (0 where a query sees no key, as TransformerLens's NaN scrub gives)
    attn_out  = z W_O + b_O   (the same ``F.linear`` call as TransformerLens)

Every hook sitelens uses (``hook_z`` above all) fires with the same shapes and, to float rounding,
the same values. A call falls back to TransformerLens's own forward whenever the fast path would
differ: a hook on ``hook_attn_scores`` or ``hook_pattern`` (so ``run_with_cache`` and pattern
plots see real patterns), or a feature it does not implement (ALiBi, relative position bias,
score soft-capping, attention sinks, log-n scaling, QKV clipping, OLMo's QK norm, ``use_attn_result``,
4-bit weights, bidirectional attention, an additive mask or position bias).

The TransformerBridge backend is untouched (it runs the Hugging Face attention).
"""

from __future__ import annotations

import types

import einops
import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor

_FLAG = "_sitelens_fast_attention"


def _attention_modules(model) -> list:
    try:
        from transformer_lens.components.abstract_attention import AbstractAttention
    except ImportError:  # a TransformerLens without HookedTransformer's components
        return []
    return [m for m in model.modules() if isinstance(m, AbstractAttention)]


def enable_fast_attention(model, enabled: bool = True):
    """Turn the fused attention fast path on (default) or off for every attention module of a
    ``HookedTransformer``; returns ``model``. A no-op on a ``TransformerBridge``. Results match
    TransformerLens's own attention to float rounding (tested); see the module docstring for when
    a call still takes the slow path."""
    for attn in _attention_modules(model):
        if enabled and not getattr(attn, _FLAG, False):
            attn.forward = types.MethodType(_fast_forward, attn)
            setattr(attn, _FLAG, True)
        elif not enabled and getattr(attn, _FLAG, False):
            del attn.forward  # back to the class's forward
            setattr(attn, _FLAG, False)
    return model


def fast_attention_enabled(model) -> bool:
    """Whether :func:`enable_fast_attention` is on for every attention module of ``model``
    (False for a model without TransformerLens attention modules, e.g. a bridge)."""
    mods = _attention_modules(model)
    return bool(mods) and all(getattr(m, _FLAG, False) for m in mods)


def _hooked(hook_point) -> bool:
    return bool(hook_point.fwd_hooks) or bool(hook_point.bwd_hooks)


def slow_path_features(attn) -> list[str]:
    """The features of ``attn``'s configuration that send every call to TransformerLens's own
    forward (hooks on scores/patterns aside), named as a user would: empty when the fused path
    computes the module exactly."""
    cfg = attn.cfg
    softcap = cfg.attn_scores_soft_cap
    positions = cfg.positional_embedding_type
    checks = (
        (positions not in ("rotary", "standard", "shortformer"),
         {"alibi": "ALiBi", "relative_positional_bias": "relative position bias"}.get(
             positions, f"{positions} positions")),
        (softcap is not None and softcap > 0, "attention score soft-capping"),
        (getattr(cfg, "use_attention_sinks", False), "attention sinks"),
        (getattr(cfg, "use_logn_attn", False), "log-n attention scaling"),
        (getattr(cfg, "clip_qkv", None) is not None, "QKV clipping"),
        # TransformerLens builds a Q norm over the full projection (before the head split) for
        # the OLMo architectures; a per-head one is ``use_qk_norm``, which the fast path runs
        (getattr(attn, "q_norm", None) is not None and not cfg.use_qk_norm,
         "full-width QK norm (OLMo)"),
        (cfg.use_attn_result, "use_attn_result"),
        (cfg.load_in_4bit, "4-bit weights"),
        ((getattr(attn, "_attention_dir_override", None) or cfg.attention_dir) != "causal",
         "bidirectional attention"),
    )
    return [name for hit, name in checks if hit]


def supports_fast_path(attn) -> bool:
    """Whether ``attn``'s configuration is one the fast path computes exactly (hooks aside):
    :func:`slow_path_features` names what stops it."""
    return not slow_path_features(attn)


def _fast_forward(
    self,
    query_input: Float[Tensor, "batch pos d_model"],
    key_input: Float[Tensor, "batch kv_pos d_model"],
    value_input: Float[Tensor, "batch kv_pos d_model"],
    past_kv_cache_entry=None,
    additive_attention_mask: Tensor | None = None,
    attention_mask: Int[Tensor, "batch offset_pos"] | None = None,
    position_bias: Tensor | None = None,
) -> Float[Tensor, "batch pos d_model"]:
    slow = type(self).forward
    if (
        additive_attention_mask is not None
        or position_bias is not None
        or _hooked(self.hook_attn_scores)
        or _hooked(self.hook_pattern)
        or not supports_fast_path(self)
    ):
        return slow(self, query_input, key_input, value_input, past_kv_cache_entry,
                    additive_attention_mask, attention_mask, position_bias)
    q, k, v = self.calculate_qkv_matrices(query_input, key_input, value_input)  # [b, pos, h, d]
    offset = 0
    if past_kv_cache_entry is not None:
        offset = past_kv_cache_entry.past_keys.size(1)
        k, v = past_kv_cache_entry.append(k, v)  # [b, kv_pos, kv_heads, d_head]
    if self.cfg.positional_embedding_type == "rotary":
        q = self.hook_rot_q(self.apply_rotary(q, offset, attention_mask))  # [b, pos, h, d]
        k = self.hook_rot_k(self.apply_rotary(k, 0, attention_mask))  # [b, kv_pos, kv_h, d]
    n_q, n_k = q.shape[1], k.shape[1]
    if n_q + offset != n_k:
        raise ValueError(f"query length {n_q} + cache offset {offset} != key length {n_k}")
    # the padding is read (a host sync, and a graph break under torch.compile) only where it
    # decides the kernel: a pass with a cached prefix always takes the masked one
    plain_causal = offset == 0 and self.attn_type != "local" and (
        attention_mask is None or bool(attention_mask.all()))
    qh = q.transpose(1, 2)  # [b, h, pos, d_head]
    kh = k.transpose(1, 2).to(qh.dtype)  # [b, kv_h, kv_pos, d_head]
    vh = v.transpose(1, 2).to(qh.dtype)  # [b, kv_h, kv_pos, d_head]
    gqa = kh.shape[1] != qh.shape[1]
    scale = 1.0 / float(self.attn_scale)
    if plain_causal:
        z = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=scale,
                                           enable_gqa=gqa)  # [b, h, pos, d_head]
    else:
        mask = self._make_causal_mask(query_ctx_length=n_q, key_ctx_length=n_k,
                                      past_kv_pos_offset=offset, device=q.device)  # [1, 1, q, k]
        if attention_mask is not None:
            mask = mask & attention_mask.bool().to(q.device)[:, None, None, :]  # [b, 1, q, k]
        seen = mask.any(-1, keepdim=True)  # [b|1, 1, q, 1]: the query sees at least one key
        mask = mask | ~seen  # a blind query (left padding) attends anywhere; zeroed below, and
        # its finite row keeps NaN out of the backward pass, as TransformerLens's where() does
        z = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scale,
                                           enable_gqa=gqa)  # [b, h, pos, d_head]
        z = torch.where(seen, z, torch.zeros((), dtype=z.dtype, device=z.device))  # blind rows -> 0
    z = self.hook_z(z.transpose(1, 2).to(v.dtype))  # [b, pos, n_heads, d_head]
    w = einops.rearrange(
        self.W_O, "head_index d_head d_model -> d_model (head_index d_head)"
    ).contiguous()  # [d_model, n_heads * d_head]
    z = z.to(w.dtype).reshape(z.shape[0], z.shape[1], -1)  # [b, pos, n_heads * d_head]
    return F.linear(z, w.to(z.device), self.b_O.to(z.device))  # [b, pos, d_model]
