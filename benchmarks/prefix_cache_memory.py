"""Peak memory of the frozen prefix KV caches that a SITE stage-2 fit builds.

Stage 2 computes the KV cache of every zero-shot prompt's prefix once (validation items, then the
training items the batches use) and re-runs only the last token per step. On long zero-shot
prompts (squad_val: ~240 tokens) these caches are the largest thing a fit holds. This script
builds exactly the caches ``fit_alpha`` builds for one task and samples the process RSS every
5 ms, reporting the peak above the RSS just before the build and the bytes of K/V that remain.

    python benchmarks/prefix_cache_memory.py --model smollm2-135m-instruct \
        --fv ../shared/datasets/fv --task squad_val --label "$(git rev-parse --short HEAD)"

Appends one row to ``results/prefix_cache_memory.csv`` and rewrites ``results/prefix_cache_memory.md``.
To measure another commit, run this script with ``PYTHONPATH`` pointing at a worktree of it.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import pandas as pd
import torch

from sitelens.pipelines.experiment import DATA_ROOT, PeakRSS, md_table
from sitelens.pipelines.store import ResultsStore

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
FIELDS = ["model", "task", "label", "n_prompts", "max_prefix_tokens", "kv_gib", "peak_above_gib",
          "seconds", "load_avg_1min"]


def run(args) -> Path:
    import sitelens
    from sitelens import FitConfig, load_model, load_task
    from sitelens.models import encode, prefix_cache
    from sitelens.site import training_batches
    from sitelens.tasks import zero_shot_prompt

    torch.set_num_threads(args.threads)
    model = load_model(args.model)
    task = load_task(Path(args.fv) / args.task, dedupe=True)
    cfg = FitConfig(seed=0)
    valid = (task.valid or task.train)[: cfg.n_valid]
    used = sorted({i for b in training_batches(list(range(len(task.train))), cfg) for i in b})
    items = valid + [task.train[i] for i in used]
    caches = []
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    with PeakRSS(every=0.005) as mem:
        for part in (items[: len(valid)], items[len(valid):]):  # as fit_alpha: valid, then train
            enc = encode(model, [zero_shot_prompt(ex.input) for ex in part])
            caches.append(prefix_cache(model, enc)[0])
    seconds = time.perf_counter() - t0
    kv = sum(e.past_keys.nbytes + e.past_values.nbytes for c in caches for e in c.entries)
    width = max(c.entries[0].past_keys.shape[1] for c in caches)
    row = {"model": args.model, "task": args.task, "label": args.label, "n_prompts": len(items),
           "max_prefix_tokens": width, "kv_gib": round(kv / 2**30, 2),
           "peak_above_gib": round((mem.peak - mem.start) / 2**30, 2),
           "seconds": round(seconds, 1), "load_avg_1min": round(load, 2)}
    print(row, "sitelens from", Path(sitelens.__file__).parent, flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "prefix_cache_memory.csv"
    ResultsStore(out, FIELDS, key=None).append([row])
    return out


def summarize(path: Path) -> str:
    d = pd.read_csv(path)
    lines = [
        "# Stage-2 prefix KV caches: peak memory",
        "",
        "Made by `python benchmarks/prefix_cache_memory.py --model MODEL --fv ../shared/datasets/fv "
        "--task TASK --label LABEL` (one row per run; `label` is the commit measured). `kv_gib` is "
        "the K/V the caches hold afterwards; `peak_above_gib` is the largest RSS above the RSS just "
        "before building them (sampled every 5 ms), so the difference is the transient overhead "
        "of assembling them.",
        "",
        md_table(d),
        "",
    ]
    text = "\n".join(lines)
    (RESULTS / "prefix_cache_memory.md").write_text(text)
    return text


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--fv", default=str(DATA_ROOT / "fv"))
    p.add_argument("--task", default="squad_val")
    p.add_argument("--label", default="working tree")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    print(summarize(run(args)))


if __name__ == "__main__":
    main()
