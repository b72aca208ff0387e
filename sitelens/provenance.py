"""What made a result: the numerics version of sitelens and stable hashes of settings.

Every cached or resumable result (a ``sitelens bench`` row, a ``sitelens figures`` cell) is keyed
on everything that produced it — model and weight fingerprint, task and a hash of its splits, the
method and all its hyperparameters, the prompt template, seed, sizes — and on
:data:`NUMERICS_VERSION`. A row or cell whose key differs is recomputed, never reused.

Bump :data:`NUMERICS_VERSION` (and write one line in :data:`NUMERICS_HISTORY`) with any change
that can move a result: the attention path, caching, batching, scoring, prompt building, default
hyperparameters. The golden tests (``tests/test_golden.py``) fail on such a change until they are
regenerated with ``python scripts/regenerate_golden.py``, which refuses to run unless the version
was bumped.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from typing import Any, TypeVar

ConfigT = TypeVar("ConfigT")

NUMERICS_VERSION = 3

NUMERICS_HISTORY = {
    1: "everything before provenance keys existed (fused SDPA attention, batched prefix caches)",
    2: "results keyed on settings + numerics version; no change of numerics from 1",
    3: "answers scored on their first token that carries text: whitespace-only leading tokens "
       "(the space of ' 150' under digit-splitting tokenizers) end the prompt instead",
}
# What each bump moved, as a rule over tasks: sitelens.tasks.numerics.NUMERICS_TOUCHES (it reads
# answer tokens, a layer above this module).



OMIT_DEFAULT = "omit_default"  # field metadata: left out of canonical() while at its default


def at_omitted_default(obj: Any, f: dataclasses.Field) -> bool:
    """Whether field ``f`` of ``obj`` is marked ``metadata={OMIT_DEFAULT: True}`` (a setting added
    after records and hashes were written) and holds its default, so that canonical forms (and
    the hashes and records made from them) stay those of before the field existed."""
    return bool(f.metadata.get(OMIT_DEFAULT)) and getattr(obj, f.name) == f.default


def canonical(obj: Any) -> Any:
    """A JSON-able, order-independent form of ``obj`` (dataclasses, tuples, sets, floats).
    Dataclass fields declared with ``compare=False`` (bookkeeping, not settings) are left out, and
    so are fields at their default marked :data:`OMIT_DEFAULT` (:func:`at_omitted_default`)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {"__type__": type(obj).__name__,
                **{f.name: canonical(getattr(obj, f.name)) for f in dataclasses.fields(obj)
                   if f.compare and not at_omitted_default(obj, f)}}
    if isinstance(obj, dict):
        return {str(k): canonical(v) for k, v in sorted(obj.items(), key=lambda kv: str(kv[0]))}
    if isinstance(obj, (list, tuple)):
        return [canonical(v) for v in obj]
    if isinstance(obj, (set, frozenset)):
        return sorted(canonical(v) for v in obj)
    if isinstance(obj, float):
        if math.isnan(obj):
            return "nan"
        if math.isinf(obj):
            return "inf" if obj > 0 else "-inf"
        return float(repr(obj))
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    return repr(obj)


def settings_hash(obj: Any, n: int = 12) -> str:
    """Short SHA-256 of the canonical JSON of ``obj`` (stable across runs and machines)."""
    text = json.dumps(canonical(obj), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:n]


def task_hash(task) -> str:
    """Hash of a task's name, splits (every input and output, in order), case rule and, when the
    task defines them, its labels (a task without labels adds no labels entry, so results keyed
    on such a task keep their keys)."""
    labels = getattr(task, "labels", None)
    return settings_hash({
        "name": task.name,
        "case_sensitive": task.case_sensitive,
        **{s: [[ex.input, ex.output] for ex in getattr(task, s)] for s in ("train", "valid", "test")},
        **({"labels": list(labels)} if labels else {}),
    })




def config_with_overrides(
    config_type: type[ConfigT], config: ConfigT | None, overrides: dict[str, Any], where: str
) -> ConfigT:
    """``config`` (default ``config_type()``) with the fields in ``overrides`` replaced. An
    unknown name raises ``TypeError`` naming ``where`` and the valid fields."""
    if config is not None and not isinstance(config, config_type):
        raise TypeError(
            f"{where}: config must be a {config_type.__name__}, got {type(config).__name__}."
        )
    fields = [f.name for f in dataclasses.fields(config_type)]
    unknown = sorted(set(overrides) - set(fields))
    if unknown:
        raise TypeError(
            f"{where}() got unexpected keyword argument(s) {', '.join(map(repr, unknown))}; "
            f"{config_type.__name__} fields are: {', '.join(fields)}."
        )
    config = config_type() if config is None else config
    return dataclasses.replace(config, **overrides) if overrides else config


__all__ = [
    "NUMERICS_VERSION", "NUMERICS_HISTORY", "canonical", "settings_hash", "task_hash",
    "config_with_overrides",
]
