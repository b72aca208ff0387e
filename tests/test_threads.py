"""The CLI's default thread count leaves the busy cores out (issue: a run beside one other job
took 6 min with torch's one-thread-per-core default and 40 s with one thread)."""

from __future__ import annotations

import types

import pytest

from sitelens import threads


@pytest.mark.parametrize(("cores", "load", "want"), [
    (2, 0.3, 2),   # quiet: every core
    (2, 1.2, 1),   # one other busy process: the free core only
    (2, 7.4, 1),   # far oversubscribed: never below one
    (16, 3.9, 13),  # the load is rounded down: 3.9 busy cores leave 13
])
def test_default_threads_leaves_out_busy_cores(monkeypatch, cores, load, want):
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (load, load, load))
    assert threads.default_threads() == want


def test_no_load_average_means_every_core(monkeypatch):
    def none():
        raise OSError("no load average here")

    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    monkeypatch.setattr(threads.os, "getloadavg", none)
    assert threads.default_threads() == 3


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
