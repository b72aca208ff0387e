"""The report of benchmarks/dtype_compare.py on small made-up tables: CPU seconds are summed per
kind of CPU (bfloat16 matmuls native, emulated, or not recorded in rows older than the column),
never across kinds, while the accuracy comparison pairs every task. Running the fits is the
benchmark's job, never a test's."""

from __future__ import annotations

import pandas as pd
import pytest
from bench_util import bench_module

dc = bench_module("dtype_compare")  # benchmarks/dtype_compare.py
MODEL = "smollm2-135m-instruct"


def _row(task, dtype, em, cpu_s, kind):
    row = {"model": MODEL, "task": task, "dtype": dtype, "exact_match": em, "first_token_acc": em,
           "n": 50, "stage1_seconds": cpu_s, "stage2_seconds": cpu_s, "eval_seconds": cpu_s,
           "stage1_cpu_seconds": cpu_s, "stage2_cpu_seconds": cpu_s, "eval_cpu_seconds": cpu_s,
           "best_step": 50, "load_avg": 1.0}
    if kind is not None:
        row["cpu_bf16"] = kind
    return row


@pytest.fixture
def report(tmp_path):
    # rows from before the cpu_bf16 column read it blank (the store rewrites the older header)
    rows = [_row("a", "float32", 0.5, 30.0, None), _row("a", "bfloat16", 0.5, 10.0, None),
            _row("b", "float32", 0.6, 20.0, "emulated"), _row("b", "bfloat16", 0.4, 80.0, "emulated"),
            _row("c", "float32", 0.7, 10.0, "emulated"),  # c: one dtype only, left out
            # d: resumed on another CPU between its dtypes: in the accuracy, not in the seconds
            _row("d", "float32", 0.3, 500.0, None), _row("d", "bfloat16", 0.4, 5.0, "emulated")]
    pd.DataFrame(rows, columns=dc.FIELDS).to_csv(tmp_path / f"dtype_compare_{MODEL}.csv", index=False)
    assert dc.main(dc.DtypeCompare(), ["--report", "--out", str(tmp_path)]) == 0
    return tmp_path


def test_cpu_seconds_are_summed_per_cpu_kind(report):
    s = pd.read_csv(report / "dtype_compare_summary.csv")
    total = s[s.stage == "all_cpu_seconds"].set_index("cpu_bf16")
    assert set(total.index) == {"not recorded", "emulated"}
    # a: float32 3 × 30 s against bfloat16 3 × 10 s; b: 3 × 20 s against 3 × 80 s
    assert total.loc["not recorded", "ratio"] == pytest.approx(3.0)
    assert total.loc["emulated", "ratio"] == pytest.approx(0.25)
    assert total.loc["emulated", "n_tasks"] == 1


def test_accuracy_pairs_every_task_with_both_dtypes(report):
    p = pd.read_csv(report / "dtype_compare_paired.csv").set_index("metric")
    em = p.loc["exact_match"]
    assert em.n == 3  # a, b and d; c has one dtype only
    assert em["diff"] == pytest.approx((0.0 - 0.2 + 0.1) / 3)
    md = (report / "dtype_compare.md").read_text()
    assert "### cpu_bf16 emulated: 1 task(s)" in md and "### cpu_bf16 not recorded: 1 task(s)" in md
