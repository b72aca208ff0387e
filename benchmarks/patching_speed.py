"""Per-head causal effects: batched (heads in rows of one forward pass, prefix KV cache) vs the
serial loop (one full forward pass per head).

    python benchmarks/patching_speed.py                 # default bundled model, 8 prompts
    python benchmarks/patching_speed.py --tiny          # smoke test on a tiny random model

The committed results come from ``--n-prompts 2 --n-mean-prompts 20 --threads 1`` (the command is
in the md; about 6 min on one thread). ``forward_passes`` is the number of model calls
``head_causal_effects`` counted (a forward pre-hook on the model), not a formula.

Writes ``benchmarks/results/patching_speed.csv`` and ``.md`` (``--out`` to change). The task-mean
activation is computed once, outside the timed region, and passed to both modes; both modes see
the same corrupted prompts, so their effect maps must agree (max |Δ| is reported).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import pandas as pd
import torch

from sitelens.models import DEFAULT_MODEL, load_model, model_name, tiny_model
from sitelens.patching import corrupted_prompts, head_causal_effects, patched_last_logits
from sitelens.pipelines.experiment import md_table
from sitelens.site import task_embedding
from sitelens.tasks import load_task


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--task", default="antonym")
    p.add_argument("--n-prompts", type=int, default=8)
    p.add_argument("--n-shots", type=int, default=10)
    p.add_argument("--n-mean-prompts", type=int, default=50)
    p.add_argument("--batch-size", type=int, default=64, help="rows per batched forward pass")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tiny", action="store_true",
                   help="tiny random model and sizes: checks the script runs (not a benchmark)")
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.tiny:
        model = tiny_model(n_layers=4, n_heads=4, d_head=8, n_key_value_heads=2)
        args.n_prompts, args.n_shots, args.n_mean_prompts = 2, 2, 2
        load_s = 0.0
    else:
        t0 = time.perf_counter()
        model = load_model(args.model)
        load_s = time.perf_counter() - t0
    task = load_task(args.task)
    emb = task_embedding(model, task, n_prompts=args.n_mean_prompts, n_shots=args.n_shots,
                         seed=args.seed)  # [n_layers, n_heads, d_head]
    # warm-up (first-call allocations) outside the timed region
    prompts, _ = corrupted_prompts(model, task, n_prompts=1, n_shots=args.n_shots, seed=args.seed)
    patched_last_logits(model, prompts, use_cache=False)

    kw = dict(n_prompts=args.n_prompts, n_shots=args.n_shots, seed=args.seed, embedding=emb,
              batch_size=args.batch_size, return_stats=True)
    load_avg = os.getloadavg()[0]  # 1-minute load average before the timed runs (contention)
    cpu0 = time.process_time()  # CPU seconds of this process: far less inflated by other jobs
    eff_b, st_b = head_causal_effects(model, task, batched=True, **kw)
    cpu1 = time.process_time()
    eff_s, st_s = head_causal_effects(model, task, batched=False, **kw)
    st_b["cpu_seconds"], st_s["cpu_seconds"] = cpu1 - cpu0, time.process_time() - cpu1
    load_after = os.getloadavg()[0]
    diff = float((eff_b - eff_s).abs().max())
    speedup = st_s["seconds"] / st_b["seconds"]
    cpu_speedup = st_s["cpu_seconds"] / st_b["cpu_seconds"]

    common = {
        "model": model_name(model),
        "task": task.name,
        "n_prompts": args.n_prompts,
        "n_shots": args.n_shots,
        "n_layers": model.cfg.n_layers,
        "n_heads": model.cfg.n_heads,
        "n_heads_total": st_b["n_heads_total"],
        "batch_size": args.batch_size,
        "threads": torch.get_num_threads(),
        "device": str(model.cfg.device),
        "torch": torch.__version__,
        "load_seconds": round(load_s, 2),
        "load_avg_1min": round(load_avg, 2),
        "load_avg_1min_after": round(load_after, 2),
    }
    rows = []
    for st in (st_s, st_b):
        rows.append({
            **common,
            "mode": st["mode"],
            "forward_passes": st["forward_passes"],
            "rows": st["rows"],
            "seconds": round(st["seconds"], 3),
            "seconds_per_head": round(st["seconds"] / st["n_heads_total"], 5),
            "speedup_vs_serial": round(st_s["seconds"] / st["seconds"], 2),
            "cpu_seconds": round(st["cpu_seconds"], 3),
            "cpu_speedup_vs_serial": round(st_s["cpu_seconds"] / st["cpu_seconds"], 2),
            "max_abs_diff_vs_serial": diff,
            "baseline_prob": round(st["baseline_prob"], 5),
        })
    df = pd.DataFrame(rows)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "patching_speed.csv", index=False)
    cols = ["mode", "forward_passes", "rows", "seconds", "seconds_per_head", "speedup_vs_serial",
            "cpu_seconds", "cpu_speedup_vs_serial"]
    md = [
        "# Per-head causal effects: batched vs serial",
        "",
        f"Model `{common['model']}` ({common['n_layers']} layers × {common['n_heads']} heads = "
        f"{common['n_heads_total']} heads), task `{task.name}`, {args.n_prompts} corrupted "
        f"{args.n_shots}-shot prompts, {common['threads']} torch thread(s) on "
        f"{common['device']} ({platform.processor() or platform.machine()}), torch "
        f"{torch.__version__}; 1-minute load average {load_avg:.2f} before the timed runs and "
        f"{load_after:.2f} after them (this machine has {os.cpu_count()} cores).",
        "",
        "- **serial**: one full forward pass (all prompts) per head, plus one unpatched pass.",
        f"- **batched**: each prompt's prefix encoded once into a frozen KV cache; then only the "
        f"last token is re-run, one head patched per row, {args.batch_size} rows per pass.",
        "",
        md_table(df[cols]),
        "",
        "`forward_passes` is counted, not computed: the calls of the model that "
        "`head_causal_effects` made, seen by a forward pre-hook on it (the batched mode's "
        "prefix-cache passes included; the task-mean activation, computed once before, "
        "excluded). `rows`: (prompt, condition) rows run, one condition per head plus the "
        "unpatched one.",
        "",
        "`seconds` is wall-clock; `cpu_seconds` is the CPU time of this process over the same "
        "call (`time.process_time()`), which other jobs on the cores inflate far less.",
        "",
        f"Batched is **{speedup:.1f}×** faster than the serial loop in wall-clock time and "
        f"**{cpu_speedup:.1f}×** in CPU time; the two effect maps agree to max |Δ| = {diff:.2e} "
        "(probability units).",
        "",
        f"Command: `python benchmarks/patching_speed.py {' '.join(sys.argv[1:])}`".rstrip(),
        "",
    ]
    if args.tiny:
        md.insert(2, "**Smoke test on a tiny random model (--tiny): not a benchmark.**\n")
    (out / "patching_speed.md").write_text("\n".join(md))
    print(df[cols].to_string(index=False))
    print(f"speedup {speedup:.2f}x wall, {cpu_speedup:.2f}x cpu, max |diff| {diff:.2e} -> {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
