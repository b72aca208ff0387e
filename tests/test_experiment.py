"""The experiment runner's hooks (configure, batch, replace, a report that is its whole document,
bad input) and its measurement helpers."""

import json
import subprocess

import pandas as pd
import pytest

from sitelens.errors import UsageError
from sitelens.pipelines.experiment import (
    CallClock,
    Clock,
    Experiment,
    Job,
    json_lines,
    main,
    md_table,
    time_commands,
    worker_env,
)


class Grouped(Experiment):
    """Cells run two at a time by one job; the report is a whole document."""

    name = "grouped"
    columns = ["key", "x", "group"]
    replace = False

    def add_arguments(self, p):
        p.add_argument("--n", type=int, default=4)
        p.add_argument("--fail", action="store_true")

    def configure(self, args):
        args.n = args.n * 2 if args.tiny_twice else args.n

    def parser(self):
        p = super().parser()
        p.add_argument("--tiny-twice", action="store_true")
        return p

    def cells(self, args):
        if args.fail:
            raise UsageError("no such cells")
        return [Job(f"k{i}", f"cell {i}", {"x": i}) for i in range(args.n)]

    def batch(self, todo):
        return [Job(f"g{i}", f"group {i}", {"cells": todo[i:i + 2]}) for i in range(0, len(todo), 2)]

    def run(self, job):
        self.groups = getattr(self, "groups", []) + [job.key]
        return [{"key": c.key, "x": c["x"], "group": job.key} for c in job["cells"]]

    def report(self, df):
        return f"# Grouped ({len(df)} rows)\n\n{md_table(df)}\n"


def test_configure_batch_and_a_whole_document_report(tmp_path):
    exp = Grouped()
    assert main(exp, ["--out", str(tmp_path), "--tiny-twice", "--n", "3"], prog="x") == 0
    assert exp.groups == ["g0", "g2", "g4"]  # 6 cells (configure doubled 3), two per job
    df = pd.read_csv(tmp_path / "grouped.csv")
    assert list(df.key) == [f"k{i}" for i in range(6)]
    assert list(df.group) == ["g0", "g0", "g2", "g2", "g4", "g4"]
    assert (tmp_path / "grouped.md").read_text().startswith("# Grouped (6 rows)\n\n| key |")
    again = Grouped()  # every key done: nothing runs, batch is not asked
    main(again, ["--out", str(tmp_path), "--n", "6"], prog="x")
    assert not hasattr(again, "groups")


def test_replace_keeps_only_the_latest_run(tmp_path):
    class Snapshot(Grouped):
        name, key, replace = "snap", None, True

    main(Snapshot(), ["--out", str(tmp_path), "--n", "4"], prog="x")
    main(Snapshot(), ["--out", str(tmp_path), "--n", "2"], prog="x")
    assert len(pd.read_csv(tmp_path / "snap.csv")) == 2


def test_per_model_tables(tmp_path):
    class PerModel(Grouped):
        name, per_model = "pm", True

    main(PerModel(), ["--out", str(tmp_path), "--n", "2", "--models", "a"], prog="x")
    main(PerModel(), ["--out", str(tmp_path), "--n", "4", "--models", "b"], prog="x")
    assert [len(pd.read_csv(tmp_path / f"pm_{m}.csv")) for m in "ab"] == [2, 4]
    assert not (tmp_path / "pm.csv").exists()


def test_bad_input_exits_2_with_the_message(tmp_path, capsys):
    assert main(Grouped(), ["--out", str(tmp_path), "--fail"], prog="x") == 2
    assert "error: no such cells" in capsys.readouterr().err
    assert not (tmp_path / "grouped.csv").exists()


def test_clocks_and_worker_helpers():
    import torch

    with Clock() as t:
        sum(range(10000))
    assert t.wall >= 0 and t.cpu >= 0
    lin = torch.nn.Linear(2, 2)
    with CallClock(lin) as clock:
        lin(torch.zeros(1, 2))
        lin(torch.zeros(1, 2))
    lin(torch.zeros(1, 2))  # after the block: not timed
    assert len(clock.marks) == 2 and clock.marks[0][0] <= clock.marks[1][0]
    assert json_lines("noise\n" + json.dumps({"a": 1}) + "\n{\"b\": 2}") == [{"a": 1}, {"b": 2}]
    env = worker_env(3, EXTRA="1")
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "3" and env["EXTRA"] == "1"


def test_time_commands_times_each_command_in_fresh_processes_with_the_worker_env(tmp_path):
    """One row per timed run (the warm-up run is not one), in the children the worker environment
    (its thread count) reaches; a failing child raises rather than being timed."""
    log = tmp_path / "runs.txt"
    count = f"open({str(log)!r}, 'a').write('x')"
    check = "import os, sys; sys.exit(os.environ['OMP_NUM_THREADS'] != '3')"
    rows = time_commands({"count": ["-c", count], "threads": ["-c", check]}, repeats=2, threads=3)
    assert [(r["command"], r["run"]) for r in rows] == [("count", 0), ("count", 1),
                                                         ("threads", 0), ("threads", 1)]
    assert log.read_text() == "xxx"  # the warm-up run and the two timed ones
    assert all(r["wall_s"] > 0 and r["load_average"] >= 0 for r in rows)
    with pytest.raises(subprocess.CalledProcessError):  # the wrong thread count reaches the child
        time_commands({"threads": ["-c", check]}, repeats=1, threads=2)
