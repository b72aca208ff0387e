"""Which architecture family a local Hugging Face model directory is, read from its own
``config.json`` (``architectures``, else ``model_type``), and whether the chosen backend can load it
(:func:`check_hf_dir`), and whether its files can load (:func:`check_hf_files`: weights, dtype,
tokenizer). Imports neither torch nor TransformerLens: the CLI refuses an unsupported
directory before any work. The families, and the ``model_type`` values that name them, are
:data:`sitelens.models.families.FAMILIES`; the conversion itself is in
:mod:`sitelens.models.hf_convert`.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

from sitelens.errors import ModelError
from sitelens.models.families import BY_ARCHITECTURE, FAMILIES, MODEL_TYPES, Family

# config keys that mark a mixture-of-experts MLP (Mixtral, Qwen2-MoE, OLMoE, DeepSeek, ...)
_MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_intermediate_size")


_RESAVE = "save the model into the directory again (model.save_pretrained(DIR))"


def read_config(path: str | Path) -> dict:
    """The directory's ``config.json`` as a dict (:class:`ModelError` when absent or not JSON)."""
    file = Path(path).expanduser() / "config.json"
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except OSError as e:
        raise ModelError(f"Cannot read {file}: {e.strerror or e}; {_RESAVE}.") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise ModelError(f"{file} is not valid JSON ({e}); fix it, or {_RESAVE}.") from None
    if not isinstance(data, dict):
        raise ModelError(f"{file} is not a JSON object; fix it, or {_RESAVE}.")
    return data


def architecture_of(config: dict) -> str | None:
    """The Hugging Face class the config names (``architectures[0]``), else the causal-LM class of
    its ``model_type`` (:data:`~sitelens.models.families.MODEL_TYPES`), else None."""
    archs = config.get("architectures")
    if isinstance(archs, list) and archs and isinstance(archs[0], str):
        return archs[0]
    return MODEL_TYPES.get(str(config.get("model_type", "")))


def family_of(config: dict) -> Family | None:
    """The :class:`~sitelens.models.families.Family` of a config, or None for one sitelens does not
    know (the family is the architecture's; a ``model_type`` alone also names it)."""
    arch = architecture_of(config)
    return BY_ARCHITECTURE.get(arch) if arch else None


def check_hf_dir(path: str | Path, *, backend: str | None) -> Family | None:
    """Raise :class:`ModelError`, naming the family and what is missing, when ``backend`` cannot
    load the Hugging Face directory ``path``: on ``"hooked"`` an unknown architecture, a
    mixture-of-experts one, or a family TransformerLens 3.9 cannot convert; on ``"bridge"`` (or
    ``None``, backend not yet resolved) only a mixture-of-experts one (the bridge's own adapters
    decide the rest when it loads). Returns the family (None if unknown)."""
    config = read_config(path)
    arch = architecture_of(config) or "?"
    model_type = config.get("model_type", "?")
    fam = family_of(config)
    where = f"The Hugging Face directory {str(path)!r} (architecture {arch}, model_type {model_type!r})"
    moe = [k for k in _MOE_KEYS if config.get(k)]
    if moe or "moe" in arch.lower():
        raise ModelError(
            f"{where} is a mixture-of-experts model ({', '.join(moe) or arch}); sitelens supports "
            "dense families only (its head effects, injection and lenses assume one MLP per block)."
        )
    if backend != "hooked":
        return fam
    if fam is None:
        known = ", ".join(f"{f.name} ({f.architecture})" for f in FAMILIES.values() if f.supported)
        raise ModelError(
            f"{where} is not a family sitelens maps to a TransformerLens HookedTransformer; missing: "
            f"a HookedTransformer conversion for {arch}. Families that load: {known}. Try "
            "backend='bridge' (--backend bridge) if TransformerBridge supports it."
        )
    if not fam.supported:
        raise ModelError(f"{where} is family {fam.name!r}; missing: {fam.unsupported}.")
    return fam


# weights files a local directory may hold (transformers' own names), single or sharded by an index
WEIGHTS_FILES = ("model.safetensors", "pytorch_model.bin")
WEIGHTS_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
# the dtypes a config.json may name (``dtype``, ``torch_dtype``): torch's floating-point types
FLOAT_DTYPES = ("float32", "float16", "bfloat16", "float64", "float", "half", "double",
                "float8_e4m3fn", "float8_e5m2")
# a tokenizer's vocabulary: one of these files, or any *.model (sentencepiece) or *.tiktoken file
# (a tokenizer_config.json alone holds none: transformers then builds an empty tokenizer)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt")


def _safetensors_problem(file: Path) -> str | None:
    """What is wrong with a ``.safetensors`` file, read from its header alone (the 8-byte header
    length, the JSON header, the tensors' byte ranges against the file's size), or None."""
    try:
        size = file.stat().st_size
        with file.open("rb") as f:
            head = f.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else None
            if n is None or n > size - 8:
                return (f"{file.name} is truncated or not a safetensors file ({size} bytes, too few "
                        "for its header)")
            header = json.loads(f.read(n).decode("utf-8"))
    except OSError as e:
        return f"{file.name} cannot be read ({e.strerror or e})"
    except (ValueError, UnicodeDecodeError):
        return f"{file.name} has a corrupt header (not JSON)"
    if not isinstance(header, dict):
        return f"{file.name} has a corrupt header (not a JSON object)"
    try:
        end = max((int(t["data_offsets"][1]) for k, t in header.items() if k != "__metadata__"),
                  default=0)
    except (TypeError, KeyError, IndexError, ValueError):
        return f"{file.name} has a corrupt header (tensors without data_offsets)"
    if 8 + n + end != size:
        return (f"{file.name} is truncated or corrupt: its header describes {8 + n + end} bytes, "
                f"the file holds {size}")
    return None


def _torch_file_problem(file: Path) -> str | None:
    """What is wrong with a ``torch.save`` file, read from its first and last bytes alone: a zip
    archive (torch >= 1.6; a truncated one has lost its central directory at the end) or a legacy
    pickle (0x80 and a protocol 2 to 5), or None."""
    try:
        with file.open("rb") as f:
            first = f.read(2)
        if zipfile.is_zipfile(file) or (len(first) == 2 and first[0] == 0x80 and 2 <= first[1] <= 5):
            return None
    except OSError as e:
        return f"{file.name} cannot be read ({e.strerror or e})"
    return f"{file.name} is truncated or not a PyTorch checkpoint (neither a zip archive nor a pickle)"


def _weights_problem(path: Path) -> str | None:
    """What is wrong with the directory's weights files, or None."""
    for index in WEIGHTS_INDEXES:
        if (path / index).is_file():
            try:
                shards = sorted(set(json.loads((path / index).read_text(encoding="utf-8"))
                                    ["weight_map"].values()))
            except (OSError, ValueError, UnicodeDecodeError, KeyError, TypeError, AttributeError):
                return f"{index} is not a valid weights index (no weight_map)"
            missing = [s for s in shards if not (path / s).is_file()]
            if missing:
                return f"{index} names {len(missing)} shard(s) that are missing ({missing[0]}, ...)"
            return next((p for s in shards if s.endswith(".safetensors")
                         if (p := _safetensors_problem(path / s))), None)
    if (path / WEIGHTS_FILES[0]).is_file():
        return _safetensors_problem(path / WEIGHTS_FILES[0])
    if (path / WEIGHTS_FILES[1]).is_file():
        return _torch_file_problem(path / WEIGHTS_FILES[1])
    return (f"no weights file ({', '.join(WEIGHTS_FILES)}, or a sharded "
            f"{' / '.join(WEIGHTS_INDEXES)})")


def check_hf_files(path: str | Path) -> None:
    """Raise :class:`ModelError`, naming the directory, what is wrong and the fix, when the files
    of the Hugging Face directory ``path`` cannot load: no weights file, a truncated or corrupt
    ``.safetensors`` file (checked from its header and size, no tensor read), a ``dtype`` in
    ``config.json`` that is not a floating-point torch type, no tokenizer vocabulary. Reads no
    weights; imports neither torch nor transformers."""
    path = Path(path).expanduser()
    where = f"The Hugging Face directory {str(path)!r}"
    config = read_config(path)
    for key in ("dtype", "torch_dtype"):
        value = config.get(key)
        if value is not None and value != "auto" and value not in FLOAT_DTYPES:
            raise ModelError(
                f"{where} has config.json {key!r}: {value!r}, which is not a floating-point torch "
                f"dtype; set it to one of {', '.join(FLOAT_DTYPES[:3])} (or remove it).")
    problem = _weights_problem(path)
    if problem is not None:
        raise ModelError(
            f"{where} cannot load: {problem}; save the model into it again "
            "(model.save_pretrained(DIR)) or copy its complete weights files there.")
    if not any(f.is_file() and (f.name in TOKENIZER_FILES or f.suffix in (".model", ".tiktoken"))
               for f in path.iterdir()):
        raise ModelError(
            f"{where} has no tokenizer (none of {', '.join(TOKENIZER_FILES)}); save the model's "
            "tokenizer into it (tokenizer.save_pretrained(DIR)).")


__all__ = ["architecture_of", "check_hf_dir", "check_hf_files", "family_of", "read_config"]
