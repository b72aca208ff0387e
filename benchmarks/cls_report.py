"""LTV vs the other task-vector methods on the classification collection: the report.

The cells come from the resumable CLI, one CSV per model (test split capped with ``--limit``):

    sitelens bench --models MODEL --tasks-dir ../shared/datasets/cls \\
        --methods zero-shot,icl,fv,tv,sv,i2cl,mtv,ltv --limit L --threads 1 \\
        --out benchmarks/results/cls_MODEL.csv
    python benchmarks/cls_report.py --run-sweep-ltv --models MODEL --limit L   # + "ltv-sweep"
    python benchmarks/cls_report.py                                   # -> results/cls_report.md

``--run-sweep-ltv`` adds the cells of ``LTV(layer="sweep", name="ltv-sweep")`` to the same CSV
through :func:`sitelens.pipelines.bench.run_bench` (the CLI takes registry names only).
"""

from __future__ import annotations

import pandas as pd

from sitelens.pipelines.bench import dntp_accuracy_correlation, read_results, summary_markdown
from sitelens.pipelines.experiment import Experiment, main, md_table, pct

MODELS = ("smollm2-135m-instruct", "gemma-3-270m")
# gradient-free task vectors (the paper's "training-free" LTV, FV, TV, State Vector) and the two
# that fit a few parameters by gradient (I2CL: 4 per layer; MTV: a head mask by REINFORCE)
TRAINING_FREE = ["fv", "tv", "sv", "ltv", "ltv-sweep", "ltv-valid"]
FEW_PARAMS = ["i2cl", "mtv"]
ORDER = ["zero-shot", "icl", *TRAINING_FREE, *FEW_PARAMS]
INTRO = (
    "Made by the commands in `benchmarks/cls_report.py` (resumable). Accuracies in %. **label acc** ranks "
    "the task's label words by their log-likelihood under the method (full label; first token where the "
    "labels' first tokens differ), the headline for a closed label set; **exact match** and **first-token** "
    "score the greedy generation. dNTP = KL(P_icl ‖ P_method) at the answer position against the 10-shot "
    "ICL reference (ICL's is 0). Means over the tasks where every method finished.")


def split(df: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    """(the finished cells, those of the core methods on the tasks where every core method finished,
    the core methods: those that finished on the most tasks; a method added later on fewer tasks
    is reported apart rather than shrinking the grid to its tasks)."""
    ok = df[pd.to_numeric(df["exact_match"], errors="coerce").notna()]
    n = ok.groupby("method")["task"].nunique()
    core = sorted(n.index[n == n.max()]) if len(n) else []
    full = ok[ok["method"].isin(core)]
    tasks = [t for t, g in full.groupby("task") if set(g["method"]) >= set(core)]
    return ok, full[full["task"].isin(tasks)], core


def label_table(sub: pd.DataFrame, cols: list[str], fmt) -> str:
    piv = sub.pivot_table(index="task", columns="method", values="label_acc_full")
    chance = sub.groupby("task")["chance"].mean()
    return md_table(pd.DataFrame([{"task": t, "chance": pct(chance[t]), **{c: fmt(piv, t, c) for c in cols}}
                                  for t in sorted(sub["task"].unique())]))


def extras(ok: pd.DataFrame, core: list[str]) -> list[str]:
    """Methods outside the main grid, each beside ICL, zero-shot, TV and LTV on its tasks."""
    lines = []
    for m in [x for x in ORDER if x in set(ok["method"]) - set(core)]:
        sub = ok[ok["task"].isin(ok.loc[ok["method"] == m, "task"])]
        dn = sub.pivot_table(index="task", columns="method", values="dntp")
        cols = [c for c in ("zero-shot", "icl", "tv", "ltv", m) if c in set(sub["method"])]
        lines += [f"**{m}** (on {sub['task'].nunique()} of the tasks so far): label accuracy % (dNTP)", "",
                  label_table(sub, cols, lambda p, t, c, d=dn: f"{pct(p.loc[t, c])} ({d.loc[t, c]:.2f})"), ""]
    return lines


def ordering(full: pd.DataFrame) -> list[str]:
    m = full.groupby("method")[["label_acc_full", "label_acc_first", "exact_match", "dntp"]].mean()
    vec = [x for x in m.sort_values("label_acc_full", ascending=False).index
           if x in TRAINING_FREE + FEW_PARAMS]
    return ["| rank | method | label acc (full) | label acc (first token) | exact match | dNTP |",
            "|---:|---|---:|---:|---:|---:|"] + [
        f"| {i} | {x}{'' if x in TRAINING_FREE else ' (trains)'} | {pct(r.label_acc_full)} | "
        f"{pct(r.label_acc_first)} | {pct(r.exact_match)} | {r.dntp:.2f} |"
        for i, (x, r) in enumerate(((x, m.loc[x]) for x in vec), 1)]


def correlations(full: pd.DataFrame) -> list[str]:
    lines = ["| accuracy | methods | cells | Pearson r | Spearman ρ (pooled) | "
             "Spearman ρ within a task (mean) |", "|---|---|---:|---:|---:|---:|"]
    for acc in ("label_acc_full", "exact_match"):
        for label, exclude in (("all but ICL", ("icl",)), ("task vectors only", ("icl", "zero-shot"))):
            c = next(iter(dntp_accuracy_correlation(full, accuracy=acc, exclude=exclude).values()), None)
            if c:
                lines.append(f"| {acc} | {label} | {c['n_cells']} | {c['pearson']:.2f} | "
                             f"{c['spearman']:.2f} | {c['within_task_spearman']:.2f} "
                             f"({c['n_tasks_within']} tasks) |")
    return lines


class ClsReport(Experiment):
    name = "cls_report"
    key = None
    models = MODELS
    limit = 100

    def add_arguments(self, p) -> None:
        p.add_argument("--run-sweep-ltv", action="store_true", help="add the ltv-sweep cells first")

    def cells(self, args):
        if not args.run_sweep_ltv or args.dry_run:
            return
        from sitelens.baselines import LTV
        from sitelens.pipelines.bench import run_bench
        from sitelens.tasks import load_collection

        for model in args.models:
            run_bench([model], load_collection(args.data_root / "cls"),
                      [LTV(layer="sweep", name="ltv-sweep")], self.out / f"cls_{model}.csv", limit=args.limit,
                      progress=True)
        yield from ()

    def write_report(self) -> str:
        from sitelens.io import atomic_write_text

        parts = ["# Task vectors on the classification collection (cls/)", "", INTRO, ""]
        for model in [m for m in MODELS if (self.out / f"cls_{m}.csv").exists()]:
            df = read_results(self.out / f"cls_{model}.csv")
            ok, full, core = split(df)
            tasks = sorted(full["task"].unique())
            cols = [m for m in ORDER if m in set(full["method"])]
            parts += [f"## {model}", "",
                      f"{len(tasks)} tasks complete ({', '.join(tasks)}); test items per task: the first "
                      f"{', '.join(map(str, sorted(set(df['limit'].dropna().astype(int)))))}.", "",
                      "Task-vector methods ordered by label accuracy:", "", *ordering(full), "",
                      summary_markdown(full).strip().split("\n", 2)[2], "", "Label accuracy per task:", "",
                      label_table(full, cols, lambda p, t, c: pct(p.loc[t, c])), "",
                      "dNTP vs accuracy across (task, method) cells:", "", *correlations(full), "",
                      *extras(ok, core)]
        text = "\n".join(parts) + "\n"
        atomic_write_text(self.out / "cls_report.md", text)
        return text


if __name__ == "__main__":
    raise SystemExit(main(ClsReport()))
