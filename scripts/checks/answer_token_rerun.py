"""What scoring the answer instead of its whitespace moved (numerics version 3), on the FV tasks
whose answers start with a digit (word_length, next_item, prev_item, squad_val): the site_fv rows
of those tasks before (read from git at ``BEFORE``, the last commit of numerics version 2) and after
(the committed CSVs, rerun with ``python benchmarks/site_fv.py --models MODEL --limit 50
--no-reference --threads 1 [--abstractive] --tasks ...``).

    python scripts/checks/answer_token_rerun.py

Writes ``benchmarks/results/answer_token_rerun.csv`` and ``.md``: per model, task and method, the
first-token accuracy and exact match before and after, and their changes in points.
"""

from __future__ import annotations

import io
import subprocess
from pathlib import Path

import pandas as pd

from sitelens.io import atomic_write_csv, atomic_write_text

ROOT = Path(__file__).resolve().parents[2]
RES = ROOT / "benchmarks" / "results"
BEFORE = "98023ea"  # the last commit scored on the whitespace token
TASKS = ("word_length", "next_item", "prev_item", "squad_val")
MODELS = ("smollm2-135m-instruct", "gemma-3-270m")


def before_csv(model: str) -> pd.DataFrame:
    path = f"benchmarks/results/site_fv_{model}.csv"
    text = subprocess.run(["git", "-C", str(ROOT), "show", f"{BEFORE}:{path}"], check=True,
                          capture_output=True, text=True).stdout
    return pd.read_csv(io.StringIO(text))


def main() -> int:
    rows = []
    for model in MODELS:
        old = before_csv(model)
        new = pd.read_csv(RES / f"site_fv_{model}.csv")
        keys = ["task", "method"]
        m = old[old.task.isin(TASKS)].merge(new[new.task.isin(TASKS)], on=keys,
                                            suffixes=("_before", "_after"))
        m.insert(0, "model", model)
        rows.append(m[["model", *keys, "n_before", "n_after", "first_token_acc_before",
                       "first_token_acc_after", "exact_match_before", "exact_match_after"]])
    df = pd.concat(rows, ignore_index=True)
    df["first_token_change"] = (100 * (df.first_token_acc_after - df.first_token_acc_before)).round(1)
    df["exact_match_change"] = (100 * (df.exact_match_after - df.exact_match_before)).round(1)
    atomic_write_csv(RES / "answer_token_rerun.csv", df)
    lines = ["# Scoring the answer, not its whitespace: the site_fv rows that moved", "",
             "Made by `python scripts/checks/answer_token_rerun.py` (before: commit "
             f"{BEFORE}, numerics version 2; after: the committed site_fv CSVs, numerics version 3). "
             "FT: first-token accuracy, EM: exact match, in %; first 50 test items of each task. "
             "squad_val was not rerun (its stage 1 alone takes most of an hour on this CPU): its "
             "rows are the same before and after.", "",
             "| model | task | method | FT before | FT after | EM before | EM after |",
             "|---|---|---|---|---|---|---|"]
    for r in df.itertuples():
        lines.append(f"| {r.model} | {r.task} | {r.method} | {100 * r.first_token_acc_before:.0f} | "
                     f"{100 * r.first_token_acc_after:.0f} | {100 * r.exact_match_before:.0f} | "
                     f"{100 * r.exact_match_after:.0f} |")
    atomic_write_text(RES / "answer_token_rerun.md", "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
