"""Names to models: bundled offline models, TransformerLens names, local HF dirs, tiny test models.

With :mod:`sitelens.models.attention` (the fused attention fast path installed on every
``HookedTransformer``), the :mod:`sitelens.models` package is the only place that knows
TransformerLens model classes. Everything else talks to a model through
:func:`~sitelens.models.hooks.act_name` / :func:`~sitelens.models.hooks.z_hook_name`,
:func:`~sitelens.models.tokens.encode`, the KV-cache helpers of :mod:`sitelens.models.kv` and the
standard ``model(tokens, attention_mask=...)`` call.

Backends (``backend=`` of :func:`load_model` / :func:`~sitelens.models.tiny.tiny_model`; default:
``$SITELENS_BACKEND``, else ``"hooked"`` where TransformerLens still has ``HookedTransformer``
(3.x), else ``"bridge"``):

- ``"hooked"``: a ``HookedTransformer`` (TransformerLens 3.9).
- ``"bridge"``: a ``TransformerBridge`` around the Hugging Face model (TransformerLens 3.9 and 4.x),
  raw HF numerics; ``enable_compatibility_mode()`` is never called implicitly. The per-head
  ``z`` hook is resolved by :func:`~sitelens.models.hooks.z_hook_name` and checked at run time
  (``[batch, pos, n_heads, d_head]``); :func:`~sitelens.models.hooks.self_check` verifies on load
  that it fires and changes the logits. KV caches fall back to full forward passes with the same
  results (:mod:`sitelens.models.kv`).

Reserved names for tests and subprocesses: ``"tiny-random"`` and ``"tiny-random-gqa"`` (2 key/value
heads) load :func:`~sitelens.models.tiny.tiny_model` (seed 0) on the chosen backend, offline, in
well under a second.

BOS convention (decided per model, stored in ``model.cfg.default_prepend_bos`` and honoured by
:func:`~sitelens.models.tokens.encode`):

- ``smollm2-135m-instruct``: **no BOS**. Its GGUF tokenizer names ``<|im_start|>`` as BOS, but that
  token opens a chat turn; the Hugging Face tokenizer does not prepend it for plain text either, and the
  model was pretrained on raw text without it. Prompts start directly with ``Q:``.
- ``gemma-3-270m``: ``<bos>`` is prepended (Gemma is trained with it and degrades without it).
- tiny test models: ``<bos>`` is prepended.
"""

from __future__ import annotations

import difflib
import hashlib
import os
import time
from contextlib import contextmanager
from pathlib import Path

import torch

from sitelens.errors import ModelError
from sitelens.models.cache import (
    _gguf_path,
    dequantized_dir,
    is_cached,
    load_dequantized,
    load_processed,
    processed_dir,
    save_dequantized,
    save_processed,
)
from sitelens.models.devices import (
    input_device,
    place_pipeline,
    resolve_device,
    resolve_dtype,
    resolve_n_devices,
)
from sitelens.models.gguf import _convert_bundled, _from_llama_hf, _hf_load
from sitelens.models.hooks import is_bridge, self_check

DEFAULT_MODEL = "smollm2-135m-instruct"
BUNDLED_MODELS = ("smollm2-135m-instruct", "gemma-3-270m")
TINY_MODELS = {"tiny-random": {}, "tiny-random-gqa": {"n_key_value_heads": 2}}
BACKENDS = ("hooked", "bridge")
DEFAULT_N_CTX = 2048
ALLOW_DOWNLOAD_ENV = "SITELENS_ALLOW_DOWNLOAD"
# defaults of load_model's device=, dtype=, n_devices=, device_map= (the CLI's --device, --dtype,
# --n-devices, --device-map set them for the duration of a command, so that every model it loads,
# in this process or in worker processes, honours them; a notebook can set them too)
DEVICE_ENV, DTYPE_ENV = "SITELENS_DEVICE", "SITELENS_DTYPE"
N_DEVICES_ENV, DEVICE_MAP_ENV = "SITELENS_N_DEVICES", "SITELENS_DEVICE_MAP"


# ----------------------------------------------------------------------------------------------
# names and backends


def available_models() -> list[str]:
    """Bundled model names (loadable offline). Any TransformerLens official name or a local HF
    directory is accepted too, and the reserved test names in :data:`TINY_MODELS`."""
    return list(BUNDLED_MODELS)


def has_hooked_transformer() -> bool:
    """Whether the installed TransformerLens still has ``HookedTransformer`` (3.x; gone in 4.0)."""
    try:
        from transformer_lens import HookedTransformer  # noqa: F401
    except ImportError:
        return False
    return True


def default_backend() -> str:
    """``$SITELENS_BACKEND`` if set, else ``"hooked"`` on TransformerLens 3.x, else ``"bridge"``."""
    env = os.environ.get("SITELENS_BACKEND", "").strip().lower()
    if env:
        if env not in BACKENDS:
            raise ModelError(
                f"SITELENS_BACKEND={env!r} is not a backend; use one of {', '.join(BACKENDS)}."
            )
        return env
    return "hooked" if has_hooked_transformer() else "bridge"


def resolve_backend(backend: str | None) -> str:
    """``backend``, or :func:`default_backend` for ``None``; :class:`ModelError` for an unknown
    backend or ``"hooked"`` on a TransformerLens without ``HookedTransformer``."""
    backend = default_backend() if backend is None else backend
    if backend not in BACKENDS:
        raise ModelError(f"Unknown backend {backend!r}; use one of {', '.join(BACKENDS)}.")
    if backend == "hooked" and not has_hooked_transformer():
        import importlib.metadata as md

        raise ModelError(
            "backend='hooked' needs HookedTransformer, which TransformerLens "
            f"{md.version('transformer-lens')} no longer has. Use backend='bridge' (or "
            "SITELENS_BACKEND=bridge), or install 'transformer-lens>=3.9,<4'."
        )
    return backend


def _official_names() -> list[str]:
    try:
        from transformer_lens.supported_models import OFFICIAL_MODEL_NAMES
    except ImportError:  # older layouts
        try:
            from transformer_lens.loading_from_pretrained import OFFICIAL_MODEL_NAMES
        except ImportError:
            return []
    return list(OFFICIAL_MODEL_NAMES)


# ----------------------------------------------------------------------------------------------
# loading


def load_model(
    name: str = DEFAULT_MODEL,
    *,
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
    or a reserved tiny test model (``"tiny-random"``, ``"tiny-random-gqa"``: :func:`tiny_model`,
    seed 0). ``backend``: ``"hooked"`` (``HookedTransformer``) or ``"bridge"``
    (``TransformerBridge``); default :func:`default_backend`. Processed weights of bundled models
    are cached under :func:`cache_dir` (atomic writes; on the bridge backend the dequantized
    Hugging Face model is cached). ``n_ctx``: the longest prompt + generation, in tokens (default
    ``DEFAULT_N_CTX`` = 2048, 256 for the tiny models; Llama-style models cap it at their
    ``max_position_embeddings``); a longer
    context costs TransformerLens an n_ctx × n_ctx causal mask per layer (0.5 GB at 4096 on SmolLM2).
    ``fast_attention``: a ``HookedTransformer`` gets :func:`sitelens.models.attention.enable_fast_attention`
    (fused attention, the same numbers to float rounding, ~4x faster forward passes on long
    prompts; hooks on ``hook_pattern``/``hook_attn_scores`` still see real patterns).

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
    name → device); not together with ``device`` or ``n_devices``. Each of the four defaults to
    its environment variable when not given: ``$SITELENS_DEVICE``, ``$SITELENS_DTYPE``,
    ``$SITELENS_N_DEVICES``, ``$SITELENS_DEVICE_MAP`` (set by the CLI's options).
    """
    device, dtype, n_devices, device_map = _env_defaults(device, dtype, n_devices, device_map)
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
        from sitelens.models.tiny import tiny_model  # tiny.py builds on this module

        model = tiny_model(backend=backend, **TINY_MODELS[name], **({"n_ctx": n_ctx} if n_ctx else {}))
        model.cfg.model_name = name
        if device is None and dtype is None and n_devices == 1 and device_map is None:
            from sitelens.models.attention import enable_fast_attention

            return enable_fast_attention(model, fast_attention)  # a no-op on a bridge
        if backend == "bridge" and (device_map is not None or n_devices > 1):
            _dispatch(model.original_model, device_map, device, n_devices)
    elif name in BUNDLED_MODELS:
        if backend == "bridge":
            model = _load_bundled_bridge(name, n_ctx=ctx, use_cache=use_cache, **place)
        else:
            model = _load_bundled(name, n_ctx=ctx, use_cache=use_cache)
    elif _is_dir(name):
        check_model_available(name)
        model = _load_hf_dir(Path(name).expanduser(), n_ctx=ctx, backend=backend, **place)
    else:
        check_model_available(name)
        model = _load_official(name, n_ctx=ctx, backend=backend, **place)
    return _finalize(model, device=device, dtype=dtype, n_devices=n_devices,
                     fast_attention=fast_attention)


def timed_load(name: str = DEFAULT_MODEL, **kw):
    """``(model, seconds)``: convenience for benchmarks."""
    t0 = time.perf_counter()
    m = load_model(name, **kw)
    return m, time.perf_counter() - t0


# ----------------------------------------------------------------------------------------------
# local directories and the Hugging Face cache (read without network access)


def _is_dir(name) -> bool:
    name = os.fspath(name) if isinstance(name, os.PathLike) else name
    try:
        return isinstance(name, str) and bool(name.strip()) and Path(name).expanduser().is_dir()
    except (OSError, RuntimeError):  # a name too long for a path; ~user that does not exist
        return False


def _download_allowed() -> bool:
    return os.environ.get(ALLOW_DOWNLOAD_ENV, "") not in ("", "0")


@contextmanager
def _hub_offline(enabled: bool = True):
    """Hugging Face Hub offline mode for the duration (no HTTP requests, cached files only)."""
    from huggingface_hub import constants

    old = constants.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = old or enabled
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = old


def _load_official(name: str, *, n_ctx: int, backend: str, device=None, dtype=None,
                   n_devices: int = 1, device_map=None):
    """A TransformerLens official model from the local Hugging Face cache (checked first by
    :func:`check_model_available`), in Hub offline mode unless downloads are allowed. Loaded in
    ``dtype`` (no float32 copy of a large model); a ``HookedTransformer`` goes to ``device`` (one
    device) or stays on the CPU for :func:`_finalize` to split (``n_devices`` > 1); a bridge gets
    ``device`` / ``n_devices`` / ``device_map`` from Hugging Face."""
    offline = not _download_allowed()
    dtype = dtype or torch.float32
    try:
        with _hub_offline(offline):
            if backend == "bridge":
                from transformer_lens.model_bridge import TransformerBridge

                kw = {"device": str(device)} if device is not None else {}
                if device_map is not None:
                    kw = {"device_map": device_map}
                elif n_devices > 1:
                    kw = {"n_devices": n_devices}
                model = TransformerBridge.boot_transformers(name, n_ctx=n_ctx, dtype=dtype, **kw)
            else:
                from transformer_lens import HookedTransformer

                one = n_devices == 1
                model = HookedTransformer.from_pretrained(
                    name, n_ctx=n_ctx, default_padding_side="left", dtype=dtype,
                    device=str(device) if (device is not None and one) else "cpu",
                    move_to_device=one,
                )
    except OSError as e:  # a file the local cache lacks (offline mode raises at once)
        if not offline:
            raise
        why = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ModelError(
            f"Model {name!r} is only partly in the local Hugging Face cache ({why}). Download it "
            f"again on a machine with network (`hf download {name}`), or set "
            f"{ALLOW_DOWNLOAD_ENV}=1 to let TransformerLens fetch the missing files."
        ) from e
    model.cfg.model_name = name
    return model


def _hf_cache_dir() -> str:
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


def hf_cached(repo_id: str) -> bool:
    """Whether the local Hugging Face cache holds a snapshot of ``repo_id`` (no network access:
    only the cache directory is read)."""
    from huggingface_hub import try_to_load_from_cache

    try:
        if isinstance(try_to_load_from_cache(repo_id, "config.json"), str):
            return True
    except ValueError:  # a repo id the hub library rejects
        return False
    snapshots = Path(_hf_cache_dir()) / f"models--{repo_id.replace('/', '--')}" / "snapshots"
    try:  # repos without a config.json (TransformerLens's own checkpoints): any cached file
        return any(f.is_file() for f in snapshots.rglob("*"))
    except OSError:
        return False


def check_model_available(name: str) -> None:
    """Raise :class:`ModelError` at once if :func:`load_model` cannot load ``name`` from local
    files: an empty or unknown name, a directory without ``config.json``, or a TransformerLens
    official model whose weights are not in the local Hugging Face cache. Reads no weights and
    makes no network requests (set ``SITELENS_ALLOW_DOWNLOAD=1`` to let TransformerLens download
    uncached official models instead)."""
    name = os.fspath(name) if isinstance(name, os.PathLike) else name
    if not isinstance(name, str) or not name.strip():
        raise ModelError(
            f"Bad model name {name!r}: give a bundled model ({', '.join(BUNDLED_MODELS)}), a "
            "TransformerLens official model name or a local Hugging Face directory."
        )
    if name in TINY_MODELS or name in BUNDLED_MODELS:
        return
    if _is_dir(name):
        if not (Path(name).expanduser() / "config.json").is_file():
            raise ModelError(
                f"{name} is a directory but not a Hugging Face model directory (no config.json); "
                "pass a directory written by save_pretrained(), or a bundled model: "
                f"{', '.join(BUNDLED_MODELS)}."
            )
        return
    official = _official_names()
    if name not in official:
        close = difflib.get_close_matches(
            name, list(BUNDLED_MODELS) + list(TINY_MODELS) + official, n=5, cutoff=0.4
        )
        raise ModelError(
            f"Unknown model {name!r}. Bundled (offline) models: {', '.join(BUNDLED_MODELS)}."
            + (f" Close matches: {', '.join(close)}." if close else "")
            + " You may also pass a TransformerLens official model name or a local Hugging"
            " Face directory."
        )
    if _download_allowed() or hf_cached(name):
        return
    raise ModelError(
        f"Model {name!r} is not in the local Hugging Face cache ({_hf_cache_dir()}) and sitelens "
        f"does not download at run time. Download it into the cache on a machine with network "
        f"(`hf download {name}`) and copy the cache here (or point HF_HOME at it), pass a local "
        f"Hugging Face directory, or use a bundled model: {', '.join(BUNDLED_MODELS)} "
        f"(or set {ALLOW_DOWNLOAD_ENV}=1 to let TransformerLens download it)."
    )


# ----------------------------------------------------------------------------------------------
# making a model ready


_resolve_dtype = resolve_dtype  # the name older callers import


def _env_defaults(device, dtype, n_devices, device_map):
    """``device``, ``dtype``, ``n_devices``, ``device_map``, each from its environment variable
    (:data:`DEVICE_ENV`, ...) when None and the variable is set and not empty."""
    env = {k: os.environ.get(k, "").strip() for k in
           (DEVICE_ENV, DTYPE_ENV, N_DEVICES_ENV, DEVICE_MAP_ENV)}
    if device is None and env[DEVICE_ENV]:
        device = env[DEVICE_ENV]
    if dtype is None and env[DTYPE_ENV]:
        dtype = env[DTYPE_ENV]
    if n_devices is None and env[N_DEVICES_ENV]:
        try:
            n_devices = int(env[N_DEVICES_ENV])
        except ValueError:
            raise ModelError(f"{N_DEVICES_ENV}={env[N_DEVICES_ENV]!r} is not a number of GPUs; "
                             "give a positive integer or unset it.") from None
    if device_map is None and env[DEVICE_MAP_ENV]:
        device_map = env[DEVICE_MAP_ENV]
    return device, dtype, n_devices, device_map


def _check_device_map(device_map, *, backend: str, device, n_devices: int) -> None:
    """``device_map`` is the bridge's (Hugging Face's placement), alone."""
    if device_map is None:
        return
    if backend != "bridge":
        raise ModelError("device_map places a TransformerBridge's Hugging Face modules; with "
                         "backend='hooked' split the model with n_devices instead.")
    if device is not None or n_devices > 1:
        raise ModelError("Give device_map alone: it already says where every module goes "
                         "(drop device / n_devices).")
    if isinstance(device_map, str):
        if device_map not in ("auto", "balanced", "balanced_low_0", "sequential"):
            raise ModelError(f"Unknown device_map {device_map!r}; use auto, balanced, "
                             "balanced_low_0, sequential or a dict of module name -> device.")
    elif not isinstance(device_map, dict) or not device_map:
        raise ModelError(f"device_map must be a string or a non-empty dict, got {device_map!r}.")


def _dispatch(hf, device_map, device, n_devices: int):
    """Place an in-memory Hugging Face model (bundled, tiny) with accelerate: ``device_map`` (a
    dict, or a strategy name resolved as Hugging Face's ``from_pretrained`` does), or a balanced
    split over ``n_devices`` GPUs from ``device`` on."""
    from accelerate import dispatch_model, infer_auto_device_map
    from accelerate.utils import get_balanced_memory

    no_split = getattr(hf, "_no_split_modules", None) or []
    if device_map is None:  # n_devices > 1
        first = (device.index or 0) if device is not None else 0
        max_memory = {i: torch.cuda.mem_get_info(i)[0] for i in range(first, first + n_devices)}
        device_map = "balanced"
    else:
        max_memory = None
    if isinstance(device_map, str):
        if device_map != "sequential":
            max_memory = get_balanced_memory(hf, max_memory=max_memory, no_split_module_classes=no_split,
                                             low_zero=device_map == "balanced_low_0")
        device_map = infer_auto_device_map(hf, max_memory=max_memory, no_split_module_classes=no_split)
    dispatch_model(hf, device_map=device_map)
    hf.hf_device_map = dict(device_map)
    return hf


def _cast(model, dtype) -> None:
    """Every floating parameter and buffer to ``dtype``, ``cfg.dtype`` too. (``nn.Module.to``:
    TransformerLens's own ``HookedTransformer.to(dtype)`` also rebuilds the state dict once per
    tensor, 5 s on SmolLM2, for the same result.)"""
    if is_bridge(model):
        model.to(dtype, print_details=False)  # the bridge's own: keeps a dispatched split
    else:
        torch.nn.Module.to(model, dtype)
    model.cfg.dtype = dtype


def _finalize(model, *, device=None, dtype=None, n_devices: int = 1, fast_attention: bool = True):
    if dtype is not None and getattr(model.cfg, "dtype", None) != dtype:
        _cast(model, dtype)
    if is_bridge(model):
        if getattr(model.original_model, "hf_device_map", None):
            model.cfg.device = str(input_device(model))  # where encode() puts the tokens
        elif device is not None:
            model.to(device, print_details=False)
            model.cfg.device = str(device)  # (its .to(torch.device) records only the type)
    elif n_devices > 1:
        place_pipeline(model, device or torch.device("cuda"), n_devices)
    elif device is not None:
        torch.nn.Module.to(model, device)  # (HookedTransformer.to(torch.device) drops the index)
        model.cfg.device = str(device)
        model.cfg.n_devices = 1
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    if not is_bridge(model):
        fast_layout(model)
        from sitelens.models.attention import enable_fast_attention

        enable_fast_attention(model, fast_attention)
    if model.tokenizer is not None:
        model.tokenizer.padding_side = "left"
        if model.tokenizer.pad_token_id is None:
            model.tokenizer.pad_token = model.tokenizer.eos_token
    self_check(model)
    return model


def prepare_bridge(bridge, *, prepend_bos: bool | None = None, name: str | None = None):
    """Make a ``TransformerBridge`` you built yourself (e.g. ``TransformerBridge.boot_transformers``)
    ready for sitelens: eval mode, grads off, left padding, BOS convention, :func:`self_check`.
    It never calls ``enable_compatibility_mode()`` (sitelens works on raw HF numerics)."""
    if not is_bridge(bridge):
        raise ModelError(f"prepare_bridge expects a TransformerBridge, got {type(bridge).__name__}.")
    if prepend_bos is not None:
        bridge.cfg.default_prepend_bos = prepend_bos
    if name is not None:
        bridge.cfg.model_name = name
    return _finalize(bridge)


def fast_layout(model) -> None:
    """Store weights in the memory layout that TransformerLens's forward pass asks for.

    TransformerLens 3.9 calls ``W.T.contiguous()`` / ``rearrange(...)`` on every weight matrix in
    every forward pass (gated MLP, unembedding, Q/K/V/O projections), which copies the whole model
    each call (for Gemma-3's 262k-token unembedding, 670 MB per call). Re-striding each parameter so
    that the transposed view is already contiguous turns those copies into no-ops; values and shapes
    are unchanged. Measured in ``benchmarks/``.
    """
    for name, p in model.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        w = p.data
        if leaf in ("W_Q", "W_K", "W_V", "_W_K", "_W_V") and w.dim() == 3:
            p.data = w.transpose(1, 2).contiguous().transpose(1, 2)  # [H, d_head, d_model] in memory
        elif leaf == "W_O" and w.dim() == 3:
            p.data = w.permute(2, 0, 1).contiguous().permute(1, 2, 0)  # [d_model, H, d_head]
        elif leaf in ("W_in", "W_gate", "W_out", "W_U") and w.dim() == 2:
            p.data = w.T.contiguous().T


# ----------------------------------------------------------------------------------------------
# bundled models and Hugging Face directories


def _load_bundled(name: str, *, n_ctx: int, use_cache: bool):
    """A bundled model as a ``HookedTransformer``: converted from its GGUF file once, then loaded
    from the processed-weight cache (also right after writing it, so both paths give the same
    model); ``use_cache=False`` returns the converted model and writes nothing."""
    target = processed_dir(name, n_ctx)
    if not (use_cache and is_cached(target)):
        model, tokenizer = _convert_bundled(name, n_ctx=n_ctx)
        if not use_cache:
            return model
        save_processed(target, model, tokenizer)
    return load_processed(target, name)


def _load_bundled_bridge(name: str, *, n_ctx: int, use_cache: bool = True, device=None,
                         dtype=None, n_devices: int = 1, device_map=None):
    """A bundled model on the bridge backend: the GGUF file dequantized by transformers, wrapped
    in a ``TransformerBridge`` (raw HF numerics, no folded LayerNorm). The dequantized Hugging
    Face model is cached under :func:`~sitelens.models.cache.cache_dir` ``/hf`` (safetensors;
    loads in seconds)."""
    target = dequantized_dir(name)
    if use_cache and is_cached(target):
        hf, tokenizer = load_dequantized(target)
    else:
        hf, tokenizer = _hf_load(_gguf_path(name))
        if name == "gemma-3-270m":
            hf.config.architectures = ["Gemma3ForCausalLM"]  # a GGUF-loaded config lacks it
        if use_cache:
            save_dequantized(target, hf, tokenizer)
    if dtype is not None:
        hf.to(dtype)
    if device_map is not None or n_devices > 1:
        _dispatch(hf, device_map, device, n_devices)
    return _bridge_from_hf(
        hf, tokenizer, name=name, prepend_bos=name != "smollm2-135m-instruct", n_ctx=n_ctx
    )


def _bridge_from_hf(hf, tokenizer, *, name: str, prepend_bos: bool, n_ctx: int | None = None):
    """Wrap a loaded Hugging Face causal LM in a ``TransformerBridge`` offline (no hub call).

    The tokenizer is attached as is (TransformerLens's ``setup_tokenizer`` would reload it by name);
    sitelens tokenizes with :func:`encode` and never lets the tokenizer add special tokens."""
    from transformer_lens.model_bridge.sources._bridge_builder import build_bridge_from_module

    arch = (getattr(hf.config, "architectures", None) or [type(hf).__name__])[0]
    if hasattr(hf, "set_attn_implementation"):
        try:
            hf.set_attn_implementation("eager")  # the bridge's hooks need the eager path
        except (ValueError, ImportError):
            pass
    try:
        bridge = build_bridge_from_module(
            hf, arch, hf_config=hf.config, tokenizer=None, model_name=name
        )
    except (ValueError, KeyError, NotImplementedError) as e:
        raise ModelError(
            f"TransformerBridge cannot wrap {name!r} (architecture {arch}): {e}. Use "
            "backend='hooked' on TransformerLens 3.9."
        ) from e
    bridge.tokenizer = tokenizer  # first assignment: attached without a reload
    bridge.cfg.default_prepend_bos = prepend_bos
    bridge.cfg.tokenizer_prepends_bos = False
    bridge.cfg.model_name = name
    if n_ctx is not None:
        bridge.cfg.n_ctx = min(int(n_ctx), int(bridge.cfg.n_ctx or n_ctx))
    return bridge


def _load_hf_dir(path: Path, *, n_ctx: int, backend: str = "hooked", device=None, dtype=None,
                 n_devices: int = 1, device_map=None):
    """A local Hugging Face directory: a bridge loads in ``dtype`` with Hugging Face's
    ``device_map`` (or a balanced one over ``n_devices`` GPUs); a ``HookedTransformer`` is
    converted from float32 (cast and placed by :func:`_finalize`)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    hf_cfg = AutoConfig.from_pretrained(str(path))
    arch = (getattr(hf_cfg, "architectures", None) or ["?"])[0]
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    kw = {}
    if backend == "bridge":
        kw["dtype"] = dtype or torch.float32
        if device_map is not None:
            kw["device_map"] = device_map
        elif n_devices > 1:
            first = (device.index or 0) if device is not None else 0
            kw["device_map"] = "balanced"
            kw["max_memory"] = {i: torch.cuda.mem_get_info(i)[0]
                                for i in range(first, first + n_devices)}
    hf = AutoModelForCausalLM.from_pretrained(str(path), **{"dtype": torch.float32, **kw})
    if backend == "bridge":
        return _bridge_from_hf(
            hf, tokenizer, name=path.name, prepend_bos=tokenizer.bos_token is not None, n_ctx=n_ctx
        )
    if arch == "LlamaForCausalLM":
        return _from_llama_hf(hf, tokenizer, n_ctx=n_ctx, prepend_bos=tokenizer.bos_token is not None)
    from transformer_lens import HookedTransformer

    official = _official_names()
    guess = getattr(hf_cfg, "_name_or_path", "")
    if guess in official:
        return HookedTransformer.from_pretrained(
            guess, hf_model=hf, tokenizer=tokenizer, n_ctx=n_ctx, default_padding_side="left"
        )
    raise ModelError(
        f"Cannot map the Hugging Face directory {str(path)!r} (architecture {arch}) to a "
        "TransformerLens architecture. Llama-architecture directories load directly; for others, "
        "set `_name_or_path` in its config.json to the TransformerLens official model name, or use "
        "backend='bridge'."
    )


# ----------------------------------------------------------------------------------------------
# identity


def model_name(model) -> str:
    return getattr(model.cfg, "model_name", None) or "unknown"


def _model_dtype(model) -> torch.dtype:
    for p in model.parameters():
        if p.is_floating_point():
            return p.dtype
    return torch.float32


def fingerprint(model) -> str:
    """A short hash of the model's config and a sample of its weights (and, for a model not in
    float32, its dtype): adapters check it, and bench rows and figure cells are keyed on it, so a
    bfloat16 run never reuses a float32 one."""
    h = hashlib.sha256()
    c = model.cfg
    h.update(f"{c.n_layers}|{c.n_heads}|{c.d_head}|{c.d_model}|{c.d_vocab}".encode())
    dtype = _model_dtype(model)
    if dtype != torch.float32:  # float32 fingerprints are as before the dtype was part of them
        h.update(f"|{dtype}".encode())
    if is_bridge(model):  # HF parameter names: first, middle and last tensors
        params = list(model.original_model.named_parameters())
        tensors = [params[i][1] for i in sorted({0, len(params) // 2, len(params) - 1})]
    else:
        sd = model.state_dict()
        keys = ("embed.W_E", "blocks.0.attn.W_Q", f"blocks.{c.n_layers - 1}.attn.W_O", "unembed.W_U")
        tensors = [sd[k] for k in keys if k in sd]
    for t in tensors:
        t = t.detach().float().flatten()
        steps = min(4096, t.numel())
        idx = torch.arange(steps) * (t.numel() - 1) // max(1, steps - 1)
        h.update(t[idx].cpu().numpy().round(5).tobytes())
    return h.hexdigest()[:16]


__all__ = [
    "ALLOW_DOWNLOAD_ENV", "BACKENDS", "BUNDLED_MODELS", "DEFAULT_MODEL", "DEFAULT_N_CTX",
    "DEVICE_ENV", "DEVICE_MAP_ENV", "DTYPE_ENV", "N_DEVICES_ENV",
    "TINY_MODELS", "available_models", "check_model_available", "default_backend", "fast_layout",
    "fingerprint", "has_hooked_transformer", "hf_cached", "load_model", "model_name",
    "prepare_bridge", "resolve_backend", "timed_load",
]
