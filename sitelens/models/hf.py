"""Models from Hugging Face files: TransformerLens official names (read from the local Hugging Face
cache, never downloaded unless ``$SITELENS_ALLOW_DOWNLOAD`` is set), local Hugging Face
directories. The check that a name can load before anything loads (:func:`check_model_available`)
is in :mod:`sitelens.models.available`, which imports no torch.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import torch

from sitelens.errors import ModelError
from sitelens.models.available import (  # noqa: F401 (re-exported: load.py reads _is_dir here)
    ALLOW_DOWNLOAD_ENV,
    _download_allowed,
    _is_dir,
    _official_names,
    check_model_available,
    hf_cached,
)
from sitelens.models.bridge import bridge_from_hf
from sitelens.models.hf_arch import architecture_of, check_hf_dir, check_hf_files, read_config
from sitelens.models.hf_convert import hooked_from_hf


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


def _capped_n_ctx(name: str, n_ctx: int) -> int:
    """``n_ctx`` capped at the official model's own context length (read from its cached
    ``config.json`` by TransformerLens): learned position embeddings (GPT-2's 1024) cannot be
    stretched, and local directories and bundled models cap it the same way."""
    from transformer_lens.loading_from_pretrained import get_pretrained_model_config

    own = get_pretrained_model_config(name).n_ctx
    return min(int(n_ctx), int(own or n_ctx))


def _load_official(name: str, *, n_ctx: int, backend: str, device=None, dtype=None,
                   n_devices: int = 1, device_map=None):
    """A TransformerLens official model from the local Hugging Face cache (checked first by
    :func:`check_model_available`), in Hub offline mode unless downloads are allowed. As a local
    directory or a bundled model: LayerNorm folded, writing weights and unembedding not centred
    (the Hugging Face model's own logits), ``n_ctx`` capped at the model's own. Loaded in
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
                # booted at the model's own context (learned position embeddings cannot be
                # stretched), then capped as a local directory's bridge is
                model = TransformerBridge.boot_transformers(name, dtype=dtype, **kw)
                model.cfg.n_ctx = min(int(n_ctx), int(model.cfg.n_ctx or n_ctx))
            else:
                from transformer_lens import HookedTransformer

                n_ctx = _capped_n_ctx(name, n_ctx)
                one = n_devices == 1
                model = HookedTransformer.from_pretrained(
                    name, n_ctx=n_ctx, default_padding_side="left", dtype=dtype,
                    center_writing_weights=False, center_unembed=False,  # HF's own logits
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


@contextmanager
def _folder_errors(path: Path):
    """A failure of transformers to read the files of the directory ``path`` (the checks of
    :func:`~sitelens.models.hf_arch.check_hf_files` passed, yet a file is unreadable: a corrupt
    ``pytorch_model.bin``, weights that do not match config.json) as one :class:`ModelError`
    naming the folder, whatever the exception (a garbled pickle raises anything from IndexError to
    UnpicklingError); running out of memory is not a folder's failure and is raised as it is."""
    try:
        yield
    except (MemoryError, torch.cuda.OutOfMemoryError):
        raise
    except Exception as e:  # whatever transformers and torch raise on a bad file (pickle, zip, ...)
        why = (str(e).strip().splitlines() or [""])[0]
        raise ModelError(
            f"The Hugging Face directory {str(path)!r} cannot load ({type(e).__name__}: {why}); "
            "save the model and its tokenizer into it again (save_pretrained(DIR)) or copy its "
            "complete files there.") from e


@contextmanager
def _quiet_transformers():
    """transformers' warnings and progress bars off for the duration (a failed load is one line
    of sitelens's own; a loaded folder's size is printed by the loader)."""
    from transformers.utils import logging as hf_logging

    level, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


def _check_loading_info(path: Path, info: dict) -> None:
    """Refuse a folder whose weights do not fit the model its ``config.json`` describes: a tensor
    of another shape (a ``hidden_size`` or ``intermediate_size`` edited by hand) or one the model
    needs that the weights lack (transformers would fill it with random numbers)."""
    where = f"The Hugging Face directory {str(path)!r}"
    mismatched = list(info.get("mismatched_keys") or [])
    if mismatched:
        key, in_file, in_model = mismatched[0]
        raise ModelError(
            f"{where} does not match its config.json: {key} is {list(in_file)} in the weights but "
            f"{list(in_model)} in the model config.json describes ({len(mismatched)} tensor(s) "
            "differ); correct config.json (hidden_size, intermediate_size, vocab_size, ...) or "
            "save the model into it again (save_pretrained(DIR)).")
    missing = sorted(info.get("missing_keys") or [])
    if missing:
        raise ModelError(
            f"{where} lacks {len(missing)} weight(s) the model of its config.json needs "
            f"({missing[0]}, ...), which would be random; save the model into it again "
            "(save_pretrained(DIR)) or copy its complete weights files there.")


def _load_hf_dir(path: Path, *, n_ctx: int, backend: str = "hooked", device=None, dtype=None,
                 n_devices: int = 1, device_map=None):
    """A local Hugging Face directory of any family sitelens maps, read from the folder's own
    ``config.json`` (:mod:`sitelens.models.hf_arch`): a bridge loads in ``dtype`` with Hugging
    Face's ``device_map`` (or a balanced one over ``n_devices`` GPUs); a ``HookedTransformer`` is
    converted from float32 (:func:`~sitelens.models.hf_convert.hooked_from_hf`; cast and placed
    when it is finalized). An unsupported architecture: :class:`ModelError` before any weight
    loads."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    check_hf_dir(path, backend=backend)  # before anything loads
    check_hf_files(path)
    arch = architecture_of(read_config(path))
    with _folder_errors(path):
        tokenizer = AutoTokenizer.from_pretrained(str(path))
    if not tokenizer("a b", add_special_tokens=False)["input_ids"]:
        raise ModelError(f"The Hugging Face directory {str(path)!r} has a tokenizer that encodes "
                         "text to nothing (no vocabulary); save the model's tokenizer into it "
                         "(tokenizer.save_pretrained(DIR)).")
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
    with _folder_errors(path), _quiet_transformers():
        # mismatched sizes are reported here (one line naming the tensor), not as transformers'
        # multi-line load report; the model loaded with them is thrown away
        hf, info = AutoModelForCausalLM.from_pretrained(
            str(path), ignore_mismatched_sizes=True, output_loading_info=True,
            **{"dtype": torch.float32, **kw})
    _check_loading_info(path, info)
    if arch is not None and not getattr(hf.config, "architectures", None):
        hf.config.architectures = [arch]  # a config.json with model_type only
    if backend == "bridge":
        return bridge_from_hf(
            hf, tokenizer, name=path.name, prepend_bos=tokenizer.bos_token is not None, n_ctx=n_ctx
        )
    return hooked_from_hf(hf, tokenizer, arch=arch, n_ctx=n_ctx, name=str(path))


__all__ = ["ALLOW_DOWNLOAD_ENV", "check_model_available", "hf_cached"]
