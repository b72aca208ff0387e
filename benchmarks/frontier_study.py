"""The frontier study (``python benchmarks/frontier_study.py``): :func:`sitelens.lenses.frontier`
on the figures' 8 FV tasks for both bundled models, one stored cell per (model, task, seed).

A cell appends its frontier rows (:data:`sitelens.lenses.frontier.COLUMNS` + ``key``) to
``{out}/frontier_study.csv`` and writes its summary (k*, stability, overlap, what each selector
chose) with the cell's own table to ``{out}/frontier_study/{model}/{task}_seed{seed}/``
(``frontier.csv``, ``summary.json``); a cell whose key is in the CSV
is done and is not recomputed (run the command again to resume). ``--report`` (also after every
run) writes ``{out}/frontier_study.md`` and the figure ``{out}/frontier_study_kstar.{html,png,csv}``
from the stored cells: k* per selector and task (smallest k reaching 90% of full SITE's test
accuracy, mean over seeds), the stability of each selector's sets (Jaccard over seeds), and the
comparison at k = 10 of the paper's top-10 α heads (its own figure for them is cited from
``benchmarks/cited.csv``, never a column of ours) and the Function
Vectors paper's top-10 causal heads (the ``effect`` selector: the same indirect effect) with full
SITE. Stability (``--stability-seeds S``, ``--n-bootstrap B``): selection-only cells
(:func:`sitelens.lenses.frontier.frontier_sets`, nothing scored on test), one per extra fit seed
1..S and per bootstrap resample 0..B-1 of the train/valid items (fit seed 0), append the sets they
chose to ``{out}/frontier_study_sets.csv``; the report's stability is the Jaccard of S_k between
seed 0's cell and each replicate, and a k* whose sets are unstable (mean raw Jaccard at k* below
:data:`RAW_UNSTABLE_BELOW`) is marked so. These tables choose k* on test and mark stability on the
raw Jaccard; ``sitelens frontier`` (:func:`sitelens.lenses.frontier.frontier`) chooses k* on valid
and marks stability on the chance-adjusted index. ``--joint``: the stability cells of
one model and replicate fitted together (one joint full SITE fit for all their tasks, equal to
one-task fits up to float rounding; the sets table's ``joint_tasks`` says how many shared it).
``--tiny``: a smoke test on a tiny random model (its first task, unless ``--tasks`` names them)."""

from __future__ import annotations

from collections.abc import Callable
from itertools import combinations

import numpy as np
import pandas as pd
from lib.cited import cited
from lib.study import heads_total

from sitelens.io import atomic_write_csv
from sitelens.pipelines.experiment import Experiment, Job, main, md_table

TASKS = ("antonym", "capitalize_first_letter", "choose_first_of_3", "country_capital", "english_french",
         "english_spanish", "first_letter", "present_past")  # the figures' INTRA_TASKS
MODELS = ("smollm2-135m-instruct", "gemma-3-270m")
K_CMP = 10
SETS = "frontier_study_sets"  # the stability cells' table
VALID_COLUMNS = ("valid_acc", "full_site_valid", "zero_shot_valid")
# set_stability's figures: the adjusted Jaccard's mean, sd and pairs; the raw mean and its chance level
STABILITY = ["stability", "stability_sd", "n_pairs", "raw_jaccard", "chance_jaccard"]
SET_COLUMNS = ["key", "model", "task", "replicate", "index", "selector", "k", "heads", "forward_passes",
               "backward_passes", "seconds", "joint_tasks"]
OLDER_SET_COLUMNS = [SET_COLUMNS[:-1]]  # before --joint: every fit one task alone (joint_tasks blank)


def _jaccard(a: str, b: str) -> float:
    """The Jaccard of two head sets written as ``L{l}H{h}`` labels joined by ``;``."""
    from sitelens.stats import jaccard

    return jaccard(a.split(";"), b.split(";"))


NO_K_STAR = "no k*"  # full SITE does not clearly beat zero-shot on the cell's test items


def cell_summaries(out, df: pd.DataFrame) -> dict[tuple[str, str, int], dict]:
    """Each scored cell's ``summary.json`` (:attr:`sitelens.lenses.frontier.FrontierResult.summary`)
    by (model, task, seed), where the cell wrote one under ``{out}/frontier_study/``."""
    import json

    found = {}
    for m, t, s in df[["model", "task", "seed"]].drop_duplicates().itertuples(index=False):
        path = out / "frontier_study" / m / f"{t}_seed{int(s)}" / "summary.json"
        if path.exists():
            found[(m, t, int(s))] = json.loads(path.read_text(encoding="utf-8"))
    return found


def k_star_table(df: pd.DataFrame, threshold: float = 0.9,
                 summaries: dict[tuple[str, str, int], dict] | None = None) -> pd.DataFrame:
    """Per model, task, selector and injection: k* from the seed-averaged accuracy, chosen on
    valid (``chosen_on = "valid"``) where the cell scored valid (its full SITE's valid accuracy is
    recorded; a budget a selector did not reach, greedy's past its stop, has no valid accuracy and
    does not reach k*), else on test (the cells scored before the frontier measured valid:
    ``chosen_on = "test"``, the report marks them); the test accuracy at k* beside it.

    With the cells' ``summaries`` (:func:`cell_summaries`): :data:`NO_K_STAR` where a scored cell's
    full SITE does not clearly beat zero-shot (its status ``site_not_above_zero_shot``: the paired
    interval over test items reaches 0), and, with one scored seed, k*'s bootstrap interval over
    valid items (``k_star_low``, ``k_star_high``) and the Wilson interval of the test accuracy at
    k* (``test_ci_low``, ``test_ci_high``), as the library's frontier gives them."""
    from sitelens.lenses.frontier import SITE_NOT_ABOVE_ZERO_SHOT, k_star

    summaries = summaries or {}
    rows = []
    for (m, t, sel, inj), d in df.groupby(["model", "task", "selector", "injection"], sort=False):
        on_valid = ("full_site_valid" in d
                    and bool(pd.to_numeric(d.full_site_valid, errors="coerce").notna().all()))
        acc_col, full_col = ("valid_acc", "full_site_valid") if on_valid else ("first_token_acc", "full_site")
        acc = d.groupby("k")[acc_col].mean()
        ks = k_star(acc.index.tolist(), acc.tolist(), float(d[full_col].mean()), threshold)
        test = d.groupby("k").first_token_acc.mean()
        cells = [summaries.get((m, t, int(s))) for s in sorted(d.seed.unique())]
        if on_valid and cells and all(c is not None for c in cells) and any(
                c.get("status") == SITE_NOT_ABOVE_ZERO_SHOT for c in cells):
            ks = NO_K_STAR
        row = {"model": m, "task": t, "selector": sel, "injection": inj, "k_star": ks,
               "chosen_on": "valid" if on_valid else "test",
               "test_acc_at_k_star": float(test[ks]) if isinstance(ks, int) else float("nan"),
               "full_site": float(d.full_site.mean()), "zero_shot": float(d.zero_shot.mean())}
        one = cells[0] if len(cells) == 1 and on_valid else None
        at = (one or {}).get("selectors", {}).get(sel, {}).get("at_k_star", {}).get(inj, {})
        interval = at.get("k_star_interval") if ks != NO_K_STAR else None
        row["k_star_low"], row["k_star_high"] = interval if interval else ("", "")
        at_k = d[d.k == ks] if isinstance(ks, int) and len(cells) == 1 and "ci_low" in d else d.iloc[:0]
        row["test_ci_low"] = float(at_k.ci_low.iloc[0]) if len(at_k) else float("nan")
        row["test_ci_high"] = float(at_k.ci_high.iloc[0]) if len(at_k) else float("nan")
        rows.append(row)
    return pd.DataFrame(rows)


def _span(v: pd.Series) -> str:
    """``"3"`` when every value is 3, ``"2–3"`` when they range from 2 to 3 (replicates per task
    while the study is partly done)."""
    lo, hi = int(v.min()), int(v.max())
    return str(lo) if lo == hi else f"{lo}–{hi}"


def stability_table(df: pd.DataFrame, sets: pd.DataFrame | None = None,
                    n_total: Callable[[str], int] = heads_total) -> pd.DataFrame:
    """Per model, task, selector and k: the stability of S_k by
    :func:`sitelens.lenses.frontier.set_stability` (the one definition ``sitelens frontier`` uses):
    the chance-adjusted Jaccard over every pair of fit seeds (seed 0's scored cell and the
    selection-only seed replicates in ``sets``) and between seed 0's set and each bootstrap
    resample's, its mean, standard deviation and number of pairs, beside the raw Jaccard's mean
    and its chance level (over ``n_total(model)`` heads); NaN where nothing was compared."""
    from sitelens.lenses.frontier import set_stability

    a1 = df[(df.injection == "alpha1") & (df.heads.fillna("") != "")]
    main = a1[["model", "task", "selector", "k", "heads", "seed"]].assign(replicate="seed")
    reps = (pd.DataFrame(columns=[*SET_COLUMNS]) if sets is None else sets)
    reps = reps[reps.heads.fillna("") != ""]
    group = ["model", "task", "selector", "k"]
    seeds = pd.concat([main.rename(columns={"seed": "index"}), reps[reps.replicate == "seed"]])
    boots = {key: [h.split(";") for h in g.heads] for key, g in
             reps[reps.replicate == "bootstrap"].groupby(group)}
    rows = []
    for (m, t, sel, k), d in seeds.groupby(group, sort=False):
        d = d.drop_duplicates("index").sort_values("index")
        by_seed = [h.split(";") for h in d.heads] if (d["index"] == 0).any() else [None, *d.heads]
        st = set_stability(by_seed, boots.get((m, t, sel, k), []), n_total(m), int(k))
        rows.append({"model": m, "task": t, "selector": sel, "k": int(k), "seeds": len(d),
                     "bootstraps": len(boots.get((m, t, sel, k), [])),
                     **{c: float("nan") if st[c] is None else st[c] for c in STABILITY}})
    return pd.DataFrame(rows, columns=[*group, "seeds", "bootstraps", *STABILITY])


def overlap_table(df: pd.DataFrame, model: str, k: int = K_CMP) -> pd.DataFrame:
    """Selector × selector: the Jaccard of their S_k (seed 0, α = 1 rows), mean over the model's
    tasks where both have a set; NaN where they never both do."""
    d = df[(df.model == model) & (df.injection == "alpha1") & (df.k == k) & (df.seed == 0)
           & (df.heads.fillna("") != "")]
    sels = list(dict.fromkeys(df[df.model == model].selector))
    by = {(t, s): h for t, s, h in zip(d.task, d.selector, d.heads)}
    tasks = list(dict.fromkeys(d.task))
    out = pd.DataFrame(index=sels, columns=sels, dtype=float)
    for a, b in combinations(sels, 2):
        js = [_jaccard(by[t, a], by[t, b]) for t in tasks if (t, a) in by and (t, b) in by]
        out.loc[a, b] = out.loc[b, a] = float(np.mean(js)) if js else float("nan")
    for a in sels:
        out.loc[a, a] = 1.0
    return out.round(2).rename_axis("selector").reset_index()


def mark_unstable(ks: pd.DataFrame, st: pd.DataFrame) -> pd.DataFrame:
    """``ks`` with the stability at k* (``stability``: the chance-adjusted Jaccard's mean,
    ``stability_sd``, ``n_pairs``) and ``k_star`` written ``"20 (unstable)"`` where that mean is
    below :data:`sitelens.lenses.frontier.UNSTABLE_BELOW` (the library's mark); NaN, and no mark,
    where nothing was compared."""
    from sitelens.lenses.frontier import UNSTABLE_BELOW

    at = {(r.model, r.task, r.selector, r.k): r for r in st.itertuples()}
    ks = ks.copy()
    for c in ("stability", "stability_sd", "n_pairs"):
        ks[c] = [getattr(at[(r.model, r.task, r.selector, r.k_star)], c)
                 if isinstance(r.k_star, int) and (r.model, r.task, r.selector, r.k_star) in at
                 else float("nan") for r in ks.itertuples()]
    def marked(r) -> str:
        text = str(r.k_star)
        if isinstance(r.k_star, int) and str(getattr(r, "k_star_low", "")) not in ("", "nan"):
            text += f" [{r.k_star_low}, {r.k_star_high}]"
        return f"{text} (unstable)" if r.stability < UNSTABLE_BELOW else text

    ks["k_star_marked"] = [marked(r) for r in ks.itertuples()]
    return ks


class FrontierStudy(Experiment):
    name, title = "frontier_study", "How few heads carry each task? The frontier on the figures' FV tasks"
    models, tasks, threads = MODELS, TASKS, 2
    key = "key"

    @property
    def columns(self):
        from sitelens.lenses.frontier import COLUMNS

        return ["key", *COLUMNS]

    @property
    def command(self) -> str:
        """The command that makes (and resumes) every stored cell; ``--report`` rewrites from them."""
        return "python benchmarks/frontier_study.py --stability-seeds 2 --n-bootstrap 3 --threads 1"

    @property
    def older(self):
        """The cells scored before the frontier chose k* on valid: no valid accuracies (their k* is
        chosen on test, and the report says so)."""
        return [[c for c in self.columns if c not in VALID_COLUMNS]]

    def add_arguments(self, p) -> None:
        p.add_argument("--seeds", type=int, default=1, help="fit seeds per (model, task): cells 0..N-1")
        p.add_argument("--budgets", default="1,2,5,10,20,50")
        p.add_argument("--stability-seeds", type=int, default=0,
                       help=f"selection-only cells for fit seeds 1..S per (model, task) ({SETS}.csv)")
        p.add_argument("--n-bootstrap", type=int, default=0,
                       help=f"selection-only cells for bootstrap resamples 0..B-1 ({SETS}.csv)")
        p.add_argument("--joint", action="store_true",
                       help="the selection-only cells of one model and replicate (fit seed s, or resample b) "
                            "to run, their full SITE fits in one joint fit (frontier_sets_tasks; equal to "
                            "one-task fits up to float rounding), then each task's selectors")
        p.add_argument("--tiny", action="store_true", help="tiny random model, budgets 1,2,5 (smoke test)")

    def cells(self, args):
        models = ["tiny-random"] if args.tiny else args.models
        # --tiny: the first task only, unless --tasks names the tasks
        names = args.tasks[:1] if args.tiny and args.tasks == list(TASKS) else args.tasks
        for m in models:
            for t in names:
                for seed in range(args.seeds):
                    yield Job(f"{m}/{t}/{seed}", f"{m} {t} seed {seed}",
                              {"model": m, "task": t, "seed": seed})
        for m in models:  # after every scored cell: the stability replicates
            for t in names:
                for s in range(1, args.stability_seeds + 1):
                    yield Job(f"{m}/{t}/select-seed{s}", f"{m} {t} sets of seed {s}",
                              {"model": m, "task": t, "seed": s, "replicate": "seed", "index": s})
                for b in range(args.n_bootstrap):
                    yield Job(f"{m}/{t}/select-boot{b}", f"{m} {t} sets of bootstrap {b}",
                              {"model": m, "task": t, "seed": 0, "replicate": "bootstrap", "index": b})

    def sets_store(self):
        from sitelens.pipelines.store import ResultsStore

        return ResultsStore(self.out / f"{SETS}.csv", SET_COLUMNS, key="key", older=OLDER_SET_COLUMNS)

    def batch(self, todo: list[Job]) -> list[Job]:
        """With ``--joint``: the selection-only cells of one (model, replicate kind, index) as one
        job, in the place of the first (it appends each cell's sets under the cell's own key as
        the cell finishes, so a stopped group resumes with the cells not done); else each cell
        alone."""
        if not self.args.joint:
            return todo
        out, groups = [], {}
        for j in todo:
            if "replicate" not in j.params:
                out.append(j)
                continue
            g = (j["model"], j["replicate"], j["index"])
            if g not in groups:
                groups[g] = Job(f"{j['model']}/joint-{j['replicate']}{j['index']}",
                                f"{j['model']} sets of {j['replicate']} {j['index']}, tasks fitted jointly",
                                {**j.params, "cells": []})
                out.append(groups[g])
            groups[g]["cells"].append((j.key, j["task"]))
        return out

    def done_keys(self) -> set[str]:
        return self.store().keys() | self.sets_store().keys()

    def config(self):
        from sitelens.lenses.selectors import FrontierConfig

        if not self.args.tiny:
            return FrontierConfig()
        from sitelens import FitConfig
        from sitelens.lenses.attribution import AttributionConfig

        att = AttributionConfig(n_prompts=4, n_shots=2, n_mean_prompts=4, n_boot=20, n_alpha_items=6)
        return FrontierConfig(fit=FitConfig(n_examples=16, n_valid=8), n_prompts=4, n_shots=2, n_valid=8,
                              attribution=att, test_limit=6)

    def run(self, job: Job) -> list[dict]:
        from sitelens.heads import head_label
        from sitelens.lenses.frontier import frontier, frontier_sets, joint_full_fits
        from sitelens.pipelines.executors import cached_model
        from sitelens.tasks import load_task

        model = cached_model(job["model"])
        task = load_task(job["task"])
        budgets = [int(k) for k in self.args.budgets.split(",")]
        budgets = [k for k in budgets if k <= model.cfg.n_layers * model.cfg.n_heads]
        if "replicate" in job.params:  # stability cells: the sets only, in their own table
            boot = job["index"] if job["replicate"] == "bootstrap" else None
            cfg, H = self.config(), model.cfg.n_heads
            if "cells" in job.params:  # --joint: the cells of one replicate, their fits made together
                keys, names = zip(*job["cells"])
                tasks = [load_task(n) for n in names]
                fits = joint_full_fits(model, tasks, cfg, job["seed"], bootstrap=boot)
            else:
                keys, tasks, fits = (job.key,), [task], [None]
            for key, t, fit in zip(keys, tasks, fits):  # each cell stored as it finishes
                sels = frontier_sets(model, t, budgets=budgets, seed=job["seed"], bootstrap=boot, config=cfg,
                                     fit=fit)
                self.sets_store().append(
                    {"key": key, "model": job["model"], "task": t.name, "replicate": job["replicate"],
                     "index": job["index"], "selector": s.selector, "k": k,
                     "heads": "" if h is None else ";".join(head_label(j, H) for j in h),
                     "forward_passes": s.forward_passes, "backward_passes": s.backward_passes,
                     "seconds": round(s.seconds, 2), "joint_tasks": s.meta.get("fit_joint_tasks", "")}
                    for s in sels for k, h in s.sets.items())
            return []
        res = frontier(model, task, budgets=budgets, seeds=[job["seed"]], config=self.config())
        res.to_dir(self.out / "frontier_study" / job["model"] / f"{job['task']}_seed{job['seed']}")
        return res.table.assign(key=job.key).to_dict("records")

    def report(self, df: pd.DataFrame) -> str:
        from sitelens.lenses.frontier import UNSTABLE_BELOW
        from sitelens.viz.export import FigureWriter

        st = stability_table(df, self.sets_store().read())
        ks = mark_unstable(k_star_table(df, summaries=cell_summaries(self.out, df)), st)
        wide = ks.pivot_table(index=["model", "task"], columns=["selector", "injection"],
                              values="k_star_marked", aggfunc="first").reset_index()
        wide.columns = [c if isinstance(c, str) else "/".join(x for x in c if x) for c in wide.columns]
        pairs = df[["model", "task"]].drop_duplicates()  # pivot's dropna=False adds every product
        stab = pairs.merge(st.pivot_table(index=["model", "task"], columns="selector", values="stability",
                                          dropna=False).reset_index().round(2), how="left")
        per_sel = (st.groupby(["model", "selector"])
                   .agg(stability=("stability", "mean"), stability_sd=("stability", "std"),
                        n_values=("stability", "count"), pairs_per_value=("n_pairs", "median"),
                        raw_jaccard=("raw_jaccard", "mean"), chance_jaccard=("chance_jaccard", "mean"),
                        seeds=("seeds", _span), bootstraps=("bootstraps", _span)).reset_index())
        reached = ks[ks.k_star.map(lambda v: isinstance(v, int))]
        per_sel = per_sel.merge(
            reached.groupby(["model", "selector"]).agg(
                k_star_reached=("k_star", "size"),
                unstable_at_k_star=("k_star_marked", lambda v: int(v.str.endswith("(unstable)").sum())))
            .reset_index(), on=["model", "selector"], how="left").fillna({"k_star_reached": 0,
                                                                        "unstable_at_k_star": 0})
        a1 = df[(df.injection == "alpha1") & (df.k == K_CMP)]
        cmp_rows = []
        for m, d in a1.groupby("model"):
            per_task = d.groupby(["task", "selector"]).first_token_acc.mean().unstack()
            full = df[df.model == m].groupby("task").full_site.mean()
            over = [_jaccard(x, y) for _, g in d.groupby(["task", "seed"])
                    for x, y in [((g[g.selector == "alpha"].heads.tolist() or [""])[0],
                                  (g[g.selector == "effect"].heads.tolist() or [""])[0])] if x and y]
            def mean(sel, per_task=per_task):
                return float(per_task[sel].mean()) if sel in per_task else float("nan")

            cmp_rows.append({"model": m, "tasks": len(per_task), "full_site": float(full.mean()),
                             "top10_alpha": mean("alpha"), "fv_top10_effect": mean("effect"),
                             "jaccard_alpha_effect": float(np.mean(over)) if over else np.nan})
        # The summaries unrounded, for the pages that quote them (docs/claims.toml); the tables round.
        atomic_write_csv(self.out / "frontier_study_stability.csv", per_sel)
        cmp = pd.DataFrame(cmp_rows)
        atomic_write_csv(self.out / "frontier_study_k10.csv", cmp)
        per_sel = per_sel.round(3)
        fig = self.figure(ks)
        w = FigureWriter()
        try:
            w.write(fig, ks, self.out / "frontier_study_kstar")
        finally:
            w.close()
        n = df.groupby(["model", "task"]).ngroups
        n_test = int((ks.chosen_on == "test").sum())
        paper = cited("paper_top10_alpha")
        return "\n".join([
            f"{n} (model, task) pair(s), {df.seed.nunique()} scored seed(s); every selector's sets chosen on "
            "train/valid, accuracy on test (first token; intervals and exact match: `frontier_study.csv`). "
            "k* = the smallest budget whose accuracy reaches 90% of full SITE's (`not reached` within the "
            "budgets), chosen on valid where a cell scored valid, with its percentile bootstrap interval "
            "over the valid items in brackets (one scored seed: the cell's `summary.json`); its test "
            "accuracy and Wilson interval are in `frontier_study_kstar.csv`. "
            f"`{NO_K_STAR}`: the cell's full SITE does not clearly beat zero-shot (the paired interval of "
            "full SITE − zero-shot over its test items reaches 0), so 90% of it says nothing about heads. "
            + (f"{n_test} of {len(ks)} (model, task, selector, injection) values here come from cells "
               "scored before the frontier measured valid, and for them k* is chosen on test (`chosen_on` "
               "in `frontier_study_kstar.csv`): the accuracy at such a k* is the best of a search over "
               "budgets on the same items, not an estimate on held-out ones." if n_test else
               f"Every one of the {len(ks)} (model, task, selector, injection) values is chosen on valid."),
            "",
            "## k* per selector (alpha1 = α = 1 on S_k; refit = α re-fitted on S_k)", "", md_table(wide),
            "", "## Stability of S_k (chance-adjusted Jaccard)", "",
            "Per (task, selector, budget), `sitelens.lenses.frontier.set_stability`: the chance-adjusted "
            "Jaccard (`sitelens.stats.adjusted_jaccard`, 0 = the overlap two random k-sets of the model's "
            "N = n_layers · n_heads heads share, 1 = the same set) over every pair of fit seeds (seed 0's "
            f"scored cell and the selection-only seeds in `{SETS}.csv`) and between seed 0's set and each "
            "bootstrap resample's (train/valid items drawn with replacement, fit seed 0). A k* above is "
            f"marked `(unstable)` where that mean at k* is below {UNSTABLE_BELOW} (the library's mark; "
            "alpha1 and refit share the sets); NaN: nothing compared.", "",
            "Per model and selector: `stability` is the mean over tasks and budgets of the per-(task, "
            "budget) means, `stability_sd` their standard deviation over those `n_values`, each a mean "
            "over `pairs_per_value` pairs (median); `raw_jaccard` and `chance_jaccard` are the raw "
            "overlap and what random sets would share, for reading the two apart; `seeds` and "
            "`bootstraps` are the fit seeds and resamples compared per task (a range where tasks "
            "differ: the study resumes task by task); `k_star_reached` and "
            "`unstable_at_k_star` count (task, injection) pairs:", "", md_table(per_sel), "",
            "Per task (mean over budgets):", "", md_table(stab), "",
            f"## Overlap between selectors at k = {K_CMP} (Jaccard of S_{K_CMP}, seed 0, mean over tasks)",
            "", *[x for m in dict.fromkeys(df.model)
                  for x in (f"{m}:", "", md_table(overlap_table(df, m)), "")],
            f"## At k = {K_CMP}: the paper's top-10 α heads and FV's top-10 causal heads (α = 1, mean "
            "over tasks)",
            "", md_table(cmp.round(3)) if cmp_rows else f"(no k = {K_CMP} in the budgets)", "",
            "`top10_alpha`: first-token accuracy with α = 1 on the 10 heads of largest α (λ = 0), stage 2 "
            "fitted with the default batched schedule on these models and tasks. The paper's figure for its "
            f"top-10 α heads is cited, not measured here: {paper.describe('.1%')}; "
            "`benchmarks/cited.csv`. Its models, tasks and fitting schedule differ from ours.", "",
            "Figure: `frontier_study_kstar.html` (k* per selector and task).", ""])

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
        fig.update_layout(title="k*: the fewest heads reaching 90% of full SITE "
                                "(α = 1; blank: not reached, or no k*)")
        return fig


if __name__ == "__main__":
    raise SystemExit(main(FrontierStudy()))
