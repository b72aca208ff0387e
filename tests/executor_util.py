"""Helpers of tests/test_executors.py that worker processes import by name: spawned processes get
the tests directory from this process's ``sys.path``, the test's Ray cluster gets it as
``PYTHONPATH``."""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field

from sitelens.baselines.zero_shot import ZeroShot


@dataclass(kw_only=True)
class KillOnce(ZeroShot):
    """Zero-shot, except that the first fit of this method anywhere SIGKILLs its own worker
    process: the worker dies in the middle of the cell, without a word to its executor. The first
    fit creates ``marker`` (atomically, ``O_EXCL``: exactly one fit wins) and writes its pid
    there; later fits find the file and run normally. Never kills ``driver_pid`` (the test)."""

    name: str = "kill-once"
    marker: str = field(default="", compare=False)  # bookkeeping: not part of the cell's key
    driver_pid: int = field(default=0, compare=False)

    def _fit(self, model, task, seed, template, progress):
        if self.marker and os.getpid() != self.driver_pid:
            try:
                fd = os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                pass
            else:
                os.write(fd, str(os.getpid()).encode())
                os.close(fd)
                os.kill(os.getpid(), signal.SIGKILL)
        return super()._fit(model, task, seed, template, progress)


LOADS = {"n": 0, "counting": False}  # this process's load_model calls since its first CountLoads fit


def _count_loads() -> None:
    """From now on, count this process's calls of ``sitelens.models.load_model`` (the function
    :func:`sitelens.pipelines.executors.cached_model` imports) in ``LOADS["n"]``."""
    import sitelens.models as models

    if LOADS["counting"]:
        return
    real = models.load_model

    def counted(*a, **kw):
        LOADS["n"] += 1
        return real(*a, **kw)

    models.load_model, LOADS["counting"] = counted, True


@dataclass(kw_only=True)
class CountLoads(ZeroShot):
    """Zero-shot that appends ``pid id(model) loads`` to ``log`` on every fit: its process, the
    model object the cell got and the models that process loaded since its first CountLoads fit
    (which came after that process's first load, if any). ``forget``: then drop the process's
    cached model (a planted bug: the next cell must load it again)."""

    name: str = "count-loads"
    log: str = field(default="", compare=False)
    forget: bool = field(default=False, compare=False)

    def _fit(self, model, task, seed, template, progress):
        from sitelens.pipelines import executors

        _count_loads()
        with open(self.log, "a") as f:
            f.write(f"{os.getpid()} {id(model)} {LOADS['n']}\n")
        if self.forget:
            executors._MODEL.clear()
        return super()._fit(model, task, seed, template, progress)
