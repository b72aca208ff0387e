"""The whole frontier's time, per selector (``python benchmarks/frontier_time.py``): one model,
one task, every selector, budgets up to 50, both injections, one seed, exact match included.

Rows: ``fit`` (full SITE: the embedding every selector injects and ``alpha``'s α), one per
selector (its own selection: counted forward/backward passes and seconds; ``refit_seconds``: its
share of the joint refit of every distinct set, see :func:`sitelens.lenses.frontier.frontier`),
``scoring`` (the refits, the batched first-token pass over every mix and the exact-match
generation: the wall time left once the fit and the selectors are taken out) and ``total`` (the
whole call, wall clock). The load average is read before and after (other jobs share the cores).
``--tiny``: a smoke test on a tiny random model."""

from __future__ import annotations

import time

from lib.study import add_model_task_arguments, study_model

from sitelens.pipelines.experiment import Experiment, Job, load_avg, main, md_table


class FrontierTime(Experiment):
    name, title = "frontier_time", "The whole frontier's time, per selector"
    columns = ("model task budgets threads load_avg_1min load_avg_1min_after part forward_passes "
               "backward_passes seconds refit_seconds").split()
    key, replace, threads = None, True, 2

    def add_arguments(self, p) -> None:
        add_model_task_arguments(p)
        p.add_argument("--budgets", default="1,2,5,10,20,50")

    def cells(self, args):
        return [Job(f"{args.model}/{args.task}")]

    def run(self, job: Job) -> list[dict]:
        import torch

        from sitelens.lenses.frontier import frontier
        from sitelens.lenses.selectors import FrontierConfig
        from sitelens.models import model_name
        from sitelens.tasks import load_task

        a = self.args
        model = study_model(a)
        budgets = [int(k) for k in a.budgets.split(",")]
        if a.tiny:
            from sitelens import FitConfig
            from sitelens.lenses.attribution import AttributionConfig

            cfg = FrontierConfig(fit=FitConfig(n_examples=16, n_valid=8), n_prompts=4, n_shots=2, n_valid=8,
                                 attribution=AttributionConfig(n_prompts=4, n_shots=2, n_mean_prompts=4,
                                                               n_boot=20, n_alpha_items=6), test_limit=6)
            budgets = [k for k in budgets if k <= 8]
        else:
            cfg = FrontierConfig()
        task, load0 = load_task(a.task), load_avg()
        t0 = time.perf_counter()
        res = frontier(model, task, budgets=budgets, config=cfg)
        total = time.perf_counter() - t0
        t = res.table
        common = dict(model=model_name(model), task=task.name, budgets=",".join(map(str, budgets)),
                      threads=torch.get_num_threads(), load_avg_1min=load0, load_avg_1min_after=load_avg())
        s = res.summary["selectors"]
        fit = {c: float(t[(t.selector == "alpha") & (t.injection == "alpha1")][c].iloc[0])
               for c in ("forward_passes", "backward_passes", "seconds")}  # alpha = the full fit
        rows = [dict(common, part="fit", refit_seconds=0.0, **{k: round(x, 1) for k, x in fit.items()})]
        for sel, v in s.items():
            d = t[t.selector == sel]
            base = fit if sel == "alpha" else dict.fromkeys(fit, 0.0)  # alpha's cost includes the fit
            own = {c: round(v[c] - base[c], 1) for c in fit}
            r, a1 = d[d.injection == "refit"], d[d.injection == "alpha1"]
            refit = (r.seconds.to_numpy() - a1.seconds.to_numpy())[r.heads.ne("").to_numpy()].sum()
            rows.append(dict(common, part=sel, refit_seconds=round(float(refit), 1), **own))
        nan = float("nan")
        rows.append(dict(common, part="scoring", forward_passes=nan, backward_passes=nan,
                         seconds=round(total - sum(r["seconds"] for r in rows), 1),
                         refit_seconds=round(sum(r["refit_seconds"] for r in rows), 1)))
        rows.append(dict(common, part="total", forward_passes=nan, backward_passes=nan,
                         seconds=round(total, 1), refit_seconds=nan))
        return rows

    def report(self, df) -> str:
        c, tot = df.iloc[0], float(df[df.part == "total"].seconds.iloc[0])
        return (f"{'**Smoke test (--tiny): not a benchmark.**  ' * self.args.tiny}`{c.model}`, `{c.task}`: "
                f"every selector, budgets {c.budgets}, both injections (alpha1, refit), one seed, exact "
                f"match; {c.threads} thread(s); load average {c.load_avg_1min:.2f} before, "
                f"{c.load_avg_1min_after:.2f} after (other jobs share the cores).\n\n"
                f"`seconds`: the part's own time (a selector: its selection; `scoring`: the joint refit, "
                f"the batched test pass and exact-match generation); `refit_seconds`: a selector's share of "
                f"the joint refit (inside `scoring`).\n\n{md_table(df)}\n\n"
                f"The whole frontier took **{tot:.0f} s** ({tot / 60:.1f} min; target ≤ 600 s).\n")


if __name__ == "__main__":
    raise SystemExit(main(FrontierTime()))
