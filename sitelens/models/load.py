"""Names to models: bundled offline models, TransformerLens names, local HF dirs, tiny test models.

With :mod:`sitelens.models.attention` (the fused attention fast path installed on every
``HookedTransformer``), the :mod:`sitelens.models` package is the only place that knows
TransformerLens model classes. Everything else talks to a model through
:func:`~sitelens.models.hooks.act_name` / :func:`~sitelens.models.hooks.z_hook_name`,
:func:`~sitelens.models.tokens.encode`, the KV-cache helpers of :mod:`sitelens.models.kv` and the
standard ``model(tokens, attention_mask=...)`` call.

Where each part lives: the bundled models' records in :mod:`sitelens.models.registry` (files,
conversion, BOS convention), backends and the load specification in :mod:`sitelens.models.spec`,
official names and local directories in :mod:`sitelens.models.hf`, the bridge wrapper in
:mod:`sitelens.models.bridge`, placement in :mod:`sitelens.models.devices`, the final steps in
:mod:`sitelens.models.prepare`.

Reserved names for tests and subprocesses: ``"tiny-random"`` and ``"tiny-random-gqa"`` (2 key/value
heads) load :func:`sitelens.testing.tiny_model` (seed 0) on the chosen backend, offline, in
well under a second.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from sitelens.errors import ModelError
from sitelens.models.attention import enable_fast_attention
from sitelens.models.bridge import bridge_from_hf
from sitelens.models.cache import (
    CACHE_FORMAT,
    _gguf_path,
    dequantized_dir,
    discard,
    is_cached,
    load_dequantized,
    load_processed,
    one_converter,
    processed_dir,
    save_dequantized,
    save_processed,
    stored_format,
)
from sitelens.models.devices import (
    _check_device_map,
    _dispatch,
    resolve_device,
    resolve_dtype,
    resolve_n_devices,
)
from sitelens.models.gguf import _convert_bundled, _hf_load
from sitelens.models.hf import _is_dir, _load_hf_dir, _load_official, check_model_available
from sitelens.models.prepare import prepare_model
from sitelens.models.registry import BUNDLED, DEFAULT_MODEL, DEFAULT_N_CTX, TINY_MODELS
from sitelens.models.spec import LoadSpec, resolve_backend
from sitelens.testing import tiny_model


def load_model(
    name: str = DEFAULT_MODEL,
    *,
    spec: LoadSpec | None = None,
    backend: str | None = None,
    device: str | torch.device | None = None,
    dtype: torch.dtype | str | None = None,
    n_ctx: int | None = None,
    use_cache: bool = True,
    fast_attention: bool = True,
    n_devices: int | None = None,
    device_map: str | dict | None = None,
):
    """Load a ready model (eval mode, grads off, tokenizer with left padding).

    ``name`` is a bundled model (``"smollm2-135m-instruct"``, ``"gemma-3-270m"``), a TransformerLens
    official model name (needs its weights locally or a network), a local Hugging Face directory,
    or a reserved tiny test model (``"tiny-random"``, ``"tiny-random-gqa"``:
    :func:`sitelens.testing.tiny_model`, seed 0). ``backend``: ``"hooked"``
    (``HookedTransformer``) or ``"bridge"`` (``TransformerBridge``); default
    :func:`~sitelens.models.spec.default_backend`. Processed
    weights of bundled models are cached under :func:`cache_dir` (atomic writes; on the bridge
    backend the dequantized Hugging Face model is cached). ``n_ctx``: the longest prompt +
    generation, in tokens (default ``DEFAULT_N_CTX`` = 2048, 256 for the tiny models; Llama-style
    models cap it at their ``max_position_embeddings``); a longer context costs TransformerLens an
    n_ctx × n_ctx causal mask per layer (0.5 GB at 4096 on SmolLM2). ``fast_attention``: a
    ``HookedTransformer`` gets :func:`sitelens.models.attention.enable_fast_attention` (fused
    attention, the same numbers to float rounding, ~4x faster forward passes on long prompts;
    hooks on ``hook_pattern``/``hook_attn_scores`` still see real patterns).

    Devices and precision (:mod:`sitelens.models.devices`; all checked before anything loads):
    ``dtype``: ``"float32"`` (default), ``"bfloat16"`` or ``"float16"`` (or a ``torch.dtype``): the
    weights and activations; SITE's α, its optimizer state and every mean, loss and KL stay
    float32. TransformerLens names and local directories load in that dtype directly; bundled
    models are converted in float32 and then cast. ``device``: ``"cpu"``, ``"cuda"``, ``"cuda:N"``
    or ``"mps"`` (default: where the model loads, the CPU for bundled and tiny models).
    ``n_devices``: split the model over that many CUDA GPUs from ``device`` on: a
    ``HookedTransformer`` in pipeline order (block ``i`` on TransformerLens's
    ``get_device_for_block_index(i, cfg)``, :func:`~sitelens.models.devices.place_pipeline`), a
    bridge through Hugging Face's balanced ``device_map``. ``device_map``: the bridge backend
    only, passed to Hugging Face (``"auto"``, ``"balanced"``, ``"sequential"`` or a dict of module
    name → device); not together with ``device`` or ``n_devices``.

    ``spec``: a :class:`~sitelens.models.spec.LoadSpec` holding ``device``, ``dtype``,
    ``n_devices``, ``device_map`` and ``backend`` in one value (what the CLI and the runners pass);
    a keyword argument given here (not None) takes precedence over the spec's field.
    """
    if spec is not None:
        backend = spec.backend if backend is None else backend
        device = spec.device if device is None else device
        dtype = spec.dtype if dtype is None else dtype
        n_devices = spec.n_devices if n_devices is None else n_devices
        device_map = spec.device_map if device_map is None else device_map
    backend = resolve_backend(backend)
    dtype = resolve_dtype(dtype)
    device = resolve_device(device)
    n_devices = resolve_n_devices(n_devices, device)
    _check_device_map(device_map, backend=backend, device=device, n_devices=n_devices)
    place = dict(device=device, dtype=dtype, n_devices=n_devices, device_map=device_map)
    if n_ctx is not None and (isinstance(n_ctx, bool) or not isinstance(n_ctx, int) or n_ctx < 1):
        raise ModelError(f"n_ctx must be a positive integer number of tokens, got {n_ctx!r}.")
    ctx = DEFAULT_N_CTX if n_ctx is None else n_ctx  # real models; tiny ones keep their own
    if name in TINY_MODELS:
        model = tiny_model(backend=backend, **TINY_MODELS[name], **({"n_ctx": n_ctx} if n_ctx else {}))
        model.cfg.model_name = name
        if device is None and dtype is None and n_devices == 1 and device_map is None:
            return enable_fast_attention(model, fast_attention)  # a no-op on a bridge
        if backend == "bridge" and (device_map is not None or n_devices > 1):
            _dispatch(model.original_model, device_map, device, n_devices)
    elif name in BUNDLED:
        if backend == "bridge":
            model = _load_bundled_bridge(name, n_ctx=ctx, use_cache=use_cache, **place)
        else:
            model = _load_bundled(name, n_ctx=ctx, use_cache=use_cache)
    elif _is_dir(name):
        check_model_available(name, backend)
        model = _load_hf_dir(Path(name).expanduser(), n_ctx=ctx, backend=backend, **place)
    else:
        check_model_available(name)
        model = _load_official(name, n_ctx=ctx, backend=backend, **place)
    return prepare_model(model, device=device, dtype=dtype, n_devices=n_devices,
                     fast_attention=fast_attention)


def timed_load(name: str = DEFAULT_MODEL, **kw):
    """``(model, seconds)``: convenience for benchmarks."""
    t0 = time.perf_counter()
    m = load_model(name, **kw)
    return m, time.perf_counter() - t0


# ----------------------------------------------------------------------------------------------
# bundled models


def _load_bundled(name: str, *, n_ctx: int, use_cache: bool):
    """A bundled model as a ``HookedTransformer``: converted from its GGUF file once, then loaded
    from the processed-weight cache (also right after writing it, so both paths give the same
    model); ``use_cache=False`` returns the converted model and writes nothing. A directory of
    another cache format (:func:`~sitelens.models.cache.stored_format`) is discarded and rebuilt.
    One process converts, others wanting the same directory wait for it (:func:`one_converter`)."""
    if not use_cache:
        return _convert_bundled(name, n_ctx=n_ctx)[0]
    target = processed_dir(name, n_ctx)
    if not (is_cached(target) and stored_format(target) == CACHE_FORMAT):
        with one_converter(target):
            if is_cached(target) and stored_format(target) != CACHE_FORMAT:
                discard(target)
            if not is_cached(target):
                model, tokenizer = _convert_bundled(name, n_ctx=n_ctx)
                save_processed(target, model, tokenizer)
    return load_processed(target, name)


def _dequantize_bundled(name: str):
    """``(hf, tokenizer)``: the bundled model's GGUF file dequantized by transformers."""
    hf, tokenizer = _hf_load(_gguf_path(name))
    if (architecture := BUNDLED[name].architecture) is not None:  # a GGUF-loaded config lacks it
        hf.config.architectures = [architecture]
    return hf, tokenizer


def _load_bundled_bridge(name: str, *, n_ctx: int, use_cache: bool = True, device=None,
                         dtype=None, n_devices: int = 1, device_map=None):
    """A bundled model on the bridge backend: the GGUF file dequantized by transformers, wrapped
    in a ``TransformerBridge`` (raw HF numerics, no folded LayerNorm). The dequantized Hugging
    Face model is cached under :func:`~sitelens.models.cache.cache_dir` ``/hf`` (safetensors;
    loads in seconds; one process writes it, others wanting it wait: :func:`one_converter`)."""
    record = BUNDLED[name]
    target = dequantized_dir(name)
    hf = None
    if use_cache and not is_cached(target):
        with one_converter(target):
            if not is_cached(target):
                hf, tokenizer = _dequantize_bundled(name)
                save_dequantized(target, hf, tokenizer)
    if hf is None:
        hf, tokenizer = load_dequantized(target) if use_cache else _dequantize_bundled(name)
    if dtype is not None:
        hf.to(dtype)
    if device_map is not None or n_devices > 1:
        _dispatch(hf, device_map, device, n_devices)
    return bridge_from_hf(hf, tokenizer, name=name, prepend_bos=record.prepend_bos, n_ctx=n_ctx)


__all__ = ["load_model", "timed_load"]
