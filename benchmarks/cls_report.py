"""LTV vs the other task-vector methods on the classification collection: the report.

The cells come from the resumable CLI, one CSV per model (test split capped with ``--limit``):

    sitelens bench --models MODEL --tasks-dir ../shared/datasets/cls \\
        --methods zero-shot,icl,fv,tv,sv,i2cl,mtv,ltv --limit L --threads 1 \\
        --out benchmarks/results/cls_MODEL.csv
    python benchmarks/cls_report.py --run-sweep-ltv --models MODEL --limit L   # + "ltv-sweep"
    python benchmarks/cls_report.py                                   # -> results/cls_report.md

``--run-sweep-ltv`` adds the cells of ``LTV(layer="sweep", name="ltv-sweep")`` (the block chosen
on the valid split, :mod:`sitelens.baselines.ltv`) to the same CSV through
:func:`sitelens.pipelines.bench.run_bench`, with the bench's keys and settings (the CLI takes registry
names only). The report: per model, means over the tasks where every method finished, of
full-label ranking accuracy (the headline for a closed label set), first-token label ranking,
length-normalized ranking, the chance level, first-token accuracy and exact match of the greedy
generation, and dNTP; the ordering of the task-vector methods by label accuracy; per-task label
accuracy; and the dNTP–accuracy correlations (against label accuracy and against exact match).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from sitelens.io import atomic_write_text
from sitelens.pipelines.bench import dntp_accuracy_correlation, read_results, summary_markdown
from sitelens.pipelines.experiment import DATA_ROOT, md_table, pct

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
CLS = DATA_ROOT / "cls"
MODELS = ("smollm2-135m-instruct", "gemma-3-270m")
# gradient-free task vectors (the paper's "training-free" LTV, FV, TV, State Vector) and the two
# that fit a few parameters by gradient (I2CL: 4 per layer; MTV: a head mask by REINFORCE)
TRAINING_FREE = ["fv", "tv", "sv", "ltv", "ltv-sweep", "ltv-valid"]
FEW_PARAMS = ["i2cl", "mtv"]
ORDER = ["zero-shot", "icl", *TRAINING_FREE, *FEW_PARAMS]


def _finished(df: pd.DataFrame) -> pd.DataFrame:
    return df[pd.to_numeric(df["exact_match"], errors="coerce").notna()]


def core_methods(df: pd.DataFrame) -> list[str]:
    """The methods that finished on the most tasks (the main grid); a method added later on
    fewer tasks (``ltv-valid``) is reported apart (:func:`extras`) rather than shrinking the grid
    to its tasks."""
    n = _finished(df).groupby("method")["task"].nunique()
    return sorted(n.index[n == n.max()]) if len(n) else []


def complete(df: pd.DataFrame) -> pd.DataFrame:
    """The cells of the core methods on the tasks where every core method finished."""
    ok = _finished(df)
    methods = set(core_methods(df))
    ok = ok[ok["method"].isin(methods)]
    tasks = [t for t, g in ok.groupby("task") if set(g["method"]) >= methods]
    return ok[ok["task"].isin(tasks)]


def extras(df: pd.DataFrame) -> list[str]:
    """Methods outside the main grid, each beside ICL, zero-shot, TV and LTV on the tasks where
    it finished."""
    ok = _finished(df)
    core = set(core_methods(df))
    lines = []
    for m in [x for x in ORDER if x in set(ok["method"]) - core]:
        tasks = sorted(ok.loc[ok["method"] == m, "task"].unique())
        sub = ok[ok["task"].isin(tasks)]
        cols = [c for c in ("zero-shot", "icl", "tv", "ltv", m) if c in set(sub["method"])]
        piv = sub.pivot_table(index="task", columns="method", values="label_acc_full")
        dn = sub.pivot_table(index="task", columns="method", values="dntp")
        chance = sub.groupby("task")["chance"].mean()
        rows = [{"task": t, "chance": pct(chance[t]),
                 **{c: f"{pct(piv.loc[t, c])} ({dn.loc[t, c]:.2f})" for c in cols}} for t in tasks]
        lines += [f"**{m}** (on {len(tasks)} of the tasks so far): label accuracy % (dNTP)", "",
                  md_table(pd.DataFrame(rows)), ""]
    return lines



def ordering(full: pd.DataFrame) -> list[str]:
    m = full.groupby("method")[["label_acc_full", "label_acc_first", "exact_match", "dntp"]].mean()
    lines = ["| rank | method | label acc (full) | label acc (first token) | exact match | dNTP |",
             "|---:|---|---:|---:|---:|---:|"]
    vec = [x for x in m.sort_values("label_acc_full", ascending=False).index
           if x in TRAINING_FREE + FEW_PARAMS]
    for i, x in enumerate(vec, 1):
        r = m.loc[x]
        lines.append(f"| {i} | {x}{'' if x in TRAINING_FREE else ' (trains)'} | "
                     f"{pct(r.label_acc_full)} | {pct(r.label_acc_first)} | "
                     f"{pct(r.exact_match)} | {r.dntp:.2f} |")
    return lines


def per_task(full: pd.DataFrame) -> str:
    piv = full.pivot_table(index="task", columns="method", values="label_acc_full")
    cols = [m for m in ORDER if m in piv.columns]
    chance = full.groupby("task")["chance"].mean()
    rows = [{"task": t, "chance": pct(chance[t]), **{m: pct(piv.loc[t, m]) for m in cols}}
            for t in piv.index]
    return md_table(pd.DataFrame(rows))


def correlations(full: pd.DataFrame) -> list[str]:
    lines = ["| accuracy | methods | cells | Pearson r | Spearman ρ (pooled) | "
             "Spearman ρ within a task (mean) |", "|---|---|---:|---:|---:|---:|"]
    for acc in ("label_acc_full", "exact_match"):
        for label, exclude in (("all but ICL", ("icl",)),
                               ("task vectors only", ("icl", "zero-shot"))):
            c = next(iter(dntp_accuracy_correlation(full, accuracy=acc, exclude=exclude).values()),
                     None)
            if c:
                lines.append(f"| {acc} | {label} | {c['n_cells']} | {c['pearson']:.2f} | "
                             f"{c['spearman']:.2f} | {c['within_task_spearman']:.2f} "
                             f"({c['n_tasks_within']} tasks) |")
    return lines


def report() -> str:
    parts = ["# Task vectors on the classification collection (cls/)", "",
             "Made by the commands in `benchmarks/cls_report.py` (resumable). Accuracies in %. "
             "**label acc** ranks the task's label words by their log-likelihood under the "
             "method (full label; first token where the labels' first tokens differ), the "
             "headline for a closed label set; **exact match** and **first-token** score the "
             "greedy generation. dNTP = KL(P_icl ‖ P_method) at the answer position against the "
             "10-shot ICL reference (ICL's is 0). Means over the tasks where every method "
             "finished.", ""]
    for model in MODELS:
        path = RESULTS / f"cls_{model}.csv"
        if not path.exists():
            continue
        df = read_results(path)
        full = complete(df)
        tasks = sorted(full["task"].unique())
        limit = sorted(set(df["limit"].dropna().astype(int)))
        parts += [f"## {model}", "",
                  f"{len(tasks)} tasks complete ({', '.join(tasks)}); test items per task: the "
                  f"first {', '.join(map(str, limit))}.", "",
                  "Task-vector methods ordered by label accuracy:", "", *ordering(full), "",
                  summary_markdown(full).strip().split("\n", 2)[2], "",
                  "Label accuracy per task:", "", per_task(full), "",
                  "dNTP vs accuracy across (task, method) cells:", "", *correlations(full), "",
                  *extras(df)]
    return "\n".join(parts) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run-sweep-ltv", action="store_true")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--limit", type=int, default=100)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    if args.run_sweep_ltv:
        import torch

        from sitelens.baselines import LTV
        from sitelens.pipelines.bench import run_bench
        from sitelens.tasks import load_collection

        torch.set_num_threads(args.threads)
        for model in args.models.split(","):
            run_bench([model], load_collection(CLS), [LTV(layer="sweep", name="ltv-sweep")],
                      RESULTS / f"cls_{model}.csv", limit=args.limit, progress=True)
    md = report()
    atomic_write_text(RESULTS / "cls_report.md", md)
    print(md)


if __name__ == "__main__":
    main()
