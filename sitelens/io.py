"""Every file sitelens writes goes through here: atomic, of the right kind, never clobbering.

- :func:`atomic_write` (and the ``_text`` / ``_json`` / ``_csv`` forms): write to a temporary
  sibling, fsync, rename over the target — a crash leaves the old file or the new one, never a
  half-written one, and no temporary file on an error.
- :func:`atomic_write_dir`: a directory of files, filled in a temporary sibling directory and then
  renamed into place (readers never see a half-filled one), e.g. the processed-weight cache.
- :func:`new_dir_or_nothing`: an output directory made before the work, removed again if the work
  fails before writing into it.
- :func:`check_output`: refuse, before any work, an output path whose suffix is not of the kind
  the command writes (``bench --out r.md`` would put CSV rows into a markdown name) or where a
  file of another kind already lies (a markdown file where the results CSV should be).
- :func:`locked`: an exclusive ``fcntl`` lock on a sibling ``.NAME.lock`` file, so that several
  processes appending to one results file lose no rows (read, append, replace under the lock).

Every failure is an :class:`~sitelens.errors.OutputError` that names the path and the fix.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from sitelens.errors import OutputError

# kind -> accepted suffixes
KINDS: dict[str, tuple[str, ...]] = {
    "csv": (".csv",),
    "md": (".md",),
    "json": (".json",),
    "html": (".html", ".htm"),
    "png": (".png",),
    "safetensors": (".safetensors",),
}


def sniff_kind(path: str | Path) -> str | None:
    """The kind of an existing file from its first bytes (``None``: empty or unknown)."""
    try:
        with open(path, "rb") as f:
            head = f.read(512)
    except OSError:
        return None
    if not head.strip():
        return None
    if head.startswith(b"\x89PNG"):
        return "png"
    text = head.lstrip()
    if text[:1] in (b"{", b"["):
        return "json"
    if text[:1] == b"<":
        return "html"
    if text[:1] in (b"#", b"|", b"-", b"*", b">"):
        return "md"
    if len(head) >= 8 and int.from_bytes(head[:8], "little") < 10_000_000 and head[8:9] == b"{":
        return "safetensors"
    first = text.split(b"\n", 1)[0]
    if b"," in first:
        return "csv"
    return None


def check_output(path: str | Path, kind: str, *, option: str = "--out") -> Path:
    """Raise :class:`OutputError` unless ``path`` may receive a ``kind`` file: its suffix is one
    of the kind's, no directory sits at the path, its parent can be created, and any existing file
    there is of the same kind (or empty). Returns ``path`` as a :class:`Path`."""
    path = Path(path)
    want = KINDS[kind]
    if path.suffix.lower() not in want:
        raise OutputError(
            f"{option} {path} must be a {kind} file (name ending in {' or '.join(want)}); "
            f"give e.g. {path.with_suffix(want[0]).name}."
        )
    if path.is_dir():
        raise OutputError(f"{option} {path} is a directory; give a file name ending in {want[0]}.")
    blocker = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        raise OutputError(
            f"Cannot write {path}: {blocker} is a file, not a directory. Choose another {option}."
        )
    if path.exists():
        found = sniff_kind(path)
        if found is not None and found != kind:
            raise OutputError(
                f"{path} already holds a {found} file, not {kind}; refusing to overwrite it. "
                f"Move it away or choose another {option}."
            )
    return path


def _no_file_in_the_way(path: Path, option: str) -> None:
    """Raise :class:`OutputError` if ``path`` or one of its parents is a file, not a directory."""
    blocker = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        raise OutputError(
            f"Cannot write to {path}: {blocker} is a file, not a directory. Choose another "
            f"output directory ({option})."
        )


def check_dir(path: str | Path, *, option: str = "--out") -> Path:
    """Raise :class:`OutputError` unless the directory ``path`` could be created and written,
    without creating anything (so a later failure leaves nothing behind)."""
    path = Path(path)
    _no_file_in_the_way(path, option)
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not os.access(existing, os.W_OK | os.X_OK):
        raise OutputError(
            f"Cannot write to {path}: {existing} is not writable. Choose a writable output "
            f"directory ({option})."
        )
    return path


def ensure_dir(path: str | Path, *, option: str = "--out") -> Path:
    """Create the directory ``path`` (and parents) and check that files can be written in it."""
    path = Path(path)
    _no_file_in_the_way(path, option)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".sitelens-write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise OutputError(
            f"Cannot write to {path}: {e.strerror or e}. Choose a writable output directory "
            f"({option})."
        ) from e
    return path


@contextlib.contextmanager
def new_dir_or_nothing(path: str | Path, *, option: str = "--out") -> Iterator[Path]:
    """:func:`ensure_dir` ``path`` for the body; if the body raises, the directories this call
    created are removed again while empty, so a failed command leaves no empty output behind."""
    path = Path(path)
    created = [p for p in (path, *path.parents) if not p.exists()]
    ensure_dir(path, option=option)
    try:
        yield path
    except BaseException:
        for p in created:  # deepest first; stops at the first that is not empty
            try:
                p.rmdir()
            except OSError:
                break
        raise


def atomic_write(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (temp sibling, fsync, rename)."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputError(f"Cannot create {path.parent}: {e.strerror or e}. Choose a writable path.") from e
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise OutputError(f"Cannot write {path}: {e.strerror or e}. Choose a writable path.") from e
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def atomic_write_dir(path: str | Path, fill: Callable[[Path], None]) -> Path:
    """Create the directory ``path`` atomically: ``fill(tmp)`` writes the files into a temporary
    sibling directory, which is then renamed into place — readers see no directory or a complete
    one, and an error (in ``fill`` too) leaves no temporary directory behind.

    If ``path`` already exists when ``fill`` is done (a concurrent writer finished first), the
    existing directory is kept and the new one discarded: for content that is the same whoever
    writes it (a cache). Failures to create the directory raise :class:`OutputError`."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=path.name + ".tmp", dir=path.parent))
    except OSError as e:
        raise OutputError(f"Cannot create a directory in {path.parent}: {e.strerror or e}. "
                          "Choose a writable path.") from e
    try:
        fill(tmp)
        if path.exists():  # a concurrent writer won; keep theirs
            shutil.rmtree(tmp, ignore_errors=True)
            return path
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    return atomic_write(path, text.encode())


def atomic_write_json(path: str | Path, obj, *, indent: int = 1) -> Path:
    return atomic_write(path, (json.dumps(obj, indent=indent, default=str) + "\n").encode())


def atomic_write_csv(path: str | Path, df) -> Path:
    """A pandas DataFrame as CSV (no index), atomically."""
    return atomic_write(path, df.to_csv(index=False).encode())


@contextlib.contextmanager
def locked(path: str | Path) -> Iterator[None]:
    """Hold an exclusive lock for ``path`` (on ``.NAME.lock`` beside it) for the ``with`` body.
    Blocks until the lock is free; released when the body ends or the process dies."""
    path = Path(path)
    lock = path.with_name(f".{path.name}.lock")
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise OutputError(
            f"Cannot write the results to {path}: {e.strerror or e}. Choose a writable path."
        ) from e
    with flocked(fd):
        yield


@contextlib.contextmanager
def flocked(fd: int):
    """An exclusive ``flock`` on the open descriptor ``fd`` while the body runs; ``fd`` is closed
    after. Every lock of sitelens goes through here (a lock file by :func:`locked`, a run
    directory itself by :class:`sitelens.pipelines.store.CellStore`)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


__all__ = [
    "KINDS", "atomic_write", "atomic_write_csv", "atomic_write_dir", "atomic_write_json",
    "atomic_write_text",
    "check_dir", "check_output", "ensure_dir", "flocked", "locked", "sniff_kind",
]
