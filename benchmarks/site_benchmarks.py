"""SITE's benchmark table at our scale (issue 21, part 6): zero-shot, k-shot ICL, SITE, LoRA and
(IA)3 on ANLI, MMLU-Pro and BIG-Bench Hard for both bundled models, beside the FV rows of the
committed baselines grid (``benchmarks/results/baselines_{model}.csv``, not rerun).

Steps (each resumable; run one model per process, niced, one thread):

    python benchmarks/site_benchmarks.py shots  --model MODEL   # prompt lengths per k -> shots CSV
    python benchmarks/site_benchmarks.py run --model MODEL --rounds 1   # one task per benchmark
    python benchmarks/site_benchmarks.py run    --model MODEL   # the grid -> site_benchmarks_{model}.csv
    python benchmarks/site_benchmarks.py report                 # -> site_benchmarks.md

Cells are ``sitelens bench`` cells: the same settings, resume keys
(:func:`sitelens.pipelines.bench.cell_key`),
columns and scoring (:func:`sitelens.pipelines.bench.score_fitted`: greedy exact match, first-token accuracy
and, on tasks with a closed label set, label-ranking accuracy and the chance level). The one
difference from ``run_bench``: the k-shot ICL reference distribution for dNTP is not computed (it
is a second k-shot pass over every test item, which this CPU budget does not allow); those rows
say so in ``error`` (``dntp: not computed ...``, not a failure).

Shot count k (``shots``): per benchmark, the largest k ≤ 10 for which every prompt a cell builds
fits in n_ctx = 2048 tokens minus :data:`GEN_ROOM` generated tokens with both models' tokenizers:
the k-shot ICL prompt of each of the first 50 test items (those of the first ``limit`` items are
the same prompts: demonstrations are drawn query by query) and SITE's 50 k-shot stage-1 prompts,
on every task of the whole collection, not only the sampled ones. The same k is used by ICL and
by SITE's task embedding (the paper's 10-shot embedding cannot be built where a 10-shot prompt
does not fit). Result: ANLI 10, MMLU-Pro 2, BBH 5 (``site_benchmarks_shots.csv``).

Caps (:data:`BENCHMARKS`): the test split is capped at ``limit`` = 30 items per task (the first
ones of the seeded test split), and the tasks of each collection are taken in a fixed seeded order
(:meth:`Benchmark.order`), round-robin across the benchmarks (``run --rounds N`` stops after N
tasks per benchmark), so however far a run gets, every benchmark has the same number of tasks
(± 1). ICL, SITE, LoRA and (IA)3 run with their defaults (SITE: 50 stage-1 prompts, 50 Adam steps
of batch 8; LoRA/(IA)3: 50 Adam steps of batch 8, validated every 10 steps on 64 items): no
training was shortened. Why the caps are this small: two CPU cores for every benchmark of the
issue; the first cells ran at ``nice 10`` beside other jobs and got a few percent of one core
(see the md).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from sitelens.baselines import IA3, ICL, SITE, LoRA, ZeroShot
from sitelens.errors import SitelensError
from sitelens.eval.labels import label_set
from sitelens.models import load_model, token_ids
from sitelens.pipelines.bench import (
    LABEL_METRICS,
    append_row,
    cell_key,
    cell_settings,
    read_results,
    score_fitted,
)
from sitelens.pipelines.experiment import DATA_ROOT, pct
from sitelens.tasks import DEFAULT_TEMPLATE, embedding_prompts, few_shot_prompts, load_task

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
DATA = DATA_ROOT
MODELS = ["smollm2-135m-instruct", "gemma-3-270m"]
N_CTX = 2048
GEN_ROOM = 32  # score_fitted generates at most 32 new tokens
MAX_SHOTS = 10
SEED = 0
BATCH_SIZE = 16
METHODS = ["zero-shot", "icl", "site", "lora", "ia3"]
SHOTS_CHECK_ITEMS = 50  # the shot check covers the first 50 test items (a superset of --limit's)


@dataclass(frozen=True)
class Benchmark:
    name: str
    shots: int  # k for ICL and SITE's stage-1 prompts (from the ``shots`` step)
    n_tasks: int | None = None  # a seeded sample of the collection's tasks (None: all)
    limit: int = 30  # test items per task (CPU budget: see the module docstring)

    def all_tasks(self) -> list[str]:
        return sorted(p.name for p in (DATA / self.name).iterdir() if (p / "train.json").exists())

    def order(self) -> list[str]:
        """All tasks in a fixed seeded order (``random.Random(0).shuffle`` of the sorted names):
        a sample of n is its first n, so a larger cap extends a smaller one."""
        names = self.all_tasks()
        random.Random(SEED).shuffle(names)
        return names

    def tasks(self) -> list[str]:
        """The tasks run: the first ``n_tasks`` of :meth:`order` (all when ``n_tasks`` is None)."""
        return self.order()[: self.n_tasks]


BENCHMARKS = {
    "anli": Benchmark("anli", shots=10),
    "mmlu_pro": Benchmark("mmlu_pro", shots=2),
    "bbh": Benchmark("bbh", shots=5),
}
CHANCE_NOTE = {
    "fv": "open-ended",
    "anli": "3 labels",
    "mmlu_pro": "up to 10 options",
    "bbh": "2-18 options on the multiple-choice tasks; the free-form ones have none",
}


def methods_for(k: int) -> list:
    return [ZeroShot(), ICL(n_shots=k), SITE(n_shots=k), LoRA(), IA3()]


def csv_path(model: str) -> Path:
    return RESULTS / f"site_benchmarks_{model}.csv"


# ----------------------------------------------------------------------------------------------
# shot counts


def prompt_lengths(model, task, k: int, limit: int) -> list[int]:
    """Token lengths of every prompt a cell with k shots builds on ``task``: the ICL prompt of each
    of the first ``limit`` test items and SITE's 50 stage-1 prompts."""
    prompts = few_shot_prompts(task, task.test[:limit], k, seed=SEED)
    prompts += embedding_prompts(task, 50, k, seed=SEED)
    return [len(token_ids(model, p)) for p in prompts]


def cmd_shots(args) -> None:
    model = load_model(args.model, n_ctx=N_CTX)
    out = RESULTS / "site_benchmarks_shots.csv"
    old = pd.read_csv(out) if out.exists() else pd.DataFrame()
    rows = []
    for bench in BENCHMARKS.values():
        tasks = {t: load_task(str(DATA / bench.name / t)) for t in bench.all_tasks()}
        if bench.name not in args.start:
            continue
        for k in range(args.start[bench.name], 0, -1):
            lengths = {t: prompt_lengths(model, task, k, SHOTS_CHECK_ITEMS)
                       for t, task in tasks.items()}
            longest = max(lengths, key=lambda t: max(lengths[t]))
            mx = max(lengths[longest])
            rows.append({"model": args.model, "benchmark": bench.name, "k": k, "max_tokens": mx,
                         "longest_task": longest,
                         "median_tokens": int(np.median(np.concatenate(list(lengths.values())))),
                         "fits": mx + GEN_ROOM <= N_CTX})
            print(rows[-1], flush=True)
            if rows[-1]["fits"]:
                break  # the largest k that fits
    if len(old):
        old = old[~old.set_index(["model", "benchmark", "k"]).index.isin(
            pd.DataFrame(rows).set_index(["model", "benchmark", "k"]).index)]
    pd.concat([old, pd.DataFrame(rows)]).to_csv(out, index=False)


def chosen_shots(shots: pd.DataFrame) -> dict[str, int]:
    """Per benchmark, the largest k that fits with every measured tokenizer."""
    fit = shots[shots["fits"].astype(bool)]
    best = fit.groupby(["benchmark", "model"])["k"].max()
    return {b: int(best[b].min()) for b in best.index.get_level_values(0).unique()}


# ----------------------------------------------------------------------------------------------
# cells


def run_cells(model, bench: Benchmark, tasks: list[str], out_csv: Path, limit: int) -> None:
    """Every (task, method) cell of ``bench`` not yet in ``out_csv``, appended as it finishes."""
    done = {k for k in read_results(out_csv)["key"].astype(str) if k}
    for name in tasks:
        task = load_task(str(DATA / bench.name / name))
        items = task.test[:limit]
        labels = label_set(task)
        for method in methods_for(bench.shots):
            settings = cell_settings(model, task, method, seed=SEED, n_shots=bench.shots,
                                     limit=limit, batch_size=BATCH_SIZE, template=DEFAULT_TEMPLATE)
            settings["task"] = f"{bench.name}/{name}"
            key = cell_key(settings)
            if key in done:
                continue
            row = dict(settings, key=key, n=len(items))
            t0 = time.perf_counter()
            try:
                fitted = method.fit(model, task, seed=SEED)
                fit_s = time.perf_counter() - t0
                res = score_fitted(model, task, items, fitted, reference=None,
                                   batch_size=BATCH_SIZE, labels=labels)
                row.update({k: res[k] for k in ("first_token_acc", "exact_match", "dntp",
                                                 "seconds_per_item", *LABEL_METRICS)})
                row.update(trainable_params=fitted.n_params, fit_seconds=fit_s,
                           error="dntp: not computed (benchmarks/site_benchmarks.py)")
            except SitelensError as e:
                nan = float("nan")
                row.update(first_token_acc=nan, exact_match=nan, dntp=nan, trainable_params=nan,
                           fit_seconds=time.perf_counter() - t0, seconds_per_item=nan,
                           error=f"{type(e).__name__}: {e}", **dict.fromkeys(LABEL_METRICS, nan))
            append_row(out_csv, row)
            print(f"{time.strftime('%H:%M:%S')} {row['task']} {method.name}: "
                  f"EM {row['exact_match']:.3f} label {row['label_acc_full']:.3f} "
                  f"fit {row['fit_seconds']:.1f}s {row['seconds_per_item']:.3f}s/item", flush=True)


def cmd_run(args) -> None:
    """Round-robin over the benchmarks (the i-th task of each, then the next), so partial
    results cover every benchmark; the first round is the timing of one cell per method."""
    model = load_model(args.model, n_ctx=N_CTX)
    benches = [BENCHMARKS[b] for b in args.benchmarks.split(",")]
    for i in range(min(args.rounds, max(len(b.tasks()) for b in benches))):
        for bench in benches:
            if i < len(bench.tasks()):
                run_cells(model, bench, [bench.tasks()[i]], csv_path(args.model),
                          limit=bench.limit)


# ----------------------------------------------------------------------------------------------
# report


def load_rows(model: str) -> pd.DataFrame:
    """This script's rows for ``model`` plus its FV rows from the baselines grid (the five
    methods), with a ``benchmark`` column."""
    parts = []
    path = csv_path(model)
    if path.exists():
        df = read_results(path)
        df["benchmark"] = df["task"].str.split("/").str[0]
        parts.append(df)
    fv = RESULTS / f"baselines_{model}.csv"
    if fv.exists():
        df = read_results(fv)
        df = df[df["method"].isin(METHODS)].copy()
        df["benchmark"] = "fv"
        parts.append(df)
    if not parts:
        return pd.DataFrame()
    df = pd.concat(parts, ignore_index=True)
    df["model"] = model
    for c in ("exact_match", "first_token_acc", "fit_seconds", "seconds_per_item",
              "trainable_params", "n", *LABEL_METRICS):
        df[c] = pd.to_numeric(df[c], errors="coerce")
    return df[df["exact_match"].notna()]


def complete(df: pd.DataFrame) -> pd.DataFrame:
    """Rows of the tasks where all five methods finished (so every method is averaged over the
    same tasks)."""
    keep = [t for t, g in df.groupby("task") if set(g["method"]) >= set(METHODS)]
    return df[df["task"].isin(keep)]


def summary(df: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for (model, bench), g in df.groupby(["model", "benchmark"], sort=False):
        g = complete(g)
        icl = g[g["method"] == "icl"]
        for method in METHODS:
            m = g[g["method"] == method]
            if not len(m):
                continue
            lab = m[m["chance"].notna()]
            icl_lab = icl[icl["chance"].notna()]
            rows.append({
                "model": model, "benchmark": bench, "method": method,
                "n_tasks": len(m), "n_items": int(m["n"].sum()),
                "k": _shots(icl),
                "exact_match": m["exact_match"].mean(),
                "em_gap_icl": m["exact_match"].mean() - icl["exact_match"].mean(),
                "n_label_tasks": len(lab),
                "label_acc": lab["label_acc_full"].mean() if len(lab) else np.nan,
                "label_gap_icl": (lab["label_acc_full"].mean() - icl_lab["label_acc_full"].mean()
                                  if len(lab) else np.nan),
                "chance": lab["chance"].mean() if len(lab) else np.nan,
                "trainable_params": m["trainable_params"].median(),
                "fit_seconds": m["fit_seconds"].mean(),
                "seconds_per_item": m["seconds_per_item"].mean(),
            })
    return pd.DataFrame(rows)


def _shots(icl: pd.DataFrame) -> int:
    """The ICL rows' shot count (the FV grid's rows predate the settings columns: 10 shots)."""
    k = pd.to_numeric(icl["n_shots"], errors="coerce").dropna()
    return int(k.iloc[0]) if len(k) else 10



def _gap(x) -> str:
    return "–" if pd.isna(x) else f"{100 * x:+.1f}"


def markdown(table: pd.DataFrame, df: pd.DataFrame) -> str:
    lines = [
        "# SITE's benchmark table at our scale",
        "",
        "Made by `python benchmarks/site_benchmarks.py run --model MODEL` (resumable; one model "
        "per process, one torch thread) and `python benchmarks/site_benchmarks.py "
        "report`; the FV rows are the zero-shot / ICL / SITE / LoRA / (IA)3 rows of the committed "
        "baselines grid (`baselines_{model}.csv`, 50 test items per task, all 57 FV tasks on "
        "SmolLM2, the 29 abstractive ones plus choose_first_of_3 on Gemma), not rerun. Settings and "
        "caps: see below the table. Accuracies in %; means over tasks (every method over the same "
        "tasks); gap = method − ICL in points. Seconds are wall-clock on one torch thread, under "
        "two machine states: SmolLM2's ANLI r1 and MMLU-Pro business zero-shot / ICL / SITE cells "
        "ran at `nice 10` beside normal-priority jobs (load average ≈ 12), inflated many times "
        "over; its MMLU-Pro LoRA / (IA)3 cells and every Gemma cell ran at normal priority, one "
        "process per core (load ≈ 2). So fit seconds and seconds per item compare only roughly, "
        "and not with the FV grid's.",
        "",
        "| model | benchmark (chance) | k | method | tasks | items | exact match | gap to ICL | "
        "label acc (tasks) | gap to ICL | trainable params | fit s | s / item |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in table.itertuples():
        chance = "–" if pd.isna(r.chance) else f"{100 * r.chance:.1f}"
        lines.append(
            f"| {r.model} | {r.benchmark} (chance {chance}) | {r.k} | {r.method} | {r.n_tasks} | "
            f"{r.n_items} | {pct(r.exact_match)} | {_gap(r.em_gap_icl)} | "
            f"{pct(r.label_acc)} ({r.n_label_tasks}) | {_gap(r.label_gap_icl)} | "
            f"{'–' if pd.isna(r.trainable_params) else f'{int(r.trainable_params):,}'} | "
            f"{r.fit_seconds:.1f} | {r.seconds_per_item:.3f} |")
    lines += ["", "Chance: mean over the closed-label-set tasks of 1 / (number of labels of the "
              "item) (" + "; ".join(f"{b}: {n}" for b, n in CHANCE_NOTE.items()) + "). Label acc: "
              "the full-label log-likelihood ranking (`label_acc_full`) under the method's "
              "intervention, over the tasks with a closed label set (count in brackets); exact "
              "match is greedy generation, over all tasks.", ""]
    lines += ["## Tasks and caps", ""]
    for b in BENCHMARKS.values():
        lines.append(f"- **{b.name}** ({len(b.all_tasks())} tasks in the collection): k = {b.shots} "
                     f"shots (ICL and SITE's stage-1 prompts; the largest k whose prompts fit, "
                     f"`site_benchmarks_shots.csv`), the first {b.limit} items of each task's "
                     f"seeded test split; tasks taken in the seeded order "
                     f"{', '.join(b.order())}.")
        for model in MODELS:
            g = complete(df[(df["model"] == model) & (df["benchmark"] == b.name)])
            done = sorted(set(g["task"].str.split("/").str[1]))
            lines.append(f"  - {model}: {len(done)} task(s) with all five methods: "
                         + (", ".join(done) if done else "none yet") + ".")
    return "\n".join(lines) + "\n"


def cmd_report(args) -> None:
    df = pd.concat([load_rows(m) for m in MODELS], ignore_index=True)
    table = summary(df)
    table.to_csv(RESULTS / "site_benchmarks_summary.csv", index=False)
    (RESULTS / "site_benchmarks.md").write_text(markdown(table, df))
    print(markdown(table, df))


def _starts(text: str) -> dict[str, int]:
    out = {}
    for part in text.split(","):
        b, k = part.split("=")
        if b not in BENCHMARKS or not 1 <= int(k) <= MAX_SHOTS:
            raise argparse.ArgumentTypeError(f"expected BENCHMARK=K with K in 1..{MAX_SHOTS}: {part}")
        out[b] = int(k)
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("shots", "run"):
        q = sub.add_parser(name)
        q.add_argument("--model", required=True, choices=MODELS)
        q.add_argument("--threads", type=int, default=1)
        if name == "shots":
            q.add_argument("--start", type=_starts, default=dict.fromkeys(BENCHMARKS, MAX_SHOTS),
                           help="the k to start the descending search at, per benchmark "
                                "(anli=10,bbh=6): a k known not to fit need not be retokenized")
        if name == "run":
            q.add_argument("--benchmarks", default=",".join(BENCHMARKS))
            q.add_argument("--rounds", type=int, default=10**6,
                           help="stop after this many tasks per benchmark (round-robin)")
    sub.add_parser("report")
    args = p.parse_args(argv)
    if getattr(args, "threads", None):
        torch.set_num_threads(args.threads)
    {"shots": cmd_shots, "run": cmd_run, "report": cmd_report}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
