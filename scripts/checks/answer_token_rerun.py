"""What scoring the answer instead of its whitespace moved (numerics version 3), on the FV tasks
whose answers start with a digit (word_length, next_item, prev_item, squad_val): the rows of those
tasks in the site_fv and baselines results, before (read from git at each source's ``before``
commit, the last one scored on the whitespace token) and after (the committed CSVs, rerun with
the commands in ``COMMANDS``).

    python scripts/checks/answer_token_rerun.py

Writes ``benchmarks/results/answer_token_rerun.csv`` and ``.md``: per source, model, task and
method, the first-token accuracy and exact match before and after and their changes in points.
A row whose seconds per item are the same before and after was not rerun (a rerun never times
the same to the last digit); those rows are left out of the table and listed, with their command.
"""

from __future__ import annotations

import io
import subprocess
from pathlib import Path

import pandas as pd

from sitelens.io import atomic_write_csv, atomic_write_text

ROOT = Path(__file__).resolve().parents[2]
RES = ROOT / "benchmarks" / "results"
TASKS = ("word_length", "next_item", "prev_item", "squad_val")
MODELS = ("smollm2-135m-instruct", "gemma-3-270m")
# source: (the last commit of its rows scored on the whitespace token, its results file)
SOURCES = {"site_fv": ("98023ea", "site_fv_{model}.csv"),
           "baselines": ("88209db", "baselines_{model}.csv")}
COMMANDS = {
    "site_fv": "python benchmarks/site_fv.py --models {model} --limit 50 --no-reference --threads 1 "
               "--tasks {tasks}",
    "baselines": "sitelens bench --models {model} --tasks ../shared/datasets/fv/{{{tasks}}} --limit 50 "
                 "--threads 1{n_ctx} --out benchmarks/results/baselines_{model}.csv",
}
N_CTX = {"smollm2-135m-instruct": " --n-ctx 4096"}  # squad_val's 10-shot prompts (benchmarks/baselines.py)


def before_csv(commit: str, path: str) -> pd.DataFrame:
    text = subprocess.run(["git", "-C", str(ROOT), "show", f"{commit}:{path}"], check=True,
                          capture_output=True, text=True).stdout
    return pd.read_csv(io.StringIO(text))


def compare() -> pd.DataFrame:
    rows = []
    for source, (commit, pattern) in SOURCES.items():
        for model in MODELS:
            path = f"benchmarks/results/{pattern.format(model=model)}"
            old = before_csv(commit, path)
            new = pd.read_csv(ROOT / path)
            keys = ["task", "method"]
            m = old[old.task.isin(TASKS)].merge(new[new.task.isin(TASKS)], on=keys, how="left",
                                                suffixes=("_before", "_after"))
            m.insert(0, "model", model)
            m.insert(0, "source", source)
            rows.append(m[["source", "model", *keys, "n_before", "n_after", "first_token_acc_before",
                           "first_token_acc_after", "exact_match_before", "exact_match_after",
                           "seconds_per_item_before", "seconds_per_item_after"]])
    df = pd.concat(rows, ignore_index=True)
    df["rerun"] = df.seconds_per_item_before != df.seconds_per_item_after
    df["first_token_change"] = 100 * (df.first_token_acc_after - df.first_token_acc_before)
    df["exact_match_change"] = 100 * (df.exact_match_after - df.exact_match_before)
    return df.drop(columns=["seconds_per_item_before", "seconds_per_item_after"])


def main() -> int:
    df = compare()
    atomic_write_csv(RES / "answer_token_rerun.csv", df)
    done, left = df[df.rerun], df[~df.rerun]
    lines = ["# Scoring the answer, not its whitespace: the rows that moved", "",
             "Made by `python scripts/checks/answer_token_rerun.py`. Before: the rows at the last "
             "commit scored on the whitespace token (" + ", ".join(
                 f"{s} {c}" for s, (c, _) in SOURCES.items()) + "); after: the committed CSVs "
             "(numerics version 3). FT: first-token accuracy, EM: exact match, in %; first 50 test "
             "items of each task (47 for next_item and prev_item, their whole test split). A row "
             "counts as rerun where its seconds per item changed.", "",
             "| source | model | task | method | FT before | FT after | EM before | EM after |",
             "|---|---|---|---|---|---|---|---|"]
    for r in done.itertuples():
        lines.append(f"| {r.source} | {r.model} | {r.task} | {r.method} | "
                     f"{100 * r.first_token_acc_before:.0f} | {100 * r.first_token_acc_after:.0f} | "
                     f"{100 * r.exact_match_before:.0f} | {100 * r.exact_match_after:.0f} |")
    if len(left):
        lines += ["", "## Not rerun yet", "",
                  "These rows are still the ones scored on the whitespace token; the commands rerun "
                  "them (after their old rows are removed from the results file):", ""]
        for (source, model), g in left.groupby(["source", "model"], sort=False):
            tasks = ",".join(dict.fromkeys(g.task))
            cmd = COMMANDS[source].format(model=model, tasks=tasks, n_ctx=N_CTX.get(model, ""))
            lines.append(f"- {source}, {model}: {', '.join(dict.fromkeys(g.task))} ({len(g)} rows): `{cmd}`")
    atomic_write_text(RES / "answer_token_rerun.md", "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
