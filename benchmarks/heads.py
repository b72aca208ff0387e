"""Which heads matter: every lens on both bundled models, exact vs fast, α's schedule, agreement.

    python benchmarks/heads.py --models smollm2-135m-instruct --threads 1     # one model per process
    python benchmarks/heads.py --models gemma-3-270m --official-tasks 3 --threads 1
    python benchmarks/heads.py --report                                       # tables + figures only
    python benchmarks/heads.py --tiny --out /tmp/heads                        # smoke test

A (model, task) unit goes to ``results/heads/{model}/{task}/`` and is skipped when its settings hash
is done; the report writes ``results/heads_*.{csv,md}`` and figures (docs/lenses.md).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path

import pandas as pd
import torch

from sitelens import FitConfig
from sitelens import lenses as L
from sitelens.eval.metrics import mean_over_tasks
from sitelens.io import atomic_write_csv, atomic_write_dir, atomic_write_json
from sitelens.lenses import AblationConfig, AttributionConfig, HeadScores
from sitelens.lenses.compare import fast_vs_exact, lens_agreement
from sitelens.lenses.plots import agreement_matrix, alpha_uncertainty, lens_maps
from sitelens.models import fingerprint, model_name
from sitelens.patching import intra_task
from sitelens.pipelines.executors import cached_model
from sitelens.pipelines.experiment import Experiment, Job, main, md_table, write_report
from sitelens.provenance import NUMERICS_VERSION, settings_hash, task_hash
from sitelens.site import SiteAdapter
from sitelens.tasks import load_task
from sitelens.viz.export import FigureWriter

TASKS = ("antonym", "country_capital", "present_past", "english_french", "english_spanish",
         "first_letter", "capitalize_first_letter", "choose_first_of_3")  # figures' INTRA_TASKS
MODELS = ("smollm2-135m-instruct", "gemma-3-270m")
COMMAND = "python benchmarks/heads.py --report"  # the tables and figures from the committed units
ORDER = ("effect", "atp", "atp-star", "alpha-grad", "alpha", "alpha-official", "ablation-mean",
         "ablation-zero", "dla")


class Heads(Experiment):
    name = "heads"
    key = None
    models = MODELS
    tasks = TASKS
    limit = 40  # test items of intra-task patching

    def add_arguments(self, p) -> None:
        p.add_argument("--seeds", type=int, default=5, help="default-protocol fits per task")
        p.add_argument("--official-seeds", type=int, default=3, help="official-protocol fits per task")
        p.add_argument("--official-tasks", type=int, default=4,
                       help="official-protocol fits on the first N tasks only (the schedule experiment)")
        p.add_argument("--tiny", action="store_true", help="tiny random model and sizes, k = 3 (smoke test)")

    @property
    def k(self) -> int:  # heads per selection
        return 3 if self.args.tiny else 10

    def official_seeds(self, task) -> int:
        """``--official-seeds`` on the first ``--official-tasks`` tasks, none on the others."""
        return self.args.official_seeds if task.name in self.args.tasks[: self.args.official_tasks] else 0

    def fit_config(self, official: bool = False):
        tiny = {"n_examples": 16, "n_valid": 8, **({"eval_every": 8} if official else {})}
        return (FitConfig.official if official else FitConfig)(**(tiny if self.args.tiny else {}))

    def configs(self):
        if self.args.tiny:
            return (AttributionConfig(n_prompts=4, n_shots=2, n_mean_prompts=4, n_boot=100, n_alpha_items=8),
                    AblationConfig(n_prompts=4, n_shots=2, n_boot=100))
        return AttributionConfig(), AblationConfig()

    def settings(self, model, task) -> dict:
        att, abl = self.configs()
        return {
            "model": model_name(model), "fingerprint": fingerprint(model), "task": task.name,
            "task_hash": task_hash(task), "seeds": self.args.seeds,
            "official_seeds": self.official_seeds(task), "limit": self.args.limit, "k": self.k,
            "fit": asdict(self.fit_config()),
            "official": asdict(self.fit_config(official=True)), "attribution": asdict(att),
            "ablation": asdict(abl), "numerics_version": NUMERICS_VERSION, "tiny": self.args.tiny,
            "_types": [type(c).__name__ for c in (FitConfig(), AttributionConfig(), AblationConfig())],
        }

    def done_keys(self) -> set[str]:
        return {json.loads(m.read_text())["settings_hash"] for m in self.out.glob("heads/*/*/meta.json")}

    def cells(self, args):
        for name in ["tiny-random"] if args.tiny else args.models:
            for t in args.tasks[: 2 if args.tiny else None]:
                st = self.settings(cached_model(name), load_task(t))
                yield Job(settings_hash(st), f"{st['model']}/{t}", dict(name=name, task=t, settings=st))

    def run(self, job: Job) -> list:
        args, k = self.args, self.k
        model, task = cached_model(job["name"]), load_task(job["task"])
        att, abl = self.configs()
        t0 = time.perf_counter()
        runs = {sched: L.alpha_over_seeds(model, task, range(n), self.fit_config(sched == "official"),
                                          n_prompts=att.n_mean_prompts, n_shots=att.n_shots, k=k, lens=lens)
                for sched, n, lens in (("default", args.seeds, "alpha"),
                                       ("official", self.official_seeds(task), "alpha-official")) if n}
        ad0 = runs["default"].adapters[0]
        emb = ad0.embedding
        scores = L.HeadScores.concat([r.scores for r in runs.values()] + [
            L.alpha_gradient(model, task, emb, att), L.attribution_patching(model, task, emb, att),
            L.attribution_patching(model, task, emb, att, grad_drop=True),
            L.exact_effects(model, task, emb, att), L.head_ablation(model, task, abl, reference="mean"),
            L.head_ablation(model, task, abl, reference="zero"),
            L.direct_logit_attribution(model, task, ad0, limit=8 if args.tiny else 64, n_boot=att.n_boot)])
        stab = pd.concat([r.stability.assign(schedule=s) for s, r in runs.items()], ignore_index=True)
        intra = []
        for sched, run in runs.items():
            for seed, ad in enumerate(run.adapters):
                df = intra_task(model, task, ad, ks=[k], n_random_seeds=3, limit=args.limit, reverse=False,
                                seed=0)
                intra.append(df.assign(kind="alpha_fit", schedule=sched, fit_seed=seed, lens="alpha"))
        for lens in [x for x in ORDER if x in scores.lenses]:
            m = torch.nan_to_num(scores.map(lens), nan=float("-inf"))  # [n_layers, n_heads]
            df = intra_task(model, task, SiteAdapter(alpha=m, embedding=emb, meta=ad0.meta), ks=[k],
                            n_random_seeds=0, limit=args.limit, reverse=False, references=False, seed=0)
            intra.append(df.assign(kind="lens_topk", schedule="", fit_seed=pd.NA, lens=lens))
        intra = pd.concat(intra, ignore_index=True)
        seconds = time.perf_counter() - t0

        def fill(tmp: Path) -> None:
            scores.to_csv(tmp / "scores.csv")
            stab.to_csv(tmp / "stability.csv", index=False)
            intra.to_csv(tmp / "intra.csv", index=False)
            atomic_write_json(tmp / "meta.json", {
                "settings_hash": job.key, "settings": job["settings"], "seconds": seconds,
                "threads": torch.get_num_threads(), "torch": torch.__version__,
                "best_steps": {s: [a.meta["best_step"] for a in r.adapters] for s, r in runs.items()},
            })

        path = self.out / "heads" / job["settings"]["model"] / task.name
        if path.exists():  # stale settings: keep the old unit beside, never overwrite it
            path.rename(path.with_name(f"{path.name}.stale-{int(time.time())}"))
        atomic_write_dir(path, fill)
        return []

    def write_report(self) -> str | None:
        figures = self.out if self.args.tiny else self.out.parent.parent / "figures"
        return report(self.out, figures, self.k)


# ----------------------------------------------------------------------------------------------
# report


def load_units(out: Path) -> dict[tuple[str, str], dict]:
    units = {}
    for meta in sorted((out / "heads").glob("*/*/meta.json")):
        d = meta.parent
        if ".stale-" in d.name or ".tmp" in d.name:
            continue
        units[(d.parent.name, d.name)] = {name: pd.read_csv(d / f"{name}.csv")
                                          for name in ("scores", "intra", "stability")}
    return units


def schedule(units, k: int = 10) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(per model × schedule × selection: mean over tasks of the seed-averaged first-token accuracy,
    95% bootstrap CI over tasks; per model × lens: the lens's top-k / bottom-k; per model ×
    schedule: seed stability)."""
    intra = pd.concat([u["intra"].assign(model_key=m) for (m, _), u in units.items()], ignore_index=True)
    a = intra[intra.kind == "alpha_fit"]
    a = a[(a.k == k) | a.selection.isin(["site", "zero_shot"])]
    parts = []
    for model, am in a.groupby("model_key"):
        paired = sorted(set(am[am.schedule == "official"].task) & set(am[am.schedule == "default"].task))
        for sched, label, tasks in (("default", "default", paired), ("official", "official", paired),
                                    ("default", "default (all tasks)", sorted(set(am.task)))):
            if len(sub := am[(am.schedule == sched) & am.task.isin(tasks)]):
                parts.append(mean_over_tasks(sub, ["selection"]).assign(
                    model=model, schedule=label, n_seeds=am[am.schedule == sched].fit_seed.nunique(),
                    tasks=" ".join(tasks)))
    rows = pd.concat(parts, ignore_index=True)[["model", "schedule", "selection", "accuracy", "ci_low",
                                                "ci_high", "n_tasks", "n_seeds", "tasks"]]
    lt = intra[(intra.kind == "lens_topk") & (intra.k == k)]
    lens_rows = mean_over_tasks(lt, ["model_key", "lens", "selection"]).rename(columns={"model_key": "model"})
    st = pd.concat([u["stability"].assign(model=m, task=t) for (m, t), u in units.items()], ignore_index=True)
    stab = st.groupby(["model", "schedule"]).agg(
        spearman=("spearman", "mean"), spearman_min=("spearman", "min"),
        **{f"top{k}_jaccard": (f"top{k}_jaccard", "mean")}, pairs=("spearman", "size")).reset_index()
    # the top-k Jaccard against chance: two random k-sets of the model's N heads share
    # expected_jaccard(k, k, N); the adjusted index is linear in the raw one at fixed k and N, so the
    # mean of the per-pair adjusted values is the adjusted mean
    from lib.study import heads_total

    from sitelens.stats import expected_jaccard

    n_total = stab.model.map(heads_total)
    stab[f"top{k}_chance"] = [expected_jaccard(k, k, n) for n in n_total]
    stab[f"top{k}_adjusted"] = ((stab[f"top{k}_jaccard"] - stab[f"top{k}_chance"])
                               / (1 - stab[f"top{k}_chance"]))
    return rows, lens_rows, stab


def paired_topk(units, k: int = 10) -> pd.DataFrame:
    """Per model: each lens's top-k heads (α = 1 on them), and SITE's full α, against α's own
    top-k (default schedule, seed-averaged), paired over the tasks both ran
    (:func:`sitelens.stats.paired_difference`): A − B in first-token accuracy, its 95% bootstrap
    interval over tasks, n and the tasks where each side is ahead."""
    from sitelens.stats import paired_difference

    intra = pd.concat([u["intra"].assign(model_key=m) for (m, _), u in units.items()], ignore_index=True)
    a = intra[(intra.kind == "alpha_fit") & (intra.schedule == "default")]
    per_task = {"alpha top-k": a[(a.selection == "top") & (a.k == k)],
                "full α (site)": a[a.selection == "site"]}
    lt = intra[(intra.kind == "lens_topk") & (intra.k == k) & (intra.selection == "top")]
    per_task |= {f"{lens} top-k": g for lens, g in lt.groupby("lens") if lens != "alpha"}
    rows = []
    for model in sorted(set(intra.model_key)):
        acc = {name: d[d.model_key == model].groupby("task").accuracy.mean() for name, d in per_task.items()}
        base = acc["alpha top-k"]
        for name, x in acc.items():
            if name == "alpha top-k" or x.empty:
                continue
            tasks = sorted(set(x.index) & set(base.index))
            r = paired_difference(x[tasks].to_numpy(), base[tasks].to_numpy(), over="tasks")
            rows.append({"model": model, "a": name.replace("top-k", f"top-{k}"), "b": f"alpha top-{k}",
                         "diff": r.diff, "ci_low": r.ci_low, "ci_high": r.ci_high, "n": r.n,
                         "over": r.over, "a_ahead": r.a_ahead, "b_ahead": r.b_ahead})
    return pd.DataFrame(rows)


def pivot(df: pd.DataFrame, index: list[str]) -> pd.DataFrame:
    v = df.apply(lambda r: f"{r.accuracy:.3f} [{r.ci_low:.3f}, {r.ci_high:.3f}]", axis=1)
    df = df.assign(v=v).pivot_table(index=index, columns="selection", values="v", aggfunc="first")
    return df.reset_index()


def report(out: Path, figures: Path, k: int = 10, heatmap_task: str = "antonym") -> str | None:
    units = load_units(out)
    if not units:
        print("no units yet")
        return None
    scores = HeadScores.concat([HeadScores(u["scores"]) for u in units.values()])
    evf, cert = fast_vs_exact(scores, k)
    agree = lens_agreement(scores, k, lenses=list(ORDER))
    sched, lens_top, stab = schedule(units, k)
    paired = paired_topk(units, k)
    for name, df in (("exact_vs_fast", evf), ("certified_topk", cert), ("agreement", agree),
                     ("schedule", sched), ("lens_topk", lens_top), ("stability", stab),
                     ("paired", paired)):
        atomic_write_csv(out / f"heads_{name}.csv", df)
    summ = evf.groupby(["model", "lens"]).agg(
        tasks=("task", "size"), spearman_median=("spearman", "median"),
        spearman_min=("spearman", "min"), tasks_rho_ge_0_8=("spearman", lambda x: int((x >= 0.8).sum())),
        **{f"top{k}_recall": (f"top{k}_recall", "mean")},
        forward=("forward_passes", "median"), backward=("backward_passes", "median"),
        seconds=("seconds", "median"), exact_forward=("exact_forward_passes", "median"),
        exact_rows=("exact_rows", "median"), exact_seconds=("exact_seconds", "median"),
    ).reset_index().round(3)
    csum = cert.groupby(["model", "lens", "rule"]).agg(
        tasks=("task", "size"), recall=("recall", "mean"), certified=("certified", "sum"),
        verified_share=("verified_share", "mean"), exact_rows_share=("exact_rows_share", "mean"),
    ).reset_index().round(3)
    tasks = sorted({t for _, t in units})
    head = (f"{len(tasks)} tasks: {', '.join(tasks)}; models: {', '.join(sorted({m for m, _ in units}))}; "
            "units by `python benchmarks/heads.py --models MODEL` (Gemma: `--official-tasks 3`); every "
            "setting and the columns: docs/lenses.md.")
    write_report(out / "heads_exact_vs_fast.md", "Exact vs fast head-importance lenses", COMMAND, "\n".join([
        head, "", md_table(summ), "", f"## Certified top-{k} (budget: 15% of the exact rows)", "",
        md_table(csum), ""]))
    write_report(out / "heads_schedule.md", "Does α pick the heads that carry the task? (λ = 0)", COMMAND,
                 "\n".join([head, "", md_table(pivot(sched, ["model", "schedule"])), "",
                            "## α's stability over seeds", "", md_table(stab.round(3)), "",
                            f"## The top-{k} heads of every lens", "",
                            md_table(pivot(lens_top, ["model", "lens"])), "",
                            f"## Paired against α's top-{k} (first-token accuracy, A − B over tasks)", "",
                            "Each lens's top-k heads (α = 1 on them) and SITE's full α against the top-k "
                            "of α (default schedule, mean over its fit seeds), on the same tasks and items: "
                            "the mean of the per-task differences, its 95% bootstrap interval over tasks, n "
                            "tasks and how many tasks each side is ahead on (`heads_paired.csv`).", "",
                            md_table(paired.round(3)), ""]))
    fig, frame = agreement_matrix(agree, list(ORDER))
    figures.mkdir(parents=True, exist_ok=True)
    w = FigureWriter()
    try:
        w.write(fig, frame, out / "heads_lens_agreement")  # beside the tables (and their plotly.js)
        for (model, task), u in units.items():
            if task == heatmap_task:
                hs = HeadScores(u["scores"])
                w.write(alpha_uncertainty(hs, "alpha"), hs.lens("alpha").df,
                        figures / model / f"alpha_uncertainty_{task}")
                w.write(lens_maps(hs, [x for x in ORDER if x in hs.lenses]), hs.df,
                        figures / model / f"lens_maps_{task}")
    finally:
        w.close()
    mean = frame[frame.lens_a < frame.lens_b]
    write_report(out / "heads_agreement.md", "Agreement across lenses", COMMAND, "\n".join([
        head + f" Spearman ρ of every pair of lenses' head maps, mean ± sd over tasks (top-{k} Jaccard per "
        "task: `heads_agreement.csv`; figure: `heads_lens_agreement.png`).", "",
        md_table(mean.round(3)[["model", "lens_a", "lens_b", "spearman_mean", "spearman_sd"]]), ""]))
    return f"report: {len(units)} units -> {out}"


if __name__ == "__main__":
    raise SystemExit(main(Heads()))
