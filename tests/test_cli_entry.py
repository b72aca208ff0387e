"""The process entry point (``sitelens`` / ``python -m sitelens.cli``), run as a process: main's
status is the exit status, and the collector is frozen only after main has returned (see
:func:`sitelens.cli.entry`)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import sitelens.cli as cli

# ``python -m sitelens.cli ARGV`` with a profiler that reads gc's freeze count as main returns, and
# an atexit handler that reads it as the interpreter shuts down (after SystemExit): main and the
# entry point are the real ones, only observed
OBSERVED = """
import atexit, gc, json, runpy, sys
import sitelens.cli as cli
seen = {"at_start": gc.get_freeze_count()}
def profile(frame, event, arg):
    if event == "return" and frame.f_code is cli.main.__code__:
        seen["main_returned"] = arg
        seen["at_main_return"] = gc.get_freeze_count()
sys.setprofile(profile)
def report():
    sys.stderr.write("OBSERVED " + json.dumps({**seen, "at_exit": gc.get_freeze_count()}) + "\\n")
atexit.register(report)
sys.argv = ["sitelens", *json.loads(sys.argv[1])]
runpy.run_module("sitelens.cli", run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize("argv, status", [
    (["--help"], 0),
    (["run", "--model", "no-such-model", "--task", "antonym"], 2),
])
def test_the_process_exits_with_mains_status_and_freezes_after_it(argv, status):
    r = subprocess.run([sys.executable, "-c", OBSERVED, json.dumps(argv)], capture_output=True, text=True,
                       timeout=120)
    line = next(ln for ln in r.stderr.splitlines() if ln.startswith("OBSERVED "))
    seen = json.loads(line.removeprefix("OBSERVED "))
    assert r.returncode == status == seen["main_returned"], (r.returncode, seen, r.stderr[-2000:])
    assert seen["at_start"] == 0 and seen["at_main_return"] == 0, seen  # nothing frozen before main ends
    assert seen["at_exit"] > 0, seen  # ... and the live objects frozen before the interpreter exits


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
