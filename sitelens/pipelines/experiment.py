"""The benchmark harness: every benchmark script is an :class:`Experiment` (its config, its cells,
its metric and its report) run by :func:`main`, as nanoGPT's experiments are configs of one
script.

An experiment declares its results table (``name`` -> ``{out}/{name}.csv`` and ``.md``, its
``columns`` and ``key``), lists its cells (:meth:`Experiment.cells`: objects with a ``key`` and a
``label``, usually :class:`Job`), computes one (:meth:`Experiment.run`: the rows of that cell)
and writes its report (:meth:`Experiment.report`: markdown from the whole CSV). :func:`main`
gives every script the same flags::

    --models A,B --tasks X,Y --limit N --threads T --executor local|processes:N|ray[:ADDRESS]
    --data-root DIR --dry-run --report --out DIR

and the rest: cells whose key is done in the :class:`~sitelens.pipelines.store.ResultsStore` are
skipped (``--dry-run`` lists what would run and stops), the others run on the executor
(:func:`sitelens.pipelines.executors.make_executor`) and their rows are appended as each finishes;
the markdown report starts with the command that regenerates it (:func:`write_report`). Hooks:
:meth:`Experiment.configure` (defaults that depend on other flags), :meth:`Experiment.batch`
(several cells run by one job, e.g. one model build for all its stages). Helpers for measurements:
:class:`Clock` (wall and CPU seconds), :class:`CallClock`, :class:`PeakRSS`, :func:`host_name`,
:func:`load_avg`, :func:`worker_env`, :func:`json_lines`, :func:`now`, :func:`time_commands`
(start-up: whole fresh processes); for fits of how a cost
grows, :func:`fit_power_law` and :func:`predict`.

``--data-root`` defaults to :data:`DATA_ROOT`: ``$SITELENS_DATA_ROOT``, else the
``shared/datasets`` folder beside the repository (this checkout's copy), resolved here once.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from sitelens.errors import SitelensError
from sitelens.io import atomic_write_text
from sitelens.pipelines.executors import SPEC_HELP, Cell, make_executor
from sitelens.pipelines.store import ObjectCache, ResultsStore

REPO = Path(__file__).resolve().parents[2]
# the datasets root: $SITELENS_DATA_ROOT, else this checkout's copy beside the repository
DATA_ROOT = Path(os.environ.get("SITELENS_DATA_ROOT") or REPO.parent / "shared" / "datasets")
RESULTS = REPO / "benchmarks" / "results"


@dataclasses.dataclass(frozen=True)
class Job:
    """One cell of an experiment: its store ``key``, a ``label`` for messages and the ``params``
    :meth:`Experiment.run` needs (picklable when a non-local executor runs it)."""

    key: str
    label: str = ""
    params: dict = dataclasses.field(default_factory=dict)

    def __getitem__(self, name: str) -> Any:
        return self.params[name]


def split_list(text: str | Sequence[str] | None) -> list[str]:
    """``"a,b"`` -> ``["a", "b"]`` (blanks dropped); a list is returned as a list."""
    if text is None:
        return []
    if isinstance(text, str):
        return [t.strip() for t in text.split(",") if t.strip()]
    return list(text)


def md_table(df: pd.DataFrame) -> str:
    """A GitHub markdown table of ``df`` (no index)."""
    head = "| " + " | ".join(str(c) for c in df.columns) + " |"
    rule = "|" + "|".join("---" for _ in df.columns) + "|"
    body = ["| " + " | ".join(str(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join([head, rule, *body])


def pct(x, digits: int = 1) -> str:
    """A fraction as a percentage with ``digits`` decimals; ``–`` for a missing value."""
    try:
        x = float(x)
    except (TypeError, ValueError):
        return "–"
    return "–" if x != x else f"{100 * x:.{digits}f}"


def write_report(path: str | Path, title: str, command: str, body: str) -> str:
    """Write ``# title``, the line naming ``command`` (what regenerates the file) and ``body``
    atomically to ``path``; returns the text. A ``body`` that starts with ``# `` is the whole
    document (its own heading names its command) and is written as it is."""
    text = body if body.startswith("# ") else f"# {title}\n\nMade by `{command}`.\n\n{body.rstrip()}\n"
    atomic_write_text(path, text)
    return text


def now(fmt: str = "%Y-%m-%d %H:%M") -> str:
    """The UTC time now, formatted."""
    return time.strftime(fmt, time.gmtime())


def load_avg() -> float:
    """The 1-minute load average (other jobs on a shared machine inflate wall time)."""
    return round(os.getloadavg()[0], 2)


def worker_env(threads: int | None, **extra: str) -> dict:
    """The environment of a measuring child process: ``threads`` BLAS/OpenMP threads, warnings off."""
    t = {} if threads is None else {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    return {**os.environ, **t, "PYTHONWARNINGS": "ignore", **extra}


def time_commands(commands: dict[str, Sequence[str]], repeats: int, threads: int | None = None) -> list[dict]:
    """Wall seconds of each ``python ARGS`` of ``commands`` (name -> ARGS) as a whole fresh process
    (interpreter start included), ``repeats`` runs after one untimed run (it warms the page cache):
    one row per run, ``{"command", "run", "wall_s", "load_average"}`` (the load average just
    before it). A run that fails raises :class:`subprocess.CalledProcessError`."""
    rows = []
    for name, args in commands.items():
        argv = [sys.executable, *args]
        for i in range(-1, repeats):
            la, t0 = load_avg(), time.perf_counter()
            subprocess.run(argv, env=worker_env(threads), capture_output=True, check=True)
            if i >= 0:
                rows.append(dict(command=name, run=i, wall_s=round(time.perf_counter() - t0, 3),
                                 load_average=la))
    return rows


def json_lines(text: str) -> list[dict]:
    """The JSON objects printed one per line in ``text`` (a child's stdout); other lines ignored."""
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


class Clock:
    """Wall (``wall``) and process-CPU (``cpu``) seconds of the block; ``sync`` runs at both ends
    (e.g. ``torch.cuda.synchronize``). CPU time is what other jobs on a shared machine inflate least."""

    def __init__(self, sync=None):
        self.sync = sync or (lambda: None)

    def __enter__(self) -> Clock:
        self.sync()
        self.t0, self.c0 = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc) -> None:
        self.sync()
        self.wall, self.cpu = time.perf_counter() - self.t0, time.process_time() - self.c0


class CallClock:
    """Timestamps (wall, CPU) of every call of ``module`` while the block runs (a forward
    pre-hook; ``sync`` first, e.g. ``torch.cuda.synchronize``): times parts of a call sequence,
    such as the step passes of a fit without its setup."""

    def __init__(self, module, sync=None):
        self.module, self.sync, self.marks = module, sync or (lambda: None), []

    def _pre(self, module, args) -> None:
        self.sync()
        self.marks.append((time.perf_counter(), time.process_time()))

    def __enter__(self) -> CallClock:
        self._hook = self.module.register_forward_pre_hook(self._pre)
        return self

    def __exit__(self, *exc) -> None:
        self._hook.remove()


def host_name(cuda: bool = False) -> str:
    """The GPU's name (``cuda``) or the CPU's model name."""
    import platform

    if cuda:
        import torch

        return torch.cuda.get_device_name(0)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


class PeakRSS:
    """Peak resident memory (bytes) of this process while the block runs, sampled every
    ``every`` seconds; ``start`` is the resident memory on entry."""

    def __init__(self, every: float = 0.02):
        self.every = every

    def __enter__(self) -> PeakRSS:
        import psutil

        self.proc, self._stop = psutil.Process(), threading.Event()
        self.start = self.peak = self.proc.memory_info().rss
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(self.every):
            self.peak = max(self.peak, self.proc.memory_info().rss)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.proc.memory_info().rss)


def fit_power_law(df: pd.DataFrame, ycol: str, *, x: str = "params_compute", t: str = "prompt_tokens"):
    """OLS of log y = c + a·log x + b·log t over the rows with y > 0: a dict with ``a``, ``b``, ``c``,
    ``r2`` and ``n`` (rows), or None below 3 rows. ``b`` is NaN (and ``t`` left out of the fit) when
    log t spans at most 0.1 (every row has about the same length)."""
    import numpy as np

    d = df[(df[ycol] > 0)]
    if len(d) < 3:
        return None
    y = np.log(d[ycol].to_numpy(float))
    P = np.log(d[x].to_numpy(float))
    T = np.log(d[t].to_numpy(float))
    use_t = np.ptp(T) > 0.1
    X = np.column_stack([np.ones_like(y), P] + ([T] if use_t else []))
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    ss = ((y - y.mean()) ** 2).sum()
    r2 = 1 - ((y - X @ coef) ** 2).sum() / ss if ss > 0 else float("nan")
    return dict(a=coef[1], b=coef[2] if use_t else float("nan"), c=coef[0], r2=r2, n=len(d))


def predict(fit: dict, x: float, t: float) -> float:
    """``exp(c) · x^a · t^b`` of a :func:`fit_power_law` fit (``t`` ignored when ``b`` is NaN)."""
    b = 0.0 if math.isnan(fit["b"]) else fit["b"]
    return math.exp(fit["c"] + fit["a"] * math.log(x) + b * math.log(t))


def parser(doc: str, *, models: Sequence[str] = (), tasks: Sequence[str] = (), limit: int | None = None,
           threads: int | None = 1) -> argparse.ArgumentParser:
    """The flags every benchmark script takes, with its defaults (its own flags go on top)."""
    p = argparse.ArgumentParser(description=doc.strip().split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", type=split_list, default=list(models), help="comma-separated")
    p.add_argument("--tasks", type=split_list, default=list(tasks), help="comma-separated")
    p.add_argument("--limit", type=int, default=limit, help="test items per task")
    p.add_argument("--threads", type=int, default=threads, help="torch threads")
    p.add_argument("--executor", default="local", help=SPEC_HELP)
    p.add_argument("--data-root", type=Path, default=DATA_ROOT, help=f"datasets (default {DATA_ROOT})")
    p.add_argument("--dry-run", action="store_true", help="list the cells that would run; run none")
    p.add_argument("--report", action="store_true", help="only rewrite the report from the CSV")
    p.add_argument("--out", type=Path, default=RESULTS, help="results directory")
    return p


class Experiment:
    """A benchmark: subclass it, set the class attributes and write :meth:`cells`, :meth:`run`
    and :meth:`report`. ``self.args`` holds the parsed flags while it runs."""

    name = ""  # results stem: {out}/{name}.csv and {name}.md
    title = ""  # the report's heading; empty: report() returns the whole file, naming its command
    columns: Sequence[str] = ()
    key: str | None = "key"  # None: an unkeyed measurement log (every run appends)
    older: Sequence[Sequence[str]] = ()  # earlier headers of the table, read with the new columns blank
    replace = False  # True: a run replaces the table (a snapshot of the latest run, not a log)
    per_model = False  # True: one table per model, {out}/{name}_{model}.csv, and one --models per process
    models: Sequence[str] = ()  # --models default
    tasks: Sequence[str] = ()  # --tasks default
    limit: int | None = None  # --limit default
    threads: int | None = 1  # --threads default
    args: argparse.Namespace

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Flags of this experiment beyond the common ones."""

    def configure(self, args: argparse.Namespace) -> None:
        """Adjust ``args`` after parsing (defaults that depend on other flags)."""

    def batch(self, todo: list[Job]) -> list[Job]:
        """The jobs that run ``todo`` (the cells not done): by default each cell alone; an
        experiment whose cells share an expensive setup (a model build, captured states) groups
        them, and :meth:`run` of a group returns (or appends itself) the rows of all its cells."""
        return todo

    def done(self, row: dict) -> bool:
        """Whether a stored row finishes its key (a row recording a failure may not)."""
        return True

    def done_keys(self) -> set[str] | None:
        """The keys of the cells already done (``None``: run every cell); override for results
        kept elsewhere than one keyed CSV."""
        return None if self.key is None else self.store().keys()

    def cells(self, args: argparse.Namespace) -> Iterable[Job]:
        """Every cell of the sweep ``args`` asks for, done or not."""
        raise NotImplementedError

    def run(self, job: Job) -> list[dict] | dict:
        """The rows of one cell."""
        raise NotImplementedError

    def report(self, df: pd.DataFrame) -> str | None:
        """The report's markdown body from the whole results table (``None``: no report)."""
        return None

    def read(self) -> pd.DataFrame:
        """The results table (override for dtypes)."""
        return self.store().read()

    # ------------------------------------------------------------------------------------------

    def store(self, name: str | None = None, columns: Sequence[str] | None = None,
              key: str | None = "key") -> ResultsStore:
        """The results store ``{out}/{name}.csv`` (default: this experiment's own table,
        ``{name}_{model}.csv`` when :attr:`per_model`)."""
        if name is None:
            name = self.name
            if self.per_model:
                (model,) = self.args.models  # one model per process
                name = f"{name}_{model}"
            return ResultsStore(self.out / f"{name}.csv", self.columns, key=self.key, done=self.done,
                                older=self.older)
        return ResultsStore(self.out / f"{name}.csv", columns or (), key=key)

    def cache(self, directory: str | Path) -> ObjectCache:
        """A keyed tensor / object cache under ``directory``."""
        return ObjectCache(directory)

    @property
    def out(self) -> Path:
        return Path(self.args.out)

    @property
    def command(self) -> str:
        """The command line of this run (what the report names)."""
        return self.args.command

    def parser(self) -> argparse.ArgumentParser:
        doc = sys.modules[type(self).__module__].__doc__ or self.title
        p = parser(doc, models=self.models, tasks=self.tasks, limit=self.limit, threads=self.threads)
        self.add_arguments(p)
        return p

    def write_report(self) -> str | None:
        """Rewrite ``{name}.md`` from the whole CSV (nothing when there is no CSV or report)."""
        if not self.store().path.exists():
            return None
        body = self.report(self.read())
        if body is None:
            return None
        if not self.title:
            atomic_write_text(self.out / f"{self.name}.md", body)
            return body
        return write_report(self.out / f"{self.name}.md", self.title, self.command, body)


def _run_job(experiment: Experiment, job: Job):
    return experiment.run(job)


def plan(experiment: Experiment, args: argparse.Namespace) -> tuple[list[Job], list[Job]]:
    """(every cell, the cells to run): a cell runs when its key is not done
    (:meth:`Experiment.done_keys`; unkeyed experiments run every cell); a key listed twice runs once."""
    experiment.args = args
    cells = list(experiment.cells(args))
    done = experiment.done_keys()
    if done is None:
        return cells, cells
    todo, seen = [], set(done)
    for c in cells:
        if c.key not in seen:
            seen.add(c.key)
            todo.append(c)
    return cells, todo


def main(experiment: Experiment, argv: Sequence[str] | None = None, *, prog: str | None = None) -> int:
    """Parse the flags, run the cells not yet done, append their rows, rewrite the report."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = experiment.parser().parse_args(argv)
    experiment.args = args
    experiment.configure(args)
    script = prog or f"benchmarks/{Path(sys.argv[0]).name}"
    # the command that regenerates the results: this one, less the flags that only read them
    args.command = shlex.join(["python", script, *[a for a in argv if a not in ("--report", "--dry-run")]])
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    try:
        return _main(experiment, args)
    except SitelensError as e:  # bad input: the message and exit status 2
        print(f"error: {e}", file=sys.stderr)
        return 2


def _main(experiment: Experiment, args: argparse.Namespace) -> int:
    if not args.report:
        cells, todo = plan(experiment, args)
        print(f"{experiment.name}: {len(cells)} cell(s), {len(cells) - len(todo)} done, "
              f"{len(todo)} to run", flush=True)
        if args.dry_run:
            for c in todo:
                print(f"  would run {c.label or c.key}")
            return 0
        store = experiment.store()
        if experiment.replace and todo:
            store.path.unlink(missing_ok=True)

        def on_result(cell: Cell, rows) -> None:
            store.append([rows] if isinstance(rows, dict) else rows)
            print(f"  done {cell.label or cell.key}", flush=True)

        with make_executor(args.executor, threads=args.threads) as ex:
            jobs = experiment.batch(todo) if todo else []
            ex.run([Cell(c.key, _run_job, (experiment, c), c.label) for c in jobs], on_result)
    text = experiment.write_report()
    if text:
        print(text)
    return 0


__all__ = [
    "DATA_ROOT", "RESULTS", "CallClock", "Clock", "Experiment", "Job", "PeakRSS", "host_name", "json_lines",
    "load_avg", "main", "md_table", "now", "parser", "pct", "plan", "split_list", "time_commands",
    "worker_env", "write_report",
]
