"""Helpers shared by the benchmark scripts (imported as ``_common``: each script runs with
``benchmarks/`` first on ``sys.path``)."""

from __future__ import annotations

import csv
import os
import threading
from pathlib import Path

import pandas as pd
import psutil


class PeakRSS:
    """Peak resident memory of this process while the block runs, sampled every ``every``
    seconds; ``start`` is the RSS on entry."""

    def __init__(self, every: float = 0.02):
        self.every = every

    def __enter__(self):
        self.proc, self._stop = psutil.Process(), threading.Event()
        self.start = self.peak = self.proc.memory_info().rss
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def _run(self):
        while not self._stop.wait(self.every):
            self.peak = max(self.peak, self.proc.memory_info().rss)

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, self.proc.memory_info().rss)


def append_csv(path: Path, fields: list[str], rows: list[dict]) -> None:
    """Append ``rows`` (missing fields blank) to ``path``, writing the header when it is new."""
    new = not path.exists()
    with open(path, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        if new:
            w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k, "") for k in fields})
        f.flush()
        os.fsync(f.fileno())


def md_table(df: pd.DataFrame) -> str:
    """A GitHub markdown table (no tabulate dependency)."""
    head = "| " + " | ".join(df.columns) + " |"
    rule = "|" + "|".join("---" for _ in df.columns) + "|"
    body = ["| " + " | ".join(str(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join([head, rule, *body])


def done_keys(path: Path, column: str = "key") -> set[str]:
    """The ``column`` values of a keyed results CSV (empty when the file does not exist)."""
    if not Path(path).exists():
        return set()
    with open(path, newline="") as f:
        return {r[column] for r in csv.DictReader(f) if r.get(column)}


def append_rows_atomic(path: Path, fields: list[str], rows: list[dict]) -> None:
    """Append ``rows`` to a keyed results CSV under a file lock, by rewriting it to a temporary
    sibling renamed over it (``sitelens.io``): a killed run leaves the old file or the new one,
    never a torn line. A file with another header is an error (move it away)."""
    import io

    from sitelens.io import atomic_write, locked

    path = Path(path)
    with locked(path):
        old = path.read_bytes() if path.exists() else b""
        if old.strip() and old.split(b"\n", 1)[0].decode().strip().split(",") != fields:
            raise SystemExit(f"{path} has other columns than {fields}; move it away and rerun.")
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
        if not old.strip():
            w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k, "") for k in fields})
        if old and not old.endswith(b"\n"):
            old += b"\n"
        atomic_write(path, old + buf.getvalue().encode())


_PINNED: dict[str, str] = {}


def pinned_source(module: str) -> str:
    """``sha256[:12]@commit`` of a sitelens module's file as this process imports it (read right
    before the import and checked unchanged after it; ``+dirty`` when it differs from HEAD), so
    rows made by a long run name the code that made them even if the file is edited meanwhile.
    Call it before anything imports ``module``."""
    if module not in _PINNED:
        import hashlib
        import importlib
        import subprocess
        import sys

        if module in sys.modules:
            raise RuntimeError(f"pinned_source({module!r}) must run before {module} is imported")
        root = Path(__file__).resolve().parent.parent
        path = root / (module.replace(".", "/") + ".py")
        before = path.read_bytes()
        importlib.import_module(module)
        if path.read_bytes() != before:
            raise SystemExit(f"{path} changed while it was imported; rerun.")
        try:
            commit = subprocess.run(["git", "log", "-1", "--format=%h", "--", str(path)], cwd=root,
                                    capture_output=True, text=True, check=True).stdout.strip()
            dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", str(path)], cwd=root).returncode
        except (OSError, subprocess.CalledProcessError):
            commit, dirty = "?", 0
        _PINNED[module] = (f"{hashlib.sha256(before).hexdigest()[:12]}@{commit}"
                           + ("+dirty" if dirty else ""))
    return _PINNED[module]
