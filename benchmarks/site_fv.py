"""SITE vs zero-shot vs 10-shot ICL on the FV benchmark tasks, with timings and peak memory.

    python benchmarks/site_fv.py --models smollm2-135m-instruct --limit 50 --no-reference
    python benchmarks/site_fv.py --models gemma-3-270m --abstractive --limit 50 --no-reference
    python benchmarks/site_fv.py --report
"""

from __future__ import annotations

import json

import pandas as pd
from lib.paired import paired_rows

from sitelens import FitConfig, fit_site, load_task, summarize
from sitelens.eval.evaluation import evaluate
from sitelens.io import atomic_write_csv
from sitelens.pipelines.bench import FV_EXTRACTIVE
from sitelens.pipelines.executors import cached_model
from sitelens.pipelines.experiment import Experiment, Job, PeakRSS, main, md_table, pct, write_report

# Tasks where the reference schedule (400 steps of batch 1) is also run.
REFERENCE_SAMPLE = ["antonym", "country-capital", "english-french", "present-past", "singular-plural",
                    "capitalize_first_letter", "choose_first_of_3", "person-occupation"]
FIELDS = ["model", "task", "method", "first_token_acc", "exact_match", "n", "seconds_per_item",
          "stage1_seconds", "stage2_seconds", "fit_peak_rss_mb", "best_step"]
MAIN = ("zero-shot", "icl", "site")
COMMAND = "python benchmarks/site_fv.py --models MODEL --limit 50 --no-reference --threads 1 [--abstractive]"


class SiteFV(Experiment):
    name, columns, key, per_model = "site_fv", FIELDS, None, True
    models, limit, threads = ("smollm2-135m-instruct",), 50, 2

    def add_arguments(self, p) -> None:
        p.add_argument("--abstractive", action="store_true", help="the 29 abstractive tasks only")
        p.add_argument("--no-reference", dest="reference", action="store_false", help="no site-ref rows")
        p.add_argument("--n-ctx", type=int, default=4096)

    def done_keys(self) -> set[str]:
        df = self.read()
        have = {(t, m) for t, m in zip(df.task, df.method)}
        return {f"{t}/site-ref" for t, m in have if m == "site-ref"} | {
            f"{t}/main" for t in df.task if all((t, m) in have for m in MAIN)}

    def cells(self, args):
        """The reference sample first, then short-prompt tasks before long ones (ag_news,
        commonsense_qa, squad_val), so an interrupted run has covered the most tasks."""
        fv = args.data_root / "fv"
        names = sorted(p.name for p in fv.iterdir() if (p / "train.json").exists())
        names = [n for n in names if not (args.abstractive and n in FV_EXTRACTIVE)
                 and (not args.tasks or n in args.tasks)]

        def prompt_chars(n: str) -> float:
            items = json.loads((fv / n / "valid.json").read_text())
            return sum(len(str(x["input"])) + len(str(x["output"])) for x in items) / max(1, len(items))

        rest = sorted((n for n in names if n not in REFERENCE_SAMPLE), key=prompt_chars)
        for name in [n for n in REFERENCE_SAMPLE if n in names] + rest:
            yield Job(f"{name}/main", name, {"task": name, "part": "main"})
            if name in REFERENCE_SAMPLE and args.reference:
                yield Job(f"{name}/site-ref", f"{name} site-ref", {"task": name, "part": "site-ref"})

    def run(self, job: Job) -> list[dict]:
        args, name = self.args, job["task"]
        model = cached_model(args.models[0], n_ctx=args.n_ctx)
        task = load_task(args.data_root / "fv" / name, dedupe=True)
        ref = job["part"] == "site-ref"
        config = FitConfig(seed=0, batch_size=1, n_examples=400, eval_every=50) if ref else FitConfig(seed=0)
        with PeakRSS() as mem:
            adapter = fit_site(model, task, config=config)
        fit_info = {"stage1_seconds": round(adapter.meta["stage1_seconds"], 2),
                    "stage2_seconds": round(adapter.meta["stage2_seconds"], 2),
                    "fit_peak_rss_mb": round(mem.peak / 2**20), "best_step": adapter.meta["best_step"]}
        df = evaluate(model, task, adapter=adapter, limit=args.limit, seed=0,
                      **({"methods": ["site"]} if ref else {}))
        rows = [{"model": args.models[0], "task": name, "method": "site-ref" if ref else r.method,
                 "first_token_acc": round(r.first_token_acc, 4), "exact_match": round(r.exact_match, 4),
                 "n": r.n, "seconds_per_item": round(r.seconds_per_item, 4),
                 **(fit_info if r.method == "site" else {})} for r in summarize(df).itertuples()]
        return rows

    def write_report(self) -> str:
        body = [f"Cells: `{COMMAND}` per model; the `site-ref` rows (400 steps of batch 1) by the same "
                "command without `--no-reference`, `--tasks` the 8-task sample. EM, FT: exact match and "
                "first-token accuracy in %; test split capped at 50 items; settings: docs/benchmarks.md. "
                "Paired differences (`site_fv_paired.csv`): per task, method A − method B on the same "
                "items, then the mean over tasks with its 95% percentile bootstrap interval over tasks "
                "(sitelens.stats.paired_difference, 10,000 resamples). Costs (`site_fv_cost.csv`): "
                "per task, SITE's fit (stage 1 + stage 2) plus its evaluation against ICL's evaluation "
                "on the same items, and the items at which SITE starts to pay.",
                ""]
        paired, cost = [], []
        for path in sorted(p for p in self.out.glob("site_fv_*.csv") if is_model_table(p)):
            df = pd.read_csv(path)
            paired.append(paired_table(df))
            cost.append(cost_table(df))
            body += model_section(df, paired[-1], cost[-1])
        atomic_write_csv(self.out / "site_fv_paired.csv", pd.concat(paired, ignore_index=True))
        atomic_write_csv(self.out / "site_fv_cost.csv", pd.concat(cost, ignore_index=True))
        return write_report(self.out / "site_fv.md", "SITE on the FV benchmark tasks",
                            "python benchmarks/site_fv.py --report", "\n".join(body))


def is_model_table(path) -> bool:
    """``site_fv_{model}.csv``, not a derived table (paired, cost) or a saved copy."""
    return not any(path.stem.endswith(x) for x in ("_paired", "_cost", ".before"))


PAIRS = (("site", "icl"), ("site", "zero-shot"), ("icl", "zero-shot"))


def paired_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per pair of :data:`PAIRS` and metric: A − B over the tasks both ran (the same items)."""
    return pd.concat([paired_rows(df, PAIRS, m) for m in ("exact_match", "first_token_acc")],
                     ignore_index=True)


def cost_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per task: SITE's fit + evaluation seconds against ICL's (and zero-shot's) evaluation on the
    same ``n`` items, and ``break_even_items`` = fit ÷ (ICL s/item − SITE s/item), the item count
    from which SITE's whole cost is below ICL's (inf when SITE is not cheaper per item)."""
    w = df.pivot_table(index="task", columns="method", values=["seconds_per_item", "n"])
    site = df[df.method == "site"].set_index("task")
    fit = site.stage1_seconds + site.stage2_seconds
    n = w["n"]["site"]
    out = pd.DataFrame({
        "model": df.model.iloc[0], "n": n, "fit_seconds": fit,
        "site_total_seconds": fit + n * w["seconds_per_item"]["site"],
        "icl_eval_seconds": n * w["seconds_per_item"]["icl"],
        "zero_shot_eval_seconds": n * w["seconds_per_item"]["zero-shot"],
    })
    spi = w["seconds_per_item"]
    saving = spi["icl"] - spi["site"]
    out["break_even_items"] = (fit / saving).where(saving > 0, float("inf"))
    out["site_slower_than_icl"] = out.site_total_seconds > out.icl_eval_seconds
    out["site_over_zero_shot_per_item"] = spi["site"] / spi["zero-shot"]  # inference only
    out["icl_over_site_per_item"] = spi["icl"] / spi["site"]
    return out.reset_index()


def model_section(df: pd.DataFrame, paired: pd.DataFrame, cost: pd.DataFrame) -> list[str]:
    means = df.groupby("method")[["exact_match", "first_token_acc", "seconds_per_item"]].mean()
    means = means.loc[[m for m in MAIN if m in means.index]]
    table = pd.DataFrame({"mean EM": means.exact_match.map(pct), "mean FT": means.first_token_acc.map(pct),
                          "mean s/item": means.seconds_per_item.map("{:.3f}".format)})
    lines = [f"## {df.model.iloc[0]} ({df.task.nunique()} tasks)", "", md_table(table.reset_index()), ""]
    em = paired[paired.metric == "exact_match"].set_index(["a", "b"])
    for (a, b), r in em.iterrows():
        lines.append(f"- {a} − {b}, exact match, paired over tasks: {100 * r['diff']:+.1f} "
                     f"[{100 * r.ci_low:.1f}, {100 * r.ci_high:.1f}] points over {r.n} tasks "
                     f"({a} ahead on {r.a_ahead}, behind on {r.b_ahead}).")
    slower = int(cost.site_slower_than_icl.sum())
    lines.append(
        f"- Cost with the fit, {int(cost.n.median())} items per task (median): SITE fit + evaluation "
        f"took longer than ICL's whole evaluation on {slower} of {len(cost)} tasks (median "
        f"{cost.site_total_seconds.median():.1f} s vs {cost.icl_eval_seconds.median():.1f} s); SITE "
        f"starts to pay after a median {cost.break_even_items.median():.0f} items per task "
        f"(fit ÷ ICL's extra seconds per item).")
    site = df[df.method == "site"]
    lines += [
        f"- stage 1 + stage 2 per task: median {(site.stage1_seconds + site.stage2_seconds).median():.1f} s "
        f"(stage 1 median {site.stage1_seconds.median():.1f} s, stage 2 median "
        f"{site.stage2_seconds.median():.1f} s); peak RSS of a fit: median "
        f"{site.fit_peak_rss_mb.median():.0f} MB, max {site.fit_peak_rss_mb.max():.0f} MB.",
        f"- Inference only (the fit not counted): SITE s/item ÷ zero-shot s/item: median "
        f"{cost.site_over_zero_shot_per_item.median():.2f}; ICL s/item ÷ SITE s/item: median "
        f"{cost.icl_over_site_per_item.median():.2f}."]
    ref = df[df.method == "site-ref"]
    if len(ref):
        sub = df[df.task.isin(ref.task)]
        m, s = sub.groupby("method").exact_match.mean(), sub[sub.method == "site"]
        lines.append(f"- reference schedule (400 × batch 1) on {len(ref)} tasks: "
                     f"EM {100 * m['site-ref']:.1f} vs batched default {100 * m['site']:.1f}; fit median "
                     f"{(ref.stage1_seconds + ref.stage2_seconds).median():.1f} s vs "
                     f"{(s.stage1_seconds + s.stage2_seconds).median():.1f} s.")
    piv = df.pivot_table(index="task", columns="method", values=["exact_match", "first_token_acc"])
    cols = {f"{m} EM": ("exact_match", m) for m in (*MAIN, "site-ref")} | {
        f"{m} FT": ("first_token_acc", m) for m in MAIN}
    table = pd.DataFrame({name: piv[c].map(lambda v: "" if pd.isna(v) else f"{100 * v:.0f}") if c in piv
                          else "" for name, c in cols.items()}, index=piv.index)
    return lines + ["", md_table(table.reset_index()), ""]


if __name__ == "__main__":
    raise SystemExit(main(SiteFV()))
