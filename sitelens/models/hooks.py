"""Hook names and hook plumbing: one vocabulary for both backends.

- :func:`act_name` is the one place hook names are spelled (in the spirit of TransformerLens's
  ``utils.get_act_name``): ``act_name("resid_pre", 3)`` is ``"blocks.3.hook_resid_pre"``,
  ``act_name("z", 3, model)`` the per-head attention output of layer 3 on a
  ``HookedTransformer`` or a ``TransformerBridge``. A bridge accepts the ``HookedTransformer``
  names as aliases of its own hook points, so a name without ``model`` registers on both.
- :func:`z_hook_name` resolves the per-head ``z`` hook (``[batch, pos, n_heads, d_head]``, query
  heads even for GQA/MQA); :func:`check_z_shape` checks it at run time and :func:`self_check`
  verifies on load that it fires and changes the logits.
- :func:`wrap_hook` / :func:`position_wise` make a hook function see, on a bridge, exactly the
  positions it would see with a KV cache (see :mod:`sitelens.models.kv`); :func:`forward_until`
  ends a forward pass as soon as every hook it waits for has run.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from contextlib import contextmanager

import torch
from torch import Tensor

from sitelens.errors import ModelError
from sitelens.models.tokens import encode


def is_bridge(model) -> bool:
    """Whether ``model`` is a TransformerLens ``TransformerBridge`` (else a ``HookedTransformer``)."""
    for cls in type(model).__mro__:
        if cls.__name__ == "TransformerBridge" and cls.__module__.startswith("transformer_lens"):
            return True
    return False


# ----------------------------------------------------------------------------------------------
# the vocabulary

# kind -> the hook point's path inside ``blocks.{layer}`` (HookedTransformer names)
BLOCK_HOOKS: dict[str, str] = {
    "resid_pre": "hook_resid_pre",
    "resid_mid": "hook_resid_mid",
    "resid_post": "hook_resid_post",
    "attn_in": "hook_attn_in",
    "attn_out": "hook_attn_out",
    "mlp_in": "hook_mlp_in",
    "mlp_out": "hook_mlp_out",
    **{k: f"attn.hook_{k}" for k in
       ("q", "k", "v", "z", "rot_q", "rot_k", "attn_scores", "pattern", "result")},
    **{k: f"mlp.hook_{k}" for k in ("pre", "mid", "post", "pre_linear")},
    **{f"{norm}.{leaf}": f"{norm}.hook_{leaf}"
       for norm in ("ln1", "ln2", "ln1_post", "ln2_post") for leaf in ("scale", "normalized")},
}
# kind -> hook name, for hook points outside the blocks (``layer`` is None)
MODEL_HOOKS: dict[str, str] = {
    "embed": "hook_embed",
    "pos_embed": "hook_pos_embed",
    "ln_final.scale": "ln_final.hook_scale",
    "ln_final.normalized": "ln_final.hook_normalized",
}
# TransformerLens's spellings of the same kinds
KIND_ALIASES: dict[str, str] = {
    "query": "q", "key": "k", "value": "v", "attn_logits": "attn_scores",
    "mlp_pre": "pre", "mlp_mid": "mid", "mlp_post": "post",
}


def act_name(kind: str, layer: int | None = None, model=None) -> str:
    """The hook name of activation ``kind`` in block ``layer`` (``None`` for the hook points
    outside the blocks: ``embed``, ``pos_embed``, ``ln_final.scale``, ``ln_final.normalized``).

    Kinds are TransformerLens's (``resid_pre``, ``attn_out``, ``q``, ``z``, ``pattern``, ``post``,
    ...; :data:`BLOCK_HOOKS`, :data:`MODEL_HOOKS`, with the aliases of :data:`KIND_ALIASES`);
    a norm's hooks are ``"{norm}.scale"`` / ``"{norm}.normalized"`` (``ln1``, ``ln2``,
    ``ln1_post``, ``ln2_post``). Without ``model`` the ``HookedTransformer`` name is returned
    (``act_name("post", 2) == "blocks.2.mlp.hook_post"``); a ``TransformerBridge`` registers hooks
    under it too. With ``model``, on a bridge, the name a hook function sees as ``hook.name``
    (:func:`canonical_hook_name`; for ``z``, :func:`z_hook_name`), which is what code that keys
    captured values by ``hook.name`` needs. Whether the model has that hook point is not checked
    on a ``HookedTransformer`` (``name in model.hook_dict`` does)."""
    kind = KIND_ALIASES.get(kind, kind)
    if layer is None:
        if kind not in MODEL_HOOKS:
            raise ValueError(
                f"act_name({kind!r}) needs a layer, or is not a hook kind; without a layer: "
                f"{', '.join(MODEL_HOOKS)}."
            )
        name = MODEL_HOOKS[kind]
    else:
        if kind not in BLOCK_HOOKS:
            raise ValueError(
                f"Unknown hook kind {kind!r} in a block; use one of {', '.join(BLOCK_HOOKS)} (or "
                f"{', '.join(KIND_ALIASES)})."
            )
        if kind == "z" and model is not None:
            return z_hook_name(model, layer)
        name = f"blocks.{layer}.{BLOCK_HOOKS[kind]}"
    return name if model is None else canonical_hook_name(model, name)


_Z_HOOKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # bridge -> {layer: name}
# Candidate names of the per-head attention output before the output projection, on a bridge:
# TL 3.9 and 4.x alias ``attn.hook_z`` to ``attn.o.hook_in`` (the o_proj input, reshaped to heads).
_BRIDGE_Z_CANDIDATES = ("blocks.{layer}.attn.hook_z", "blocks.{layer}.attn.o.hook_in")


def z_hook_name(model, layer: int) -> str:
    """The per-head attention output hook of ``layer`` ([batch, pos, n_heads, d_head], query heads
    even for GQA/MQA models): ``blocks.{layer}.attn.hook_z`` on a ``HookedTransformer``; on a
    ``TransformerBridge``, the canonical name of the hook point behind that alias
    (``blocks.{layer}.attn.o.hook_in`` in TL 3.9/4.x), so that ``hook.name`` inside a hook
    function equals the returned name. Shapes are checked at run time (:func:`check_z_shape`)."""
    if not is_bridge(model):
        return act_name("z", layer)
    names = _Z_HOOKS.setdefault(model, {})
    if layer not in names:
        if not 0 <= layer < model.cfg.n_layers:
            raise ModelError(f"Layer {layer} out of range: the model has {model.cfg.n_layers} layers.")
        hook_dict = model.hook_dict
        for pattern in _BRIDGE_Z_CANDIDATES:
            cand = pattern.format(layer=layer)
            if cand in hook_dict:
                names[layer] = getattr(hook_dict[cand], "name", None) or cand
                break
        else:
            attn = sorted(n for n in hook_dict if n.startswith(f"blocks.{layer}.attn."))
            raise ModelError(
                f"No per-head z hook found in layer {layer} of this TransformerBridge (looked for "
                f"{', '.join(p.format(layer=layer) for p in _BRIDGE_Z_CANDIDATES)}; the attention "
                f"hooks are: {', '.join(attn) or 'none'}). sitelens needs the attention output per "
                "head before the output projection; this architecture is not supported yet."
            )
    return names[layer]


def canonical_hook_name(model, name: str) -> str:
    """The name a hook function sees as ``hook.name`` for the hook point ``name``.

    On a HookedTransformer that is ``name``. A TransformerBridge accepts the HookedTransformer
    names (``blocks.{l}.hook_resid_pre``, ``hook_attn_out``, ``attn.hook_z``, ...) as aliases of its
    own hook points (``blocks.{l}.hook_in``, ``attn.hook_out``, ``attn.o.hook_in``, ...), and a hook
    function registered under an alias sees the canonical name: code that keys captured values
    by ``hook.name`` must look them up under this name."""
    if not is_bridge(model):
        return name
    point = model.hook_dict.get(name)
    if point is None:
        raise ModelError(f"This TransformerBridge has no hook point {name!r}.")
    return getattr(point, "name", None) or name


def check_z_shape(z: Tensor, n_heads: int, d_head: int, hook_name: str | None = None) -> None:
    """Raise :class:`ModelError` unless ``z`` is ``[batch, pos, n_heads, d_head]``."""
    if z.dim() != 4 or tuple(z.shape[2:]) != (n_heads, d_head):
        raise ModelError(
            f"The z hook {hook_name or '?'} gave activations of shape {list(z.shape)}, but sitelens "
            f"needs [batch, pos, n_heads={n_heads}, d_head={d_head}]. This model/TransformerLens "
            "version exposes a different per-head layout; use backend='hooked' (TransformerLens "
            "3.9) or report the architecture."
        )


def self_check(model, layers: list[int] | None = None) -> dict:
    """Check that the z hook of every layer fires on a forward pass with activations
    ``[batch, pos, n_heads, d_head]``, and that changing it changes the model's output (first and
    last layer). Raises :class:`ModelError` naming the hook; returns ``{"hooks": [...], "shape": ...}``.

    The output compared is the residual stream after the bumped layer (what every later layer,
    the final norm and the logits are computed from): each pass ends there
    (:func:`forward_until`), so the check runs no unembedding (Gemma-3's reads 670 MB) and the
    first layer's runs one block. A hook whose return value is ignored leaves that residual
    bit-identical (the same operations on the same inputs), which is what is tested."""
    c = model.cfg
    layers = list(range(c.n_layers)) if layers is None else list(layers)
    names = [z_hook_name(model, layer) for layer in layers]
    tok = model.tokenizer
    if tok is None:
        raise ModelError("The model has no tokenizer; sitelens needs one (model.tokenizer).")
    enc = encode(model, ["Q: a\nA:"])
    seen: dict[str, tuple] = {}
    outs = {layer: act_name("resid_post", layer) for layer in dict.fromkeys([layers[0], layers[-1]])}
    base: dict[str, Tensor] = {}

    def grab(z, hook):
        seen[hook.name] = tuple(z.shape)
        check_z_shape(z, c.n_heads, c.d_head, hook.name)

    def keep(store: dict, key: str):
        def fn(x, hook=None):
            store[key] = x.clone()  # [1, pos, d_model]
        return fn

    with torch.no_grad():
        forward_until(model, [(n, grab) for n in names] + [(o, keep(base, o)) for o in outs.values()],
                      enc.tokens, attention_mask=enc.attention_mask)
        missing = [n for n in names if n not in seen]
        if missing:
            raise ModelError(
                f"The z hook(s) {', '.join(missing)} did not fire on a forward pass: interventions "
                "on them would silently do nothing. This model/TransformerLens version is not "
                "supported by sitelens."
            )
        for layer, out in outs.items():
            name, bumped = names[layers.index(layer)], {}

            def bump(z, hook):
                return z + 1.0  # [batch, pos, n_heads, d_head]

            forward_until(model, [(name, bump), (out, keep(bumped, out))], enc.tokens,
                          attention_mask=enc.attention_mask)
            if torch.equal(bumped[out], base[out]):
                raise ModelError(
                    f"Changing the z hook {name} did not change the logits (the residual stream "
                    "after its layer is unchanged): the hook's return value is ignored by this "
                    "model/TransformerLens version, so interventions would silently do nothing."
                )
    return {"hooks": names, "shape": seen[names[0]]}


# ----------------------------------------------------------------------------------------------
# hook functions on a bridge: the positions a KV-cached pass would show them
#
# sitelens.models.kv runs a bridge's "KV-cached" calls as full forward passes and records here,
# per model, which position segments a cached pass would have run separately.

_SEGMENTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> [(start, end, act)]


@contextmanager
def _segment_view(model, segments: list[tuple[int, int, bool]]):
    _SEGMENTS[model] = segments
    try:
        yield
    finally:
        _SEGMENTS.pop(model, None)


def wrap_hook(model, fn: Callable) -> Callable:
    """``fn`` as it must be registered on ``model`` (used by :func:`sitelens.site.injection.apply_hooks`).

    On a HookedTransformer it is ``fn`` itself. On a TransformerBridge, during a
    :func:`~sitelens.models.kv.kv_forward` / :func:`~sitelens.models.kv.last_token_forward` full
    pass, ``fn`` is called once per segment
    of positions (axis 1) that a KV-cached pass would have run separately (the prompt, then each
    decode step), and never on a frozen prefix; outside those passes it is called as usual.

    A function marked position-wise (:func:`position_wise`: it acts on each position on its own,
    the same way at every step) is called once on all positions instead, and the frozen prefix is
    restored afterwards. Hook functions that share state across hook points (LoRA reads the
    block input in one hook and adds to ``hook_q`` in another) must be marked so."""
    if not is_bridge(model):
        return fn
    pointwise = getattr(fn, "sitelens_position_wise", False)

    def viewed(x, hook=None):
        segs = _SEGMENTS.get(model)
        if segs is None or not isinstance(x, Tensor) or x.dim() < 2 or x.shape[1] != segs[-1][1]:
            return fn(x, hook=hook)
        if pointwise:
            out = fn(x, hook=hook)
            out = x if out is None else out
            frozen = [(s, e) for s, e, active in segs if not active]
            if frozen:
                out = out.clone()
                for s, e in frozen:
                    out[:, s:e] = x[:, s:e]
            return out
        parts = []
        for start, end, active in segs:
            part = x[:, start:end]  # [batch, end - start, ...]
            if active:
                out = fn(part, hook=hook)
                part = part if out is None else out
            parts.append(part)
        return torch.cat(parts, dim=1)  # [batch, pos, ...]

    return viewed


def position_wise(fn: Callable) -> Callable:
    """Mark a hook function as acting on each position on its own, identically at every forward
    step (e.g. LoRA, (IA)3): on a bridge it then sees all positions of a pass at once (see
    :func:`wrap_hook`). Returns ``fn``."""
    fn.sitelens_position_wise = True
    return fn


class _AllHooksFired(Exception):
    """Raised inside a forward pass by :func:`forward_until` once every hook it waits for has run."""


def forward_until(model, hooks: Sequence[tuple[str, Callable]], *args, **kwargs) -> bool:
    """``model(*args, **kwargs)`` with the ``(hook_name, fn)`` forward hooks, ended as soon as each
    of them has run once: the blocks above the last hooked one, the final norm and the unembedding
    are skipped (on a TransformerBridge too, whose ``stop_at_layer`` still unembeds). For hooks that
    only read activations. Returns whether the pass ended early. Hooks are removed on exit."""
    pending = {name for name, _ in hooks}

    def waiting(name: str, fn: Callable) -> Callable:
        def run(x, hook=None):
            out = fn(x, hook=hook)
            pending.discard(name)
            if not pending:
                raise _AllHooksFired
            return out

        return run

    try:
        with model.hooks(fwd_hooks=[(n, wrap_hook(model, waiting(n, fn))) for n, fn in hooks]):
            model(*args, **kwargs)
    except _AllHooksFired:
        return True
    return False


__all__ = [
    "BLOCK_HOOKS", "KIND_ALIASES", "MODEL_HOOKS", "act_name", "canonical_hook_name",
    "check_z_shape", "forward_until", "is_bridge", "position_wise", "self_check", "wrap_hook",
    "z_hook_name",
]
