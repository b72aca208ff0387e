"""SITE vs zero-shot vs 10-shot ICL on the FV benchmark tasks, with timings and peak memory.

    python benchmarks/site_fv.py --models smollm2-135m-instruct --limit 50 --no-reference
    python benchmarks/site_fv.py --models gemma-3-270m --abstractive --limit 50 --no-reference
    python benchmarks/site_fv.py --report
"""

from __future__ import annotations

import json

import pandas as pd

from sitelens import FitConfig, fit_site, load_task, summarize
from sitelens.eval.evaluate import evaluate
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
                "first-token accuracy in %; test split capped at 50 items; settings: docs/benchmarks.md.",
                ""]
        for path in sorted(self.out.glob("site_fv_*.csv")):
            body += model_section(pd.read_csv(path))
        return write_report(self.out / "site_fv.md", "SITE on the FV benchmark tasks",
                            "python benchmarks/site_fv.py --report", "\n".join(body))


def model_section(df: pd.DataFrame) -> list[str]:
    means = df.groupby("method")[["exact_match", "first_token_acc", "seconds_per_item"]].mean()
    means = means.loc[[m for m in MAIN if m in means.index]]
    table = pd.DataFrame({"mean EM": means.exact_match.map(pct), "mean FT": means.first_token_acc.map(pct),
                          "mean s/item": means.seconds_per_item.map("{:.3f}".format)})
    lines = [f"## {df.model.iloc[0]} ({df.task.nunique()} tasks)", "", md_table(table.reset_index()), ""]
    if {"site", "icl"} <= set(means.index):
        gap = 100 * (means.loc["site", "exact_match"] - means.loc["icl", "exact_match"])
        lines.append(f"- SITE − 10-shot ICL, mean exact match: {gap:+.1f} points.")
    site = df[df.method == "site"]
    spi = {m: df[df.method == m].set_index("task").seconds_per_item for m in MAIN}
    lines += [
        f"- stage 1 + stage 2 per task: median {(site.stage1_seconds + site.stage2_seconds).median():.1f} s "
        f"(stage 1 median {site.stage1_seconds.median():.1f} s, stage 2 median "
        f"{site.stage2_seconds.median():.1f} s); peak RSS of a fit: median "
        f"{site.fit_peak_rss_mb.median():.0f} MB, max {site.fit_peak_rss_mb.max():.0f} MB.",
        f"- SITE s/item ÷ zero-shot s/item: median {(spi['site'] / spi['zero-shot']).median():.2f}; "
        f"ICL s/item ÷ SITE s/item: median {(spi['icl'] / spi['site']).median():.2f}."]
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
