"""Resumable runs: cells, the store that keeps them, and config overrides for run entry points.

A **cell** is one cached result, keyed by a hash of everything that produced it: a file (or an
adapter directory) under a run directory for ``sitelens figures`` (:class:`CellStore`), a row of
the results CSV for ``sitelens bench`` (:func:`sitelens.pipelines.bench.cell_key`). A cell whose key differs
is recomputed, never reused (:mod:`sitelens.provenance`).

:func:`config_with_overrides` builds a config dataclass from an optional config plus keyword
overrides, so that entry points (:func:`sitelens.pipelines.figures.make_figures`,
:func:`sitelens.pipelines.bench.run_bench`, :func:`sitelens.patching.effects.head_causal_effects`)
accept every field as a keyword without repeating the field list.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pandas as pd

from sitelens.io import atomic_write_csv, atomic_write_text
from sitelens.provenance import settings_hash

ConfigT = TypeVar("ConfigT")


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


def slug(name: str) -> str:
    """``name`` made safe as a file name (anything but letters, digits, ``-_.`` becomes ``_``)."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


@contextlib.contextmanager
def _dir_locked(directory: Path):
    """An exclusive ``flock`` on ``directory`` itself (no lock file among the cells) while the body
    runs: the processes of one sweep take turns updating the timings ledger."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


class CellStore:
    """The cells of one run directory, plus a timings ledger (``timings.json``); both survive
    restarts.

    A cell's file name is ``{name}_{key}{suffix}``, where the key hashes its parameters *and*
    ``base`` (for ``sitelens figures``: the model's weight fingerprint, the prompt template and
    :data:`sitelens.provenance.NUMERICS_VERSION`; callers add each task's split hash). A cell made
    by other code, weights or settings has another name, so it is recomputed, never reused."""

    def __init__(self, directory: Path, log: Callable[[str], None], base: dict | None = None):
        self.dir = directory
        self.base = dict(base or {})
        self.dir.mkdir(parents=True, exist_ok=True)
        self.log = log
        self.ledger_path = self.dir / "timings.json"
        try:
            self.timings = json.loads(self.ledger_path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            self.timings = {}

    def key(self, params: dict) -> str:
        """The 8-hex-digit hash of ``params`` and :attr:`base`."""
        return settings_hash({**params, "base": self.base}, n=8)

    def path(self, name: str, params: dict, suffix: str = "") -> Path:
        """Where the cell ``name`` (may contain ``/``: a subfolder) with ``params`` lives."""
        return self.dir / f"{name}_{self.key(params)}{suffix}"

    def record(self, name: str, seconds: float) -> None:
        """Write ``seconds`` for ``name`` into the timings ledger: atomically, under a lock, merged
        with what other processes (workers of one sweep) recorded since this store was opened."""
        with _dir_locked(self.dir):
            try:
                on_disk = json.loads(self.ledger_path.read_text())
            except (FileNotFoundError, json.JSONDecodeError):
                on_disk = {}
            self.timings = {**self.timings, **on_disk, name: round(seconds, 2)}
            atomic_write_text(self.ledger_path, json.dumps(self.timings, indent=1, sort_keys=True))

    def csv(self, name: str, params: dict, compute: Callable[[], pd.DataFrame]) -> pd.DataFrame:
        """The CSV cell ``name``: read back if a readable one exists, else ``compute()``d,
        written atomically and timed."""
        path = self.path(name, params, ".csv")
        if path.exists():
            try:
                return pd.read_csv(path)
            except (pd.errors.ParserError, pd.errors.EmptyDataError):
                self.log(f"  {path.name} is unreadable; recomputing")
        self.log(f"  computing {name} ...")
        t0 = time.perf_counter()
        df = compute()
        dt = time.perf_counter() - t0
        atomic_write_csv(path, df)
        self.record(name, dt)
        self.log(f"  {name} done in {dt:.1f}s")
        return df


__all__ = ["CellStore", "config_with_overrides", "slug"]
