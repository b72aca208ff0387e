"""Models: loading, tokens, hook names, KV caches — the only package that knows TransformerLens
model classes (with :mod:`sitelens.models.attention`, the fused attention forward).

- :mod:`sitelens.models.registry`: one :class:`BundledModel` record per bundled model (files,
  conversion, BOS convention, shot counts, defaults): :data:`BUNDLED`, :data:`DEFAULT_MODEL`.
- :mod:`sitelens.models.spec`: backends and :class:`LoadSpec`, the frozen load specification
  (device, dtype, devices, device map, backend) that runs pass down to ``load_model``.
- :mod:`sitelens.models.load`: names → ready models (``load_model``: bundled, TransformerLens
  names, local Hugging Face directories, the tiny test models of :mod:`sitelens.testing`).
- :mod:`sitelens.models.hf`: TransformerLens names from the local Hugging Face cache, local
  directories; :mod:`sitelens.models.available`: ``check_model_available``, ``hf_cached`` (no
  torch: the command line checks ``--model`` with it before anything loads).
- :mod:`sitelens.models.bridge`: wrapping Hugging Face models in a ``TransformerBridge``
  (``bridge_from_hf``), ``prepare_bridge``.
- :mod:`sitelens.models.prepare`: the last steps of every load (``prepare_model``: eval mode,
  ``fast_layout``, fused attention, left padding, self-check).
- :mod:`sitelens.models.identity`: ``model_name``, ``backend_of``, ``fingerprint`` (results' key),
  ``weights_fingerprint`` (adapters' check, the same on both backends).
- :mod:`sitelens.models.families`: architecture families as data (``FAMILIES``); imported from
  the submodule. Tiny test models of them, and of any size: :mod:`sitelens.testing`.
- :mod:`sitelens.models.tokens`: ``encode`` (BOS, left padding), memory-bounded batches.
- :mod:`sitelens.models.hooks`: the hook-name vocabulary (``act_name``, ``z_hook_name``), the z-hook
  self-check, hook functions on a bridge (``wrap_hook``), ``forward_until``.
- :mod:`sitelens.models.kv`: KV caches (``prefix_cache``, ``kv_forward``), last-position logits
  (``unembed_last``), one block on a residual stream (``block_forward``).
- :mod:`sitelens.models.devices`: dtypes and devices (``resolve_dtype``, ``resolve_device``), where
  each layer lives (``layer_devices``, ``input_device``, ``output_device``), per-layer placement
  (``place_layer_rows``), splitting a ``HookedTransformer`` over GPUs (``place_pipeline``),
  placing a loaded model and memory-sized batches (``memory_budget``).
- :mod:`sitelens.models.cache`: the cache directory and the processed-weight cache.
- :mod:`sitelens.models.gguf`: GGUF files → Hugging Face models → ``HookedTransformer``.

Every public name is re-exported here (``from sitelens.models import load_model, encode, ...``);
private helpers are imported from the submodule that defines them. To monkeypatch a function for
the code that calls it, patch it in that submodule (``sitelens.models.kv.unembed_last``): the name
here is looked up there at every access (:mod:`sitelens.lazy`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sitelens.lazy import lazy_names

if TYPE_CHECKING:  # for type checkers; at run time each name is imported on first access
    from sitelens.models.available import ALLOW_DOWNLOAD_ENV, check_model_available, hf_cached
    from sitelens.models.bridge import bridge_from_hf, prepare_bridge
    from sitelens.models.cache import CACHE_FORMAT, cache_dir
    from sitelens.models.devices import (
        DTYPES,
        SlowDtypeWarning,
        accumulation_dtype,
        cpu_native_matmul,
        dtype_name,
        input_device,
        is_multi_device,
        layer_devices,
        memory_budget,
        model_devices,
        output_device,
        pipeline_plan,
        place_layer_rows,
        place_pipeline,
        resolve_device,
        resolve_dtype,
        resolve_n_devices,
        stacked_weight,
    )
    from sitelens.models.gguf import llama_config_from_hf, load_hf_reference
    from sitelens.models.hooks import (
        act_name,
        canonical_hook_name,
        check_z_shape,
        forward_until,
        is_bridge,
        position_wise,
        self_check,
        wrap_hook,
        z_hook_name,
    )
    from sitelens.models.identity import backend_of, fingerprint, model_name, weights_fingerprint
    from sitelens.models.kv import (
        SELECT_BUDGET_BYTES,
        BridgeKVCache,
        RecomputeCache,
        block_forward,
        cache_rows_per_batch,
        concat_caches,
        drive_hf_cache,
        kv_forward,
        last_position_logits,
        last_token_forward,
        new_kv_cache,
        prefix_cache,
        select_cache,
        select_entry,
        unembed_last,
    )
    from sitelens.models.load import load_model, timed_load
    from sitelens.models.prepare import fast_layout, prepare_model
    from sitelens.models.registry import (
        ATLAS_MODELS,
        BUNDLED,
        BUNDLED_MODELS,
        DEFAULT_MODEL,
        DEFAULT_N_CTX,
        FIGURE_MODELS,
        TINY_MODELS,
        BundledModel,
        available_models,
    )
    from sitelens.models.spec import (
        BACKEND_ENV,
        BACKENDS,
        LoadSpec,
        default_backend,
        has_hooked_transformer,
        resolve_backend,
    )
    from sitelens.models.tokens import (
        ATTENTION_BUDGET_BYTES,
        Encoded,
        budget_batches,
        encode,
        length_batches,
        prepends_bos,
        token_ids,
    )

# name -> the module that defines it (PEP 562: imported when first used)
__getattr__, __dir__ = lazy_names(__name__, {
    "sitelens.models.available": ("ALLOW_DOWNLOAD_ENV", "check_model_available", "hf_cached"),
    "sitelens.models.bridge": ("bridge_from_hf", "prepare_bridge"),
    "sitelens.models.cache": ("CACHE_FORMAT", "cache_dir"),
    "sitelens.models.devices": ("DTYPES", "accumulation_dtype", "dtype_name", "input_device",
        "is_multi_device", "layer_devices", "memory_budget", "model_devices", "output_device",
        "pipeline_plan", "place_layer_rows", "place_pipeline", "resolve_device", "resolve_dtype",
        "resolve_n_devices", "stacked_weight", "SlowDtypeWarning", "cpu_native_matmul"),
    "sitelens.models.gguf": ("llama_config_from_hf", "load_hf_reference"),
    "sitelens.models.hooks": ("act_name", "canonical_hook_name", "check_z_shape", "forward_until",
        "is_bridge", "position_wise", "self_check", "wrap_hook", "z_hook_name"),
    "sitelens.models.identity": ("backend_of", "fingerprint", "model_name", "weights_fingerprint"),
    "sitelens.models.kv": ("SELECT_BUDGET_BYTES", "BridgeKVCache", "RecomputeCache", "block_forward",
        "cache_rows_per_batch", "concat_caches", "drive_hf_cache", "kv_forward", "last_position_logits",
        "last_token_forward", "new_kv_cache", "prefix_cache", "select_cache", "select_entry",
        "unembed_last"),
    "sitelens.models.load": ("load_model", "timed_load"),
    "sitelens.models.prepare": ("fast_layout", "prepare_model"),
    "sitelens.models.registry": ("ATLAS_MODELS", "BUNDLED", "BUNDLED_MODELS", "DEFAULT_MODEL",
        "DEFAULT_N_CTX", "FIGURE_MODELS", "TINY_MODELS", "BundledModel", "available_models"),
    "sitelens.models.spec": ("BACKEND_ENV", "BACKENDS", "LoadSpec", "default_backend",
        "has_hooked_transformer", "resolve_backend"),
    "sitelens.models.tokens": ("ATTENTION_BUDGET_BYTES", "Encoded", "budget_batches", "encode",
        "length_batches", "prepends_bos", "token_ids"),
})

__all__ = [
    # registry, spec
    "ATLAS_MODELS", "BUNDLED", "BUNDLED_MODELS", "BundledModel", "DEFAULT_MODEL", "DEFAULT_N_CTX",
    "FIGURE_MODELS", "TINY_MODELS", "available_models",
    "BACKEND_ENV", "BACKENDS", "LoadSpec", "default_backend", "has_hooked_transformer",
    "resolve_backend",
    # load, hf, bridge, prepare, identity
    "ALLOW_DOWNLOAD_ENV", "bridge_from_hf", "check_model_available", "fast_layout", "fingerprint",
    "hf_cached", "load_model", "model_name", "prepare_bridge", "prepare_model", "timed_load",
    "backend_of", "weights_fingerprint",
    # tokens
    "ATTENTION_BUDGET_BYTES", "Encoded", "budget_batches", "encode", "length_batches",
    "prepends_bos", "token_ids",
    # hooks
    "act_name", "canonical_hook_name", "check_z_shape", "forward_until", "is_bridge",
    "position_wise", "self_check", "wrap_hook", "z_hook_name",
    # kv
    "SELECT_BUDGET_BYTES", "BridgeKVCache", "RecomputeCache", "block_forward", "cache_rows_per_batch",
    "concat_caches", "drive_hf_cache", "kv_forward",
    "last_position_logits", "last_token_forward", "new_kv_cache", "prefix_cache", "select_cache",
    "select_entry",
    "unembed_last",
    # devices
    "DTYPES", "accumulation_dtype", "dtype_name", "input_device", "is_multi_device",
    "layer_devices", "memory_budget", "model_devices", "output_device", "pipeline_plan",
    "place_layer_rows", "place_pipeline", "resolve_device", "resolve_dtype", "resolve_n_devices",
    "stacked_weight", "SlowDtypeWarning", "cpu_native_matmul",
    # cache, gguf
    "CACHE_FORMAT", "cache_dir", "llama_config_from_hf", "load_hf_reference",
]
