"""Devices and dtypes: where each layer lives, per-layer placement, memory-sized batches.

- :func:`resolve_dtype` / :func:`resolve_device` / :func:`resolve_n_devices`: the ``dtype=``,
  ``device=`` and ``n_devices=`` of :func:`~sitelens.models.load.load_model` (and of the CLI's
  ``--dtype`` / ``--device`` / ``--n-devices``), checked before anything loads
  (:class:`~sitelens.errors.ModelError` naming the fix).
- :func:`layer_devices` / :func:`input_device` / :func:`output_device`: where a model's blocks,
  its embedding and its unembedding actually live (read from their parameters, so they are right
  for one device, for a ``HookedTransformer`` split with ``n_devices`` and for a
  ``TransformerBridge`` dispatched by a Hugging Face ``device_map``). Everything sitelens creates
  for one layer (SITE's α row and task-embedding row, patching rows) goes to
  ``layer_devices(model)[layer]`` (:func:`place_layer_rows`); tokens go to the input device; the
  answer ids that meet the logits go to the output device.
- :func:`place_pipeline`: a ``HookedTransformer`` split over ``n_devices`` GPUs in pipeline order,
  block ``i`` on TransformerLens's ``get_device_for_block_index(i, cfg)`` — the device its forward
  pass moves the residual stream to — the embedding with block 0, the final norm and the
  unembedding with the last block. (TransformerLens 3.9's own ``move_model_modules_to_device``
  puts each module on whichever GPU has the most free memory at that moment, which disagrees with
  its forward pass; TransformerLens issue #907.)
- placing a loaded model (used by :func:`~sitelens.models.load.load_model`): the device-map
  checks, accelerate's dispatch of an in-memory Hugging Face model, the dtype cast and the move
  to one device or the split over ``n_devices`` GPUs.
- :func:`accumulation_dtype`: float32 for float32 / float16 / bfloat16 models (float64 stays
  float64): every mean, loss, KL and the α optimizer state are kept in it.
- :func:`memory_budget`: memory-bounded batches. On the CPU the budgets are
  today's constants (so CPU results stay bit-identical); on CUDA a share of the free memory
  (``torch.cuda.mem_get_info``) of the model's fullest device.
"""

from __future__ import annotations

import importlib
import platform
import warnings
from collections.abc import Sequence

import torch
from torch import Tensor

from sitelens.errors import ModelError

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
}
DTYPE_ALIASES = {"fp32": "float32", "fp16": "float16", "half": "float16", "bf16": "bfloat16"}
DEVICE_TYPES = ("cpu", "cuda", "mps")
# The share of a CUDA device's free memory one batch's largest transient tensor may take: the
# forward pass holds a few such tensors at once (scores, pattern, the MLP activations) next to
# the weights and caches that were already allocated when the free memory was read.
CUDA_BUDGET_SHARE = 0.25


# ----------------------------------------------------------------------------------------------
# dtypes and devices given by the user


def resolve_dtype(dtype) -> torch.dtype | None:
    """``None``, a ``torch.dtype`` among float32 / float16 / bfloat16, or its name (``"bfloat16"``,
    also ``"bf16"``, ``"fp16"``, ``"half"``, ``"fp32"``); else :class:`ModelError`."""
    if dtype is None:
        return None
    if isinstance(dtype, torch.dtype):
        if dtype in DTYPES.values() or dtype == torch.float64:
            return dtype
    elif isinstance(dtype, str):
        name = dtype.strip().lower().removeprefix("torch.")
        name = DTYPE_ALIASES.get(name, name)
        if name in DTYPES:
            return DTYPES[name]
    raise ModelError(
        f"Unknown dtype {dtype!r}; use one of {', '.join(DTYPES)} (bfloat16 halves the memory of "
        "float32 and keeps its range; float16 needs a GPU to be fast)."
    )


class SlowDtypeWarning(UserWarning):
    """Half-precision weights on a CPU that has no matrix instructions for them."""


def cpu_native_matmul(dtype: torch.dtype) -> bool | None:
    """Whether this CPU multiplies ``dtype`` matrices in hardware, as PyTorch's CPU feature probe
    reports: bfloat16 with AVX-512 BF16 or AMX, float16 with AMX-FP16; float32 and float64
    always. ``None`` where the probe cannot tell (not x86, or a torch without the probe).
    Without them PyTorch converts on the fly and a half-precision matmul runs several times slower
    than float32 (docs/benchmarks.md, "bfloat16 weights on the CPU", has SITE's stages measured on
    CPUs with and without AVX-512 BF16)."""
    if dtype in (torch.float32, torch.float64):
        return True
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None  # the probes below are x86 feature flags
    # torch.cpu's probes are private (torch 2.x has no public one); getattr: a torch without them
    probes = {torch.bfloat16: ("_is_avx512_bf16_supported", "_is_amx_tile_supported"),
              torch.float16: ("_is_amx_fp16_supported",)}.get(dtype, ())
    found = [getattr(torch.cpu, name, None) for name in probes]
    if not found or any(f is None for f in found):
        return None
    return any(f() for f in found)


def warn_slow_cpu_dtype(model) -> None:
    """:class:`SlowDtypeWarning` when a placed model's weights are bfloat16 or float16 on a CPU
    that has no matrix instructions for them (:func:`cpu_native_matmul` is False): a speed trap,
    not an error (the numbers are right, only slower than float32 here). Read off the weights
    themselves, so it holds however the model was loaded, cast or dispatched."""
    w = next((p for p in model.parameters() if p.is_floating_point()), None)
    if w is None or w.device.type != "cpu" or w.dtype not in (torch.bfloat16, torch.float16):
        return
    if cpu_native_matmul(w.dtype) is False:
        name = dtype_name(w.dtype)
        need = "AVX-512 BF16 or AMX" if w.dtype == torch.bfloat16 else "AMX-FP16"
        warnings.warn(
            f"{name} weights on this CPU, which has no {need} instructions: PyTorch converts its "
            f"matmuls on the fly, several times slower than float32. Leave --dtype out (float32) on "
            f"this machine; {name} pays off on a GPU or on a CPU with {need}.",
            SlowDtypeWarning, stacklevel=3)


def dtype_name(dtype: torch.dtype | None) -> str:
    """``"float32"`` for ``torch.float32`` (``None`` = float32), etc."""
    return str(dtype or torch.float32).removeprefix("torch.")


def resolve_device(device) -> torch.device | None:
    """``None`` or a device that exists here: ``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``"mps"`` (or a
    ``torch.device``). A malformed name, a device type sitelens does not run on, CUDA / MPS where
    this torch has none, or a CUDA index past the last GPU raise :class:`ModelError`."""
    if device is None:
        return None
    try:
        dev = torch.device(device.strip() if isinstance(device, str) else device)
    except (RuntimeError, TypeError, ValueError):
        raise ModelError(
            f"Unknown device {device!r}; use cpu, cuda, cuda:N (N = 0, 1, ...) or mps."
        ) from None
    if dev.type not in DEVICE_TYPES:
        raise ModelError(f"Device {str(dev)!r} is not supported; use cpu, cuda, cuda:N or mps.")
    if dev.type == "cuda":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n == 0:
            raise ModelError(
                f"Device {str(dev)!r} needs CUDA, but this torch ({torch.__version__}) sees no CUDA "
                "GPU. Use --device cpu, or install a CUDA build of torch on a machine with a GPU."
            )
        if dev.index is not None and dev.index >= n:
            raise ModelError(f"Device {str(dev)!r} does not exist: this machine has {n} CUDA "
                             f"GPU(s), cuda:0 to cuda:{n - 1}.")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise ModelError(f"Device {str(dev)!r} needs Apple's MPS, which this machine lacks; use cpu.")
    return dev


def resolve_n_devices(n_devices, device: torch.device | None) -> int:
    """``n_devices`` (``None`` = 1) checked: a positive integer; more than 1 needs CUDA GPUs
    ``device.index`` .. ``device.index + n_devices - 1`` (``device`` None or ``cuda``)."""
    if n_devices is None:
        return 1
    if isinstance(n_devices, bool) or not isinstance(n_devices, int) or n_devices < 1:
        raise ModelError(f"n_devices must be a positive integer, got {n_devices!r}.")
    if n_devices == 1:
        return 1
    if device is not None and device.type != "cuda":
        raise ModelError(f"n_devices={n_devices} splits the model over CUDA GPUs; device "
                         f"{str(device)!r} is not one. Use --device cuda (or leave it out).")
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    first = (device.index or 0) if device is not None else 0
    if first + n_devices > have:
        raise ModelError(
            f"n_devices={n_devices} needs CUDA GPUs cuda:{first} to cuda:{first + n_devices - 1}, "
            f"but this machine has {have}. Lower --n-devices, or use --dtype bfloat16 to halve "
            "the memory the model needs."
        )
    return n_devices


# ----------------------------------------------------------------------------------------------
# where a model lives


def _param_device(module) -> torch.device | None:
    for p in module.parameters():
        return p.device
    for b in module.buffers():
        return b.device
    return None


def _cfg_device(model) -> torch.device:
    dev = getattr(model.cfg, "device", None)
    return torch.device(dev) if dev is not None else torch.device("cpu")


def layer_devices(model) -> list[torch.device]:
    """The device of each block (``[n_layers]``), read from the block's own parameters: where its
    hooks (``hook_z`` above all) see their activations. One device for a model on one device; a
    pipeline for ``n_devices`` / ``device_map`` models."""
    default = _cfg_device(model)
    return [_param_device(block) or default for block in model.blocks]


def input_device(model) -> torch.device:
    """Where the token ids go: the input embedding's device."""
    embed = getattr(model, "embed", None)
    dev = _param_device(embed) if embed is not None else None
    return dev or _cfg_device(model)


def output_device(model) -> torch.device:
    """Where the logits come out: the unembedding's device."""
    unembed = getattr(model, "unembed", None)
    dev = _param_device(unembed) if unembed is not None else None
    return dev or (layer_devices(model) or [_cfg_device(model)])[-1]


def model_devices(model) -> list[torch.device]:
    """The distinct devices of a model, in pipeline order (input, blocks, output)."""
    seen: list[torch.device] = []
    for d in [input_device(model), *layer_devices(model), output_device(model)]:
        if d not in seen:
            seen.append(d)
    return seen


def is_multi_device(model) -> bool:
    return len(model_devices(model)) > 1


def place_layer_rows(x: Tensor | Sequence[Tensor], model, *, layer_dim: int = 0,
                     dtype: torch.dtype | None = None) -> list[Tensor]:
    """Split ``x`` along ``layer_dim`` (a ``[n_layers, ...]`` tensor, e.g. α ``[L, H]`` or a task
    embedding ``[L, H, d_head]``; or a per-layer sequence already) into one tensor per layer, each
    on that layer's device (:func:`layer_devices`) and, if given, in ``dtype``. A row already there
    is returned as is (no copy), so a placed sequence places to itself."""
    devs = layer_devices(model)
    rows = list(x) if not isinstance(x, Tensor) else list(x.unbind(layer_dim))
    if len(rows) != len(devs):
        raise ModelError(f"{len(rows)} layer rows for a model with {len(devs)} layers.")
    return [r.to(device=d, dtype=dtype or r.dtype) for r, d in zip(rows, devs)]


def accumulation_dtype(dtype: torch.dtype | None) -> torch.dtype:
    """The dtype sums, means, losses and optimizer states are kept in for a model of ``dtype``:
    float32 (float64 for a float64 model)."""
    return torch.promote_types(dtype or torch.float32, torch.float32)


# ----------------------------------------------------------------------------------------------
# splitting a HookedTransformer over GPUs


def _block_device_fn():
    """TransformerLens's ``get_device_for_block_index`` as its forward pass calls it (looked up in
    the ``HookedTransformer`` module at call time, so a test can stand in a placement plan)."""
    return importlib.import_module("transformer_lens.HookedTransformer").get_device_for_block_index


def pipeline_plan(model) -> list[torch.device]:
    """Block ``i``'s device in a ``HookedTransformer``'s forward pass:
    ``get_device_for_block_index(i, cfg)`` (the residual stream is moved there before block
    ``i``; with ``cfg.n_devices = 1`` every block gets ``cfg.device``)."""
    fn = _block_device_fn()
    return [torch.device(fn(i, model.cfg)) for i in range(model.cfg.n_layers)]


def place_pipeline(model, device: torch.device | str, n_devices: int):
    """Split a ``HookedTransformer`` over ``n_devices`` devices starting at ``device``, in the
    pipeline order its forward pass expects (:func:`pipeline_plan`): the embedding (and positional
    embedding) with block 0, block ``i`` on its planned device, the final norm and the unembedding
    with the last block. Sets ``cfg.device`` / ``cfg.n_devices``; returns ``model``."""
    device = torch.device(device)
    model.cfg.device = str(device) if device.index is None else f"{device.type}:{device.index}"
    model.cfg.n_devices = int(n_devices)
    plan = pipeline_plan(model)
    for name in ("embed", "hook_embed", "pos_embed", "hook_pos_embed"):
        if hasattr(model, name):
            getattr(model, name).to(plan[0])
    for block, dev in zip(model.blocks, plan):
        block.to(dev)
    for name in ("ln_final", "unembed"):
        if hasattr(model, name):
            getattr(model, name).to(plan[-1])
    return model


# ----------------------------------------------------------------------------------------------
# placing a loaded model (load_model's device, dtype, n_devices, device_map)


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


def _place(model, *, bridge: bool, device=None, dtype=None, n_devices: int = 1) -> None:
    """Cast a loaded model to ``dtype`` and put it on ``device`` (one device) or split it over
    ``n_devices`` GPUs; ``bridge``: whether it is a ``TransformerBridge`` (a bridge dispatched by
    a device map stays where the map put it).

    The cast is ``nn.Module.to``: TransformerLens's own ``HookedTransformer.to(dtype)`` also
    rebuilds the state dict once per tensor (5 s on SmolLM2) for the same result, and its
    ``.to(torch.device)`` drops the device index."""
    if dtype is not None and getattr(model.cfg, "dtype", None) != dtype:
        if bridge:
            model.to(dtype, print_details=False)  # the bridge's own: keeps a dispatched split
        else:
            torch.nn.Module.to(model, dtype)
        model.cfg.dtype = dtype
    if bridge:
        if getattr(model.original_model, "hf_device_map", None):
            model.cfg.device = str(input_device(model))  # where encode() puts the tokens
        elif device is not None:
            model.to(device, print_details=False)
            model.cfg.device = str(device)  # (its .to(torch.device) records only the type)
    elif n_devices > 1:
        place_pipeline(model, device or torch.device("cuda"), n_devices)
    elif device is not None:
        torch.nn.Module.to(model, device)
        model.cfg.device = str(device)
        model.cfg.n_devices = 1


def stacked_weight(model, name: str, device: torch.device | None = None) -> Tensor:
    """``blocks[l].attn.{name}`` of every layer stacked (``[n_layers, ...]``) on ``device`` (default:
    the output device), where ``model.W_O`` and the like would fail across devices."""
    device = device or output_device(model)
    return torch.stack([getattr(b.attn, name).detach().to(device) for b in model.blocks])


# ----------------------------------------------------------------------------------------------
# memory-bounded batches


def free_memory(device: torch.device) -> int | None:
    """Free bytes on a CUDA device (``torch.cuda.mem_get_info``); None elsewhere (the CPU's budgets
    are fixed constants)."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    free, _total = torch.cuda.mem_get_info(device)
    return int(free)


def memory_budget(model, cpu_bytes: int, *, share: float = CUDA_BUDGET_SHARE) -> int:
    """Bytes one batch's largest transient tensor may take: ``cpu_bytes`` (today's constant) when
    the model lives on the CPU (or MPS), else ``share`` of the free memory of its fullest CUDA
    device (at least one row always fits: the batching functions ensure that)."""
    frees = [f for d in model_devices(model) if (f := free_memory(d)) is not None]
    if not frees:
        return int(cpu_bytes)
    return max(1, int(share * min(frees)))


__all__ = [
    "CUDA_BUDGET_SHARE", "DTYPES", "accumulation_dtype", "dtype_name", "free_memory",
    "input_device", "is_multi_device", "layer_devices", "memory_budget", "model_devices",
    "output_device", "pipeline_plan", "place_layer_rows", "place_pipeline", "resolve_device",
    "resolve_dtype", "resolve_n_devices", "stacked_weight",
]
