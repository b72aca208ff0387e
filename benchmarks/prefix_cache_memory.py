"""Peak memory of the frozen prefix KV caches that a SITE stage-2 fit builds (the largest thing a
fit holds on long zero-shot prompts, e.g. squad_val ~240 tokens): exactly the caches ``fit_alpha``
builds for one task, the process RSS sampled every 5 ms; the peak above the RSS just before the
build and the bytes of K/V that remain.

    python benchmarks/prefix_cache_memory.py --model smollm2-135m-instruct \
        --fv ../shared/datasets/fv --task squad_val --label "$(git rev-parse --short HEAD)"

Appends a row to ``results/prefix_cache_memory.csv`` and rewrites ``prefix_cache_memory.md``. To
measure another commit, run it with ``PYTHONPATH`` pointing at a worktree of it.
"""

import time
from pathlib import Path

import pandas as pd

from sitelens.pipelines.experiment import Experiment, Job, PeakRSS, load_avg, main, md_table


class PrefixCacheMemory(Experiment):
    name, title = "prefix_cache_memory", "Stage-2 prefix KV caches: peak memory"
    columns = ["model", "task", "label", "n_prompts", "max_prefix_tokens", "kv_gib", "peak_above_gib",
               "seconds", "load_avg_1min"]
    key = None

    def add_arguments(self, p) -> None:
        p.add_argument("--model", default="smollm2-135m-instruct")
        p.add_argument("--fv", default=None, help="FV datasets (default {data-root}/fv)")
        p.add_argument("--task", default="squad_val")
        p.add_argument("--label", default="working tree")

    def cells(self, args):
        return [Job(f"{args.model}/{args.task}")]

    def run(self, job: Job) -> dict:
        import sitelens
        from sitelens import FitConfig, load_model, load_task
        from sitelens.models import encode, prefix_cache
        from sitelens.site import training_batches
        from sitelens.tasks import zero_shot_prompt

        a = self.args
        model = load_model(a.model)
        task = load_task(Path(a.fv or a.data_root / "fv") / a.task, dedupe=True)
        cfg = FitConfig(seed=0)
        valid = (task.valid or task.train)[: cfg.n_valid]
        used = sorted({i for b in training_batches(list(range(len(task.train))), cfg) for i in b})
        items, caches, load = valid + [task.train[i] for i in used], [], load_avg()
        t0 = time.perf_counter()
        with PeakRSS(every=0.005) as mem:
            for part in (items[: len(valid)], items[len(valid):]):  # as fit_alpha: valid, then train
                enc = encode(model, [zero_shot_prompt(ex.input) for ex in part])
                caches.append(prefix_cache(model, enc)[0])
        kv = sum(e.past_keys.nbytes + e.past_values.nbytes for c in caches for e in c.entries)
        row = {"model": a.model, "task": a.task, "label": a.label, "n_prompts": len(items),
               "max_prefix_tokens": max(c.entries[0].past_keys.shape[1] for c in caches),
               "kv_gib": round(kv / 2**30, 2), "peak_above_gib": round((mem.peak - mem.start) / 2**30, 2),
               "seconds": round(time.perf_counter() - t0, 1), "load_avg_1min": load}
        print(row, "sitelens from", Path(sitelens.__file__).parent, flush=True)
        return row

    def report(self, df: pd.DataFrame) -> str:
        return (f"One row per run (`label`: the code measured); `kv_gib`: the K/V held afterwards; "
                f"`peak_above_gib`: the peak RSS above the RSS before the build.\n\n{md_table(df)}\n")


if __name__ == "__main__":
    raise SystemExit(main(PrefixCacheMemory()))
