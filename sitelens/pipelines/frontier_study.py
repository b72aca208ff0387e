"""The frontier study (``benchmarks/frontier_study.py`` runs it): :func:`sitelens.lenses.frontier`
on the figures' 8 FV tasks for both bundled models, one stored cell per (model, task, seed).

A cell appends its frontier rows (:data:`sitelens.lenses.frontier.COLUMNS` + ``key``) to
``{out}/frontier_study.csv`` and writes its summary (k*, stability, overlap, what each selector
chose) with the cell's own table to ``{out}/frontier_study/{model}/{task}_seed{seed}/``
(``frontier.csv``, ``summary.json``); a cell whose key is in the CSV
is done and is not recomputed (run the command again to resume). ``--report`` (also after every
run) writes ``{out}/frontier_study.md`` and the figure ``{out}/frontier_study_kstar.{html,png,csv}``
from the stored cells: k* per selector and task (smallest k reaching 90% of full SITE's test
accuracy, mean over seeds), the stability of each selector's sets (Jaccard over seeds), and the
comparison at k = 10 of the paper's top-10 α heads (it reports 57.3% for them) and the Function
Vectors paper's top-10 causal heads (the ``effect`` selector: the same indirect effect) with full
SITE. ``--tiny``: a smoke test on a tiny random model."""

from __future__ import annotations

from itertools import combinations

import numpy as np
import pandas as pd

from sitelens.pipelines.experiment import Experiment, Job, md_table

TASKS = ("antonym", "capitalize_first_letter", "choose_first_of_3", "country_capital", "english_french",
         "english_spanish", "first_letter", "present_past")  # the figures' INTRA_TASKS
MODELS = ("smollm2-135m-instruct", "gemma-3-270m")
PAPER_TOP10_ALPHA = 0.573  # the SITE paper's first-token accuracy with its top-10 α heads
K_CMP = 10


def _jaccard(a: str, b: str) -> float:
    x, y = set(a.split(";")), set(b.split(";"))
    return len(x & y) / len(x | y)


def k_star_table(df: pd.DataFrame, threshold: float = 0.9) -> pd.DataFrame:
    """Per model, task, selector and injection: k* from the seed-averaged test accuracy."""
    from sitelens.lenses.frontier import k_star

    rows = []
    for (m, t, sel, inj), d in df.groupby(["model", "task", "selector", "injection"], sort=False):
        acc = d.groupby("k").first_token_acc.mean()
        rows.append({"model": m, "task": t, "selector": sel, "injection": inj,
                     "k_star": k_star(acc.index.tolist(), acc.tolist(), float(d.full_site.mean()),
                                      threshold),
                     "full_site": float(d.full_site.mean()), "zero_shot": float(d.zero_shot.mean())})
    return pd.DataFrame(rows)


def stability_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per model, task and selector: mean Jaccard of S_k over pairs of seeds (NaN with one seed)."""
    a1 = df[(df.injection == "alpha1") & (df.heads.fillna("") != "")]
    rows = []
    for (m, t, sel), d in a1.groupby(["model", "task", "selector"], sort=False):
        js = [_jaccard(x, y) for _, g in d.groupby("k") for x, y in combinations(g.heads.tolist(), 2)]
        rows.append({"model": m, "task": t, "selector": sel, "seeds": d.seed.nunique(),
                     "jaccard_seeds": float(np.mean(js)) if js else float("nan")})
    return pd.DataFrame(rows)


class FrontierStudy(Experiment):
    name, title = "frontier_study", "How few heads carry each task? The frontier on the figures' FV tasks"
    models, tasks, threads = MODELS, TASKS, 2
    key = "key"

    @property
    def columns(self):
        from sitelens.lenses.frontier import COLUMNS

        return ["key", *COLUMNS]

    def add_arguments(self, p) -> None:
        p.add_argument("--seeds", type=int, default=1, help="fit seeds per (model, task): cells 0..N-1")
        p.add_argument("--budgets", default="1,2,5,10,20,50")
        p.add_argument("--n-bootstrap", type=int, default=0, help="bootstrap resamples per cell")
        p.add_argument("--tiny", action="store_true", help="tiny random model, budgets 1,2,5 (smoke test)")

    def cells(self, args):
        models = ["tiny-random"] if args.tiny else args.models
        for m in models:
            for t in args.tasks[: 1 if args.tiny else None]:
                for seed in range(args.seeds):
                    yield Job(f"{m}/{t}/{seed}", f"{m} {t} seed {seed}",
                              {"model": m, "task": t, "seed": seed})

    def config(self):
        from sitelens.lenses.selectors import FrontierConfig

        if not self.args.tiny:
            return FrontierConfig(n_bootstrap=self.args.n_bootstrap)
        from sitelens import FitConfig
        from sitelens.lenses.attribution import AttributionConfig

        att = AttributionConfig(n_prompts=4, n_shots=2, n_mean_prompts=4, n_boot=20, n_alpha_items=6)
        return FrontierConfig(fit=FitConfig(n_examples=16, n_valid=8), n_prompts=4, n_shots=2, n_valid=8,
                              attribution=att, test_limit=6, n_bootstrap=self.args.n_bootstrap)

    def run(self, job: Job) -> list[dict]:
        from sitelens.lenses.frontier import frontier
        from sitelens.pipelines.executors import cached_model
        from sitelens.tasks import load_task

        model, task = cached_model(job["model"]), load_task(job["task"])
        budgets = [int(k) for k in self.args.budgets.split(",")]
        budgets = [k for k in budgets if k <= model.cfg.n_layers * model.cfg.n_heads]
        res = frontier(model, task, budgets=budgets, seeds=[job["seed"]], config=self.config())
        res.to_dir(self.out / "frontier_study" / job["model"] / f"{job['task']}_seed{job['seed']}")
        return res.table.assign(key=job.key).to_dict("records")

    def report(self, df: pd.DataFrame) -> str:
        from sitelens.viz.export import FigureWriter

        ks, st = k_star_table(df), stability_table(df)
        wide = ks.pivot_table(index=["model", "task"], columns=["selector", "injection"],
                              values="k_star", aggfunc="first").reset_index()
        wide.columns = [c if isinstance(c, str) else "/".join(x for x in c if x) for c in wide.columns]
        stab = st.pivot_table(index=["model", "task"], columns="selector", values="jaccard_seeds",
                              dropna=False).reset_index()
        a1 = df[(df.injection == "alpha1") & (df.k == K_CMP)]
        cmp_rows = []
        for m, d in a1.groupby("model"):
            per_task = d.groupby(["task", "selector"]).first_token_acc.mean().unstack()
            full = df[df.model == m].groupby("task").full_site.mean()
            over = [_jaccard(x, y) for _, g in d.groupby(["task", "seed"])
                    for x, y in [((g[g.selector == "alpha"].heads.tolist() or [""])[0],
                                  (g[g.selector == "effect"].heads.tolist() or [""])[0])] if x and y]
            def mean(sel, per_task=per_task):
                return round(float(per_task[sel].mean()), 3) if sel in per_task else float("nan")

            cmp_rows.append({"model": m, "tasks": len(per_task), "full_site": round(float(full.mean()), 3),
                             "top10_alpha": mean("alpha"), "paper_top10_alpha": PAPER_TOP10_ALPHA,
                             "fv_top10_effect": mean("effect"),
                             "jaccard_alpha_effect": round(float(np.mean(over)), 3) if over else np.nan})
        fig = self.figure(ks)
        w = FigureWriter()
        try:
            w.write(fig, ks, self.out / "frontier_study_kstar")
        finally:
            w.close()
        n = df.groupby(["model", "task"]).ngroups
        return "\n".join([
            f"{n} (model, task) pair(s), {df.seed.nunique()} seed(s); every selector's sets chosen on "
            "train/valid, accuracy on test (first token; intervals and exact match: `frontier_study.csv`). "
            "k* = the smallest budget whose test accuracy reaches 90% of full SITE's (`not reached` within "
            "the budgets).", "",
            "## k* per selector (alpha1 = α = 1 on S_k; refit = α re-fitted on S_k)", "", md_table(wide),
            "", "## Stability: mean Jaccard of S_k over fit seeds (NaN: one seed)", "",
            md_table(stab.round(3)), "",
            f"## At k = {K_CMP}: the paper's top-10 α heads and FV's top-10 causal heads (α = 1, mean "
            "over tasks)",
            "", md_table(pd.DataFrame(cmp_rows)) if cmp_rows else f"(no k = {K_CMP} in the budgets)", "",
            f"Figure: `frontier_study_kstar.html` (k* per selector and task). The paper reports "
            f"{PAPER_TOP10_ALPHA:.1%} for its top-10 α heads; `top10_alpha` is ours on the same footing "
            "(first-token accuracy, α = 1 on the 10 heads of largest α, λ = 0).", ""])

    @staticmethod
    def figure(ks: pd.DataFrame):
        """k* per selector (columns) and task (rows), one panel per model (alpha1 injection);
        'not reached' is blank. Returns a plotly Figure."""
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots

        d = ks[ks.injection == "alpha1"].copy()
        d["kv"] = pd.to_numeric(d.k_star, errors="coerce")
        models = list(dict.fromkeys(d.model))
        fig = make_subplots(rows=1, cols=max(len(models), 1), subplot_titles=models)
        for i, m in enumerate(models, start=1):
            p = d[d.model == m].pivot_table(index="task", columns="selector", values="kv",
                                            aggfunc="first", dropna=False)
            fig.add_trace(go.Heatmap(z=np.log10(p.to_numpy(float)), x=list(p.columns), y=list(p.index),
                                     text=p.to_numpy(), texttemplate="%{text}", colorscale="Viridis",
                                     showscale=i == 1, colorbar={"title": "log10 k*"}),
                          row=1, col=i)
        fig.update_layout(title="k*: the fewest heads reaching 90% of full SITE (α = 1; blank: not reached)")
        return fig
