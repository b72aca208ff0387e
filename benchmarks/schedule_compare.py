"""Stage-2 schedules against today's default on the FV tasks: per task stage 1 once (the embedding
is shared and cached), stage 2 under each schedule, SITE scored on the first 50 test items; then
the paired difference schedule − default in exact match over tasks, per model (issue 44, item 3).

    python benchmarks/schedule_compare.py --models MODEL --phase dev --threads 1
    python benchmarks/schedule_compare.py --models MODEL --phase test --candidate NAME --threads 1
    python benchmarks/schedule_compare.py --report

The development tasks (``--phase dev``, every schedule of :data:`SCHEDULES`) are the 8-task sample
of benchmarks/site_fv.py and fit_time.py; the candidate is chosen on them and compared with the
default on the other FV tasks (``--phase test``), in a fixed seeded order (a run stopped early has
covered a random subset, not the short or the long tasks).
"""

from __future__ import annotations

import json
import random
import time

import pandas as pd

import sitelens.site.adapter as site_adapter
from sitelens import FitConfig, fit_site, load_task, summarize
from sitelens.eval.evaluation import evaluate
from sitelens.io import atomic_write_csv
from sitelens.pipelines.executors import cached_model
from sitelens.pipelines.experiment import Experiment, Job, load_avg, main, md_table, pct, write_report
from sitelens.site.embedding import task_embedding
from sitelens.stats import paired_difference

DEV_TASKS = ("antonym", "country-capital", "english-french", "present-past", "singular-plural",
             "capitalize_first_letter", "choose_first_of_3", "person-occupation")
# name -> FitConfig fields beyond seed 0 ("default": today's schedule: 50 steps of 8, validation
# of 64 items at step 0, every 10 steps and at the end, the best α kept)
SCHEDULES = {
    "default": {},
    # validation only before training and at the end (the best α is the last one on most tasks),
    # on 32 validation items (half the validation prefixes and rows; with two checks they only
    # decide between the start and the end)
    "end-v32": {"eval_every": 50, "n_valid": 32},
    # the same 400 examples in 25 steps of 16, lr scaled by √2, validation at 0 and at the end
    "wide16": {"batch_size": 16, "lr_rule": "sqrt", "eval_every": 25},
}
PATIENCES = (1, 2)  # simulated on the default's validation history (the same run, stopped early)
FIELDS = ["model", "task", "schedule", "phase", "exact_match", "first_token_acc", "n", "stage1_seconds",
          "stage2_seconds", "stage2_cpu_seconds", "best_step", "steps_run", "final_valid_loss",
          "valid_history", "load_avg"]
OLDER = [[f for f in FIELDS if f != "stage2_cpu_seconds"]]
COMMANDS = ("python benchmarks/schedule_compare.py --models MODEL --phase dev --threads 1",
            "python benchmarks/schedule_compare.py --models MODEL --phase test --candidate CANDIDATE "
            "--threads 1")


def fv_tasks(fv) -> list[str]:
    return sorted(p.name for p in fv.iterdir() if (p / "train.json").exists())


def test_order(names) -> list[str]:
    """The non-development tasks in a seeded random order (seed 0)."""
    rest = sorted(n for n in names if n not in DEV_TASKS)
    random.Random(0).shuffle(rest)
    return rest


def stopped_at(history: list[dict], patience: int) -> tuple[int, int]:
    """(the step at which a run with ``patience`` stops, the step of the α it keeps) from a full
    run's validation ``history`` (``[{"step", "valid_loss"}]`` of its checks): the same batches and
    seed, so the early-stopped run is this run cut at that check."""
    best, best_step, stale = float("inf"), 0, 0
    for h in history:
        if h["valid_loss"] < best:
            best, best_step, stale = h["valid_loss"], h["step"], 0
        else:
            stale += 1
            if stale >= patience:
                return h["step"], best_step
    return history[-1]["step"], best_step


class ScheduleCompare(Experiment):
    name, title = "schedule_compare", "Stage-2 schedules against today's default"
    columns, older, key, per_model, limit = FIELDS, OLDER, None, True, 50

    def add_arguments(self, p) -> None:
        p.add_argument("--phase", choices=("dev", "test"), default="dev")
        p.add_argument("--candidate", choices=sorted(set(SCHEDULES) - {"default"}), default=None,
                       help="--phase test: the schedule chosen on the development tasks")
        p.add_argument("--cache", default="/tmp/sitelens_schedule_cache", help="stage-1 embeddings")
        # as benchmarks/site_fv.py: squad_val's 10-shot prompts run past 2,048 tokens on SmolLM2;
        # the context length only bounds the prompts, it changes no number of a shorter one
        p.add_argument("--n-ctx", type=int, default=4096, help="the model's context length")

    def done_keys(self) -> set[str]:
        df = self.read()
        return {f"{t}/{s}" for t, s in zip(df.task, df.schedule)}

    def cells(self, args):
        names = [n for n in fv_tasks(args.data_root / "fv") if not args.tasks or n in args.tasks]
        if args.phase == "dev":
            return [Job(f"{t}/{s}", f"{t} [{s}]", {"task": t, "schedule": s, "phase": "dev"})
                    for t in DEV_TASKS if t in names for s in SCHEDULES]
        if args.candidate is None:
            raise SystemExit("--phase test needs --candidate")
        return [Job(f"{t}/{s}", f"{t} [{s}]", {"task": t, "schedule": s, "phase": "test"})
                for t in test_order(names) for s in ("default", args.candidate)]

    def run(self, job: Job) -> list[dict]:
        args, name, sched = self.args, job["task"], job["schedule"]
        model_name = args.models[0]
        model = cached_model(model_name, n_ctx=args.n_ctx)
        task = load_task(args.data_root / "fv" / name, dedupe=True)
        stage1 = self.cache(args.cache).get(
            "embedding", {"model": model_name, "task": name, "seed": 0},
            lambda: _timed(lambda: task_embedding(model, task, seed=0)))
        emb, s1 = stage1
        config = FitConfig(seed=0, **SCHEDULES[sched])
        la = load_avg()
        with _recorded() as rec:
            adapter = fit_site(model, task, config=config, embedding=emb, stage1_seconds=s1)
        hist = [{"step": h["step"], "valid_loss": round(h["valid_loss"], 6)} for h in rec.res.history
                if h["valid_loss"] == h["valid_loss"]]
        (r,) = summarize(evaluate(model, task, methods=["site"], adapter=adapter, limit=args.limit,
                                  seed=0)).itertuples()
        m = adapter.meta
        return [{"model": model_name, "task": name, "schedule": sched, "phase": job["phase"],
                 "exact_match": round(r.exact_match, 4), "first_token_acc": round(r.first_token_acc, 4),
                 "n": r.n, "stage1_seconds": round(s1, 2), "stage2_seconds": round(m["stage2_seconds"], 2),
                 "stage2_cpu_seconds": round(rec.cpu, 2),
                 "best_step": m["best_step"], "steps_run": max(h["step"] for h in rec.res.history),
                 "final_valid_loss": round(m["final_valid_loss"], 6), "valid_history": json.dumps(hist),
                 "load_avg": la}]

    def write_report(self) -> str:
        tables = sorted(p for p in self.out.glob("schedule_compare_*.csv")
                        if not p.stem.endswith(("_paired", "_summary")))
        body = ["Per task: stage 1 once (seed 0), stage 2 under each schedule (`FitConfig(seed=0, ...)`), "
                "SITE scored on the first 50 test items (EM, FT: exact match and first-token accuracy "
                "in %); one torch thread on the shared 2-core machine (the load average at each fit "
                "is in the CSV). Paired differences: schedule − default over tasks, "
                "`sitelens.stats.paired_difference` (95% percentile bootstrap over tasks). "
                "Commands, per model:", "", *[f"    {c}" for c in COMMANDS], "",
                "Schedules: " + "; ".join(f"`{k}` = {v or 'today'}" for k, v in SCHEDULES.items())
                + ". Patience P (early stopping after P checks without improvement) is read off the "
                "default's own validation history: the same batches and seed, so the stopped run is the "
                "default cut at that check.", ""]
        paired, summary = [], []
        for path in tables:
            df = pd.read_csv(path).reindex(columns=FIELDS)  # a table with an older header: blanks
            sec, rows = model_section(df, summary)
            body += sec
            paired += rows
        if summary:
            atomic_write_csv(self.out / "schedule_compare_summary.csv", pd.DataFrame(summary))
        if paired:
            atomic_write_csv(self.out / "schedule_compare_paired.csv", pd.DataFrame(paired))
            body += choice(pd.DataFrame(paired))
        return write_report(self.out / "schedule_compare.md", self.title,
                            "python benchmarks/schedule_compare.py --report", "\n".join(body))


def num1(x: float) -> str:
    return "–" if x != x else f"{x:.1f}"


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


class _recorded:
    """Within the block, :func:`fit_site`'s stage-2 :class:`FitResult` is kept as ``.res`` (its
    validation history, which the adapter does not record for the default protocol) and the
    process CPU seconds of stage 2 as ``.cpu`` (with one torch thread, what other jobs on the
    shared cores inflate least)."""

    def __enter__(self):
        self._orig = site_adapter.fit_alpha

        def fit_alpha(*a, **kw):
            c0 = time.process_time()
            self.res = self._orig(*a, **kw)
            self.cpu = time.process_time() - c0
            return self.res

        site_adapter.fit_alpha = fit_alpha
        return self

    def __exit__(self, *exc):
        site_adapter.fit_alpha = self._orig


def choice(paired: pd.DataFrame) -> list[str]:
    """Each schedule against the rules: on the development tasks, a candidate is within ±1 point
    of the default's exact match on every model (the test command names the one compared); on
    the held-out tasks, the issue's adoption rule."""
    lines = ["## The rules", ""]
    em = paired[paired.metric == "exact_match"]
    for phase, rule in (("dev", "candidate if within ±1 point on every model"),
                        ("test", "adopted only if within ±1 point with an interval that includes 0 "
                                 "on both models, over all held-out tasks")):
        for a, g in em[em.phase == phase].groupby("a", sort=False):
            within = all(abs(d) <= 0.01 for d in g["diff"])
            has0 = all(lo <= 0 <= hi for lo, hi in zip(g.ci_low, g.ci_high))
            diffs = ", ".join(f"{m}: {100 * d:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}], n = {n}"
                              for m, d, lo, hi, n in zip(g.model, g["diff"], g.ci_low, g.ci_high, g.n))
            lines.append(f"- {phase}, {a} − default EM ({diffs}): within ±1 point on every model: "
                         f"{'yes' if within else 'no'}; intervals include 0: {'yes' if has0 else 'no'} "
                         f"({rule})")
    return lines + [""]


def paired(df: pd.DataFrame, a: str, b: str, metric: str) -> dict | None:
    w = df.pivot_table(index="task", columns="schedule", values=metric).dropna(subset=[a, b]) \
        if {a, b} <= set(df.schedule) else None
    if w is None or not len(w):
        return None
    r = paired_difference(w[a].to_numpy(), w[b].to_numpy(), over="tasks")
    return {"model": df.model.iloc[0], "phase": df.phase.iloc[0], "metric": metric, "a": a, "b": b,
            "diff": r.diff, "ci_low": r.ci_low, "ci_high": r.ci_high, "n": r.n,
            "a_ahead": r.a_ahead, "b_ahead": r.b_ahead}


def model_section(df: pd.DataFrame, summary: list[dict]) -> tuple[list[str], list[dict]]:
    """The report's section of one model; appends each schedule's means per phase to ``summary``."""
    lines, rows = [], []
    for phase in ("dev", "test"):
        d = df[df.phase == phase]
        if d.empty:
            continue
        both = d.groupby("task").schedule.nunique()
        d = d[d.task.isin(both[both == both.max()].index)]  # tasks with every schedule of the phase
        n = d.task.nunique()
        cols = ["exact_match", "first_token_acc", "stage2_seconds", "stage2_cpu_seconds"]
        means = d.groupby("schedule")[cols].mean()
        means = means.loc[[s for s in SCHEDULES if s in means.index]]
        timed = d.dropna(subset=["stage2_cpu_seconds"])  # rows from before the CPU column: wall only
        cpu = timed[timed.task.isin(timed.groupby("task").schedule.nunique().loc[
            lambda x: x == x.max()].index)].groupby("schedule").stage2_cpu_seconds.mean()
        table = pd.DataFrame({"mean EM": means.exact_match.map(pct),
                              "mean FT": means.first_token_acc.map(pct),
                              "mean stage 2 wall s": means.stage2_seconds.map("{:.1f}".format),
                              "wall vs default": (means.stage2_seconds / means.stage2_seconds.get("default")
                                                  ).map("{:.2f}×".format),
                              f"mean stage 2 CPU s ({timed.task.nunique()} tasks)": cpu.map(num1),
                              "CPU vs default": (cpu / cpu.get("default", float("nan"))
                                                 ).map(lambda x: "–" if x != x else f"{x:.2f}×")})
        for sched in means.index:
            summary.append({"model": df.model.iloc[0], "phase": phase, "schedule": sched, "n_tasks": n,
                            **means.loc[sched].to_dict(), "cpu_tasks": timed.task.nunique(),
                            "cpu_mean": cpu.get(sched, float("nan")),
                            "cpu_vs_default": cpu.get(sched, float("nan"))
                            / cpu.get("default", float("nan"))})
        what = "development tasks" if phase == "dev" else "held-out tasks (the decisive comparison)"
        lines += [f"## {df.model.iloc[0]}: {what}, {n} task(s) with every schedule", "",
                  md_table(table.reset_index()), ""]
        for s in [s for s in SCHEDULES if s != "default" and s in set(d.schedule)]:
            for metric in ("exact_match", "first_token_acc"):
                p = paired(d, s, "default", metric)
                if p:
                    rows.append(p)
                    lines.append(f"- {s} − default, {metric.replace('_', ' ')}: "
                                 f"{100 * p['diff']:+.1f} points [{100 * p['ci_low']:+.1f}, "
                                 f"{100 * p['ci_high']:+.1f}], n = {p['n']} tasks")
        dflt = d[d.schedule == "default"]
        for P in PATIENCES:
            stops = [stopped_at(json.loads(h), P) for h in dflt.valid_history]
            early = sum(s < int(last) for (s, _), last in zip(stops, dflt.steps_run))
            other = sum(k != int(b) for (_, k), b in zip(stops, dflt.best_step))
            lines.append(f"- patience {P} (simulated on the default's checks): stops early on {early} of "
                         f"{len(stops)} tasks, keeps another α than the default on {other}")
        lines.append(f"- default's kept step: {dflt.best_step.value_counts().sort_index().to_dict()}; "
                     f"load average at the fits {d.load_avg.min():.2f}–{d.load_avg.max():.2f}")
        lines.append("")
    return lines, rows


if __name__ == "__main__":
    raise SystemExit(main(ScheduleCompare()))
