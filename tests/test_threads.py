"""The CLI's default thread count leaves the busy cores out (issue: a run beside one other job
took 6 min with torch's one-thread-per-core default and 40 s with one thread)."""

from __future__ import annotations

import types

import pytest

from sitelens import threads


def _machine(monkeypatch, cores: int, busy_share: float | None, load: float = 0.0):
    """``cores`` usable cores whose non-idle share over the window is ``busy_share`` (None: no
    /proc/stat), and a 1-minute load average ``load``."""
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (load, load, load))
    monkeypatch.setattr(threads.time, "sleep", lambda s: None)
    reads = iter([(0, 0), (round(1000 * (1 - busy_share)), 1000)] if busy_share is not None else [None])
    monkeypatch.setattr(threads, "_idle_and_total", lambda c: next(reads, None))


@pytest.mark.parametrize(("cores", "busy_share", "want"), [
    (2, 0.02, 2),   # quiet: every core
    (2, 0.51, 1),   # one other busy process (half of two cores' time): the free core only
    (2, 1.00, 1),   # both cores busy: never below one
    (16, 0.24, 12),  # 3.84 busy cores round to 4
])
def test_default_threads_leaves_out_busy_cores(monkeypatch, cores, busy_share, want):
    _machine(monkeypatch, cores, busy_share, load=9.0)  # the lagging load average is not read
    assert threads.default_threads() == want


def test_the_load_average_only_without_proc_stat(monkeypatch):
    _machine(monkeypatch, 2, None, load=1.2)
    assert threads.busy_cores() == 1 and threads.default_threads() == 1


def test_no_measure_at_all_means_every_core(monkeypatch):
    def none():
        raise OSError("no load average here")

    _machine(monkeypatch, 3, None)
    monkeypatch.setattr(threads.os, "getloadavg", none)
    assert threads.default_threads() == 3


def test_proc_stat_is_read_for_the_usable_cores_only():
    """On this machine: the per-core lines of /proc/stat give idle ≤ total for the usable cores."""
    cores = threads.usable_cores()
    if not isinstance(cores, set) or threads._idle_and_total(cores) is None:
        pytest.skip("no /proc/stat or CPU affinity on this OS")
    idle, total = threads._idle_and_total(cores)
    assert 0 <= idle <= total
    assert threads._idle_and_total({max(cores) + 10_000}) is None  # a core not on this machine


def test_cli_sets_the_default_when_threads_is_not_given(monkeypatch):
    """Without --threads the command sets torch to the default (not torch's own choice); with it,
    to the number given."""
    import torch

    from sitelens.cli.common import setup_torch

    before = torch.get_num_threads()
    try:
        monkeypatch.setattr(threads, "default_threads", lambda: 1)
        torch.set_num_threads(2)
        setup_torch(types.SimpleNamespace(cmd="run", threads=None, seed=0))
        assert torch.get_num_threads() == 1
        setup_torch(types.SimpleNamespace(cmd="run", threads=2, seed=0))
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
