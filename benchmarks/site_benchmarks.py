"""SITE's benchmark table at our scale: zero-shot, k-shot ICL, SITE, LoRA and (IA)3 on ANLI,
MMLU-Pro and BIG-Bench Hard (``sitelens bench`` cells without the dNTP pass; docs/benchmarks.md).

    python benchmarks/site_benchmarks.py --models MODEL --shots   # prompt lengths per k -> shots CSV
    python benchmarks/site_benchmarks.py --models MODEL           # -> site_benchmarks_{model}.csv
    python benchmarks/site_benchmarks.py --report                 # -> site_benchmarks.md (+ _summary.csv)
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pandas as pd

from sitelens.baselines import IA3, ICL, SITE, LoRA, ZeroShot
from sitelens.eval.labels import LABEL_METRICS
from sitelens.io import atomic_write_csv
from sitelens.models import token_ids
from sitelens.pipelines.bench import (
    COLUMNS,
    BenchConfig,
    BenchJob,
    cell_key,
    cell_settings,
    read_results,
    run_cell,
)
from sitelens.pipelines.bench_summary import complete_tasks, gaps_to_reference
from sitelens.pipelines.executors import cached_model
from sitelens.pipelines.experiment import Experiment, Job, main, md_table, pct, write_report
from sitelens.tasks import DEFAULT_TEMPLATE, embedding_prompts, few_shot_prompts, load_task

MODELS = ["smollm2-135m-instruct", "gemma-3-270m"]
N_CTX = 2048
GEN_ROOM = 32  # score_fitted generates at most 32 new tokens
MAX_SHOTS = 10
SEED = 0
BATCH_SIZE = 16
METHODS = ["zero-shot", "icl", "site", "lora", "ia3"]
SHOTS_CHECK_ITEMS = 50  # the shot check covers the first 50 test items (a superset of the limit's)


SHOTS = {"anli": 10, "mmlu_pro": 2, "bbh": 5}  # k for ICL and SITE's stage-1 prompts (from --shots)
LIMIT = 30  # test items per task


def all_tasks(root: Path, bench: str) -> list[str]:
    return sorted(p.name for p in (root / bench).iterdir() if (p / "train.json").exists())


def order(root: Path, bench: str) -> list[str]:
    """All tasks of ``bench`` in a fixed seeded order: a sample of n is its first n."""
    names = all_tasks(root, bench)
    random.Random(SEED).shuffle(names)
    return names


class SiteBenchmarks(Experiment):
    name = "site_benchmarks"
    columns = COLUMNS
    per_model = True
    models = MODELS[:1]

    def add_arguments(self, p) -> None:
        p.add_argument("--rounds", type=int, default=10**6, help="stop after N tasks per benchmark")
        p.add_argument("--shots", action="store_true", help="measure the prompt lengths per k (no cells)")
        p.add_argument("--start", type=lambda s: {b: int(k) for b, k in (x.split("=") for x in s.split(","))},
                       default=dict.fromkeys(SHOTS, MAX_SHOTS),
                       help="the k to start the descending shot search at, per benchmark (anli=10,bbh=6)")

    def cells(self, args):
        """Round-robin over the benchmarks (the i-th task of each, then the next), so partial
        results cover every benchmark."""
        if args.shots:  # a measurement of its own, no cells
            return None if args.dry_run else measure_shots(cached_model(args.models[0], n_ctx=N_CTX), args)
        benches = list(SHOTS)
        orders = [order(args.data_root, b) for b in benches]
        for i in range(min(args.rounds, max(map(len, orders)))):
            for bench, names in zip(benches, orders):
                if i >= len(names):
                    continue
                task = load_task(str(args.data_root / bench / names[i]))
                k, model = SHOTS[bench], cached_model(args.models[0], n_ctx=N_CTX)
                for method in (ZeroShot(), ICL(n_shots=k), SITE(n_shots=k), LoRA(), IA3()):
                    s = cell_settings(model, task, method, seed=SEED, n_shots=k, limit=LIMIT,
                                      batch_size=BATCH_SIZE, template=DEFAULT_TEMPLATE)
                    s["task"] = f"{bench}/{names[i]}"
                    yield Job(cell_key(s), f"{s['task']} {method.name}",
                              dict(settings=s, bench=bench, method=method))

    def run(self, job: Job) -> dict:
        s, k = job["settings"], SHOTS[job["bench"]]
        cfg = BenchConfig(limit=LIMIT, seed=SEED, n_shots=k, batch_size=BATCH_SIZE, dntp=False,
                          label_metrics=True)
        task = load_task(str(self.args.data_root / s["task"]))
        return run_cell(BenchJob(self.args.models[0], N_CTX, task, job["method"], s, job.key, cfg))

    def write_report(self) -> str:
        df = pd.concat([load_rows(self.out, m) for m in MODELS], ignore_index=True)
        table = summary(df)
        atomic_write_csv(self.out / "site_benchmarks_summary.csv", table)
        return write_report(self.out / "site_benchmarks.md", "SITE's benchmark table at our scale",
                            "python benchmarks/site_benchmarks.py --report",
                            markdown(table, df, self.args.data_root))


def measure_shots(model, args) -> list:
    """Per benchmark, the largest k ≤ the --start k for which every prompt a cell builds (the ICL
    prompts of the first 50 test items, SITE's 50 stage-1 prompts) on every task of the collection
    fits n_ctx minus GEN_ROOM; the rows replace those of the same (model, benchmark, k)."""
    def lengths(task, k):
        prompts = few_shot_prompts(task, task.test[:SHOTS_CHECK_ITEMS], k, seed=SEED)
        return [len(token_ids(model, p)) for p in prompts + embedding_prompts(task, 50, k, seed=SEED)]

    rows = []
    for bench in [b for b in SHOTS if b in args.start]:
        tasks = {t: load_task(str(args.data_root / bench / t)) for t in all_tasks(args.data_root, bench)}
        for k in range(args.start[bench], 0, -1):
            n = {t: lengths(task, k) for t, task in tasks.items()}
            longest = max(n, key=lambda t: max(n[t]))
            rows.append({"model": args.models[0], "benchmark": bench, "k": k,
                         "max_tokens": max(n[longest]), "longest_task": longest,
                         "median_tokens": int(np.median(np.concatenate(list(n.values())))),
                         "fits": max(n[longest]) + GEN_ROOM <= N_CTX})
            if rows[-1]["fits"]:
                break  # the largest k that fits
    path = args.out / "site_benchmarks_shots.csv"
    old = pd.read_csv(path) if path.exists() else pd.DataFrame(columns=list(rows[0]))
    index = ["model", "benchmark", "k"]
    old = old[~old.set_index(index).index.isin(pd.DataFrame(rows).set_index(index).index)]
    atomic_write_csv(path, pd.concat([old, pd.DataFrame(rows)]))


def load_rows(out: Path, model: str) -> pd.DataFrame:
    """This script's rows for ``model`` plus the five methods' FV rows of the baselines grid, with a
    ``benchmark`` column."""
    parts = []
    if (out / f"site_benchmarks_{model}.csv").exists():
        df = read_results(out / f"site_benchmarks_{model}.csv")
        parts.append(df.assign(benchmark=df["task"].str.split("/").str[0]))
    if (out / f"baselines_{model}.csv").exists():
        df = read_results(out / f"baselines_{model}.csv")
        parts.append(df[df["method"].isin(METHODS)].assign(benchmark="fv"))
    if not parts:
        return pd.DataFrame()
    df = pd.concat(parts, ignore_index=True).assign(model=model)
    for c in ("exact_match", "first_token_acc", "fit_seconds", "seconds_per_item", "trainable_params", "n",
              *LABEL_METRICS):
        df[c] = pd.to_numeric(df[c], errors="coerce")
    return df[df["exact_match"].notna()]


def summary(df: pd.DataFrame) -> pd.DataFrame:
    """Each method's means and gap to ICL per (model, benchmark), with the benchmark's shot count."""
    t = gaps_to_reference(df, METHODS, by=("model", "benchmark"))
    icl = df[df.method == "icl"]
    shots = pd.to_numeric(icl.n_shots, errors="coerce").groupby([icl.model, icl.benchmark]).first().fillna(10)
    t.insert(5, "k", [int(shots.get((m, b), 10)) for m, b in zip(t.model, t.benchmark)])  # FV: no n_shots
    return t.rename(columns={"em_gap": "em_gap_icl", "label_gap": "label_gap_icl"})


def markdown(table: pd.DataFrame, df: pd.DataFrame, root: Path) -> str:
    def gap(x) -> str:
        return "–" if pd.isna(x) else f"{100 * x:+.1f}"

    t = pd.DataFrame({
        "model": table.model,
        "benchmark (chance)": table.benchmark + " (chance " + table.chance.map(pct) + ")",
        "k": table.k, "method": table.method, "tasks": table.n_tasks, "items": table.n_items,
        "exact match": table.exact_match.map(pct), "gap to ICL": table.em_gap_icl.map(gap),
        "label acc (tasks)": table.label_acc.map(pct) + " (" + table.n_label_tasks.astype(str) + ")",
        "label gap to ICL": table.label_gap_icl.map(gap),
        "trainable params": table.trainable_params.map(lambda x: "–" if pd.isna(x) else f"{int(x):,}"),
        "fit s": table.fit_seconds.map("{:.1f}".format),
        "s / item": table.seconds_per_item.map("{:.3f}".format)})
    lines = ["Cells by `python benchmarks/site_benchmarks.py --models MODEL` (one model per process); the "
             "FV rows are the committed baselines grid's (`baselines_{model}.csv`). Accuracies in %, means "
             "over the tasks where all five methods finished; gap = method − ICL in points; chance, label "
             "acc and the machine states behind the seconds: docs/benchmarks.md.", "", md_table(t), "",
             "## Tasks and caps", ""]
    for b, k in SHOTS.items():
        lines.append(f"- **{b}** ({len(all_tasks(root, b))} tasks): k = {k}, the first {LIMIT} test items "
                     f"per task, tasks in the seeded order {', '.join(order(root, b))}.")
        for model in MODELS:
            sub = df[(df["model"] == model) & (df["benchmark"] == b)]
            done = sorted(set(complete_tasks(sub, METHODS)["task"].str.split("/").str[1]))
            lines.append(f"  - {model}: {len(done)} task(s) with all five methods: "
                         + (", ".join(done) if done else "none yet") + ".")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main(SiteBenchmarks()))
