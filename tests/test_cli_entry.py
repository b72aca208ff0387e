"""The process entry point (``sitelens`` / ``python -m sitelens.cli``): main's status as the exit
status, and the collector frozen only after main has returned (see :func:`sitelens.cli.entry`)."""

from __future__ import annotations

import subprocess
import sys

import pytest

import sitelens.cli as cli


@pytest.mark.parametrize("status", [0, 2])
def test_entry_exits_with_mains_status_and_freezes_after_it(status, monkeypatch):
    calls = []
    monkeypatch.setattr(cli, "main", lambda: calls.append("main") or status)
    monkeypatch.setattr(cli.gc, "freeze", lambda: calls.append("freeze"))
    with pytest.raises(SystemExit) as e:
        cli.entry()
    assert e.value.code == status and calls == ["main", "freeze"]


def test_main_itself_leaves_the_collector_alone(monkeypatch):
    monkeypatch.setattr(cli.gc, "freeze", lambda: pytest.fail("main froze the caller's collector"))
    assert cli.main(["--help"]) == 0


@pytest.mark.parametrize("argv, code, needle", [
    (["--help"], 0, "usage: sitelens"),
    (["run", "--model", "no-such-model", "--task", "antonym"], 2, "sitelens: error:"),
])
def test_python_m_sitelens_cli_exit_status_and_output(argv, code, needle):
    r = subprocess.run([sys.executable, "-m", "sitelens.cli", *argv], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == code and needle in r.stdout + r.stderr
