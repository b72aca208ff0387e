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
import csv
import os
import threading
import time
from pathlib import Path

import pandas as pd
import torch

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
FIELDS = ["model", "task", "label", "n_prompts", "max_prefix_tokens", "kv_gib", "peak_above_gib",
          "seconds", "load_avg_1min"]


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakRSS:
    """Samples RSS in a thread; ``peak`` is the largest value seen between enter and exit."""

    def __init__(self, every: float = 0.005):
        self.every, self.peak, self._stop = every, 0, threading.Event()

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_bytes())
            time.sleep(self.every)

    def __enter__(self):
        self.start = rss_bytes()
        self.peak = self.start
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, rss_bytes())


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
    with PeakRSS() as mem:
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
    new = not out.exists()
    with open(out, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        if new:
            w.writeheader()
        w.writerow(row)
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
        "| " + " | ".join(d.columns) + " |",
        "|" + "---|" * len(d.columns),
        *("| " + " | ".join(str(v) for v in r) + " |" for r in d.itertuples(index=False)),
        "",
    ]
    text = "\n".join(lines)
    (RESULTS / "prefix_cache_memory.md").write_text(text)
    return text


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--fv", default="../shared/datasets/fv")
    p.add_argument("--task", default="squad_val")
    p.add_argument("--label", default="working tree")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    print(summarize(run(args)))


if __name__ == "__main__":
    main()
