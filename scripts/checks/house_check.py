"""Issue 30's "numbers unchanged" check: the same ``sitelens bench`` grid run on the code before
the restructuring (ca020c0) and after it, compared cell by cell and column by column.

    git worktree add /tmp/before ca020c0 && cd /tmp/before
    PYTHONPATH=$PWD sitelens bench --models smollm2-135m-instruct \\
        --tasks ../shared/datasets/fv/antonym ../shared/datasets/fv/country-capital \\
        --limit 50 --threads 1 --out /tmp/house/before.csv
    # the same from the restructured checkout, --out /tmp/house/after.csv
    python scripts/checks/house_check.py /tmp/house/before.csv /tmp/house/after.csv \\
        "before: ca020c0, after: 46840ca"
    # issue 41's: before 159eb94 (the answer-token fix, before the house work), after 8106dbf
    python scripts/checks/house_check.py before.csv after.csv "before: 159eb94, after: 8106dbf" \\
        house_check_41 41

Writes ``benchmarks/results/refactor_check/house_check.md`` (and copies both CSVs beside it): every
value column and every key column must be equal as written (no tolerance: the same code path on
the same CPU must give the same bytes); timings are left out.
"""

from __future__ import annotations

import shutil
import sys

import pandas as pd

from sitelens.pipelines.experiment import RESULTS, md_table

COMPARED = ["n", "first_token_acc", "exact_match", "dntp", "trainable_params", "key", "fingerprint",
            "task_hash", "method_params", "template", "numerics_version"]


def main(before: str, after: str, label: str = "", name: str = "house_check", issue: str = "30") -> int:
    """Compare ``before`` with ``after`` into ``refactor_check/{name}.md`` (and the two CSVs as
    ``{name}_before.csv`` / ``{name}_after.csv``); an earlier check's files keep their names."""
    out = RESULTS / "refactor_check"
    a, b = pd.read_csv(before, dtype=str), pd.read_csv(after, dtype=str)
    m = a.merge(b, on=["model", "task", "method", "seed"], suffixes=("_before", "_after"))
    rows = [{"column": c, "cells": len(m), "equal": int((m[f"{c}_before"] == m[f"{c}_after"]).sum())}
            for c in COMPARED]
    ok = len(m) == len(a) == len(b) and all(r["equal"] == r["cells"] for r in rows)
    text = "\n".join([
        f"# Restructuring check (issue {issue})", "",
        f"Made by `python scripts/checks/house_check.py before.csv after.csv LABEL {name} {issue}` (the "
        "bench commands are in "
        "the script's docstring)" + (f"; {label}" if label else "") + ". "
        + ("Every" if ok else "NOT every") + " compared column is equal in all "
        + f"{len(m)} (task, method) cells: {', '.join(sorted(set(m.method)))} on "
        f"{', '.join(sorted(set(m.task)))}.", "", md_table(pd.DataFrame(rows)), ""])
    prefix = "house" if name == "house_check" else name  # issue 30's files keep their names
    shutil.copy(before, out / f"{prefix}_before.csv")
    shutil.copy(after, out / f"{prefix}_after.csv")
    (out / f"{name}.md").write_text(text)
    print(text)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:6]))
