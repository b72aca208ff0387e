"""TransformerLens 4 (TransformerBridge) vs TransformerLens 3.9 (HookedTransformer): fit,
evaluation, patching and head effects, same task, same threads, same accuracy (target: bridge ≤ 1.2×).

    nice -n 10 .venv/bin/python benchmarks/bridge_speed.py --threads 1   # --resume continues the latest run

Each backend runs in its own process and venv (HookedTransformer from ``.venv-tl39``, made by
``bash scripts/test_tl39.sh``; the bridge from ``.venv``, TransformerLens 4, made by
``bash scripts/setup.sh``), back to back per model and repeat, alternating which goes first. The
stages and what each accuracy is: docs/benchmarks.md, "bridge_speed.py".
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd

from sitelens.pipelines import experiment as xp
from sitelens.pipelines.experiment import REPO, Clock, Experiment, Job, main, md_table

MODELS = ("smollm2-135m-instruct", "gemma-3-270m")
VENVS = {"hooked": REPO / ".venv-tl39", "bridge": REPO / ".venv"}
STAGES = ("fit", "evaluate", "patching", "effects")
FIELDS = ["run", "commit", "model", "backend", "transformer_lens", "transformers", "threads",
          "repeat", "order", "stage", "items", "wall_seconds", "cpu_seconds", "wall_per_item",
          "cpu_per_item", "accuracy", "detail", "load_avg_1min"]
TARGET = 1.2


def worker(args) -> None:
    """Run every stage on one model and backend; print one JSON line per stage."""
    import importlib.metadata as md

    from sitelens import FitConfig, fit_site, load_model, load_task
    from sitelens.eval.evaluation import evaluate
    from sitelens.models import kv
    from sitelens.patching import intra_task
    from sitelens.patching.effects import head_causal_effects

    versions = {k: md.version(d) for k, d in (("transformer_lens", "transformer-lens"),
                                              ("transformers", "transformers"))}
    model = load_model(args.model, backend=args.backend)
    cache = ("TransformerLens" if args.backend == "hooked"
             else "Hugging Face" if kv.drive_hf_cache(model) else "recompute")
    task = load_task(Path(args.task), dedupe=True) if Path(args.task).is_dir() else load_task(args.task)

    def emit(stage, items, t, accuracy, detail):
        print(json.dumps({"stage": stage, "items": items, "wall_seconds": round(t.wall, 3),
                          "cpu_seconds": round(t.cpu, 3), "accuracy": accuracy,
                          "detail": f"{detail} [KV cache: {cache}]", "load_avg_1min": xp.load_avg(),
                          **versions}), flush=True)

    with Clock() as t:
        adapter = fit_site(model, task, config=FitConfig(seed=0))
    meta = adapter.meta
    emit("fit", 1, t, round(float(meta["final_valid_loss"]), 4),
         f"stage1 {meta['stage1_seconds']:.1f} s, stage2 {meta['stage2_seconds']:.1f} s; "
         f"top-5 heads {[(int(a), int(b)) for a, b, _ in adapter.top_heads(5)]}")
    with Clock() as t:
        df = evaluate(model, task, adapter=adapter, limit=args.limit, labels=None)
    emit("evaluate", int(df.groupby("method").size().iloc[0]), t, round(float(df.correct.mean()), 4),
         "; ".join(f"{m} {v:.3f}" for m, v in df.groupby("method").correct.mean().items()))
    with Clock() as t:
        intra = intra_task(model, task, adapter, limit=args.limit, n_boot=100)
    site = intra[intra.selection == "site"].accuracy
    emit("patching", args.limit, t, round(float(site.iloc[0]), 4) if len(site) else "",
         f"{len(intra)} conditions; accuracy summed over conditions {intra.accuracy.sum():.3f}")
    with Clock() as t:
        eff = head_causal_effects(model, task, embedding=adapter.embedding, n_prompts=args.effect_prompts,
                                  seed=0)
    flat = eff.flatten()
    top = [divmod(int(i), eff.shape[1]) for i in flat.argsort(descending=True)[:5]]
    emit("effects", args.effect_prompts, t, round(float(flat.max()), 4),
         f"top-5 heads {top}; mean effect {float(flat.mean()):.5f}")


def commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, text=True,
                             capture_output=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "sitelens"], cwd=REPO,
                               text=True, capture_output=True).stdout.strip()
        return out + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


class BridgeSpeed(Experiment):
    name = "bridge_speed"
    title = "TransformerBridge (TransformerLens 4) vs HookedTransformer (TransformerLens 3.9)"
    columns = FIELDS
    key = None  # a measurement log: every run appends
    models = MODELS
    limit = 50

    def add_arguments(self, p) -> None:
        p.add_argument("--task", default=None, help="default {data-root}/fv/country-capital")
        p.add_argument("--repeats", type=int, default=2)
        p.add_argument("--effect-prompts", type=int, default=4)
        p.add_argument("--resume", action="store_true",
                       help="continue the latest run in the CSV (its finished workers are kept)")
        p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
        p.add_argument("--model", help=argparse.SUPPRESS)
        p.add_argument("--backend", help=argparse.SUPPRESS)

    def configure(self, args) -> None:
        args.task = args.task or str(args.data_root / "fv" / "country-capital")

    def cells(self, args):
        self.run_id, self.commit, done = xp.now("%Y-%m-%dT%H:%M:%SZ"), commit(), set()
        prev = self.read()
        if args.resume and len(prev):  # continue the latest run: skip its finished workers
            self.run_id = prev.run.iloc[-1]
            counts = prev[prev.run == self.run_id].groupby(["model", "backend", "repeat"]).stage.nunique()
            done = {k for k, n in counts.items() if n == len(STAGES)}
        for model in args.models:
            for rep in range(args.repeats):
                order = ("hooked", "bridge") if rep % 2 == 0 else ("bridge", "hooked")
                for pos, backend in enumerate(order):
                    if (model, backend, rep) not in done:
                        yield Job(f"{model}/{backend}/{rep}", f"[{backend}] {model} repeat {rep}",
                                  dict(model=model, backend=backend, repeat=rep, order=pos))

    def run(self, job: Job) -> list[dict]:
        a, backend = self.args, job["backend"]
        py = VENVS[backend] / "bin" / "python"
        if not py.exists():
            sys.exit(f"bridge_speed: {py} is missing (make .venv with scripts/setup.sh, .venv-tl39 with "
                     "scripts/test_tl39.sh)")
        cmd = [str(py), str(Path(__file__).resolve()), "--worker", "--model", job["model"], "--backend",
               backend, "--threads", str(a.threads), "--task", a.task, "--limit", str(a.limit),
               "--effect-prompts", str(a.effect_prompts)]
        env = xp.worker_env(a.threads, SITELENS_BACKEND=backend)
        proc = subprocess.run(cmd, cwd=REPO, text=True, capture_output=True, env=env)
        if proc.returncode != 0:
            sys.exit(f"bridge_speed: the {backend} worker failed:\n{proc.stderr[-4000:]}")
        rows = xp.json_lines(proc.stdout)
        for r in rows:
            print(f"  {r['stage']:9s} wall {r['wall_seconds']:8.2f} s  cpu {r['cpu_seconds']:8.2f} s  "
                  f"acc {r['accuracy']}  {r['detail']}", flush=True)
        return [{**r, "run": self.run_id, "commit": self.commit, "model": job["model"], "backend": backend,
                 "threads": a.threads, "repeat": job["repeat"], "order": job["order"],
                 "wall_per_item": round(r["wall_seconds"] / max(int(r["items"]), 1), 4),
                 "cpu_per_item": round(r["cpu_seconds"] / max(int(r["items"]), 1), 4)} for r in rows]

    def report(self, df: pd.DataFrame) -> str:
        return report(df)


def report(df: pd.DataFrame) -> str:
    """The latest run: minimum over repeats, bridge / HookedTransformer ratios."""
    run = df.run.iloc[-1]
    df = df[df.run == run]
    best = df.groupby(["model", "stage", "backend"]).agg(
        wall=("wall_seconds", "min"), cpu=("cpu_seconds", "min"), items=("items", "first"),
        accuracy=("accuracy", "first"), detail=("detail", "first"), tl=("transformer_lens", "first"),
        tf=("transformers", "first")).reset_index()
    rows = []
    for (model, stage), g in best.groupby(["model", "stage"], sort=False):
        if not {"hooked", "bridge"} <= set(g.backend):
            continue
        h, b = g[g.backend == "hooked"].iloc[0], g[g.backend == "bridge"].iloc[0]
        per = stage == "evaluate"
        unit = (lambda x, n=h["items"]: f"{x / n:.4f}") if per else (lambda x: f"{x:.2f}")
        rows.append({"model": model, "stage": stage + (" (s / item)" if per else " (s)"),
                     "HookedTransformer CPU": unit(h.cpu), "bridge CPU": unit(b.cpu),
                     "ratio CPU": f"{b.cpu / h.cpu:.2f}",
                     "HookedTransformer wall": unit(h.wall), "bridge wall": unit(b.wall),
                     "ratio wall": f"{b.wall / h.wall:.2f}",
                     "≤ 1.2×": "yes" if b.cpu / h.cpu <= TARGET else "**no**",
                     "accuracy HT / bridge": f"{h.accuracy} / {b.accuracy}"})
    met = sum(r["≤ 1.2×"] == "yes" for r in rows)
    tl = dict(zip(best.backend, zip(best.tl, best.tf)))
    # "[(12, 1), ...] [KV cache: X]" reads as a reference-style link in Markdown (mkdocs --strict)
    details = best[["model", "stage", "backend", "detail"]].assign(
        detail=best.detail.str.replace(r"\[KV cache: ([^\]]*)\]", r"(KV cache: \1)", regex=True))
    return "\n".join([
        f"Run {run}, code {df.commit.iloc[0]}; TransformerLens {tl.get('hooked', ('?',))[0]} "
        "(HookedTransformer) "
        f"vs {tl.get('bridge', ('?', '?'))[0]} (bridge, transformers {tl.get('bridge', ('?', '?'))[1]}); "
        f"{int(df.threads.iloc[0])} thread(s), minimum over repeats; the verdict uses the CPU-time ratio: "
        f"{met} of {len(rows)} stages within {TARGET}×.", "",
        md_table(pd.DataFrame(rows)), "", "## What each backend computed", "", md_table(details), ""])


if __name__ == "__main__":
    if "--worker" in sys.argv:
        exp = BridgeSpeed()
        args = exp.parser().parse_args()
        exp.configure(args)
        import torch

        torch.set_num_threads(args.threads)
        worker(args)
    else:
        raise SystemExit(main(BridgeSpeed()))
