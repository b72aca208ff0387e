"""Models from Hugging Face files: TransformerLens official names (read from the local Hugging Face
cache, never downloaded unless ``$SITELENS_ALLOW_DOWNLOAD`` is set), local Hugging Face
directories, and the check that a name can load before anything loads
(:func:`check_model_available`).
"""

from __future__ import annotations

import difflib
import os
from contextlib import contextmanager
from pathlib import Path

import torch

from sitelens.errors import ModelError
from sitelens.models.bridge import _bridge_from_hf
from sitelens.models.gguf import _from_llama_hf
from sitelens.models.registry import BUNDLED_MODELS, TINY_MODELS

ALLOW_DOWNLOAD_ENV = "SITELENS_ALLOW_DOWNLOAD"


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


def _official_names() -> list[str]:
    try:
        from transformer_lens.supported_models import OFFICIAL_MODEL_NAMES
    except ImportError:  # older layouts
        try:
            from transformer_lens.loading_from_pretrained import OFFICIAL_MODEL_NAMES
        except ImportError:
            return []
    return list(OFFICIAL_MODEL_NAMES)


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
    """Raise :class:`ModelError` at once if :func:`~sitelens.models.load.load_model` cannot load
    ``name`` from local files: an empty or unknown name, a directory without ``config.json``, or a
    TransformerLens official model whose weights are not in the local Hugging Face cache. Reads no
    weights and makes no network requests (set ``SITELENS_ALLOW_DOWNLOAD=1`` to let TransformerLens
    download uncached official models instead)."""
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


def _load_official(name: str, *, n_ctx: int, backend: str, device=None, dtype=None,
                   n_devices: int = 1, device_map=None):
    """A TransformerLens official model from the local Hugging Face cache (checked first by
    :func:`check_model_available`), in Hub offline mode unless downloads are allowed. Loaded in
    ``dtype`` (no float32 copy of a large model); a ``HookedTransformer`` goes to ``device`` (one
    device) or stays on the CPU for the finalizing step to split (``n_devices`` > 1); a bridge
    gets ``device`` / ``n_devices`` / ``device_map`` from Hugging Face."""
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


def _load_hf_dir(path: Path, *, n_ctx: int, backend: str = "hooked", device=None, dtype=None,
                 n_devices: int = 1, device_map=None):
    """A local Hugging Face directory: a bridge loads in ``dtype`` with Hugging Face's
    ``device_map`` (or a balanced one over ``n_devices`` GPUs); a ``HookedTransformer`` is
    converted from float32 (cast and placed when it is finalized)."""
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


__all__ = ["ALLOW_DOWNLOAD_ENV", "check_model_available", "hf_cached"]
