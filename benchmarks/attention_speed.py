"""Forward-pass time and peak memory: TransformerLens's attention vs sitelens's fused fast path.

    python benchmarks/attention_speed.py --threads 1          # SmolLM2, squad_val 0/1/3/10-shot prompts
    python benchmarks/attention_speed.py --tiny               # smoke test on a tiny random model

One prompt per forward pass (batch 1, no padding: the fast path's ``is_causal`` kernel) and, with
``--batches 1,2``, a padded batch of two (the masked kernel). Each configuration runs ``--repeats``
timed passes (the first included); the median is reported, with the max |Δ log-prob| between the
two paths at the last position. Appends to ``benchmarks/results/attention_speed.csv`` and rewrites
``attention_speed.md``.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import pandas as pd
import torch

from sitelens.models import DEFAULT_MODEL, encode, load_model, model_name, tiny_model
from sitelens.models.attention import enable_fast_attention
from sitelens.pipelines.experiment import DATA_ROOT, PeakRSS, md_table
from sitelens.pipelines.store import ResultsStore
from sitelens.tasks import few_shot_prompts, load_task

FIELDS = ["model", "task", "shots", "batch", "tokens", "path", "threads", "seconds", "peak_rss_gib",
          "max_abs_dlogprob", "load_avg"]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--task", default=str(DATA_ROOT / "fv" / "squad_val"))
    p.add_argument("--shots", default="0,1,3,10", help="comma-separated demonstration counts")
    p.add_argument("--batches", default="1,2", help="comma-separated batch sizes")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--n-ctx", type=int, default=4096)
    p.add_argument("--tiny", action="store_true",
                   help="tiny random model and built-in task: checks the script runs (not a benchmark)")
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    return p.parse_args(argv)


def time_forward(model, enc, repeats: int):
    """Median seconds of ``repeats`` no-grad forward passes, the peak RSS (GiB) over them and the
    last-position log-probs of the first."""
    times, out = [], None
    with torch.no_grad(), PeakRSS() as mem:
        for _ in range(max(1, repeats)):
            t0 = time.perf_counter()
            logits = model(enc.tokens, attention_mask=enc.attention_mask)
            times.append(time.perf_counter() - t0)
            if out is None:
                out = logits[:, -1].log_softmax(-1)
    return statistics.median(times), mem.peak / 2**30, out


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.tiny:
        model, task = tiny_model(backend="hooked"), load_task("antonym")
        shots, repeats, out_dir = [1, 3], 1, Path(args.out) / "tiny"
        batches = [1, 2]
    else:
        model = load_model(args.model, n_ctx=args.n_ctx, backend="hooked")
        task = load_task(args.task, dedupe=True)
        shots, repeats, out_dir = [int(s) for s in args.shots.split(",")], args.repeats, Path(args.out)
        batches = [int(b) for b in args.batches.split(",")]
    out_dir.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()[0]
    rows = []
    for k in shots:
        prompts = few_shot_prompts(task, task.test[:2], k, seed=0)
        for batch in batches:
            enc = encode(model, prompts[:batch])
            res = {}
            for fast in (False, True):
                enable_fast_attention(model, fast)
                res[fast] = time_forward(model, enc, repeats)
            enable_fast_attention(model, True)
            diff = (res[False][2] - res[True][2]).abs().max().item()
            for fast in (False, True):
                rows.append({
                    "model": model_name(model), "task": task.name, "shots": k, "batch": batch,
                    "tokens": int(enc.tokens.shape[1]), "path": "fused" if fast else "transformerlens",
                    "threads": torch.get_num_threads(), "seconds": round(res[fast][0], 3),
                    "peak_rss_gib": round(res[fast][1], 2), "max_abs_dlogprob": f"{diff:.2e}",
                    "load_avg": round(load, 2),
                })
                print(rows[-1], flush=True)
    csv_path = out_dir / "attention_speed.csv"
    ResultsStore(csv_path, FIELDS, key=None).append(rows)
    df = pd.read_csv(csv_path)
    cmd = " ".join(["python", "benchmarks/attention_speed.py", *(argv or sys.argv[1:])])
    md = [
        "# Forward pass: TransformerLens attention vs the fused fast path",
        "",
        f"Made by `{cmd}` on {platform.machine()} ({os.cpu_count()} cores); every run appends to "
        "`attention_speed.csv`. `seconds`: median no-grad forward pass over the whole prompt; "
        "`peak_rss_gib`: the process's peak resident memory during those passes; "
        "`max_abs_dlogprob`: the largest last-position log-prob difference between the two paths; "
        "`load_avg`: the 1-minute load average when the run started (other jobs share the cores).",
        "",
        md_table(df),
        "",
    ]
    (out_dir / "attention_speed.md").write_text("\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
