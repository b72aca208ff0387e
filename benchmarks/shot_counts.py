"""Shot counts that fit the context: prompt token lengths of every task of the cls, bbh, mmlu_pro
and anli collections with each bundled tokenizer, and the largest k ≤ 10 whose k-shot prompts
plus the 32 tokens of generation fit n_ctx = 2048 (:func:`sitelens.tasks.shots.shots_that_fit`).

    python benchmarks/shot_counts.py [--datasets ../shared/datasets]
        # writes results/shot_counts.csv (one row per model × task) and shot_counts.md

Tokenization only (no forward pass): a few seconds per collection. The "guaranteed" k holds for
every seed (the k longest demonstrations + the longest query); the "seed 0" k is what a bench run
with seed 0 builds for the test split. The results are deterministic, so a rerun rewrites both
files with the same content (atomically); the CSV records the models' weight fingerprints and
each task's hash.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd

import sitelens as sl
from sitelens.io import atomic_write_text
from sitelens.models import fingerprint
from sitelens.pipelines.experiment import DATA_ROOT, md_table
from sitelens.provenance import task_hash
from sitelens.tasks import load_collection
from sitelens.tasks.shots import MAX_SHOTS, RESERVE, guaranteed_lengths, seeded_lengths, shots_that_fit

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
COLLECTIONS = ("cls", "bbh", "mmlu_pro", "anli")
N_CTX = 2048


def rows_for(model, name: str, collection: str, tasks) -> list[dict]:
    rows = []
    for t in tasks:
        g = guaranteed_lengths(model, t, MAX_SHOTS)
        s = seeded_lengths(model, t, MAX_SHOTS, seed=0)
        if any(a < b for a, b in zip(g, s)):
            raise AssertionError(f"{t.name}: a seeded prompt is longer than the bound: {g} vs {s}")
        fit_g = shots_that_fit(model, t, n_ctx=N_CTX, guaranteed=True)
        fit_s = shots_that_fit(model, t, n_ctx=N_CTX, guaranteed=False, seed=0)
        rows.append({
            "model": name, "fingerprint": fingerprint(model), "collection": collection,
            "task": t.name, "task_hash": task_hash(t), "n_ctx": N_CTX, "reserve": RESERVE,
            "k_guaranteed": fit_g.k, "k_seed0": fit_s.k,
            "tokens_0shot_max": g[0], "tokens_10shot_bound": g[-1] if len(g) > MAX_SHOTS else "",
            "tokens_10shot_seed0": s[-1] if len(s) > MAX_SHOTS else "",
            "tokens_at_k_guaranteed": fit_g.tokens_at_k,
        })
    return rows


def markdown(df: pd.DataFrame) -> str:
    per = (df.groupby(["collection", "model"], sort=False)
           .agg(tasks=("task", "size"), k=("k_guaranteed", "min"), k_seed0=("k_seed0", "min"),
                longest_zero_shot=("tokens_0shot_max", "max"))
           .reset_index())
    limiting = (df.sort_values("k_guaranteed").groupby(["collection", "model"], sort=False)
                .first()["task"])
    per["smallest k at"] = [limiting[(c, m)] for c, m in zip(per["collection"], per["model"])]
    lines = [
        "# Shot counts that fit the context", "",
        f"`python benchmarks/shot_counts.py` ({time.strftime('%Y-%m-%d')}). The largest k ≤ "
        f"{MAX_SHOTS} such that every k-shot prompt plus {RESERVE} generated tokens fits "
        f"n_ctx = {N_CTX} (`sitelens.tasks.shots.shots_that_fit`). **k** holds for every seed (the k "
        "longest demonstrations + the longest query of any split, tokenized whole); "
        "**k (seed 0)** only for the prompts a bench run with seed 0 builds for the test split. "
        "One k per collection: the smallest over its tasks, so that one shot count serves "
        "them all.", "",
        md_table(per.rename(columns={"k_seed0": "k (seed 0)",
                                     "longest_zero_shot": "longest 0-shot prompt (tokens)"})),
        "", "## Per task (k < 10 only)", "",
    ]
    short = df[df["k_guaranteed"] < MAX_SHOTS][
        ["collection", "model", "task", "k_guaranteed", "k_seed0", "tokens_0shot_max",
         "tokens_10shot_bound"]]
    lines.append(md_table(short) if len(short) else "Every task fits 10 shots.")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--datasets", default=str(DATA_ROOT))
    ap.add_argument("--models", default="smollm2-135m-instruct,gemma-3-270m")
    args = ap.parse_args()
    rows = []
    collections = {c: load_collection(Path(args.datasets) / c) for c in COLLECTIONS}
    for name in args.models.split(","):
        model = sl.load_model(name)
        for c, tasks in collections.items():
            rows += rows_for(model, name, c, tasks)
        del model
    df = pd.DataFrame(rows)
    RESULTS.mkdir(exist_ok=True)
    atomic_write_text(RESULTS / "shot_counts.csv", df.to_csv(index=False))
    md = markdown(df)
    atomic_write_text(RESULTS / "shot_counts.md", md)
    print(md)


if __name__ == "__main__":
    main()
