"""Per-head causal effects: batched (heads in rows of one forward pass, prefix KV cache) vs the
serial loop (one full forward pass per head).

    python benchmarks/patching_speed.py --n-prompts 2 --n-mean-prompts 20 --threads 1  # the committed run
    python benchmarks/patching_speed.py --tiny --out /tmp/ps                            # smoke test

``forward_passes`` is the number of model calls ``head_causal_effects`` counted (a forward
pre-hook), not a formula. The task-mean activation is computed once, outside the timed region, and
both modes see the same corrupted prompts, so their effect maps must agree (max |Δ| is reported).
Writes ``results/patching_speed.csv`` (the latest run) and ``.md``.
"""

import pandas as pd

from sitelens.models import DEFAULT_MODEL
from sitelens.pipelines.experiment import Clock, Experiment, Job, load_avg, main, md_table

COLS = ["mode", "forward_passes", "rows", "seconds", "seconds_per_head", "speedup_vs_serial",
        "cpu_seconds", "cpu_speedup_vs_serial"]


class PatchingSpeed(Experiment):
    name, title = "patching_speed", "Per-head causal effects: batched vs serial"
    columns = ["model", "task", "n_prompts", "n_shots", "n_layers", "n_heads", "n_heads_total", "batch_size",
               "threads", "device", "torch", "load_seconds", "load_avg_1min", "load_avg_1min_after", "mode",
               "forward_passes", "rows", "seconds", "seconds_per_head", "speedup_vs_serial", "cpu_seconds",
               "cpu_speedup_vs_serial", "max_abs_diff_vs_serial", "baseline_prob"]
    key, replace, threads = None, True, None

    def add_arguments(self, p) -> None:
        p.add_argument("--model", default=DEFAULT_MODEL)
        p.add_argument("--task", default="antonym")
        p.add_argument("--n-prompts", type=int, default=8)
        p.add_argument("--n-shots", type=int, default=10)
        p.add_argument("--n-mean-prompts", type=int, default=50)
        p.add_argument("--batch-size", type=int, default=64, help="rows per batched forward pass")
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--tiny", action="store_true", help="tiny random model and sizes (not a benchmark)")

    def cells(self, args):
        return [Job(f"{args.model}/{args.task}")]

    def run(self, job: Job) -> list[dict]:
        import torch

        from sitelens.models import load_model, model_name
        from sitelens.patching import corrupted_prompts, head_causal_effects, patched_last_logits
        from sitelens.site import task_embedding
        from sitelens.tasks import load_task
        from sitelens.testing import tiny_model

        a = self.args
        with Clock() as load:
            if a.tiny:
                model = tiny_model(n_layers=4, n_heads=4, d_head=8, n_key_value_heads=2)
                a.n_prompts, a.n_shots, a.n_mean_prompts = 2, 2, 2
            else:
                model = load_model(a.model)
        task = load_task(a.task)
        emb = task_embedding(model, task, n_prompts=a.n_mean_prompts, n_shots=a.n_shots,
                             seed=a.seed)  # [n_layers, n_heads, d_head]
        # warm-up (first-call allocations) outside the timed region
        prompts = corrupted_prompts(model, task, n_prompts=1, n_shots=a.n_shots, seed=a.seed)[0]
        patched_last_logits(model, prompts, use_cache=False)
        kw = dict(n_prompts=a.n_prompts, n_shots=a.n_shots, seed=a.seed, embedding=emb,
                  batch_size=a.batch_size, return_stats=True)
        load0, out = load_avg(), {}
        for batched in (True, False):
            with Clock() as t:
                out[batched] = head_causal_effects(model, task, batched=batched, **kw)
            out[batched][1]["cpu_seconds"] = t.cpu
        (eff_b, st_b), (eff_s, st_s) = out[True], out[False]
        common = {"model": model_name(model), "task": task.name, "n_prompts": a.n_prompts,
                  "n_shots": a.n_shots, "n_layers": model.cfg.n_layers, "n_heads": model.cfg.n_heads,
                  "n_heads_total": st_b["n_heads_total"], "batch_size": a.batch_size,
                  "threads": torch.get_num_threads(), "device": str(model.cfg.device),
                  "torch": torch.__version__,
                  "load_seconds": 0.0 if a.tiny else round(load.wall, 2), "load_avg_1min": load0,
                  "load_avg_1min_after": load_avg()}
        diff = float((eff_b - eff_s).abs().max())
        return [{**common, "mode": st["mode"], "forward_passes": st["forward_passes"], "rows": st["rows"],
                 "seconds": round(st["seconds"], 3),
                 "seconds_per_head": round(st["seconds"] / st["n_heads_total"], 5),
                 "speedup_vs_serial": round(st_s["seconds"] / st["seconds"], 2),
                 "cpu_seconds": round(st["cpu_seconds"], 3),
                 "cpu_speedup_vs_serial": round(st_s["cpu_seconds"] / st["cpu_seconds"], 2),
                 "max_abs_diff_vs_serial": diff, "baseline_prob": round(st["baseline_prob"], 5)}
                for st in (st_s, st_b)]

    def report(self, df: pd.DataFrame) -> str:
        c, b = df.iloc[0], df[df["mode"] == "batched"].iloc[-1]
        return "\n".join([
            *(["**Smoke test on a tiny random model (--tiny): not a benchmark.**", ""] * self.args.tiny),
            f"`{c.model}` ({c.n_heads_total} heads), task `{c.task}`, {c.n_prompts} corrupted "
            f"{c.n_shots}-shot "
            f"prompts, {c.batch_size} rows per batched pass, {c.threads} thread(s) on {c.device}, torch "
            f"{c.torch}; load average {c.load_avg_1min:.2f} before, {c.load_avg_1min_after:.2f} after.", "",
            md_table(df[COLS]), "",
            f"Batched is **{b.speedup_vs_serial:.1f}×** faster in wall-clock time and "
            f"**{b.cpu_speedup_vs_serial:.1f}×** in CPU time; the effect maps agree to max |Δ| = "
            f"{c.max_abs_diff_vs_serial:.2e}.", ""])


if __name__ == "__main__":
    raise SystemExit(main(PatchingSpeed()))
