"""How the figures' sparsity λ (``loss + λ·mean(α)``) was chosen: intra-task patching on one task
for a sweep of λ, each fitted and scored as ``sitelens figures`` does (``FigureConfig()``).

    python benchmarks/lambda_selection.py --threads 1                 # SmolLM2, antonym, λ 0..10
    python benchmarks/lambda_selection.py --tiny --out /tmp/lam       # smoke test (not a benchmark)
"""

from __future__ import annotations

import os
from dataclasses import replace
from functools import cached_property
from pathlib import Path

import pandas as pd
import torch

from sitelens.models import fingerprint, load_model, model_name
from sitelens.patching import intra_task
from sitelens.pipelines.experiment import Experiment, Job, main, md_table
from sitelens.pipelines.figures import FigureConfig, intra_ks
from sitelens.provenance import NUMERICS_VERSION, settings_hash, task_hash
from sitelens.site import FitConfig, fit_site, task_embedding
from sitelens.tasks import load_task
from sitelens.testing import tiny_model

FIGURES = Path(__file__).resolve().parents[1] / "figures"
SETTINGS = ["model", "fingerprint", "task", "task_hash", "split", "limit", "n_examples",
            "n_prompts", "n_shots", "lr", "batch_size", "seed", "n_random_seeds", "n_boot", "ks",
            "numerics_version", "settings_hash"]
FIELDS = ["sparsity", *SETTINGS, "k", "selection", "random_seed", "accuracy", "ci_low",
          "ci_high", "answer_prob", "n", "best_step", "final_valid_loss", "stage2_seconds",
          "alpha_mean", "alpha_gt_half", "threads", "torch", "load_avg_1min"]


class LambdaSelection(Experiment):
    name = "lambda_selection"
    title = "Choosing the sparsity λ of the figures"
    columns = FIELDS
    key = None
    models = ("smollm2-135m-instruct",)
    tasks = ("antonym",)

    def add_arguments(self, p) -> None:
        p.add_argument("--lambdas", default="0,0.5,1,2,5,10", help="comma-separated λ")
        p.add_argument("--extra-ks", default="13", help="ks added to the figures' ks (comma-separated)")
        p.add_argument("--tiny", action="store_true", help="tiny random model and sizes (not a benchmark)")

    @cached_property
    def setup(self):
        """(model, task, figure config, ks, settings), made once."""
        cfg = FigureConfig()
        if self.args.tiny:
            model = tiny_model(n_layers=2, n_heads=4, d_head=8)
            cfg = replace(cfg, n_examples=16, n_prompts=2, n_shots=2, n_boot=50, limit=5)
        else:
            model = load_model(self.args.models[0])
        task = load_task(self.args.tasks[0], seed=cfg.seed)
        n_total = model.cfg.n_layers * model.cfg.n_heads
        extra = [int(k) for k in self.args.extra_ks.split(",") if k.strip()]
        ks = sorted(set(intra_ks(n_total, cfg)) | {k for k in extra if 1 <= k <= n_total})
        s = {"model": model_name(model), "fingerprint": fingerprint(model), "task": task.name,
             "task_hash": task_hash(task), "split": "test", "ks": " ".join(map(str, ks)),
             "numerics_version": NUMERICS_VERSION, **{f: getattr(cfg, f) for f in (
                 "limit", "n_examples", "n_prompts", "n_shots", "lr", "batch_size", "seed", "n_random_seeds",
                 "n_boot")}}
        return model, task, cfg, ks, dict(s, settings_hash=settings_hash(s))

    def done_keys(self) -> set[str]:
        df = self.read()
        return {f"{h}/{float(s)}" for h, s in zip(df.settings_hash, df.sparsity)}

    def read(self) -> pd.DataFrame:
        # hashes stay strings ("69610e739397" would otherwise parse as a float)
        return self.store().read(dtype={"fingerprint": str, "task_hash": str, "settings_hash": str})

    def cells(self, args):
        h = self.setup[-1]["settings_hash"]
        return [Job(f"{h}/{lam}", f"λ={lam:g}", {"lam": lam})
                for lam in (float(x) for x in args.lambdas.split(",") if x.strip())]

    def run(self, job: Job) -> list[dict]:
        model, task, cfg, ks, settings = self.setup
        if "_emb" not in self.__dict__:  # stage 1, shared across λ (as in sitelens.pipelines.figures)
            self._emb = task_embedding(model, task, n_prompts=cfg.n_prompts, n_shots=cfg.n_shots,
                                       seed=cfg.seed)  # [n_layers, n_heads, d_head]
        load, lam = os.getloadavg()[0], job["lam"]
        fc = FitConfig(lr=cfg.lr, n_examples=cfg.n_examples, batch_size=cfg.batch_size, sparsity=lam,
                       seed=cfg.seed)
        ad = fit_site(model, task, n_prompts=cfg.n_prompts, n_shots=cfg.n_shots, config=fc,
                      embedding=self._emb)
        df = intra_task(model, task, ad, ks=ks, n_random_seeds=cfg.n_random_seeds, limit=cfg.limit,
                        seed=cfg.seed, n_boot=cfg.n_boot)
        alpha = ad.alpha.detach().float()  # [n_layers, n_heads]
        extra = {**settings, "sparsity": lam, "best_step": ad.meta["best_step"],
                 "final_valid_loss": round(float(ad.meta["final_valid_loss"]), 5),
                 "stage2_seconds": round(float(ad.meta["stage2_seconds"]), 1),
                 "alpha_mean": round(float(alpha.mean()), 5), "alpha_gt_half": int((alpha > 0.5).sum()),
                 "threads": torch.get_num_threads(), "torch": torch.__version__,
                 "load_avg_1min": round(load, 2)}
        return [{**r, "random_seed": "" if pd.isna(r["seed"]) else int(r["seed"]), **extra}
                for r in df.to_dict("records")]

    def report(self, df: pd.DataFrame) -> str:
        """The table of one settings hash (the last one written): per λ, top-k / bottom-k / random-k
        accuracy at k = 10, 13, 14 and SITE / zero-shot; the λ the committed figures also ran, checked
        against them."""
        df = df[df.settings_hash == df.settings_hash.iloc[-1]]
        s = df.iloc[0]
        n_total = int(df[df.selection == "site"].k.iloc[0])
        top_ks = sorted(set(df[df.selection == "top"].k))
        show = [k for k in (10, 13, 14) if k in top_ks] or top_ks[:3]
        table, checks = [], []
        for lam, g in df.groupby("sparsity", sort=True):
            acc = g.groupby(["selection", "k"]).accuracy.mean()  # random: mean over seeds
            top, r = g[(g.selection == "top") & (g.k == show[0])], g.iloc[0]
            table.append({"λ": f"{lam:g}", **{f"top-{k}": f"{acc[('top', k)]:.2f}" for k in show},
                          **{f"bottom-{k}": f"{acc[('bottom', k)]:.2f}" for k in show},
                          f"random-{show[0]}": f"{acc[('random', show[0])]:.2f}",
                          f"top-{show[0]} P(answer)": f"{top.answer_prob.mean():.3f}",
                          "SITE": f"{acc[('site', n_total)]:.2f}",
                          "zero-shot": f"{acc[('zero_shot', 0)]:.2f}",
                          "mean α": f"{r.alpha_mean:.3f}", "heads α > 0.5": int(r.alpha_gt_half),
                          "best step": int(r.best_step), "stage 2 (s)": f"{r.stage2_seconds:.0f}"})
            f = FIGURES / s.model / f"patching_curves_tasks_lam{lam:g}.csv"
            if f.exists():  # the same fits run by `sitelens figures`: the same numbers?
                fig = pd.read_csv(f)
                fig = fig[(fig.task == s.task) & fig.selection.isin(["top", "bottom", "site", "zero_shot"])]
                both = [(r.accuracy, acc.get((r.selection, int(r.k)))) for r in fig.itertuples()]
                both = [b for b in both if b[1] is not None]
                worst = max((abs(a - b) for a, b in both), default=float("nan"))
                checks.append(f"- λ = {lam:g}: {len(both)} top/bottom/SITE/zero-shot accuracies shared with "
                              f"`figures/{s.model}/{f.name}`, max |Δ| = {worst:.3f}.")
        return "\n".join([
            f"`{s.model}` ({n_total} heads, weights {s.fingerprint}), task `{s.task}` (first {s.limit} test "
            f"items: n = {int(s.n)}); `FigureConfig()`: {s.n_prompts} {s.n_shots}-shot prompts, "
            f"{s.n_examples} training examples, batch {s.batch_size}, lr {s.lr}, seed {s.seed}; "
            f"{s.n_random_seeds} random-head seeds; {int(s.threads)} thread(s), torch {s.torch}, numerics "
            f"{s.numerics_version}, settings hash `{s.settings_hash}`. First-token accuracy; the setup and "
            f"the choice: docs/figures.md; every k: [`{self.name}.csv`]({self.name}.csv).", "",
            md_table(pd.DataFrame(table)), "", *checks, ""])


if __name__ == "__main__":
    raise SystemExit(main(LambdaSelection()))
