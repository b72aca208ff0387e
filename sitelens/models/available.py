"""Whether a model name can load, checked before anything loads (:func:`check_model_available`):
bundled and tiny names, local Hugging Face directories, TransformerLens official names in the
local Hugging Face cache. Imports neither torch nor TransformerLens, so a bad ``--model`` is
refused at once (the loaders are in :mod:`sitelens.models.hf`)."""

from __future__ import annotations

import ast
import difflib
import importlib.util
import os
from pathlib import Path

from sitelens.errors import ModelError
from sitelens.models.hf_arch import check_hf_dir, check_hf_files
from sitelens.models.registry import BUNDLED_MODELS, TINY_MODELS

ALLOW_DOWNLOAD_ENV = "SITELENS_ALLOW_DOWNLOAD"


def _is_dir(name) -> bool:
    name = os.fspath(name) if isinstance(name, os.PathLike) else name
    try:
        return isinstance(name, str) and bool(name.strip()) and Path(name).expanduser().is_dir()
    except (OSError, RuntimeError):  # a name too long for a path; ~user that does not exist
        return False


def is_local_dir(name) -> bool:
    """Whether ``name`` names an existing directory (a local Hugging Face model directory)."""
    return _is_dir(name)


def _download_allowed() -> bool:
    return os.environ.get(ALLOW_DOWNLOAD_ENV, "") not in ("", "0")


def _official_names() -> list[str]:
    """TransformerLens's official model names, read from its data-only ``supported_models``
    module without importing the package (which imports torch and transformers); where that file
    is absent or its list is not a literal (another TransformerLens layout), from the package."""
    names = _official_names_from_source()
    if names is not None:
        return names
    try:
        from transformer_lens.supported_models import OFFICIAL_MODEL_NAMES
    except ImportError:  # older layouts
        try:
            from transformer_lens.loading_from_pretrained import OFFICIAL_MODEL_NAMES
        except ImportError:
            return []
    return list(OFFICIAL_MODEL_NAMES)


def _official_names_from_source() -> list[str] | None:
    """``OFFICIAL_MODEL_NAMES`` of ``transformer_lens/supported_models.py`` as a literal (parsed,
    never executed), or None."""
    try:
        spec = importlib.util.find_spec("transformer_lens")
    except (ImportError, ValueError):
        return None
    for root in (spec.submodule_search_locations or []) if spec else []:
        try:
            tree = ast.parse((Path(root) / "supported_models.py").read_text(encoding="utf-8"))
        except (OSError, SyntaxError, UnicodeDecodeError):
            continue
        for node in tree.body:
            target = node.target if isinstance(node, ast.AnnAssign) else (
                node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None)
            if isinstance(target, ast.Name) and target.id == "OFFICIAL_MODEL_NAMES" and node.value:
                try:
                    names = ast.literal_eval(node.value)
                except ValueError:
                    return None
                return [str(n) for n in names] if isinstance(names, (list, tuple)) else None
    return None


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


def check_model_available(name: str, backend: str | None = None) -> None:
    """Raise :class:`ModelError` at once if :func:`~sitelens.models.load.load_model` cannot load
    ``name`` from local files: an empty or unknown name, a directory without ``config.json`` or of
    an architecture ``backend`` cannot load (:func:`~sitelens.models.hf_arch.check_hf_dir`; the
    error names the family and what is missing) or with files that cannot load (no or truncated
    weights, a dtype that is not a float type, no tokenizer:
    :func:`~sitelens.models.hf_arch.check_hf_files`), or a TransformerLens official model whose weights
    are not in the local Hugging Face cache. Reads no
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
        check_hf_dir(name, backend=backend)
        check_hf_files(name)
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


__all__ = ["ALLOW_DOWNLOAD_ENV", "check_model_available", "hf_cached", "is_local_dir"]
