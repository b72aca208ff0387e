"""SITE vs zero-shot vs 10-shot ICL on the FV benchmark tasks, with timings and peak memory.

Writes one CSV row per (model, task, method) as soon as it is finished, so a killed run resumes
where it stopped (finished tasks are skipped). ``--summarize`` writes the markdown summary.

    python benchmarks/site_fv.py --model smollm2-135m-instruct --fv ../shared/datasets/fv --limit 50
    python benchmarks/site_fv.py --model gemma-3-270m --fv ../shared/datasets/fv --abstractive --limit 50
    python benchmarks/site_fv.py --summarize
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pandas as pd
import torch

from sitelens.pipelines.bench import FV_EXTRACTIVE
from sitelens.pipelines.experiment import DATA_ROOT, PeakRSS
from sitelens.pipelines.store import ResultsStore

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"

EXTRACTIVE = FV_EXTRACTIVE  # the 28 extractive FV tasks (the other 29 are abstractive)
# Tasks where the reference schedule (400 steps of batch 1) is also run.
REFERENCE_SAMPLE = [
    "antonym", "country-capital", "english-french", "present-past", "singular-plural",
    "capitalize_first_letter", "choose_first_of_3", "person-occupation",
]
FIELDS = [
    "model", "task", "method", "first_token_acc", "exact_match", "n", "seconds_per_item",
    "stage1_seconds", "stage2_seconds", "fit_peak_rss_mb", "best_step",
]


def _done(path: Path) -> set[tuple[str, str, str]]:
    if not path.exists():
        return set()
    df = pd.read_csv(path)
    return set(zip(df.model, df.task, df.method))


def run(args) -> None:
    from sitelens import FitConfig, fit_site, load_model, load_task, summarize
    from sitelens.eval import evaluate

    torch.set_num_threads(args.threads)
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"site_fv_{args.model}.csv"
    done = _done(out)
    model = load_model(args.model, n_ctx=args.n_ctx)
    fv = Path(args.fv)
    names = sorted(p.name for p in fv.iterdir() if (p / "train.json").exists())
    if args.abstractive:
        names = [n for n in names if n not in EXTRACTIVE]
    if args.tasks:
        names = [n for n in names if n in args.tasks.split(",")]
    # the reference sample first, then short-prompt tasks before long-prompt ones (ag_news,
    # commonsense_qa, squad_val), so that an interrupted run has covered the most tasks
    def prompt_chars(n: str) -> float:
        items = json.loads((fv / n / "valid.json").read_text())
        return sum(len(str(x["input"])) + len(str(x["output"])) for x in items) / max(1, len(items))

    rest = sorted((n for n in names if n not in REFERENCE_SAMPLE), key=prompt_chars)
    names = [n for n in REFERENCE_SAMPLE if n in names] + rest
    for name in names:
        with_ref = name in REFERENCE_SAMPLE and args.reference
        want = ["zero-shot", "icl", "site"] + (["site-ref"] if with_ref else [])
        if all((args.model, name, m) in done for m in want):
            continue
        task = load_task(fv / name, dedupe=True)
        t0 = time.perf_counter()
        rows = []
        if not all((args.model, name, m) in done for m in ("zero-shot", "icl", "site")):
            with PeakRSS() as mem:
                adapter = fit_site(model, task, config=FitConfig(seed=args.seed))
            fit_info = {
                "stage1_seconds": round(adapter.meta["stage1_seconds"], 2),
                "stage2_seconds": round(adapter.meta["stage2_seconds"], 2),
                "fit_peak_rss_mb": round(mem.peak / 2**20),
                "best_step": adapter.meta["best_step"],
            }
            df = evaluate(model, task, adapter=adapter, limit=args.limit, seed=args.seed)
            for r in summarize(df).itertuples():
                rows.append({
                    "model": args.model, "task": name, "method": r.method,
                    "first_token_acc": round(r.first_token_acc, 4),
                    "exact_match": round(r.exact_match, 4),
                    "n": r.n, "seconds_per_item": round(r.seconds_per_item, 4),
                    **(fit_info if r.method == "site" else {}),
                })
        if "site-ref" in want and (args.model, name, "site-ref") not in done:
            with PeakRSS() as mem:
                ref = fit_site(
                    model, task,
                    config=FitConfig(seed=args.seed, batch_size=1, n_examples=400, eval_every=50),
                )
            d2 = evaluate(model, task, adapter=ref, methods=["site"], limit=args.limit, seed=args.seed)
            s2 = summarize(d2).iloc[0]
            rows.append({
                "model": args.model, "task": name, "method": "site-ref",
                "first_token_acc": round(s2.first_token_acc, 4), "exact_match": round(s2.exact_match, 4),
                "n": s2.n, "seconds_per_item": round(s2.seconds_per_item, 4),
                "stage1_seconds": round(ref.meta["stage1_seconds"], 2),
                "stage2_seconds": round(ref.meta["stage2_seconds"], 2),
                "fit_peak_rss_mb": round(mem.peak / 2**20), "best_step": ref.meta["best_step"],
            })
        ResultsStore(out, FIELDS, key=None).append(rows)
        em = {r["method"]: r["exact_match"] for r in rows}
        print(f"{args.model} {name}: {em}  ({time.perf_counter() - t0:.0f}s)", flush=True)


def summarize_all() -> str:
    lines = ["# SITE on the FV benchmark tasks", ""]
    lines += [
        "Made by `python benchmarks/site_fv.py --model MODEL --fv ../shared/datasets/fv --limit 50 "
        "--no-reference --threads 1 [--abstractive]`, the reference-schedule rows by the same command "
        "without `--no-reference` and with `--tasks` the 8-task sample, then "
        "`python benchmarks/site_fv.py --summarize`; on the 2-core CPU machine while other jobs "
        "(figures, baselines) shared the cores, so the seconds below are inflated by contention "
        "(antonym and country-capital ran with 2 threads, the rest with 1). Test split capped at the "
        "first 50 items per task. Exact match (EM) and first-token accuracy (FT) in %. SITE: default "
        "schedule (400 training examples in batches of 8, best validation loss kept); `site-ref`: the "
        "reference schedule, 400 steps of batch 1. The run is resumable: rerunning the command "
        "continues with the tasks not yet in the CSV. The fit time on a quiet machine (the "
        "≤ 30 s target) is measured separately in [fit_time.md](fit_time.md), with a breakdown in "
        "[fit_profile.md](fit_profile.md).",
        "",
    ]
    for path in sorted(RESULTS.glob("site_fv_*.csv")):
        df = pd.read_csv(path)
        model = df.model.iloc[0]
        piv = df.pivot_table(index="task", columns="method", values=["exact_match", "first_token_acc"])
        n_tasks = df.task.nunique()
        lines += [f"## {model} ({n_tasks} tasks)", ""]
        means = df.groupby("method")[["exact_match", "first_token_acc", "seconds_per_item"]].mean()
        lines += ["| method | mean EM | mean FT | mean s/item |", "|---|---|---|---|"]
        for m in ["zero-shot", "icl", "site"]:
            if m in means.index:
                r = means.loc[m]
                lines.append(
                    f"| {m} | {100 * r.exact_match:.1f} | {100 * r.first_token_acc:.1f} "
                    f"| {r.seconds_per_item:.3f} |"
                )
        if {"site", "icl"} <= set(means.index):
            gap = 100 * (means.loc["site", "exact_match"] - means.loc["icl", "exact_match"])
            lines += ["", f"- SITE − 10-shot ICL, mean exact match: {gap:+.1f} points."]
        site = df[df.method == "site"]
        zs = df[df.method == "zero-shot"].set_index("task").seconds_per_item
        icl = df[df.method == "icl"].set_index("task").seconds_per_item
        st = site.set_index("task").seconds_per_item
        fit = site.stage1_seconds + site.stage2_seconds
        lines += [
            f"- stage 1 + stage 2 per task: median {fit.median():.1f} s (stage 1 median "
            f"{site.stage1_seconds.median():.1f} s, stage 2 median {site.stage2_seconds.median():.1f} s); "
            f"peak RSS of a fit: median {site.fit_peak_rss_mb.median():.0f} MB, "
            f"max {site.fit_peak_rss_mb.max():.0f} MB.",
            f"- SITE s/item ÷ zero-shot s/item: median {(st / zs).median():.2f}; "
            f"ICL s/item ÷ SITE s/item: median {(icl / st).median():.2f}.",
        ]
        ref = df[df.method == "site-ref"]
        if len(ref):
            sub = df[df.task.isin(ref.task)]
            m = sub.groupby("method").exact_match.mean()
            rfit = (ref.stage1_seconds + ref.stage2_seconds).median()
            s_rows = sub[sub.method == "site"]
            sfit = (s_rows.stage1_seconds + s_rows.stage2_seconds).median()
            lines.append(
                f"- reference schedule (400 × batch 1) on {len(ref)} tasks: EM {100 * m['site-ref']:.1f} vs "
                f"batched default {100 * m['site']:.1f}; fit median {rfit:.1f} s vs {sfit:.1f} s."
            )
        lines += ["", "| task | zero-shot EM | ICL EM | SITE EM | SITE-ref EM | zero-shot FT | ICL FT "
                  "| SITE FT |",
                  "|---|---|---|---|---|---|---|---|"]
        for task, r in piv.iterrows():
            def g(kind, m, r=r):
                v = r.get((kind, m))
                return "" if v is None or pd.isna(v) else f"{100 * v:.0f}"
            lines.append(
                f"| {task} | {g('exact_match', 'zero-shot')} | {g('exact_match', 'icl')} | "
                f"{g('exact_match', 'site')} | {g('exact_match', 'site-ref')} | "
                f"{g('first_token_acc', 'zero-shot')} | {g('first_token_acc', 'icl')} | "
                f"{g('first_token_acc', 'site')} |"
            )
        lines.append("")
    text = "\n".join(lines)
    (RESULTS / "site_fv.md").write_text(text)
    return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--fv", default=str(DATA_ROOT / "fv"))
    ap.add_argument("--limit", type=int, default=50)
    ap.add_argument("--abstractive", action="store_true")
    ap.add_argument("--tasks", default="")
    ap.add_argument("--no-reference", dest="reference", action="store_false")
    ap.add_argument("--n-ctx", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--summarize", action="store_true")
    args = ap.parse_args()
    if args.summarize:
        print(summarize_all())
    else:
        run(args)


if __name__ == "__main__":
    main()
