"""Summaries of the baselines benchmark: ``baselines_{model}.md`` and ``.dntp.html`` (+ ``.png`` with
kaleido) from the ``sitelens bench`` CSVs whose command each md names (docs/benchmarks.md).

    python benchmarks/baselines.py [--no-png]
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from lib.paired import paired_rows

from sitelens.io import atomic_write_csv
from sitelens.pipelines.bench import read_results
from sitelens.pipelines.bench_summary import (
    complete_tasks,
    correlation_rows,
    dntp_accuracy_figure,
    summary_markdown,
)
from sitelens.pipelines.experiment import Experiment, main, md_table, write_report
from sitelens.viz.export import write_figure_html

EMBEDDING_BASELINES = ["fv", "tv", "ltv", "mtv", "i2cl"]
PEFT = ["lora", "ia3"]
ORDER = ["zero-shot", "icl", "site", *EMBEDDING_BASELINES, *PEFT]
N_CTX = {"smollm2-135m-instruct": 4096}  # squad_val's 10-shot prompts reach 2,621 SmolLM2 tokens


def bench_command(df: pd.DataFrame, path: Path) -> str:
    """The ``sitelens bench`` command of the cells of ``df`` (tasks in the order they were run)."""
    model = df["model"].iloc[0]
    n_ctx = f" --n-ctx {N_CTX[model]}" if model in N_CTX else ""
    return (f"sitelens bench --models {model} --tasks ../shared/datasets/fv/{{{','.join(df.task.unique())}}} "
            f"--limit 50 --threads 1{n_ctx} --out benchmarks/results/{path.name}")


def targets(df: pd.DataFrame) -> list[str]:
    """The issue's target lines: SITE vs each embedding baseline, SITE beside LoRA and (IA)3."""
    em = 100 * df.groupby("method")["exact_match"].mean()
    if "site" not in em:
        return []
    rest = [m for m in EMBEDDING_BASELINES if m in em]
    beaten, lines = [m for m in rest if em[m] > em["site"]], []
    if beaten:
        lines.append(f"- SITE ≥ every embedding baseline: **missed**, {', '.join(beaten)} higher "
                     f"(SITE {em['site']:.1f}; " + ", ".join(f"{m} {em[m]:.1f}" for m in beaten) + ").")
    elif rest:
        best = max(rest, key=lambda m: em[m])
        lines.append(f"- SITE ≥ every embedding baseline: **met** (SITE {em['site']:.1f} vs best "
                     f"embedding baseline {best} {em[best]:.1f}).")
    peft = [f"{m} {em[m]:.1f}" for m in PEFT if m in em]
    return lines + ([f"- SITE vs PEFT, side by side: SITE {em['site']:.1f}, " + ", ".join(peft)
                     + " (exact match %)."] if peft else [])


def site_vs_each(full: pd.DataFrame) -> pd.DataFrame:
    """SITE − each other method, exact match, paired over the tasks where every method finished
    (the same test items)."""
    return paired_rows(full, [("site", m) for m in ORDER if m != "site"]).drop(columns="metric")


def paired_lines(paired: pd.DataFrame) -> list[str]:
    diffs = [f"{100 * r['diff']:+.1f} [{100 * r.ci_low:.1f}, {100 * r.ci_high:.1f}]"
             for _, r in paired.iterrows()]
    ahead = [f"{a} / {b}" for a, b in zip(paired.a_ahead, paired.b_ahead)]
    table = pd.DataFrame({"SITE −": paired.b, "exact match, points": diffs, "tasks": paired.n,
                          "SITE ahead / behind": ahead})
    return ["### SITE against each method, paired over tasks", "",
            "The same tasks and items on both sides: the mean of the per-task differences with its 95% "
            "percentile bootstrap interval over tasks (sitelens.stats.paired_difference).", "",
            md_table(table), ""]


def notes(full: pd.DataFrame) -> list[str]:
    """Exact match per task; dNTP vs exact match for all methods and for the ICL-derived ones (PEFT
    left out: trained on the answer token, it can be accurate far from the ICL distribution); the
    median fit seconds and seconds per item of each method."""
    piv = full.pivot_table(index="task", columns="method", values="exact_match")
    piv = piv[[m for m in ORDER if m in piv.columns]].map(lambda v: "" if pd.isna(v) else f"{100 * v:.0f}")
    corr = correlation_rows(full, {"all but ICL": ("icl",),
                                   "ICL-derived and zero-shot (no LoRA, (IA)3)": ("icl", *PEFT)})
    corr = corr.drop(columns=["model", "accuracy"])
    t = full.groupby("method")[["fit_seconds", "seconds_per_item"]].median()
    t = t.sort_values("fit_seconds", ascending=False).reset_index()
    t = pd.DataFrame({"method": t.method, "median fit s": t.fit_seconds.round().astype(int),
                      "median s / item": t.seconds_per_item.round(3)})
    return ["### Exact match per task (%)", "", md_table(piv.reset_index()), "",
            "### dNTP and exact match", "", md_table(corr), "", "### Where the time goes", "",
            "Median over tasks; what each fit runs: docs/benchmarks.md.", "",
            md_table(t), ""]


def versions_line(df: pd.DataFrame) -> str:
    """Which numerics version (``sitelens.provenance.NUMERICS_HISTORY``) made the rows of which
    tasks: the unkeyed rows are version 1."""
    v = pd.to_numeric(df["numerics_version"], errors="coerce").fillna(1).astype(int)
    per_task = df.groupby("task").size()
    parts = []
    for k in sorted(v.unique()):
        rows = df.task[v == k].value_counts()
        tasks = sorted(rows.index)
        mixed = [t for t in tasks if rows[t] < per_task[t]]  # a task rerun for some methods only
        what = (f"{len(tasks)} tasks" if len(tasks) > 5 else ", ".join(tasks)) + "".join(
            f"; {t}: {rows[t]} of its {per_task[t]} methods" for t in mixed)
        parts.append(f"version {k}: {what}" + (" (rows from before results were keyed)" if k == 1 else ""))
    return ("Numerics versions of the rows: " + "; ".join(parts) + ". Versions 1 and 2 compute the "
            "same numbers; version 3 scores each answer on its first token that carries text, which "
            "moves only answers whose first token is whitespace (those starting with a digit here): "
            "the tasks of such answers that are still of an older version are listed in "
            "[answer_token_rerun.md](answer_token_rerun.md).") if len(parts) > 1 else ""


def summarize(path: Path, png: bool = True) -> str:
    df = read_results(path)
    dup = df.duplicated(["model", "task", "method", "seed"], keep=False)
    if dup.any():  # its means would count twice
        cells = df.loc[dup, ["task", "method"]].drop_duplicates().values.tolist()
        raise SystemExit(f"{path.name} holds the cells {cells[:5]} more than once (rows of "
                         "different settings); keep one row per cell, then rerun.")
    model = df["model"].iloc[0]
    full = complete_tasks(df)
    tasks = sorted(full["task"].unique())
    order = [m for m in ORDER if m in set(full.method)] + sorted(set(full.method) - set(ORDER))
    full = full.assign(method=pd.Categorical(full["method"], order, ordered=True))
    full = full.sort_values(["method", "task"]).assign(method=lambda d: d.method.astype(str))
    stem = path.with_suffix("")
    paired = site_vs_each(full)
    atomic_write_csv(f"{stem}_paired.csv", paired)
    text = write_report(f"{stem}.md", f"Baselines on {model}", bench_command(df, path), "\n".join([
        "Summarized by `python benchmarks/baselines.py`; test split capped at 50 items, one torch thread on "
        f"the shared 2-core CPU. Means over the {len(tasks)} of {df['task'].nunique()} tasks where every "
        f"method finished: {', '.join(tasks)}. Exact match and first-token accuracy are fractions; dNTP = "
        "KL(P_icl ‖ P_method) at the answer position (ICL's is 0).", "", versions_line(df), "",
        *targets(full), "",
        summary_markdown(full).strip(), "", *paired_lines(paired), *notes(full)]))
    fig = dntp_accuracy_figure(full)
    write_figure_html(fig, f"{stem}.dntp.html")  # + plotly.min.js beside it (offline)
    if png:
        try:
            fig.write_image(f"{stem}.dntp.png", width=900, height=500)
        except Exception as e:  # kaleido/Chromium missing: the html is still written
            print(f"no png for {model}: {e}")
    return text


class Baselines(Experiment):
    name = "baselines"
    key = None

    def add_arguments(self, p) -> None:
        p.add_argument("--no-png", action="store_true")

    def cells(self, args):
        return ()  # the cells are `sitelens bench` runs

    def write_report(self) -> str:
        paths = sorted(p for p in self.out.glob("baselines_*.csv") if not p.stem.endswith("_paired"))
        return "\n".join(summarize(p, png=not self.args.no_png) for p in paths)


if __name__ == "__main__":
    raise SystemExit(main(Baselines()))
