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
