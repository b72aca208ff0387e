"""Resumable runs: cells, the stores that keep them, and config overrides for run entry points.

A **cell** is one cached result, keyed by a hash of everything that produced it
(:func:`row_key`, :mod:`sitelens.provenance`); a cell whose key differs is recomputed, never
reused. Three stores keep cells:

- :class:`ResultsStore`: keyed rows of one results CSV (``sitelens bench``, every benchmark). A
  row whose key is already done is skipped, nothing is overwritten; appends take the file's lock
  (:func:`sitelens.io.locked`) and replace the file atomically, so concurrent writers lose no row
  and a killed run leaves the old file or the new one.
- :class:`ObjectCache`: keyed tensors / picklable objects (``torch.save``), one file per key.
- :class:`CellStore`: files (or adapter directories) of one run directory, plus a timings ledger
  (``sitelens figures``).

:func:`config_with_overrides` builds a config dataclass from an optional config plus keyword
overrides, so that entry points (:func:`sitelens.pipelines.figures.make_figures`,
:func:`sitelens.pipelines.bench.run_bench`, :func:`sitelens.patching.effects.head_causal_effects`)
accept every field as a keyword without repeating the field list.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import os
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pandas as pd

from sitelens.errors import OutputError
from sitelens.io import atomic_write, atomic_write_csv, atomic_write_text, flocked, locked
from sitelens.provenance import settings_hash

ConfigT = TypeVar("ConfigT")


def slug(name: str) -> str:
    """``name`` made safe as a file name (anything but letters, digits, ``-_.`` becomes ``_``)."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


@contextlib.contextmanager
def _dir_locked(directory: Path):
    """An exclusive ``flock`` on ``directory`` itself (no lock file among the cells) while the body
    runs: the processes of one sweep take turns updating the timings ledger."""
    with flocked(os.open(directory, os.O_RDONLY)):
        yield


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


def row_key(settings: dict, n: int = 16) -> str:
    """The key of a results row: :func:`sitelens.provenance.settings_hash` of ``settings``, which
    must hold everything that made the row (model and weight fingerprint, task hash, method
    parameters, seed, sizes, numerics version)."""
    return settings_hash(settings, n=n)


def _field(value: Any) -> Any:
    """A value as a CSV field: NaN as an empty field (read back as NaN)."""
    return "" if isinstance(value, float) and math.isnan(value) else value


class ResultsStore:
    """The keyed rows of one results CSV with the header ``columns``.

    ``key`` names the key column (``None``: an unkeyed measurement log, where every append is a
    new measurement). ``done(row)`` says whether a row on disk finishes its key (default: every
    row; e.g. ``status == "ok"`` where a failed cell is recorded and retried). :meth:`append`
    skips rows whose key is done on disk and never rewrites a row; the rows of one call are one
    cell's (several rows may share its key) and are written together. A file with one of the
    ``older`` headers is read with the missing columns blank, and the first append rewrites it
    with ``columns`` (every old row kept as it was written)."""

    def __init__(self, path: str | Path, columns: Sequence[str], *, key: str | None = "key",
                 done: Callable[[dict], bool] | None = None, older: Sequence[Sequence[str]] = ()):
        self.path = Path(path)
        self.columns = list(columns)
        self.key = key
        self.done = done
        self.older = [list(h) for h in older]
        if key is not None and key not in self.columns:
            raise ValueError(f"the key column {key!r} is not among the columns {self.columns}")

    def header(self, content: bytes) -> list[str]:
        """The header of ``content``: :attr:`columns` or one of the ``older`` headers, else an
        :class:`OutputError` naming both."""
        header = content.split(b"\n", 1)[0].decode(errors="replace").strip().split(",")
        if header != self.columns and header not in self.older:
            raise OutputError(f"{self.path} has columns {header}, not {self.columns}. Use another "
                              "output or move the old file away.")
        return header

    def _rows(self, content: bytes) -> list[dict]:
        if not content.strip():
            return []
        self.header(content)
        return [{c: r.get(c) or "" for c in self.columns}
                for r in csv.DictReader(io.StringIO(content.decode()))]

    def rows(self) -> list[dict]:
        """Every row on disk, as strings (an empty list when the file does not exist)."""
        return self._rows(self.path.read_bytes() if self.path.exists() else b"")

    def _done_keys(self, rows: Iterable[dict]) -> set[str]:
        return {r[self.key] for r in rows if r.get(self.key) and (self.done is None or self.done(r))}

    def keys(self) -> set[str]:
        """The keys whose rows are done."""
        return set() if self.key is None else self._done_keys(self.rows())

    def __contains__(self, key: str) -> bool:
        return key in self.keys()

    def read(self, **read_csv) -> pd.DataFrame:
        """The file as a DataFrame (empty, with :attr:`columns`, when it does not exist)."""
        if not self.path.exists() or not self.path.read_bytes().strip():
            return pd.DataFrame(columns=self.columns)
        self.rows()  # checks the header
        return pd.read_csv(self.path, **read_csv)

    def append(self, rows: Iterable[dict]) -> int:
        """Append ``rows`` (missing fields blank, NaN blank) under the lock by an atomic rewrite;
        returns how many were written (rows whose key is done are skipped)."""
        rows = list(rows)
        with locked(self.path):
            old = self.path.read_bytes() if self.path.exists() else b""
            done = set() if self.key is None else self._done_keys(self._rows(old))
            buf = io.StringIO()
            writer = csv.DictWriter(buf, fieldnames=self.columns, lineterminator="\n")
            if not old.strip() or self.header(old) != self.columns:
                writer.writeheader()
                for r in self._rows(old):  # an older header: its rows under the full one
                    writer.writerow(r)
                old = b""
            n = 0
            for row in rows:
                k = None if self.key is None else str(row.get(self.key) or "")
                if k and k in done:
                    continue
                writer.writerow({c: _field(row.get(c, "")) for c in self.columns})
                n += 1
            if n:
                if old and not old.endswith(b"\n"):
                    old += b"\n"
                atomic_write(self.path, old + buf.getvalue().encode())
        return n


class ObjectCache:
    """Keyed tensors and other picklable objects under ``directory``: ``{name}_{key}.pt``, the key
    a :func:`sitelens.provenance.settings_hash` of ``params``; written atomically, so a killed
    run leaves no half-written file. Read back with ``weights_only=False``: only for files this
    cache wrote."""

    def __init__(self, directory: str | Path):
        self.dir = Path(directory)

    def path(self, name: str, params: dict) -> Path:
        return self.dir / f"{name}_{settings_hash(params)}.pt"

    def get(self, name: str, params: dict, compute: Callable[[], Any]) -> Any:
        """The object ``name`` with ``params``: loaded when cached, else ``compute()``d and saved."""
        import torch

        path = self.path(name, params)
        if path.exists():
            return torch.load(path, weights_only=False)
        value = compute()
        buf = io.BytesIO()
        torch.save(value, buf)
        atomic_write(path, buf.getvalue())
        return value


__all__ = [
    "CellStore", "ObjectCache", "ResultsStore", "row_key", "slug",
]
