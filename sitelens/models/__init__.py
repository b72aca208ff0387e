"""Models: loading, tokens, hook names, KV caches — the only package that knows TransformerLens
model classes (with :mod:`sitelens.models.attention`, the fused attention forward).

- :mod:`sitelens.models.load`: names → ready models (bundled, TransformerLens names, local Hugging
  Face directories), backends, the local HF-cache check, ``prepare_bridge``, ``fingerprint``; the
  BOS convention of each model.
- :mod:`sitelens.models.tiny`: tiny random test models (``tiny_model``, ``tiny_tokenizer``).
- :mod:`sitelens.models.tokens`: ``encode`` (BOS, left padding), memory-bounded batches.
- :mod:`sitelens.models.hooks`: the hook-name vocabulary (``act_name``, ``z_hook_name``), the z-hook
  self-check, hook functions on a bridge (``wrap_hook``), ``forward_until``.
- :mod:`sitelens.models.kv`: KV caches (``prefix_cache``, ``kv_forward``), last-position logits.
- :mod:`sitelens.models.devices`: dtypes and devices (``resolve_dtype``, ``resolve_device``), where
  each layer lives (``layer_devices``, ``input_device``, ``output_device``), per-layer placement
  (``place_layer_rows``), splitting a ``HookedTransformer`` over GPUs (``place_pipeline``) and
  memory-sized batches (``memory_budget``).
- :mod:`sitelens.models.cache`: the cache directory and the processed-weight cache.
- :mod:`sitelens.models.gguf`: GGUF files → Hugging Face models → ``HookedTransformer``.

Every name is re-exported here (``from sitelens.models import load_model, encode, ...``). To
monkeypatch a function for the code that calls it, patch it in the submodule that defines it
(``sitelens.models.kv.unembed_last``): the name here is bound once, at import.
"""

from __future__ import annotations

from sitelens.models.cache import CACHE_FORMAT, cache_dir
from sitelens.models.cache import _gguf_path as _gguf_path
from sitelens.models.cache import _jsonable as _jsonable
from sitelens.models.cache import _materialize_buffers as _materialize_buffers
from sitelens.models.cache import _weights_key as _weights_key
from sitelens.models.devices import (
    DTYPES,
    accumulation_dtype,
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
from sitelens.models.gguf import _convert_bundled as _convert_bundled
from sitelens.models.gguf import _from_llama_hf as _from_llama_hf
from sitelens.models.gguf import _hf_load as _hf_load
from sitelens.models.gguf import llama_config_from_hf, load_hf_reference
from sitelens.models.hooks import _BRIDGE_Z_CANDIDATES as _BRIDGE_Z_CANDIDATES
from sitelens.models.hooks import _SEGMENTS as _SEGMENTS
from sitelens.models.hooks import _Z_HOOKS as _Z_HOOKS
from sitelens.models.hooks import _AllHooksFired as _AllHooksFired
from sitelens.models.hooks import _segment_view as _segment_view
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
from sitelens.models.kv import (
    SELECT_BUDGET_BYTES,
    BridgeKVCache,
    RecomputeCache,
    cache_rows_per_batch,
    drive_hf_cache,
    kv_forward,
    last_position_logits,
    last_token_forward,
    new_kv_cache,
    prefix_cache,
    select_cache,
    unembed_last,
)
from sitelens.models.load import (
    ALLOW_DOWNLOAD_ENV,
    BACKENDS,
    BUNDLED_MODELS,
    DEFAULT_MODEL,
    DEFAULT_N_CTX,
    TINY_MODELS,
    available_models,
    check_model_available,
    default_backend,
    fast_layout,
    fingerprint,
    has_hooked_transformer,
    hf_cached,
    load_model,
    model_name,
    prepare_bridge,
    resolve_backend,
    timed_load,
)
from sitelens.models.load import _bridge_from_hf as _bridge_from_hf
from sitelens.models.load import _download_allowed as _download_allowed
from sitelens.models.load import _finalize as _finalize
from sitelens.models.load import _hf_cache_dir as _hf_cache_dir
from sitelens.models.load import _hub_offline as _hub_offline
from sitelens.models.load import _is_dir as _is_dir
from sitelens.models.load import _load_bundled as _load_bundled
from sitelens.models.load import _load_bundled_bridge as _load_bundled_bridge
from sitelens.models.load import _load_hf_dir as _load_hf_dir
from sitelens.models.load import _load_official as _load_official
from sitelens.models.load import _official_names as _official_names
from sitelens.models.load import _resolve_dtype as _resolve_dtype
from sitelens.models.tiny import _tiny_bridge as _tiny_bridge
from sitelens.models.tiny import tiny_model, tiny_tokenizer
from sitelens.models.tokens import (
    ATTENTION_BUDGET_BYTES,
    Encoded,
    budget_batches,
    encode,
    length_batches,
    prepends_bos,
    token_ids,
)

__all__ = [
    # load
    "ALLOW_DOWNLOAD_ENV", "BACKENDS", "BUNDLED_MODELS", "DEFAULT_MODEL", "DEFAULT_N_CTX",
    "TINY_MODELS", "available_models", "check_model_available", "default_backend", "fast_layout",
    "fingerprint", "has_hooked_transformer", "hf_cached", "load_model", "model_name",
    "prepare_bridge", "resolve_backend", "timed_load",
    # tiny
    "tiny_model", "tiny_tokenizer",
    # tokens
    "ATTENTION_BUDGET_BYTES", "Encoded", "budget_batches", "encode", "length_batches",
    "prepends_bos", "token_ids",
    # hooks
    "act_name", "canonical_hook_name", "check_z_shape", "forward_until", "is_bridge",
    "position_wise", "self_check", "wrap_hook", "z_hook_name",
    # kv
    "SELECT_BUDGET_BYTES", "BridgeKVCache", "RecomputeCache", "cache_rows_per_batch",
    "drive_hf_cache", "kv_forward",
    "last_position_logits", "last_token_forward", "new_kv_cache", "prefix_cache", "select_cache",
    "unembed_last",
    # devices
    "DTYPES", "accumulation_dtype", "dtype_name", "input_device", "is_multi_device",
    "layer_devices", "memory_budget", "model_devices", "output_device", "pipeline_plan",
    "place_layer_rows", "place_pipeline", "resolve_device", "resolve_dtype", "resolve_n_devices",
    "stacked_weight",
    # cache, gguf
    "CACHE_FORMAT", "cache_dir", "llama_config_from_hf", "load_hf_reference",
]
