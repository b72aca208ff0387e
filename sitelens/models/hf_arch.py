"""Which architecture family a local Hugging Face model directory is, read from its own
``config.json`` (``architectures``, else ``model_type``), and whether the chosen backend can load it
(:func:`check_hf_dir`). Imports neither torch nor TransformerLens: the CLI refuses an unsupported
directory before any work. The families, and the ``model_type`` values that name them, are
:data:`sitelens.models.families.FAMILIES`; the conversion itself is in
:mod:`sitelens.models.hf_convert`.
"""

from __future__ import annotations

import json
from pathlib import Path

from sitelens.errors import ModelError
from sitelens.models.families import BY_ARCHITECTURE, FAMILIES, MODEL_TYPES, Family

# config keys that mark a mixture-of-experts MLP (Mixtral, Qwen2-MoE, OLMoE, DeepSeek, ...)
_MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_intermediate_size")


def read_config(path: str | Path) -> dict:
    """The directory's ``config.json`` as a dict (:class:`ModelError` when absent or not JSON)."""
    file = Path(path).expanduser() / "config.json"
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except OSError as e:
        raise ModelError(f"Cannot read {file}: {e.strerror or e}.") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise ModelError(f"{file} is not valid JSON ({e}).") from None
    if not isinstance(data, dict):
        raise ModelError(f"{file} is not a JSON object.")
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


__all__ = ["architecture_of", "check_hf_dir", "family_of", "read_config"]
