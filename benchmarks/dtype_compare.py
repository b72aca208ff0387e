"""SITE with bfloat16 weights against float32 on the FV tasks: per task the whole fit (stage 1 and
stage 2, `FitConfig(seed=0)`) and SITE's evaluation on the first 50 test items, once with each
dtype; then the paired difference bfloat16 − float32 in exact match over tasks, per model, against
issue 44's rule for a new default (within ±1 point, the interval including 0), and each stage's
CPU seconds.

    python benchmarks/dtype_compare.py --models smollm2-135m-instruct --threads 1
    python benchmarks/dtype_compare.py --models gemma-3-270m --abstractive --threads 1
    python benchmarks/dtype_compare.py --report

Why: on a CPU with AVX-512 BF16 (or AMX) a bfloat16 matmul runs several times the float32 rate,
and stage 1, the evaluation and most of stage 2 are matmuls; on one without, PyTorch converts on
the fly and bfloat16 runs slower than float32, so each row records which kind of CPU it ran on
(``cpu_bf16``) and the CPU seconds are summed per kind; `--dtype bfloat16` casts the weights
(so the forward passes, KV caches and activations), while the embedding, α and Adam's state stay
float32 ([Scaling up](../docs/scaling.md)). The tasks run in a seeded order, both dtypes of a task
one after the other, so a run stopped early has compared a random subset of tasks in pairs.
"""

from __future__ import annotations

import random
import time

import pandas as pd
from lib.cpu import cpu_bf16

from sitelens import FitConfig, fit_site, load_task, summarize
from sitelens.eval.evaluation import evaluate
from sitelens.io import atomic_write_csv
from sitelens.models import LoadSpec, load_model
from sitelens.pipelines.bench import FV_EXTRACTIVE
from sitelens.pipelines.experiment import Experiment, Job, load_avg, main, md_table, pct
from sitelens.stats import paired_difference

DTYPES = ("float32", "bfloat16")
FIELDS = ["model", "task", "dtype", "exact_match", "first_token_acc", "n", "stage1_seconds",
          "stage2_seconds", "eval_seconds", "stage1_cpu_seconds", "stage2_cpu_seconds",
          "eval_cpu_seconds", "best_step", "load_avg", "cpu_bf16"]
# rows written before cpu_bf16 existed (the 2026-12-06 runs) read it blank: "not recorded"
OLDER = [FIELDS[:-1]]
# cpu_bf16 (lib.cpu.cpu_bf16): without bfloat16 matrix instructions bfloat16 runs slower than
# float32, so the CPU seconds of the two kinds are never summed together
COMMANDS = ("python benchmarks/dtype_compare.py --models smollm2-135m-instruct --threads 1",
            "python benchmarks/dtype_compare.py --models gemma-3-270m --abstractive --threads 1")
_MODELS: dict = {}


def model_in(name: str, dtype: str, n_ctx: int):
    """Both dtypes of one model stay loaded (the cells alternate between them)."""
    key = (name, dtype, n_ctx)
    if key not in _MODELS:
        _MODELS[key] = load_model(name, n_ctx=n_ctx, spec=LoadSpec(dtype=None if dtype == "float32"
                                                                    else dtype))
    return _MODELS[key]


def fv_tasks(data_root, model: str) -> list[str]:
    """The FV tasks of ``model``'s comparison: all of them, or the abstractive ones where
    :data:`sitelens.models.ATLAS_MODELS` says so (Gemma-3-270M)."""
    from sitelens.models import ATLAS_MODELS

    abstractive = ATLAS_MODELS.get(model, "all") == "abstractive"
    return sorted(p.name for p in (data_root / "fv").iterdir() if (p / "train.json").exists()
                  and not (abstractive and p.name in FV_EXTRACTIVE))


class _Timed:
    """Wall and process CPU seconds of a block (one torch thread: CPU seconds are what other jobs
    on the shared cores inflate least)."""

    def __enter__(self):
        self.w0, self.c0 = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        self.wall, self.cpu = time.perf_counter() - self.w0, time.process_time() - self.c0


class DtypeCompare(Experiment):
    name, title = "dtype_compare", "SITE in bfloat16 against float32 on the FV tasks"
    columns, older, key, per_model, limit = FIELDS, OLDER, None, True, 50

    def add_arguments(self, p) -> None:
        p.add_argument("--abstractive", action="store_true", help="the 29 abstractive tasks only")
        # as benchmarks/site_fv.py: squad_val's 10-shot prompts run past 2,048 tokens on SmolLM2
        p.add_argument("--n-ctx", type=int, default=4096, help="the model's context length")

    def done_keys(self) -> set[str]:
        df = self.read()
        return {f"{t}/{d}" for t, d in zip(df.task, df.dtype)}

    def cells(self, args):
        names = [n for n in fv_tasks(args.data_root, "gemma-3-270m" if args.abstractive else "all")
                 if not args.tasks or n in args.tasks]
        random.Random(0).shuffle(names)
        return [Job(f"{t}/{d}", f"{t} [{d}]", {"task": t, "dtype": d}) for t in names for d in DTYPES]

    def run(self, job: Job) -> list[dict]:
        args, name, dtype = self.args, job["task"], job["dtype"]
        model_name = args.models[0]
        model = model_in(model_name, dtype, args.n_ctx)
        task = load_task(args.data_root / "fv" / name, dedupe=True)
        la = load_avg()
        from sitelens.site.embedding import task_embedding

        with _Timed() as s1:
            emb = task_embedding(model, task, seed=0)
        with _Timed() as s2:
            adapter = fit_site(model, task, config=FitConfig(seed=0), embedding=emb,
                               stage1_seconds=s1.wall)
        with _Timed() as ev:
            (r,) = summarize(evaluate(model, task, methods=["site"], adapter=adapter,
                                      limit=args.limit, seed=0)).itertuples()
        return [{"model": model_name, "task": name, "dtype": dtype,
                 "exact_match": round(r.exact_match, 4), "first_token_acc": round(r.first_token_acc, 4),
                 "n": r.n, "stage1_seconds": round(s1.wall, 2), "stage2_seconds": round(s2.wall, 2),
                 "eval_seconds": round(ev.wall, 2), "stage1_cpu_seconds": round(s1.cpu, 2),
                 "stage2_cpu_seconds": round(s2.cpu, 2), "eval_cpu_seconds": round(ev.cpu, 2),
                 "best_step": adapter.meta["best_step"], "load_avg": la,
                 "cpu_bf16": cpu_bf16()}]

    def write_report(self) -> str:
        tables = sorted(p for p in self.out.glob("dtype_compare_*.csv")
                        if not p.stem.endswith(("_paired", "_summary")))
        body = ["Per task: SITE fitted whole (stage 1: 50 ten-shot prompts; stage 2: `FitConfig(seed=0)`) "
                "and scored on the first 50 test items, once with float32 weights and once with "
                "bfloat16 (`--dtype bfloat16`: the forward passes, KV caches and activations; the "
                "embedding, α and Adam's state stay float32); one torch thread; EM, FT: exact match and "
                "first-token accuracy in %. Paired differences: bfloat16 − float32 over tasks, "
                "`sitelens.stats.paired_difference` (95% percentile bootstrap over tasks). The rule for "
                "a new default (issue 44): within ±1 point with an interval that includes 0, on all "
                "the tasks of both models. Commands:", "", *[f"    {c}" for c in COMMANDS], ""]
        paired, summary = [], []
        for path in tables:
            df = pd.read_csv(path).reindex(columns=FIELDS)  # an older header: cpu_bf16 blank
            df["cpu_bf16"] = df.cpu_bf16.astype(object).fillna("not recorded")  # all-blank reads as float
            both = df.groupby("task").dtype.nunique()
            d = df[df.task.isin(both[both == len(DTYPES)].index)]
            if d.empty:
                continue
            model, n = d.model.iloc[0], d.task.nunique()
            lines = [f"## {model}: {n} task(s) with both dtypes", "",
                     "CPU seconds by the CPU the tasks ran on (`cpu_bf16`: native = AVX-512 BF16 or AMX, "
                     "emulated = neither; not recorded = the rows of 2026-12-06, before the column):", ""]
            cols = ["exact_match", "first_token_acc", "stage1_cpu_seconds", "stage2_cpu_seconds",
                    "eval_cpu_seconds"]
            for kind, g in d.groupby("cpu_bf16", sort=False):
                # a task whose two dtypes ran on different kinds of CPU (a run resumed on another
                # machine between them) counts for accuracy only
                pair = g.groupby("task").dtype.nunique()
                g = g[g.task.isin(pair[pair == len(DTYPES)].index)]
                if g.empty:
                    continue
                sums = g.groupby("dtype")[cols].agg({**{c: "mean" for c in cols[:2]},
                                                      **{c: "sum" for c in cols[2:]}}).loc[list(DTYPES)]
                total = sums[cols[2:]].sum(axis=1)
                table = pd.DataFrame({
                    "mean EM": sums.exact_match.map(pct), "mean FT": sums.first_token_acc.map(pct),
                    **{f"{c.split('_')[0].replace('stage', 'stage ')} CPU s": sums[c].map("{:.0f}".format)
                       for c in cols[2:]},
                    "all CPU s": total.map("{:.0f}".format),
                    "float32 / this": (total["float32"] / total).map("{:.2f}×".format)})
                k = g.task.nunique()
                lines += [f"### cpu_bf16 {kind}: {k} task(s)", "", md_table(table.reset_index()), ""]
                for stage in cols[2:]:
                    summary.append({"model": model, "cpu_bf16": kind, "n_tasks": k, "stage": stage,
                                    "ratio": sums.loc["float32", stage] / sums.loc["bfloat16", stage],
                                    "float32": sums.loc["float32", stage],
                                    "bfloat16": sums.loc["bfloat16", stage]})
                summary.append({"model": model, "cpu_bf16": kind, "n_tasks": k, "stage": "all_cpu_seconds",
                                "ratio": total["float32"] / total["bfloat16"], "float32": total["float32"],
                                "bfloat16": total["bfloat16"]})
            # accuracy over every task with both dtypes (both run one after the other in one
            # process, unless a run was resumed on another machine in between)
            lines.append("Accuracy over all the tasks with both dtypes:")
            lines.append("")
            for metric in ("exact_match", "first_token_acc"):
                w = d.pivot_table(index="task", columns="dtype", values=metric)
                r = paired_difference(w["bfloat16"].to_numpy(), w["float32"].to_numpy(), over="tasks")
                paired.append({"model": model, "metric": metric, "a": "bfloat16", "b": "float32",
                               "diff": r.diff, "ci_low": r.ci_low, "ci_high": r.ci_high, "n": r.n,
                               "a_ahead": r.a_ahead, "b_ahead": r.b_ahead})
                lines.append(f"- bfloat16 − float32, {metric.replace('_', ' ')}: {100 * r.diff:+.1f} "
                             f"points [{100 * r.ci_low:+.1f}, {100 * r.ci_high:+.1f}], n = {r.n} tasks "
                             f"(bfloat16 ahead on {r.a_ahead}, float32 on {r.b_ahead})")
            lines.append(f"- load average at the cells {d.load_avg.min():.2f}–{d.load_avg.max():.2f}")
            body += lines + [""]
        if paired:
            atomic_write_csv(self.out / "dtype_compare_paired.csv", pd.DataFrame(paired))
            atomic_write_csv(self.out / "dtype_compare_summary.csv", pd.DataFrame(summary))
            p = pd.DataFrame(paired)
            em = p[p.metric == "exact_match"]
            ok = all(abs(x) <= 0.01 and lo <= 0 <= hi for x, lo, hi in zip(em["diff"], em.ci_low, em.ci_high))
            want = {m: len(fv_tasks(self.args.data_root, m)) for m in em.model}
            short = [f"{m}: {n} of {want[m]}" for m, n in zip(em.model, em.n) if n < want[m]]
            body += ["## The rule", "",
                     f"- bfloat16 − float32 EM within ±1 point with an interval that includes 0, on the "
                     f"tasks measured: {'yes' if ok else 'no'}; every FV task of both bundled models "
                     f"measured: {'no (' + '; '.join(short) + ' tasks)' if short else 'yes'}", ""]
        from sitelens.pipelines.experiment import write_report

        return write_report(self.out / "dtype_compare.md", self.title,
                            "python benchmarks/dtype_compare.py --report", "\n".join(body))


if __name__ == "__main__":
    raise SystemExit(main(DtypeCompare()))
