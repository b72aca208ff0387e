"""Where the cells of a sweep run: in this process (the default), in N worker processes, or on a
Ray cluster (``--executor local|processes:N|ray[:ADDRESS]`` of ``sitelens bench``, ``figures``
and ``atlas --refit``).

A sweep is a list of :class:`Cell` s: a module-level function and its (picklable) arguments,
named by the key of the result it produces in the run's keyed store (a bench row's
:func:`sitelens.pipelines.bench.cell_key`, a figures or atlas cell file of
:class:`sitelens.pipelines.store.CellStore`).
Cells are idempotent: running one twice gives the same result under the same key, so a cell whose
worker was killed is simply run again, and a store never holds a key twice. An executor runs the
cells and hands each result to ``on_result`` in the driver as soon as it is there, in any order:

- :class:`LocalExecutor` — one after the other in this process (what every runner did before);
- :class:`ProcessExecutor` — ``n`` worker processes (``spawn``) on this machine; a worker that dies
  (SIGKILL, out of memory) breaks the pool, which is rebuilt, and the unfinished cells are run
  again (at most ``max_retries`` times each);
- :class:`RayExecutor` — Ray remote tasks (``max_retries``: Ray reruns a task whose worker died) on
  a local Ray instance or an existing cluster (``address``: ``auto`` or the ``HOST:PORT`` that
  ``ray start --head`` prints). ``ray`` is imported only here, when a sweep starts.

A worker loads each model once and keeps it (:func:`cached_model`; the last model loaded, so one
model at a time per worker); the cells of one model then cost no reload. How it loads (device,
dtype, devices, device map, backend) travels in the cell's arguments as a
:class:`~sitelens.models.LoadSpec`, never through the environment.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from sitelens.errors import ExecutorError

if TYPE_CHECKING:
    from sitelens.models import LoadSpec

MAX_PROCESSES = 1024
SPEC_HELP = ("local, processes:N (N worker processes, 1 to 1024) or ray[:ADDRESS] (ADDRESS: auto or "
             "the HOST:PORT that `ray start --head` prints)")
_HOST = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?")


# ----------------------------------------------------------------------------------------------
# cells


@dataclass(frozen=True)
class Cell:
    """One unit of a sweep: ``fn(*args)`` (``fn`` a module-level function, so that a worker
    imports it; ``args`` picklable), whose result is stored under ``key``."""

    key: str
    fn: Callable[..., Any]
    args: tuple = ()
    label: str = ""  # for messages (e.g. "tiny-random/antonym/tv")

    def __call__(self):
        return self.fn(*self.args)


def _check_unique(cells: Sequence[Cell]) -> None:
    seen: set[str] = set()
    for c in cells:
        if c.key in seen:
            raise ValueError(f"two cells share the key {c.key!r} ({c.label}); keys must be unique")
        seen.add(c.key)


@runtime_checkable
class Executor(Protocol):
    """Runs cells; ``on_result(cell, result)`` is called in the driver once per cell, as each
    finishes. A cell that raises stops the run (finished cells have had their ``on_result``)."""

    name: str
    in_process: bool  # cells run in this process (they may use objects that cannot be pickled)

    def run(self, cells: Sequence[Cell], on_result: Callable[[Cell, Any], None]) -> None: ...

    def close(self) -> None: ...


class _Base:
    name = "base"
    in_process = False

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        pass

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name})"


class LocalExecutor(_Base):
    """Every cell in this process, in the order given (the default)."""

    name = "local"
    in_process = True

    def run(self, cells: Sequence[Cell], on_result: Callable[[Cell, Any], None]) -> None:
        _check_unique(cells)
        for cell in cells:
            on_result(cell, cell())


# ----------------------------------------------------------------------------------------------
# in the workers


_MODEL: dict[tuple, Any] = {}  # (spec, n_ctx, load) -> model: the one this process has loaded
_FINGERPRINT: dict[int, str] = {}  # id(model) -> fingerprint


def cached_model(spec: str, n_ctx: int | None = None, load: LoadSpec | None = None):
    """The model ``spec`` (:func:`sitelens.models.load_model` with ``n_ctx`` and the load
    specification ``load``, None: its defaults), loaded once per process: a worker keeps the last
    model it loaded, so consecutive cells of one model reuse it (loading another model drops it
    first: one model in memory at a time)."""
    key = (spec, n_ctx, load)
    if key not in _MODEL:
        from sitelens.models import load_model

        _MODEL.clear()
        _FINGERPRINT.clear()
        _MODEL[key] = load_model(spec, n_ctx=n_ctx, spec=load)
    return _MODEL[key]


def model_fingerprint(model) -> str:
    """:func:`sitelens.models.fingerprint`, computed once per loaded model."""
    if id(model) not in _FINGERPRINT:
        from sitelens.models import fingerprint

        _FINGERPRINT[id(model)] = fingerprint(model)
    return _FINGERPRINT[id(model)]


def check_fingerprint(model, spec: str, want: str) -> None:
    """Raise :class:`ExecutorError` unless the worker's ``model`` (loaded from ``spec``) has the
    weight fingerprint ``want`` that the driver keyed the cell on: a worker with other weights
    (another model file, another sitelens) must not write under that key."""
    got = model_fingerprint(model)
    if got != want:
        raise ExecutorError(
            f"the worker's {spec} has weight fingerprint {got}, not {want} as in the driver: give "
            "every worker the same model files (and the same sitelens version)."
        )


@contextlib.contextmanager
def preloaded(spec: str, n_ctx: int | None, model, load: LoadSpec | None = None) -> Iterator[None]:
    """Within the block, :func:`cached_model` ``(spec, n_ctx, load)`` in THIS process returns
    ``model`` (the driver's already loaded model, for cells run in-process)."""
    old = dict(_MODEL)
    _MODEL.clear()
    _MODEL[(spec, n_ctx, load)] = model
    try:
        yield
    finally:
        _MODEL.clear()
        _MODEL.update(old)
        _FINGERPRINT.pop(id(model), None)


def _set_threads(threads: int | None) -> None:
    if threads:
        import torch

        torch.set_num_threads(threads)


def _call(fn: Callable, args: tuple) -> Any:
    return fn(*args)


def _call_with_threads(fn: Callable, args: tuple, threads: int | None) -> Any:
    _set_threads(threads)
    return fn(*args)


# ----------------------------------------------------------------------------------------------
# worker processes


# imported once by the fork server, so that every worker starts with them (no per-worker import)
PRELOAD = [
    "sitelens.pipelines.executors", "sitelens.pipelines.bench", "sitelens.pipelines.figures",
    "sitelens.atlas.data",
]


class ProcessExecutor(_Base):
    """``n`` worker processes on this machine, forked from a ``forkserver`` that has imported
    sitelens once (:data:`PRELOAD`; a worker starts in well under a second, and no worker
    inherits this process's threads). Each worker sets ``threads`` torch threads (default
    ``cpu_count // n``) and keeps its model loaded across cells and runs until :meth:`close`. A
    worker that dies breaks the pool: the pool is rebuilt and every unfinished cell is run again,
    at most ``max_retries`` times.

    As with any ``multiprocessing`` start method but ``fork``, a script that runs a sweep on
    processes must guard its entry point with ``if __name__ == "__main__":`` (each worker imports
    the main module)."""

    def __init__(self, n: int, *, threads: int | None = None, max_retries: int = 3):
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_PROCESSES:
            raise ExecutorError(f"processes:N needs N in 1..{MAX_PROCESSES}, got {n!r}.")
        self.n = n
        self.threads = threads or max(1, (os.cpu_count() or 1) // n)
        self.max_retries = max_retries
        self.name = f"processes:{n}"
        self._pool = None

    def _get_pool(self):
        if self._pool is None:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            ctx = multiprocessing.get_context("forkserver")
            ctx.set_forkserver_preload(PRELOAD)  # no effect once the server runs: same list
            self._pool = ProcessPoolExecutor(self.n, mp_context=ctx, initializer=_set_threads,
                                             initargs=(self.threads,))
        return self._pool

    def _drop_pool(self, cancel: bool = False) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=cancel)
            self._pool = None

    def run(self, cells: Sequence[Cell], on_result: Callable[[Cell, Any], None]) -> None:
        from concurrent.futures import FIRST_COMPLETED, wait
        from concurrent.futures.process import BrokenProcessPool

        _check_unique(cells)
        pending = dict(enumerate(cells))
        attempts = dict.fromkeys(pending, 0)
        while pending:
            pool = self._get_pool()
            futures = {pool.submit(_call, c.fn, c.args): i for i, c in pending.items()}
            broken = False
            waiting = set(futures)
            while waiting:
                done, waiting = wait(waiting, return_when=FIRST_COMPLETED)
                for fut in done:
                    i = futures[fut]
                    try:
                        result = fut.result()
                    except BrokenProcessPool:
                        broken = True
                        continue
                    except BaseException:
                        for f in waiting:
                            f.cancel()
                        self._drop_pool(cancel=True)
                        raise
                    on_result(pending.pop(i), result)
            if broken:
                self._drop_pool()
                for i in pending:
                    attempts[i] += 1
                over = [pending[i].label or pending[i].key for i in pending
                        if attempts[i] > self.max_retries]
                if over:
                    raise ExecutorError(
                        f"worker processes died while running {', '.join(over[:5])} (run "
                        f"{self.max_retries + 1} time(s)); giving up, finished cells are kept. "
                        "Check the memory of the machine, or run with fewer processes.")

    def close(self) -> None:
        self._drop_pool(cancel=True)


# ----------------------------------------------------------------------------------------------
# Ray


def _import_ray():
    try:
        import ray
    except ImportError as e:
        raise ExecutorError(
            "--executor ray needs the ray package, which is not installed: pip install "
            "'sitelens[ray]' (or pip install ray), or use --executor processes:N."
        ) from e
    return ray


def ray_available() -> bool:
    """Whether ``import ray`` would find the package (without importing it)."""
    import importlib.util
    import sys

    if "ray" in sys.modules:
        return sys.modules["ray"] is not None
    return importlib.util.find_spec("ray") is not None


def _token_auth_if_available(address: str) -> None:
    """``ray start`` (Ray >= 2.5x) turns on token authentication and keeps the token in
    ``~/.ray/auth_token``; ``ray.init`` uses it for a cluster it finds by itself but not for an
    explicit ``HOST:PORT``. Use it there too (as Ray does for ``auto``) unless ``RAY_AUTH_MODE``
    says otherwise; a Ray without token authentication is left alone."""
    if address == "auto" or "RAY_AUTH_MODE" in os.environ:
        return
    try:
        from ray._private.authentication.authentication_token_setup import (
            maybe_enable_token_auth_if_token_available,
        )
    except ImportError:
        return
    maybe_enable_token_auth_if_token_available(warn_if_disabled=False)


@dataclass
class RayExecutor(_Base):
    """Cells as Ray remote tasks. ``address``: ``None`` starts a new local Ray instance for the run
    (``num_cpus``: its CPUs, default all), ``"auto"`` joins the cluster of ``RAY_ADDRESS`` or the
    one started on this machine (Ray's rule), ``"HOST:PORT"`` the one at that address (whose
    workers get this process's ``SITELENS_*`` variables, e.g. the cache directory). Each
    cell asks for ``threads`` CPUs and runs with that many torch threads; ``max_retries``: how
    often Ray reruns a cell whose worker died. The connection is opened at the first :meth:`run`
    and closed (the local instance stopped) by :meth:`close`."""

    address: str | None = None
    num_cpus: int | None = None
    threads: int = 1
    max_retries: int = 3
    init_kwargs: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.address is not None:
            check_ray_address(self.address)
        self.name = "ray" if self.address is None else f"ray:{self.address}"
        self._started = False

    def _ray(self):
        ray = _import_ray()
        if not ray.is_initialized():
            kw = dict(include_dashboard=False, **self.init_kwargs)
            if self.address is None:
                kw.setdefault("num_cpus", self.num_cpus)
            else:  # a running cluster's workers do not inherit this process's environment
                env = {k: v for k, v in os.environ.items() if k.startswith("SITELENS_")}
                if env:
                    kw.setdefault("runtime_env", {"env_vars": env})
                _token_auth_if_available(self.address)
            try:  # "local": a new instance, whatever RAY_ADDRESS or a stale cluster file say
                ray.init(address=self.address or "local", **kw)
            except (ConnectionError, RuntimeError, ValueError) as e:
                raise ExecutorError(
                    f"Cannot start or reach a Ray cluster at {self.address or 'this machine'}: "
                    f"{e}. Start one with `ray start --head` and pass the address it prints."
                ) from e
            self._started = True
        return ray

    def run(self, cells: Sequence[Cell], on_result: Callable[[Cell, Any], None]) -> None:
        _check_unique(cells)
        if not cells:
            return
        ray = self._ray()
        remote = ray.remote(num_cpus=self.threads, max_retries=self.max_retries)(_call_with_threads)
        refs = {remote.remote(c.fn, c.args, self.threads): c for c in cells}
        left = list(refs)
        while left:
            done, left = ray.wait(left, num_returns=1)
            for ref in done:
                try:
                    result = ray.get(ref)
                except ray.exceptions.RayTaskError as e:  # the cell raised: stop, as in-process
                    for r in left:
                        ray.cancel(r)
                    raise e.as_instanceof_cause() from None
                except ray.exceptions.RayError as e:  # its worker died more than max_retries
                    for r in left:
                        ray.cancel(r)
                    cell = refs[ref]
                    raise ExecutorError(
                        f"Ray could not run {cell.label or cell.key} ({type(e).__name__}: "
                        f"{str(e).splitlines()[0] if str(e) else ''}); finished cells are kept, "
                        "rerun the same command to resume."
                    ) from e
                on_result(refs[ref], result)

    def close(self) -> None:
        if self._started:
            import ray

            ray.shutdown()
            self._started = False


# ----------------------------------------------------------------------------------------------
# the --executor value


def check_ray_address(address: str) -> str:
    """``address`` if it is ``auto`` or ``HOST:PORT`` (HOST a name or IPv4 address, PORT in
    1..65535); else :class:`ExecutorError`."""
    if address == "auto":
        return address
    host, sep, port = address.rpartition(":")
    ok = bool(sep) and _HOST.fullmatch(host) is not None and port.isascii() and port.isdigit() \
        and 1 <= int(port) <= 65535
    if not ok:
        raise ExecutorError(
            f"ray:ADDRESS needs ADDRESS = auto or HOST:PORT with PORT in 1..65535 (e.g. "
            f"127.0.0.1:6379, what `ray start --head` prints), got {address!r}."
        )
    return address


def parse_executor(spec: str) -> tuple[str, int | str | None]:
    """Check an ``--executor`` value and split it: ``("local", None)``, ``("processes", N)``,
    ``("ray", None)`` or ``("ray", ADDRESS)``. Bad values raise :class:`ExecutorError`; nothing
    is imported or started."""
    if not isinstance(spec, str):
        raise ExecutorError(f"an executor is {SPEC_HELP}; got {spec!r}.")
    kind, sep, arg = spec.partition(":")
    if spec == "local":
        return "local", None
    if kind == "processes" and sep:
        n = int(arg) if arg.isascii() and arg.isdigit() else None
        if n is None or not 1 <= n <= MAX_PROCESSES:
            raise ExecutorError(f"processes:N needs N in 1..{MAX_PROCESSES}, got {arg!r}.")
        return "processes", n
    if kind == "ray":
        if not sep:
            return "ray", None
        return "ray", check_ray_address(arg)
    raise ExecutorError(f"an executor is {SPEC_HELP}; got {spec!r}.")


def make_executor(spec: str | Executor | None = None, *, threads: int | None = None) -> Executor:
    """An executor from an ``--executor`` value (``None``: :class:`LocalExecutor`); an
    :class:`Executor` is returned as it is. ``threads``: torch threads per worker (processes:
    default ``cpu_count // N``; Ray: CPUs and threads per cell, default 1)."""
    if spec is None:
        return LocalExecutor()
    if not isinstance(spec, str):
        if isinstance(spec, Executor):
            return spec
        raise ExecutorError(f"executor must be an --executor string or an Executor, got {spec!r}.")
    kind, arg = parse_executor(spec)
    if kind == "local":
        return LocalExecutor()
    if kind == "processes":
        return ProcessExecutor(arg, threads=threads)
    return RayExecutor(address=arg, threads=threads or 1)


__all__ = [
    "Cell", "Executor", "LocalExecutor", "ProcessExecutor", "RayExecutor", "cached_model",
    "check_fingerprint", "check_ray_address", "make_executor", "model_fingerprint",
    "parse_executor", "preloaded", "ray_available",
]
