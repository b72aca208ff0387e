"""The FV sweep fitted jointly against one task at a time (issue 44), both in one run.

    python benchmarks/sweep_joint.py --threads 1            # every FV task: hours one by one here
    python benchmarks/sweep_joint.py --threads 1 --chunks 2 --tasks TASKS   # the committed run
    python benchmarks/sweep_joint.py --report

For every FV task (``DATA_ROOT/fv``) and one model: SITE's stage 1 (the 50 ten-shot prompts),
stage 2 (α, the default FitConfig, seed 0) and SITE's evaluation on the first ``--limit`` (50) test
items, two ways in the same process:

- ``one-by-one``: per task, :func:`sitelens.fit_site` then :func:`sitelens.evaluate` (methods
  ``site``), as the sweeps do today (``benchmarks/site_fv.py``);
- ``joint``: the tasks of a chunk at once, :func:`sitelens.site.fit_site_tasks` (stage 1's prompts of all
  tasks in shared length-sorted batches; stage 2 :func:`sitelens.site.fit_alpha_tasks`, the rows of
  many tasks in every pass) then :func:`sitelens.eval.joint.evaluate_site_tasks` (the test items
  of all tasks in shared generation batches).

The tasks are dealt into ``--chunks`` chunks (task i, in order of prompt length, to chunk
i mod CHUNKS: every chunk spans short and long prompts); per chunk, the joint arm runs first (one
job for the chunk's tasks), then one cell per task for the one-by-one arm (resumable), so a run
stopped early still compares complete chunks.
Rows: one per task and arm, with each stage's seconds (the joint arm's: its wall time divided
evenly over the tasks, so an arm's column sums to its wall time), exact match and first-token
accuracy on the same items, the kept step, the load average before and after the cell (other jobs
share the machine's cores), and for the one-by-one rows the largest |α − α_joint| over heads.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pandas as pd
import torch
from lib.paired import paired_rows

from sitelens import FitConfig, fit_site, load_task, summarize
from sitelens.eval.evaluation import evaluate
from sitelens.eval.joint import evaluate_site_tasks
from sitelens.pipelines.executors import cached_model
from sitelens.pipelines.experiment import Experiment, Job, host_name, load_avg, main, md_table, pct
from sitelens.site import fit_site_tasks

STAGES = ("stage1_seconds", "stage2_seconds", "eval_seconds")
COLUMNS = ["key", "model", "task", "arm", "chunk", *STAGES, "exact_match", "first_token_acc", "n",
           "best_step", "joint_tasks", "alpha_max_abs_diff", "threads", "load_avg_before", "load_avg_after",
           "host", "when"]


def _scores(df: pd.DataFrame) -> dict:
    s = summarize(df).iloc[0]
    return {"exact_match": round(float(s.exact_match), 4),
            "first_token_acc": round(float(s.first_token_acc), 4), "n": int(s.n)}


class SweepJoint(Experiment):
    name, title = "sweep_joint", "The FV sweep: one task at a time against jointly"
    columns, key = COLUMNS, "key"
    models, limit, threads = ("smollm2-135m-instruct",), 50, 1

    def add_arguments(self, p) -> None:
        p.add_argument("--n-ctx", type=int, default=4096)
        p.add_argument("--chunks", type=int, default=3,
                       help="task chunks (task i in chunk i mod CHUNKS), each fitted jointly and then "
                            "one by one, so a partial run compares complete chunks")

    def task_names(self) -> list[str]:
        """The FV tasks asked for, shortest prompts first (the joint arm's chunks then join
        prompts of similar length; the order of site_fv.py)."""
        fv = self.args.data_root / "fv"
        names = sorted(p.name for p in fv.iterdir() if (p / "train.json").exists())
        names = [n for n in names if not self.args.tasks or n in self.args.tasks]

        def prompt_chars(n: str) -> float:
            items = json.loads((fv / n / "valid.json").read_text())
            return sum(len(str(x["input"])) + len(str(x["output"])) for x in items) / max(1, len(items))

        return sorted(names, key=prompt_chars)

    def cells(self, args):
        """Per chunk: its joint cells, then its one-by-one cells."""
        names = self.task_names()
        n = max(1, min(args.chunks, len(names)))
        for c in range(n):
            chunk = names[c::n]  # every n-th task: each chunk spans short and long prompts
            for t in chunk:
                yield Job(f"{args.models[0]}/joint/{t}", f"{t} joint",
                          {"task": t, "arm": "joint", "chunk": c})
            for t in chunk:
                yield Job(f"{args.models[0]}/one-by-one/{t}", f"{t} one-by-one",
                          {"task": t, "arm": "one-by-one", "chunk": c})

    def batch(self, todo: list[Job]) -> list[Job]:
        """A chunk's joint cells as one job (they share every pass), in the place of its first;
        the one-by-one cells alone."""
        out, joint = [], {}
        for j in todo:
            if j["arm"] != "joint":
                out.append(j)
                continue
            c = j["chunk"]
            if c not in joint:
                joint[c] = Job(f"joint/{c}", f"chunk {c} joint", {"tasks": [], "arm": "joint", "chunk": c})
                out.append(joint[c])
            joint[c]["tasks"].append(j["task"])
        return out

    def alpha_path(self, task: str) -> Path:
        """Where the joint arm leaves each task's α for the one-by-one cell to compare (not committed)."""
        runs = Path(__file__).resolve().parent.parent / "runs"
        return runs / "sweep_joint" / self.args.models[0] / f"{task}.pt"

    def common(self) -> dict:
        return {"model": self.args.models[0], "threads": torch.get_num_threads(), "host": host_name(),
                "when": time.strftime("%Y-%m-%d %H:%M", time.gmtime())}

    def run(self, job: Job) -> list[dict]:
        a = self.args
        model = cached_model(a.models[0], n_ctx=a.n_ctx)
        load0 = load_avg()
        if job["arm"] == "joint":
            tasks = [load_task(a.data_root / "fv" / n, dedupe=True) for n in job["tasks"]]
            adapters = fit_site_tasks(model, tasks, config=FitConfig(seed=0))
            t0 = time.perf_counter()
            df = evaluate_site_tasks(model, tasks, adapters, limit=a.limit)
            eval_each = (time.perf_counter() - t0) / len(tasks)
            rows = []
            for t, ad in zip(tasks, adapters):
                path = self.alpha_path(t.name)
                path.parent.mkdir(parents=True, exist_ok=True)
                torch.save(ad.alpha, path)
                rows.append({"key": f"{a.models[0]}/joint/{t.name}", "task": t.name, "arm": "joint",
                             "stage1_seconds": round(ad.meta["stage1_seconds"], 3),
                             "stage2_seconds": round(ad.meta["stage2_seconds"], 3),
                             "eval_seconds": round(eval_each, 3), **_scores(df[df.task == t.name]),
                             "best_step": ad.meta["best_step"], "joint_tasks": ad.meta.get("joint_tasks", 1),
                             "chunk": job["chunk"]})
        else:
            name = job["task"]
            task = load_task(a.data_root / "fv" / name, dedupe=True)
            ad = fit_site(model, task, config=FitConfig(seed=0))
            t0 = time.perf_counter()
            df = evaluate(model, task, adapter=ad, methods=["site"], limit=a.limit, seed=0)
            path = self.alpha_path(name)
            diff = float((ad.alpha - torch.load(path)).abs().max()) if path.exists() else float("nan")
            rows = [{"key": job.key, "task": name, "arm": "one-by-one",
                     "stage1_seconds": round(ad.meta["stage1_seconds"], 3),
                     "stage2_seconds": round(ad.meta["stage2_seconds"], 3),
                     "eval_seconds": round(time.perf_counter() - t0, 3), **_scores(df),
                     "best_step": ad.meta["best_step"], "joint_tasks": 1, "alpha_max_abs_diff": diff,
                     "chunk": job["chunk"]}]
        load1 = load_avg()
        return [dict(r, **self.common(), load_avg_before=load0, load_avg_after=load1) for r in rows]

    def full_bound(self) -> list[str]:
        """The same bound over every FV task of the model, from the one-task SITE fits of
        benchmarks/site_fv.py (the same fit, the evaluation of the first 50 test items, one thread;
        its stage seconds per task): this run's chunk holds the short-prompt tasks, whose stage 1
        is the smaller share."""
        path = self.out / f"site_fv_{self.args.models[0]}.csv"
        if not path.exists():
            return []
        s = pd.read_csv(path).query("method == 'site'")
        s1, s2, ev = s.stage1_seconds.sum(), s.stage2_seconds.sum(), (s.seconds_per_item * s.n).sum()
        n, bound = len(s), (s1 + s2 + ev) / s1
        return [f"Over all {n} FV tasks, one task at a time (`{path.name}`, its `site` rows: the same "
                f"fit and evaluation on the first {int(s.n.max())} test items, one thread, made by "
                f"`benchmarks/site_fv.py` in earlier runs): stage 1 {s1:.0f} s, stage 2 {s2:.0f} s, the "
                f"evaluation {ev:.0f} s, so with stage 1 gaining nothing, joint fitting could make the "
                f"whole {n}-task sweep at most {bound:.2f}× faster.", ""]

    def report(self, df: pd.DataFrame) -> str:
        # complete chunks only: a joint row's seconds are an even share of its chunk's wall time
        ones = set(df[df.arm == "one-by-one"].task)
        joint = df[df.arm == "joint"]
        complete = [c for c, g in joint.groupby("chunk") if set(g.task) <= ones]
        both = set(joint[joint.chunk.isin(complete)].task)
        d = df[df.task.isin(both)]
        if d.empty:
            return "No chunk has both arms yet."
        left = sorted(set(df.task) - both)
        tot = d.groupby("arm")[list(STAGES)].sum()
        tot["total"] = tot.sum(axis=1)
        bound = tot.loc["one-by-one", "total"] / tot.loc["one-by-one", STAGES[0]]
        tab = pd.DataFrame({
            "stage": ["stage 1 (task embedding)", "stage 2 (α fit)", "SITE evaluation", "whole sweep"],
            "one-by-one s": [f"{tot.loc['one-by-one', c]:.0f}" for c in (*STAGES, "total")],
            "joint s": [f"{tot.loc['joint', c]:.0f}" for c in (*STAGES, "total")],
            "speed-up": [f"{tot.loc['one-by-one', c] / tot.loc['joint', c]:.2f}×"
                         for c in (*STAGES, "total")],
        })
        pr = paired_rows(d.rename(columns={"arm": "method"}), [("joint", "one-by-one")], "exact_match")
        pf = paired_rows(d.rename(columns={"arm": "method"}), [("joint", "one-by-one")], "first_token_acc")
        wide = d.pivot_table(index="task", columns="arm", values=["exact_match", "best_step"])
        em_diff = int((wide["exact_match"]["joint"] != wide["exact_match"]["one-by-one"]).sum())
        step_diff = int((wide["best_step"]["joint"] != wide["best_step"]["one-by-one"]).sum())
        one = d[d.arm == "one-by-one"]
        means = d.groupby("arm")[["exact_match", "first_token_acc"]].mean()
        loads = d[["load_avg_before", "load_avg_after"]].stack()
        lines = [
            f"`{d.model.iloc[0]}`, {len(both)} FV tasks in {len(complete)} complete chunk(s) of "
            f"{joint[joint.chunk.isin(complete)].groupby('chunk').size().tolist()} tasks (each fitted "
            f"jointly, then one by one), SITE fit (stage 1: 50 ten-shot prompts; stage "
            f"2: the default FitConfig, seed 0) and SITE's evaluation on the first {int(d.n.max())} test "
            f"items of each task, both arms in one run on `{d.host.iloc[0]}` with "
            f"{int(d.threads.iloc[0])} torch thread(s) ({d.when.min()} to {d.when.max()} UTC). Machine load "
            f"(1-minute load average, read before and after each cell; other jobs share the 2 cores): "
            f"mean {loads.mean():.2f}, min {loads.min():.2f}, max {loads.max():.2f}.",
            "",
            "Seconds per stage, summed over the tasks (the joint arm's per-task numbers are its wall time "
            "divided evenly, so its sums are its wall times):",
            "",
            md_table(tab),
            "",
            # Amdahl: stage 1 is a few long prompts per task in full batches already, bound by
            # arithmetic, so pooling them across tasks cannot speed it up; with stage 1 at its
            # one-by-one time and everything else free, the sweep is at most this much faster
            "Bound: with stage 1 at its one-by-one seconds and stage 2 and the evaluation taking no "
            f"time at all, the joint sweep would be {bound:.2f}× "
            "faster than one by one (whole sweep over stage 1, one-by-one): the most joint fitting "
            "can give while stage 1 gains nothing from pooling.",
            "",
            *self.full_bound(),
            f"Accuracy: mean exact match one-by-one {pct(means.loc['one-by-one', 'exact_match'])}%, joint "
            f"{pct(means.loc['joint', 'exact_match'])}%; paired over tasks (joint − one-by-one, "
            f"`sitelens.stats.paired_difference`, 95% bootstrap interval): exact match "
            f"{100 * pr['diff'].iloc[0]:+.2f} points [{100 * pr.ci_low.iloc[0]:+.2f}, "
            f"{100 * pr.ci_high.iloc[0]:+.2f}], n = {int(pr.n.iloc[0])}; first-token accuracy "
            f"{100 * pf['diff'].iloc[0]:+.2f} points [{100 * pf.ci_low.iloc[0]:+.2f}, "
            f"{100 * pf.ci_high.iloc[0]:+.2f}]. Tasks whose exact match differs: {em_diff}; whose kept step "
            f"differs: {step_diff}; largest |α − α_joint| over all heads and tasks: "
            f"{one.alpha_max_abs_diff.max():.2g}.",
            "",
            "Per task: `sweep_joint.csv`."
            + (f" Not in the comparison (their chunk is incomplete): {', '.join(left)}." if left else ""),
        ]
        return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main(SweepJoint()))
