"""How the figures' sparsity λ (``loss + λ·mean(α)``) was chosen: intra-task patching on one task
for a sweep of λ, with the settings of the figures pipeline.

    python benchmarks/lambda_selection.py --threads 1                 # SmolLM2, antonym, λ 0..10
    python benchmarks/lambda_selection.py --tiny --out /tmp/lam       # smoke test (not a benchmark)

Every λ is fitted exactly as ``sitelens.pipelines.figures.fit_cell`` fits a cell (stage 1 once with
``task_embedding(n_prompts, n_shots, seed)``, then ``fit_site(..., config=FitConfig(lr,
n_examples, batch_size, sparsity=λ, seed), embedding=...)``, sizes from
``sitelens.pipelines.figures.FigureConfig()``), and scored with ``sitelens.patching.intra_task`` at the
figures' ks (``intra_ks``: 1, 2, 4, …, all heads, 10 and 5% of the heads) plus ``--extra-ks``
(default 13, the "top-13" an earlier version of the README quoted), on the first ``limit`` test
items. Nothing is read from ``figures/.runs``.

Writes ``results/lambda_selection.csv`` (one row per λ × k × selection × random seed, every
setting as a column, appended per λ) and ``results/lambda_selection.md``. Resumable: a λ whose
rows are already in the CSV with the same settings hash is skipped.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import pandas as pd
import torch

from sitelens.pipelines.experiment import md_table
from sitelens.pipelines.store import ResultsStore

HERE = Path(__file__).resolve().parent
FIGURES = HERE.parent / "figures"
LAMBDAS = "0,0.5,1,2,5,10"

SETTINGS = ["model", "fingerprint", "task", "task_hash", "split", "limit", "n_examples",
            "n_prompts", "n_shots", "lr", "batch_size", "seed", "n_random_seeds", "n_boot", "ks",
            "numerics_version", "settings_hash"]
FIELDS = ["sparsity", *SETTINGS, "k", "selection", "random_seed", "accuracy", "ci_low",
          "ci_high", "answer_prob", "n", "best_step", "final_valid_loss", "stage2_seconds",
          "alpha_mean", "alpha_gt_half", "threads", "torch", "load_avg_1min"]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--task", default="antonym")
    p.add_argument("--lambdas", default=LAMBDAS, help=f"comma-separated λ (default {LAMBDAS})")
    p.add_argument("--extra-ks", default="13", help="ks added to the figures' ks (comma-separated)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--tiny", action="store_true",
                   help="tiny random model and sizes: checks the script runs (not a benchmark)")
    p.add_argument("--out", default=str(HERE / "results"))
    return p.parse_args(argv)


def _read(path: Path) -> pd.DataFrame:
    # hashes stay strings ("69610e739397" would otherwise parse as a float)
    return pd.read_csv(path, dtype={"fingerprint": str, "task_hash": str, "settings_hash": str})


def _fmt(x: float) -> str:
    return f"{x:.2f}"


def write_md(df: pd.DataFrame, path: Path, *, csv_name: str, command: str, tiny: bool) -> None:
    """The table of one settings hash (the last one written): per λ, top-k / bottom-k / random-k
    accuracy at k = 10, 13, 14 and SITE / zero-shot."""
    df = df[df.settings_hash == df.settings_hash.iloc[-1]]
    s = df.iloc[0]
    n_total = int(df[df.selection == "site"].k.iloc[0])
    top_ks = sorted(set(df[df.selection == "top"].k))
    show = [k for k in (10, 13, 14) if k in top_ks] or top_ks[:3]
    table = []
    for lam, g in df.groupby("sparsity", sort=True):
        acc = g.groupby(["selection", "k"]).accuracy.mean()  # random: mean over seeds
        row = {"λ": f"{lam:g}"}
        for k in show:
            row[f"top-{k}"] = _fmt(acc[("top", k)])
        for k in show:
            row[f"bottom-{k}"] = _fmt(acc[("bottom", k)])
        row[f"random-{show[0]}"] = _fmt(acc[("random", show[0])])
        top_rows = g[(g.selection == "top") & (g.k == show[0])]
        row[f"top-{show[0]} P(answer)"] = f"{top_rows.answer_prob.mean():.3f}"
        row["SITE"] = _fmt(acc[("site", n_total)])
        row["zero-shot"] = _fmt(acc[("zero_shot", 0)])
        row["mean α"] = f"{g.alpha_mean.iloc[0]:.3f}"
        row["heads α > 0.5"] = int(g.alpha_gt_half.iloc[0])
        row["best step"] = int(g.best_step.iloc[0])
        row["stage 2 (s)"] = f"{g.stage2_seconds.iloc[0]:.0f}"
        table.append(row)
    md = [
        "# Choosing the sparsity λ of the figures",
        "",
        f"Model `{s.model}` ({n_total} heads, weights {s.fingerprint}), task `{s.task}` "
        f"(first {s.limit} test items: n = {int(s.n)}), SITE fitted as in `sitelens figures` "
        f"(`FigureConfig()` defaults: {s.n_prompts} {s.n_shots}-shot prompts for stage 1, "
        f"{s.n_examples} training examples, batch {s.batch_size}, lr {s.lr}, seed {s.seed}) with "
        "`loss + λ·mean(α)`; first-token accuracy when the task embedding is injected with α = 1 "
        "into only the k heads with the highest α (top-k), the lowest (bottom-k) or k random heads "
        f"(mean of {s.n_random_seeds} seeds), the full α (SITE) or nothing (zero-shot). "
        f"{int(s.threads)} torch thread(s), torch {s.torch}, numerics version "
        f"{s.numerics_version}, settings hash `{s.settings_hash}`.",
        "",
        md_table(pd.DataFrame(table)),
        "",
        "k = 14 is the figures' \"top 5% of heads\" (`sitelens.pipelines.figures.gap_k(\"5%\", 270)`); "
        "k = 13 is what an earlier README quoted. Every k of `intra_ks` (and the reverse "
        "`full_minus_top/bottom` conditions, with 95% bootstrap CIs) is in "
        f"[`{csv_name}`]({csv_name}).",
        "",
        *_figures_check(df),
        f"Command: `{command}`",
        "",
    ]
    if tiny:
        md.insert(2, "**Smoke test on a tiny random model (--tiny): not a benchmark.**\n")
    path.write_text("\n".join(md))


def _figures_check(df: pd.DataFrame) -> list[str]:
    """Lines comparing the λ that the committed figures also ran (``figures/{model}/
    patching_curves_tasks_lam{λ}.csv``) with this run, row by row (same fits, same numbers?)."""
    s = df.iloc[0]
    lines = []
    for lam, g in df.groupby("sparsity", sort=True):
        f = FIGURES / s.model / f"patching_curves_tasks_lam{lam:g}.csv"
        if not f.exists():
            continue
        fig = pd.read_csv(f)
        fig = fig[(fig.task == s.task) & fig.selection.isin(["top", "bottom", "site", "zero_shot"])]
        ours = g.groupby(["selection", "k"]).accuracy.mean()
        both = [(r.selection, int(r.k), r.accuracy, ours.get((r.selection, int(r.k))))
                for r in fig.itertuples()]
        both = [b for b in both if b[3] is not None]
        worst = max((abs(a - b) for *_, a, b in both), default=float("nan"))
        lines.append(f"- λ = {lam:g}: {len(both)} top/bottom/SITE/zero-shot accuracies shared with "
                     f"`figures/{s.model}/{f.name}`, max |Δ| = {worst:.3f}.")
    if lines:
        lines = ["Check against the committed figures (the same fits, run by `sitelens figures`):",
                 "", *lines, ""]
    return lines


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    from sitelens.models import fingerprint, load_model, model_name, tiny_model
    from sitelens.patching import intra_task
    from sitelens.pipelines.figures import FigureConfig, intra_ks
    from sitelens.provenance import NUMERICS_VERSION, settings_hash, task_hash
    from sitelens.site import FitConfig, fit_site, task_embedding
    from sitelens.tasks import load_task

    cfg = FigureConfig()
    if args.tiny:
        model = tiny_model(n_layers=2, n_heads=4, d_head=8)
        cfg = replace(cfg, n_examples=16, n_prompts=2, n_shots=2, n_boot=50, limit=5)
    else:
        model = load_model(args.model)
    task = load_task(args.task, seed=cfg.seed)
    n_total = model.cfg.n_layers * model.cfg.n_heads
    extra = [int(k) for k in args.extra_ks.split(",") if k.strip()]
    ks = sorted(set(intra_ks(n_total, cfg)) | {k for k in extra if 1 <= k <= n_total})
    settings = {
        "model": model_name(model), "fingerprint": fingerprint(model), "task": task.name,
        "task_hash": task_hash(task), "split": "test", "limit": cfg.limit,
        "n_examples": cfg.n_examples, "n_prompts": cfg.n_prompts, "n_shots": cfg.n_shots,
        "lr": cfg.lr, "batch_size": cfg.batch_size, "seed": cfg.seed,
        "n_random_seeds": cfg.n_random_seeds, "n_boot": cfg.n_boot,
        "ks": " ".join(map(str, ks)), "numerics_version": NUMERICS_VERSION,
    }
    settings["settings_hash"] = settings_hash(settings)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = "lambda_selection_tiny" if args.tiny else "lambda_selection"
    csv_path, md_path = out / f"{stem}.csv", out / f"{stem}.md"
    done: set[float] = set()
    if csv_path.exists():
        old = _read(csv_path)
        done = set(old[old.settings_hash == settings["settings_hash"]].sparsity.astype(float))

    emb = None
    for lam in (float(x) for x in args.lambdas.split(",") if x.strip()):
        if lam in done:
            print(f"λ={lam:g}: already in {csv_path.name}, skipped", flush=True)
            continue
        if emb is None:  # stage 1, shared across λ (as in sitelens.pipelines.figures)
            emb = task_embedding(model, task, n_prompts=cfg.n_prompts, n_shots=cfg.n_shots,
                                 seed=cfg.seed)  # [n_layers, n_heads, d_head]
        load = os.getloadavg()[0]
        fc = FitConfig(lr=cfg.lr, n_examples=cfg.n_examples, batch_size=cfg.batch_size,
                       sparsity=lam, seed=cfg.seed)
        ad = fit_site(model, task, n_prompts=cfg.n_prompts, n_shots=cfg.n_shots, config=fc,
                      embedding=emb)
        df = intra_task(model, task, ad, ks=ks, n_random_seeds=cfg.n_random_seeds,
                        limit=cfg.limit, seed=cfg.seed, n_boot=cfg.n_boot)
        alpha = ad.alpha.detach().float()  # [n_layers, n_heads]
        extra_cols = {
            **settings, "sparsity": lam, "best_step": ad.meta["best_step"],
            "final_valid_loss": round(float(ad.meta["final_valid_loss"]), 5),
            "stage2_seconds": round(float(ad.meta["stage2_seconds"]), 1),
            "alpha_mean": round(float(alpha.mean()), 5),
            "alpha_gt_half": int((alpha > 0.5).sum()),
            "threads": torch.get_num_threads(), "torch": torch.__version__,
            "load_avg_1min": round(load, 2),
        }
        rows = [
            {**r, "random_seed": "" if pd.isna(r["seed"]) else int(r["seed"]), **extra_cols}
            for r in df.to_dict("records")
        ]
        ResultsStore(csv_path, FIELDS, key=None).append(rows)
        acc = df.groupby(["selection", "k"]).accuracy.mean()
        tops = " ".join(f"top-{k} {acc[('top', k)]:.2f}" for k in (10, 13, 14) if k in ks)
        print(f"λ={lam:g}: {tops}, SITE {acc[('site', n_total)]:.2f} "
              f"(stage 2 {ad.meta['stage2_seconds']:.0f}s, {time.strftime('%H:%M:%S')})",
              flush=True)

    if csv_path.exists():
        argv_s = " ".join(sys.argv[1:] if argv is None else argv)
        write_md(_read(csv_path), md_path, csv_name=csv_path.name,
                 command=f"python benchmarks/lambda_selection.py {argv_s}".rstrip(),
                 tiny=args.tiny)
        print(f"-> {csv_path}, {md_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
