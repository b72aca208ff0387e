"""Seconds of a SITE fit (stage 1 + stage 2, default configuration) on a quiet machine, on a sample
of FV tasks, with the 1-minute load average before each fit.

    python benchmarks/fit_time.py --models smollm2-135m-instruct --threads 2   # -> fit_time_{model}.csv
    python benchmarks/fit_time.py --profile antonym --threads 2              # -> fit_profile.md
"""

from __future__ import annotations

import os
import time

import pandas as pd
import torch

from sitelens import FitConfig, fit_site, load_task, site
from sitelens.io import atomic_write_text
from sitelens.pipelines.executors import cached_model
from sitelens.pipelines.experiment import Clock, Experiment, Job, main, md_table, write_report
from sitelens.site import alpha, training

# The reference-schedule sample of site_fv.py plus four tasks with longer prompts.
SAMPLE = ("antonym", "country-capital", "english-french", "present-past", "singular-plural",
          "capitalize_first_letter", "choose_first_of_3", "person-occupation", "choose_middle_of_5",
          "color_v_animal_5", "synonym", "sentiment")
FIELDS = ["model", "task", "threads", "load_avg_1min", "stage1_seconds", "stage2_seconds",
          "fit_seconds", "wall_seconds"]


class FitTime(Experiment):
    name, columns, key, per_model = "fit_time", FIELDS, None, True
    models, tasks, threads = ("smollm2-135m-instruct",), SAMPLE, 2

    def add_arguments(self, p) -> None:
        p.add_argument("--profile", default="", metavar="TASK", help="time the parts of one fit")

    def done_keys(self) -> set[str]:
        return set(self.read().task)

    def cells(self, args):
        if args.profile:  # a measurement of its own, no cells
            return [] if args.dry_run else profile(self, args)
        return [Job(t, t) for t in args.tasks if (args.data_root / "fv" / t / "train.json").exists()]

    def run(self, job: Job) -> dict:
        model = cached_model(self.args.models[0])
        task = load_task(self.args.data_root / "fv" / job.key, dedupe=True)
        load = os.getloadavg()[0]
        with Clock() as clock:
            adapter = fit_site(model, task, config=FitConfig(seed=0))
        s1, s2 = adapter.meta["stage1_seconds"], adapter.meta["stage2_seconds"]
        return {"model": self.args.models[0], "task": job.key, "threads": self.args.threads,
                "load_avg_1min": round(load, 2), "stage1_seconds": round(s1, 2),
                "stage2_seconds": round(s2, 2), "fit_seconds": round(s1 + s2, 2),
                "wall_seconds": round(clock.wall, 2)}

    def write_report(self) -> str:
        mine = sorted(self.out.glob("fit_time_*.csv"))
        runs = [(p, pd.read_csv(p)) for p in mine + sorted((self.out / "fit_time_runs").glob("*.csv"))]
        body = ["Each model by `python benchmarks/fit_time.py --models MODEL --threads 2` with no other job "
                "running; default configuration; target: median ≤ 30 s on SmolLM2; `fit_time_runs/`: other "
                "runs of the same command (docs/benchmarks.md).", "", md_table(pd.DataFrame([{
                    "run": p.relative_to(self.out).with_suffix(""), "tasks": len(df),
                    **{f"{c} s {f}": f"{getattr(df[col], f)():.1f}" for c, col in (
                        ("fit", "fit_seconds"), ("stage 1", "stage1_seconds"), ("stage 2", "stage2_seconds"))
                       for f in ("median", "min", "max")},
                    "load avg range": f"{df.load_avg_1min.min():.2f}–{df.load_avg_1min.max():.2f}"}
                    for p, df in runs])), ""]
        cols = ["task", "threads", "load_avg_1min", "stage1_seconds", "stage2_seconds", "fit_seconds"]
        for _, df in runs[:len(mine)]:
            body += [f"## {df.model.iloc[0]} ({len(df)} tasks)", "", md_table(df[cols].round(2)), ""]
        return write_report(self.out / "fit_time.md", "SITE fit time on a quiet machine",
                            "python benchmarks/fit_time.py --report", "\n".join(body))


def profile(exp: FitTime, args) -> list:
    """Where the seconds of one fit go (-> fit_profile.md): stage 1, and stage 2 split into the
    frozen prefix caches, the forward passes (training batches and validation) and the backward passes."""
    model = cached_model(args.models[0])
    task = load_task(args.data_root / "fv" / args.profile, dedupe=True)
    spent: dict[str, float] = {}
    load = os.getloadavg()[0]

    def timed(fn, key):
        def wrapper(*a, **k):
            t = time.perf_counter()
            out = fn(*a, **k)
            spent[key] = spent.get(key, 0.0) + time.perf_counter() - t
            return out
        return wrapper

    with Clock() as stage1:
        emb = site.task_embedding(model, task)
    saved = training.prefix_cache, alpha.first_token_loss, torch.Tensor.backward  # the names fit_alpha calls
    training.prefix_cache = timed(training.prefix_cache, "prefix caches")
    alpha.first_token_loss = timed(alpha.first_token_loss,
                                   "forward passes (50 batches of 8, 6 validations of 64)")
    torch.Tensor.backward = timed(torch.Tensor.backward, "backward passes (50)")
    try:
        with Clock() as stage2:
            site.fit_alpha(model, task, emb)
    finally:
        training.prefix_cache, alpha.first_token_loss, torch.Tensor.backward = saved
    n_weights = sum(p.numel() for p in model.parameters())
    text = "\n".join([
        f"# Where a SITE fit spends its time ({args.models[0]}, {args.profile}, {args.threads} threads)", "",
        f"Made by `python benchmarks/fit_time.py --profile {args.profile} --threads {args.threads}` "
        f"(load average before: {load:.2f}).", "",
        "| part | seconds |", "|---|---:|", f"| stage 1 (task embedding) | {stage1.wall:.2f} |",
        f"| stage 2 (α) | {stage2.wall:.2f} |", *[f"| … {k} | {v:.2f} |" for k, v in spent.items()],
        f"| … rest (optimizer, bookkeeping) | {stage2.wall - sum(spent.values()):.2f} |", "",
        f"The model has {n_weights / 1e6:.0f}M weights ({4 * n_weights / 2**20:.0f} MiB in float32); "
        "a stage-2 step runs 8 tokens through all of them forward and backward, so it reads the "
        "weights twice for little arithmetic.", ""])
    atomic_write_text(exp.out / "fit_profile.md", text)
    print(text)
    return []


if __name__ == "__main__":
    raise SystemExit(main(FitTime()))
