"""How the cost of every sitelens stage grows with model size and prompt length, on randomly
initialised models with the exact shapes of real families (:data:`lib.shapes.SHAPES`;
nothing is downloaded).

    python benchmarks/scaling.py --threads 1     # the committed CPU run (resumable; --dry-run lists it)
    python benchmarks/scaling.py --tiny          # shrunken shapes, about a minute: checks the script
    python benchmarks/scaling.py --report        # rewrite the md / png / html from the CSV
    bash benchmarks/gpu.sh                       # the CUDA run (bfloat16, longer prompts, 8B)
What each stage times and why random weights cost what trained ones do: docs/benchmarks.md."""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import math
import os
import random
import resource
import string
import subprocess
import sys
import time
from pathlib import Path

from lib.shapes import SHAPES, compute_params, hf_param_count, random_model

from sitelens.io import atomic_write_csv
from sitelens.pipelines import experiment as xp
from sitelens.pipelines.experiment import REPO, CallClock, Clock, Experiment, Job, PeakRSS, main, md_table

BENCH_VERSION = 1  # bump when what a cell measures changes

ORDER = ["smollm2-135m", "smollm2-360m", "qwen2.5-0.5b", "llama-3.2-1b", "gemma-3-1b",
         "smollm2-1.7b", "llama-3.1-8b"]
STAGES = ["stage1", "stage2", "generate", "patching", "atp", "alpha_grad"]
UNITS = {"stage1": "prompt", "stage2": "step", "generate": "item", "patching": "head-prompt",
         "atp": "head-prompt", "alpha_grad": "head-item"}
N_SHOTS = 4  # demonstrations per few-shot prompt (their count does not matter, their tokens do)

# Per-stage sizes: a few prompts / steps / items per cell (per-unit costs are what matter).
SIZES = {
    "cpu": dict(stage1_prompts=2, stage2_steps=3, stage2_batch=8, gen_items=2, new_tokens=8,
                patch_prompts=1, atp_prompts=1, alpha_items=1),
    "cuda": dict(stage1_prompts=8, stage2_steps=10, stage2_batch=8, gen_items=8, new_tokens=16,
                 patch_prompts=2, atp_prompts=8, alpha_items=8),
}
FIELDS = [
    "key", "model", "hf", "stage", "unit", "length", "prompt_tokens", "n_units", "cpu_s", "wall_s",
    "cpu_s_per_unit", "wall_s_per_unit", "peak_rss_gib", "rss_before_gib", "cell_maxrss_gib",
    "cuda_peak_gib", "weights_gib", "n_params_tl", "params_hf", "params_compute", "n_layers",
    "n_heads", "n_kv_heads", "d_model", "d_head", "d_mlp", "d_vocab", "device", "dtype", "torch",
    "threads", "n_ctx", "sizes", "build_wall_s", "build_cpu_s", "load_avg_before", "load_avg_after",
    "status", "reason", "detail", "host", "date",
]


def make_task(kind: str, length: int, *, n_train: int, n_valid: int = 2, seed: int = 0):
    """A task whose prompts have ~``length`` tokens with the byte tokenizer (BOS included):
    ``kind="few"``: ``N_SHOTS``-shot prompts (demonstration ``"Q: x\\nA: y\\n\\n"`` = k + 10
    characters with a 1-letter answer, query ``"Q: x\\nA:"`` = k + 6); ``"zero"``: the query
    alone. Inputs are random letters; answers distinct letters."""
    from sitelens.tasks import Example, Task

    k = max(1, round((length - 1 - N_SHOTS * 10 - 6) / (N_SHOTS + 1)) if kind == "few" else length - 7)
    rng = random.Random(seed)
    items = [Example("".join(rng.choice(string.ascii_lowercase) for _ in range(k)),
                     string.ascii_lowercase[i % 26]) for i in range(n_train + 2 * n_valid)]
    return Task(f"synthetic-{kind}-{length}", items[:n_train], items[n_train:n_train + n_valid],
                items[n_train + n_valid:])


def run_stage(model, stage: str, length: int, sizes: dict, sync) -> dict:
    """Run one stage; return its unit count, prompt tokens and details, and optionally an own
    timing (``wall``/``cpu``) that replaces the timing around the whole call."""
    import torch

    from sitelens.eval.evaluation import run_method
    from sitelens.eval.scoring import Protocol
    from sitelens.lenses import alpha_gradient, attribution_patching
    from sitelens.models import encode
    from sitelens.patching.effects import corrupted_prompts, head_causal_effects
    from sitelens.site import FitConfig, fit_alpha, site_mix, task_embedding
    from sitelens.tasks import embedding_prompts, zero_shot_prompt

    L, H, dh = model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_head
    g = torch.Generator().manual_seed(0)
    emb = 0.1 * torch.randn(L, H, dh, generator=g)  # [n_layers, n_heads, d_head]; values do not matter
    few = make_task("few", length, n_train=max(N_SHOTS + 2, 12))
    zero = make_task("zero", length, n_train=1, n_valid=1)  # stage 2: a batch of 8 repeats one item

    def tokens(prompts) -> float:
        return float(encode(model, list(prompts)).attention_mask.sum(1).float().mean())

    def zero_tokens(items) -> float:
        return tokens([zero_shot_prompt(ex.input) for ex in items])

    if stage == "stage1":
        n = sizes["stage1_prompts"]
        task_embedding(model, few, n_prompts=n, n_shots=N_SHOTS, batch_size=n)
        return dict(units=n, tokens=tokens(embedding_prompts(few, n, N_SHOTS)))
    if stage == "stage2":
        steps, bs = sizes["stage2_steps"], sizes["stage2_batch"]
        fc = FitConfig(n_examples=steps * bs, batch_size=bs, eval_every=steps + 1, n_valid=1)
        with CallClock(model, sync) as clock:
            res = fit_alpha(model, zero, emb, fc)
        # calls: prefix caches, the check before training, `steps` step passes, the final check
        (w0, c0), (w1, c1) = clock.marks[-1 - steps], clock.marks[-1]
        return dict(units=steps, tokens=zero_tokens(zero.train), wall=w1 - w0, cpu=c1 - c0,
                    detail=dict(model_calls=len(clock.marks), batch_size=bs,
                                setup_wall=w0 - clock.marks[0][0], fit_seconds=res.seconds))
    if stage == "generate":
        n, new = sizes["gen_items"], sizes["new_tokens"]
        items = make_task("zero", length, n_train=n, n_valid=0, seed=1).train[:n]
        prompts = [zero_shot_prompt(ex.input) for ex in items]
        fixed = Protocol(name="fixed-length", max_new_tokens=new, min_new_tokens=new, stop_at_newline=False)
        alpha = torch.full((L, H), 0.5)  # [n_layers, n_heads]
        with CallClock(model, sync) as clock:
            run_method(model, zero, items, "site", prompts=prompts, intervention=site_mix(alpha, emb),
                       batch_size=n, protocol=fixed)
        if len(clock.marks) != new:  # one prefill + new - 1 decode steps, every one of them
            raise RuntimeError(f"generation made {len(clock.marks)} model calls, not {new}: the "
                               "length was not fixed")
        return dict(units=n, tokens=tokens(prompts), detail=dict(new_tokens=new, batch_size=n))
    if stage in ("patching", "atp"):
        n = sizes["patch_prompts" if stage == "patching" else "atp_prompts"]
        prompts = corrupted_prompts(model, few, n_prompts=n, n_shots=N_SHOTS)[0]
        if stage == "patching":
            _, st = head_causal_effects(model, few, embedding=emb, n_prompts=n, n_shots=N_SHOTS,
                                        return_stats=True)
            return dict(units=st["n_heads_total"] * n, tokens=tokens(prompts),
                        detail=dict(forward_passes=st["forward_passes"], rows=st["rows"]))
        df = attribution_patching(model, few, embedding=emb, n_prompts=n, n_shots=N_SHOTS, n_boot=0).df
        return dict(units=L * H * n, tokens=tokens(prompts),
                    detail=dict(forward_passes=int(df["forward_passes"].iloc[0]),
                                backward_passes=int(df["backward_passes"].iloc[0])))
    if stage == "alpha_grad":
        n = sizes["alpha_items"]
        task = make_task("zero", length, n_train=n, n_valid=1, seed=2)
        alpha_gradient(model, task, embedding=emb, n_alpha_items=n, n_boot=0)
        return dict(units=L * H * n, tokens=zero_tokens(task.train))
    raise ValueError(f"unknown stage {stage!r}")


def needed_bytes(fields: dict, dtype: str, length: int) -> int:
    """What a worker needs, roughly: the weights (TransformerLens keeps W_E and W_U untied), the
    imports (~0.6 GiB) and activations: a few [batch, length, d_mlp] tensors and 8 prompts' KV."""
    width = 2 if dtype in ("bfloat16", "float16") else 4
    kv = fields.get("n_key_value_heads") or fields["n_heads"]
    acts = 8 * length * (4 * fields["d_mlp"] + 2 * fields["n_layers"] * kv * fields["d_head"])
    return int(hf_param_count(fields, False, "llama") * width + 0.6 * 2**30 + acts * width
               + fields["d_vocab"] * 64 * 4)


def free_bytes(device: str) -> int:
    if device.startswith("cuda"):
        import torch

        return torch.cuda.mem_get_info()[0]
    import psutil

    return psutil.virtual_memory().available


class Scaling(Experiment):
    columns = FIELDS
    models = ("all",)  # --models: a comma list or 'all'

    def add_arguments(self, p) -> None:
        p.add_argument("--lengths", default="64,256,1024", help="prompt lengths in tokens")
        p.add_argument("--stages", default="all", help=f"comma list or 'all' ({', '.join(STAGES)})")
        p.add_argument("--device", default="cpu")
        p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
        p.add_argument("--n-ctx", type=int, default=None, help="default 1088 on the CPU, 4160 on CUDA")
        p.add_argument("--group", choices=["cell", "model"], default=None,
                       help="one worker per (model, length) [cpu default] or per model [cuda default]")
        p.add_argument("--cell-timeout", type=float, default=6 * 3600, help="seconds per worker")
        p.add_argument("--budget-s", type=float, default=None, help="start no worker after this many seconds")
        p.add_argument("--margin-gib", type=float, default=2.0, help="free memory to leave unused")
        p.add_argument("--tag", default=None, help="results name (default scaling / scaling_gpu)")
        p.add_argument("--csv", default=None, help="results CSV (default {out}/{tag}.csv)")
        p.add_argument("--tiny", action="store_true", help="toy shapes, lengths 64,128 (runs/scaling_dry/)")
        p.add_argument("--no-png", action="store_true")
        p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
        p.add_argument("--model", help=argparse.SUPPRESS)
        p.add_argument("--jobs", help=argparse.SUPPRESS)

    def configure(self, args) -> None:
        cuda = args.device.startswith("cuda")
        self.device_type = "cuda" if cuda else "cpu"
        if args.tiny and args.lengths == "64,256,1024":
            args.lengths = "64,128"
        if args.n_ctx is None:  # fixed per device (it is part of every cell's key), raised if needed
            base = 192 if args.tiny else (4160 if cuda else 1088)
            args.n_ctx = max(base, max(int(x) for x in args.lengths.split(",")) + 64)
        args.group = args.group or ("model" if cuda else "cell")
        args.tag = args.tag or ("scaling_gpu" if cuda else "scaling") + ("_dry" if args.tiny else "")
        out = REPO / "runs" / "scaling_dry" if args.tiny else args.out  # runs/ is ignored by git
        csv = Path(args.csv or out / f"{args.tag}.csv").resolve()
        args.csv, args.out, self.name = str(csv), csv.parent, csv.stem
        self.deadline = time.time() + args.budget_s if args.budget_s else None

    def done(self, row: dict) -> bool:
        return row["status"] == "ok"  # failed and skipped cells are retried

    def fields(self, name: str) -> dict:
        return SHAPES[name].config(tiny=self.args.tiny)

    def cell_key(self, name: str, length: int, stage: str) -> str:
        import torch

        a = self.args
        spec = dict(v=BENCH_VERSION, model=name, cfg=self.fields(name), length=length, stage=stage,
                    device=self.device_type, dtype=a.dtype, torch=torch.__version__, threads=a.threads,
                    n_ctx=a.n_ctx, sizes=SIZES[self.device_type], n_shots=N_SHOTS)
        # the committed rows' key rule: sha256 of this JSON (default separators), not settings_hash
        return hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:16]

    def cells(self, args):
        models = ORDER if args.models == ["all"] else args.models
        if unknown := [m for m in models if m not in SHAPES]:
            from sitelens.errors import UsageError

            raise UsageError(f"unknown model(s) {unknown}; choose from {', '.join(ORDER)}")
        stages = STAGES if args.stages == "all" else [s.strip() for s in args.stages.split(",")]
        for name in models:
            for length in [int(x) for x in args.lengths.split(",")]:
                for stage in stages:
                    yield Job(self.cell_key(name, length, stage), f"{name} L={length} {stage}",
                              dict(model=name, length=length, stage=stage))

    def batch(self, todo):
        """One worker per model (``--group model``) or per (model, length), by length first on the
        CPU: every model at the shortest length, then the next, so a partial run spans the sizes."""
        groups: dict = {}
        for j in todo:
            groups.setdefault((j["model"],) if self.args.group == "model" else (j["model"], j["length"]),
                              []).append(j)
        order = sorted(groups, key=lambda g: 0 if len(g) == 1 else groups[g][0]["length"])
        return [Job(" ".join(map(str, g)), " ".join(map(str, g)), dict(jobs=groups[g])) for g in order]

    def common_fields(self, name: str) -> dict:
        import torch

        spec, f, a = SHAPES[name], self.fields(name), self.args
        return dict(
            model=name, hf=spec.hf, params_hf=hf_param_count(f, spec.tied, spec.family),
            params_compute=compute_params(f, spec.family),
            n_kv_heads=f.get("n_key_value_heads") or f["n_heads"],
            **{k: f[k] for k in ("n_layers", "n_heads", "d_model", "d_head", "d_mlp", "d_vocab")},
            device=self.device_type, dtype=a.dtype, torch=torch.__version__, threads=a.threads, n_ctx=a.n_ctx,
            sizes=json.dumps(SIZES[self.device_type], sort_keys=True),
            host=xp.host_name(self.device_type == "cuda"), date=xp.now())

    def run(self, group: Job) -> list:
        """Check the memory, then run the group's cells in a worker process (it appends its rows)."""
        a, jobs = self.args, group["jobs"]
        name = jobs[0]["model"]
        need = needed_bytes(self.fields(name), a.dtype, max(j["length"] for j in jobs))
        free = free_bytes(a.device)
        if need + a.margin_gib * 2**30 > free:
            reason = (f"needs ~{need / 2**30:.1f} GiB ({a.dtype}) + {a.margin_gib:g} GiB margin, "
                      f"{free / 2**30:.1f} GiB free on {a.device}")
            print(f"{name}: skipped, {reason}", flush=True)
            skipped = {r["key"] for r in self.store().rows() if r["status"] == "skipped"}
            base = self.common_fields(name)
            return [dict(base, key=j.key, stage=j["stage"], unit=UNITS[j["stage"]], length=j["length"],
                         status="skipped", reason=reason) for j in jobs if j.key not in skipped]
        timeout = min(a.cell_timeout, self.deadline - time.time() if self.deadline else a.cell_timeout)
        if timeout < 20:
            print(f"{name}: out of budget, {len(jobs)} cell(s) not run", flush=True)
            return []
        spec = [dict(length=j["length"], stage=j["stage"], key=j.key) for j in jobs]
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--model", name, "--jobs",
               json.dumps(spec), "--csv", a.csv, "--device", a.device, "--dtype", a.dtype, "--threads",
               str(a.threads), "--n-ctx", str(a.n_ctx)] + (["--tiny"] if a.tiny else [])
        print(f"{name}: {len(jobs)} cell(s) [{time.strftime('%H:%M:%S')}]", flush=True)
        try:
            if rc := subprocess.run(cmd, env=xp.worker_env(a.threads), timeout=timeout, cwd=REPO).returncode:
                print(f"{name}: worker exited with {rc} (-9: killed, e.g. for memory)", flush=True)
        except subprocess.TimeoutExpired:
            print(f"{name}: worker timed out after {timeout:.0f} s", flush=True)
        return []

    def worker(self) -> int:
        import torch

        a = self.args = self.parser().parse_args()
        self.configure(a)
        torch.set_num_threads(a.threads)
        cuda = self.device_type == "cuda"
        sync = torch.cuda.synchronize if cuda else (lambda: None)
        with Clock(sync) as build:
            model = random_model(a.model, self.fields(a.model), n_ctx=a.n_ctx, device=a.device, dtype=a.dtype)
        base = dict(self.common_fields(a.model), n_params_tl=sum(p.numel() for p in model.parameters()),
                    weights_gib=sum(p.numel() * p.element_size() for p in model.parameters()) / 2**30,
                    build_wall_s=build.wall, build_cpu_s=build.cpu)
        for job in json.loads(a.jobs):  # [{"length", "stage", "key"}]
            gc.collect()
            if cuda:
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            stage, length = job["stage"], job["length"]
            row = dict(base, key=job["key"], stage=stage, unit=UNITS[stage], length=length,
                       load_avg_before=os.getloadavg()[0])
            try:
                with PeakRSS() as mem, Clock(sync) as t:
                    out = run_stage(model, stage, length, SIZES[self.device_type], sync)
            except Exception as e:  # recorded, not done: a rerun tries again
                self.store().append([dict(row, status="failed", reason=f"{type(e).__name__}: {e}"[:300])])
                print(f"  {a.model} L={length} {stage}: FAILED {e}", flush=True)
                continue
            wall, cpu, n = out.get("wall", t.wall), out.get("cpu", t.cpu), out["units"]
            self.store().append([dict(
                row, status="ok", n_units=n, prompt_tokens=round(out["tokens"], 1), wall_s=round(wall, 4),
                cpu_s=round(cpu, 4), wall_s_per_unit=wall / n, cpu_s_per_unit=cpu / n,
                rss_before_gib=mem.start / 2**30, peak_rss_gib=mem.peak / 2**30,
                cell_maxrss_gib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
                cuda_peak_gib=(torch.cuda.max_memory_allocated() / 2**30) if cuda else "",
                load_avg_after=os.getloadavg()[0], detail=json.dumps(out.get("detail", {}), sort_keys=True))])
            print(f"  {a.model} L={length} {stage}: {cpu / n:.4g} CPU s / {wall / n:.4g} wall s per "
                  f"{UNITS[stage]} (n={n})", flush=True)
        return 0

    def report(self, df) -> str | None:
        return summarize(self, df, png=not self.args.no_png)


# ----------------------------------------------------------------------------------------------
# summary: tables, log-log fits, the sweep projection, the plot


def human(n: int) -> str:
    """134.5M, 1.71B, 38.2k."""
    for div, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= div * 0.9995:  # 999.9M is 1B, not "1e+03M"
            return f"{n / div:.3g}{suffix}"
    return str(n)


def fmt(x, digits: int = 3) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}g}"


def sweep_projection(fits: dict, target: str = "llama-3.1-8b", ref: str = "smollm2-135m") -> str:
    """The measured SmolLM2-135M baselines sweep scaled to ``target`` by (P_target / P_ref)^a; the
    method and its assumptions: docs/benchmarks.md, "scaling.py"."""
    import pandas as pd

    path = REPO / "benchmarks" / "results" / "baselines_smollm2-135m-instruct.csv"
    if not path.exists() or not all(s in fits for s in ("stage1", "stage2", "generate")):
        return ""
    b = pd.read_csv(path)
    fit_s, eval_s = float(b.fit_seconds.sum()), float((b.seconds_per_item * b.n).sum())
    p_t, p_r = (compute_params(SHAPES[m].fields, SHAPES[m].family) for m in (target, ref))
    r = {s: (p_t / p_r) ** fits[s]["a"] for s in ("stage1", "stage2", "generate")}
    lo, hi = (fit_s * f(r["stage1"], r["stage2"]) + eval_s * r["generate"] for f in (min, max))
    return (f"A {b.task.nunique()}-task × {b.method.nunique()}-method sweep on {target} ({p_t / p_r:.1f}× "
            f"SmolLM2-135M's P): measured on SmolLM2-135M {(fit_s + eval_s) / 3600:.1f} h "
            f"({fit_s / 3600:.1f} h "
            f"fitting, {eval_s / 3600:.1f} h evaluating); scaled by the exponents of stage 1 / stage 2 "
            f"(fitting) and generation: **{lo / 3600:,.0f}–{hi / 3600:,.0f} h** "
            f"({lo / 86400:,.1f}–{hi / 86400:,.1f} days).")


def summarize(exp: Scaling, df, *, png: bool = True) -> str | None:
    import pandas as pd

    ok = df[df.status == "ok"].copy()
    for c in ("cpu_s_per_unit", "wall_s_per_unit", "params_compute", "prompt_tokens",
              "peak_rss_gib", "cuda_peak_gib", "length"):
        ok[c] = pd.to_numeric(ok[c], errors="coerce")
    ok = ok.drop_duplicates("key", keep="last")  # a cell rerun keeps its last ok row
    if ok.empty:
        return None
    r0, cpu = ok.iloc[0], ok.device.iloc[0] == "cpu"
    ycol, basis = ("cpu_s_per_unit", "CPU seconds") if cpu else ("wall_s_per_unit", "wall seconds")
    mcol = "peak_rss_gib" if cpu else "cuda_peak_gib"
    models = [m for m in ORDER if m in set(ok.model)]
    exp.title = (f"Scaling: sitelens stages vs model size and prompt length ({r0.device}, "
                 f"{', '.join(sorted(set(ok.dtype)))})")
    mt = [{"model": m, "config of": r.hf, "params (HF)": human(int(r.params_hf)),
           "compute params P": human(int(r.params_compute)),
           "layers × heads (KV)": f"{int(r.n_layers)} × {int(r.n_heads)} ({int(r.n_kv_heads)})",
           "d_model / d_mlp / vocab": f"{int(r.d_model)} / {int(r.d_mlp)} / {int(r.d_vocab)}",
           "weights GiB": fmt(float(r.weights_gib))} for m in models for r in [ok[ok.model == m].iloc[0]]]
    lines = [f"{len(ok)} finished cells; **{basis}** per unit with {int(r0.threads)} thread(s) on {r0.host}, "
             f"torch {r0.torch}; sizes per cell `{r0.sizes}`.", "", "## Models", "",
             md_table(pd.DataFrame(mt)), ""]
    skipped = df[(df.status == "skipped") & ~df.key.isin(ok.key)]
    lines += [f"- **{m} skipped**: {g.reason.iloc[0]}." for m, g in skipped.groupby("model")] + [""] * (
        not skipped.empty)
    lengths = sorted(ok.length.dropna().astype(int).unique())

    def by_length(rows, value) -> str:
        return md_table(pd.DataFrame([{"model": m, **{f"L={L}": value(rows[(rows.model == m)
                                                                             & (rows.length == L)])
                                                      for L in lengths}} for m in models]))

    fits, lines = {}, lines + ["## Cost per unit", "", f"{basis} per unit by requested prompt length.", ""]
    for stage in STAGES:
        s = ok[ok.stage == stage]
        if s.empty:
            continue
        if f := xp.fit_power_law(s, ycol):
            fits[stage] = f
        tab = by_length(s, lambda v: fmt(float(v[ycol].iloc[0])) if len(v) else "—")
        lines += [f"### {stage} (per {UNITS[stage]})", "", tab, ""]
    lines += ["## Peak memory (GiB)", "", f"The largest `{mcol}` over the stages of a cell.", "",
              by_length(ok, lambda v: fmt(float(v[mcol].max())) if len(v) and v[mcol].notna().any() else "—"),
              ""]
    per_cell = ok.groupby(["model", "length"]).agg(
        params_compute=("params_compute", "first"), y=(mcol, "max")).reset_index()
    mem = xp.fit_power_law(per_cell.assign(prompt_tokens=per_cell.length.astype(float)), "y")
    ft = [(s, UNITS[s], f) for s, f in fits.items()]
    ft += [("peak memory", "GiB per cell (T = requested length)", mem)] if mem else []
    # the fits unrounded, for the pages that quote them (docs/claims.toml); the table rounds
    atomic_write_csv(exp.store().path.with_name("scaling_fits.csv"), pd.DataFrame(
        [{"stage": s, "unit": u, "a": f["a"], "b": f["b"], "r2": f["r2"], "cells": f["n"]}
         for s, u, f in ft]))
    ft = [{"stage": s, "unit": u, "a (params)": f"{f['a']:.2f}", "b (tokens)": "—" if math.isnan(f["b"])
           else f"{f['b']:.2f}", "R²": f"{f['r2']:.3f}", "cells": f["n"]} for s, u, f in ft]
    lines += ["## Log-log fits", "", f"log({basis} per unit) = c + a·log P + b·log T (T: measured prompt "
              "tokens), OLS per stage.", "", md_table(pd.DataFrame(ft)) if ft else "", ""]
    target = "llama-3.1-8b"
    if fits:
        p8 = compute_params(SHAPES[target].fields, SHAPES[target].family)
        pred = [{"stage": s, "unit": UNITS[s], **{f"{target}, T={T}": fmt(xp.predict(f, p8, T))
                                                  for T in (128, 1024)}} for s, f in fits.items()]
        lines += [f"Predicted {basis} per unit for {target} (P = {p8 / 1e9:.2f}B)"
                  + (":" if target in models else ", extrapolated:"), "", md_table(pd.DataFrame(pred)), ""]
    if proj := sweep_projection(fits) if cpu else "":
        lines += ["## What a sweep costs", "", proj, ""]
    stem = exp.store().path.with_suffix("")
    lines += [f"![scaling]({stem.name}.png)" if png else "", ""]
    write_plot(ok, fits, ycol, mcol, basis, stem, png=png)
    return "\n".join(lines)


def write_plot(ok, fits: dict, ycol: str, mcol: str, basis: str, stem: Path, *, png: bool) -> None:
    from sitelens.viz.export import write_figure_html
    from sitelens.viz.plotting import cost_scaling

    fig = cost_scaling(ok, fits, y=ycol, memory=mcol, basis=basis, stages=STAGES, units=UNITS,
                       predict=xp.predict)
    write_figure_html(fig, f"{stem}.html")
    if png:
        try:
            fig.write_image(f"{stem}.png", width=fig.layout.width, height=fig.layout.height)
        except Exception as e:  # kaleido / Chromium missing: the html is still written
            print(f"no png: {e}")


if __name__ == "__main__":
    raise SystemExit(Scaling().worker() if "--worker" in sys.argv else main(Scaling()))
