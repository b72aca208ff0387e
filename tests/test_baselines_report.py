"""benchmarks/baselines.py's report: the line saying which numerics version made which tasks' rows."""

from __future__ import annotations

import pandas as pd
from bench_util import bench_module

B = bench_module("baselines")


def frame(versions: dict[str, float]) -> pd.DataFrame:
    return pd.DataFrame({"task": [t for t in versions for _ in range(2)],
                         "numerics_version": [v for v in versions.values() for _ in range(2)]})


def test_versions_line_names_the_rerun_tasks_and_counts_the_rest():
    old = {f"task{i}": float("nan") for i in range(7)}  # unkeyed rows: version 1
    line = B.versions_line(frame({**old, "word_length": 3.0, "next_item": 3.0}))
    assert "version 1: 7 tasks (rows from before results were keyed)" in line
    assert "version 3: next_item, word_length" in line
    assert "answer_token_rerun.md" in line


def test_versions_line_is_empty_when_one_version_made_every_row():
    assert B.versions_line(frame({"a": 3.0, "b": 3.0})) == ""
    assert B.versions_line(frame({"a": float("nan")})) == ""


def test_versions_line_says_when_a_task_is_rerun_for_some_methods_only():
    df = frame({"a": float("nan"), "b": float("nan"), "squad_val": 3.0})
    df.loc[len(df)] = {"task": "squad_val", "numerics_version": float("nan")}  # one method not rerun
    line = B.versions_line(df)
    assert "version 1: a, b, squad_val; squad_val: 1 of its 3 methods" in line
    assert "version 3: squad_val; squad_val: 2 of its 3 methods" in line
