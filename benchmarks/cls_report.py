"""LTV vs the other task-vector methods on the classification collection: the reports of the CLI's
cells (columns: docs/benchmarks.md).

    sitelens bench --models MODEL --tasks-dir ../shared/datasets/cls --label-metrics \\
        --methods zero-shot,icl,fv,tv,sv,i2cl,mtv,ltv,ltv-valid --limit 50 --threads 1 \\
        --out benchmarks/results/cls_MODEL.csv
    python benchmarks/cls_report.py     # -> results/cls_{MODEL}.md and cls_report.md
"""

from __future__ import annotations

import pandas as pd
from lib.paired import paired_rows

from sitelens.io import atomic_write_csv
from sitelens.pipelines.bench import read_results
from sitelens.pipelines.bench_summary import complete_tasks, correlation_rows, summary_markdown
from sitelens.pipelines.experiment import Experiment, main, md_table, pct, write_report

MODELS = ("smollm2-135m-instruct", "gemma-3-270m")
# gradient-free task vectors (the paper's "training-free" LTV, FV, TV, State Vector) and the two
# that fit a few parameters by gradient (I2CL: 4 per layer; MTV: a head mask by REINFORCE)
TRAINING_FREE = ["fv", "tv", "sv", "ltv", "ltv-valid"]
FEW_PARAMS = ["i2cl", "mtv"]
ORDER = ["zero-shot", "icl", *TRAINING_FREE, *FEW_PARAMS]


def bench_command(df: pd.DataFrame, model: str) -> str:
    """The ``sitelens bench`` command of one model's cells (methods in the order they were run;
    ``--label-metrics`` where the cells carry label metrics: the bench ranks labels only when
    asked)."""
    limit = ",".join(map(str, sorted(set(df["limit"].dropna().astype(int)))))
    labels = " --label-metrics" if pd.to_numeric(df["chance"], errors="coerce").notna().any() else ""
    return (f"sitelens bench --models {model} --tasks-dir ../shared/datasets/cls{labels} --methods "
            f"{','.join(df.method.unique())} --limit {limit} --threads 1 "
            f"--out benchmarks/results/cls_{model}.csv")


def complete(df: pd.DataFrame) -> pd.DataFrame:
    """The finished cells of the methods run on the most tasks, on the tasks where all of them
    finished (a method added later on fewer tasks is left out rather than shrinking the grid)."""
    ok = df[pd.to_numeric(df["exact_match"], errors="coerce").notna()]
    n = ok.groupby("method")["task"].nunique()
    return complete_tasks(ok[ok["method"].isin(n.index[n == n.max()])])


def section(full: pd.DataFrame) -> list[str]:
    """Task vectors ranked by label accuracy, the bench summary, label accuracy per task and the
    dNTP–accuracy correlations of one model."""
    m = full.groupby("method")[["label_acc_full", "label_acc_first", "exact_match", "dntp"]].mean()
    ranked = [x for x in m.sort_values("label_acc_full", ascending=False).index
              if x in TRAINING_FREE + FEW_PARAMS]
    rank = pd.DataFrame([{"rank": i, "method": x + ("" if x in TRAINING_FREE else " (trains)"),
                          "label acc (full)": pct(m.loc[x, "label_acc_full"]),
                          "label acc (first token)": pct(m.loc[x, "label_acc_first"]),
                          "exact match": pct(m.loc[x, "exact_match"]), "dNTP": f"{m.loc[x, 'dntp']:.2f}"}
                         for i, x in enumerate(ranked, 1)])
    piv = full.pivot_table(index="task", columns="method", values="label_acc_full")
    chance = full.groupby("task")["chance"].mean()
    cols = [c for c in ORDER if c in piv.columns]
    per_task = pd.DataFrame([{"task": t, "chance": pct(chance[t]), **{c: pct(piv.loc[t, c]) for c in cols}}
                             for t in piv.index])
    corr = correlation_rows(full, {"all but ICL": ("icl",), "task vectors only": ("icl", "zero-shot")},
                            ("label_acc_full", "exact_match")).drop(columns="model")
    return ["Task-vector methods ordered by label accuracy:", "", md_table(rank), "",
            "Paired differences in label accuracy (full label, points), over the tasks (the same 50 items "
            "of each task on both sides; `cls_paired.csv` has exact match too):", "",
            md_table(paired_table(full, "label_acc_full")), "",
            summary_markdown(full).strip().split("\n", 2)[2], "", "Label accuracy per task:", "",
            md_table(per_task), "", "dNTP vs accuracy across (task, method) cells:", "",
            md_table(corr), ""]


def comparisons(methods) -> list[tuple[str, str]]:
    """The pairs the report compares: ``ltv-valid`` (the distribution-alignment paper's method at
    its best here) against every other method, and the pinned ``ltv`` against ``ltv-valid``."""
    return [("ltv-valid", m) for m in ORDER if m not in ("ltv-valid",) and m in methods]


def paired_table(full: pd.DataFrame, metric: str) -> pd.DataFrame:
    """:func:`lib.paired.paired_rows` for :func:`comparisons`, as points for the page."""
    r = paired_rows(full, comparisons(set(full.method)), metric)
    return pd.DataFrame({"A − B": r.a + " − " + r.b,
                         "diff": (100 * r["diff"]).round(1), "95% CI (over tasks)":
                         [f"[{100 * lo:.1f}, {100 * hi:.1f}]" for lo, hi in zip(r.ci_low, r.ci_high)],
                         "n tasks": r.n, "A ahead / B ahead": [f"{a} / {b}" for a, b in
                                                              zip(r.a_ahead, r.b_ahead)]})


class ClsReport(Experiment):
    name = "cls_report"
    key = None

    def cells(self, args):
        return ()  # the cells are `sitelens bench` runs

    def write_report(self) -> str:
        parts = ["Accuracies in %; label acc ranks the label words by likelihood (the headline for a closed "
                 "label set); means over the tasks where every method finished. The cells: each model's "
                 "`cls_{model}.md`.", ""]
        paired = []
        for model in [m for m in MODELS if (self.out / f"cls_{m}.csv").exists()]:
            df = read_results(self.out / f"cls_{model}.csv")
            write_report(self.out / f"cls_{model}.md", f"Bench results: {model} on cls/",
                         bench_command(df, model),
                         "Summarized by `python benchmarks/cls_report.py`.\n\n" + summary_markdown(df))
            full = complete(df)
            paired += [paired_rows(full, comparisons(set(full.method)), metric)
                       for metric in ("label_acc_full", "exact_match")]
            tasks = sorted(full["task"].unique())
            parts += [f"## {model}", "", f"{len(tasks)} tasks complete ({', '.join(tasks)}); test items per "
                      f"task: the first {','.join(map(str, sorted(set(df['limit'].dropna().astype(int)))))}.",
                      "", *section(full)]
        atomic_write_csv(self.out / "cls_paired.csv", pd.concat(paired, ignore_index=True))
        title = "Task vectors on the classification collection (cls/)"
        return write_report(self.out / "cls_report.md", title, self.command, "\n".join(parts))


if __name__ == "__main__":
    raise SystemExit(main(ClsReport()))
