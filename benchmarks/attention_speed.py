"""Forward-pass time and peak memory: TransformerLens's attention vs sitelens's fused fast path.

    python benchmarks/attention_speed.py --threads 1          # SmolLM2, squad_val 0/1/3/10-shot prompts
    python benchmarks/attention_speed.py --tiny               # smoke test on a tiny random model

One prompt per forward pass (batch 1, no padding: the fast path's ``is_causal`` kernel) and, with
``--batches 1,2``, a padded batch of two (the masked kernel). Each configuration runs ``--repeats``
timed passes (the first included); the median is reported, with the max |Δ log-prob| between the
two paths at the last position. Appends to ``results/attention_speed.csv``, rewrites ``.md``.
"""

import os
import statistics
import time

import pandas as pd

from sitelens.models import DEFAULT_MODEL
from sitelens.pipelines.experiment import Experiment, Job, PeakRSS, main, md_table


def time_forward(model, enc, repeats: int):
    """Median seconds of ``repeats`` no-grad forward passes, the peak RSS (GiB) over them and the
    last-position log-probs of the first."""
    import torch

    times, out = [], None
    with torch.no_grad(), PeakRSS() as mem:
        for _ in range(max(1, repeats)):
            t0 = time.perf_counter()
            logits = model(enc.tokens, attention_mask=enc.attention_mask)
            times.append(time.perf_counter() - t0)
            if out is None:
                out = logits[:, -1].log_softmax(-1)
    return statistics.median(times), mem.peak / 2**30, out


class AttentionSpeed(Experiment):
    name, title = "attention_speed", "Forward pass: TransformerLens attention vs the fused fast path"
    columns = ["model", "task", "shots", "batch", "tokens", "path", "threads", "seconds", "peak_rss_gib",
               "max_abs_dlogprob", "load_avg"]
    key, threads = None, None

    def add_arguments(self, p) -> None:
        p.add_argument("--model", default=DEFAULT_MODEL)
        p.add_argument("--task", default=None, help="default {data-root}/fv/squad_val")
        p.add_argument("--shots", default="0,1,3,10", help="comma-separated demonstration counts")
        p.add_argument("--batches", default="1,2", help="comma-separated batch sizes")
        p.add_argument("--repeats", type=int, default=2)
        p.add_argument("--n-ctx", type=int, default=4096)
        p.add_argument("--tiny", action="store_true", help="tiny model, built-in task (not a benchmark)")

    def configure(self, args) -> None:
        if args.tiny:
            args.out, args.shots, args.batches, args.repeats = args.out / "tiny", "1,3", "1,2", 1

    def cells(self, args):
        return [Job("all")]

    def run(self, job: Job) -> list[dict]:
        import torch

        from sitelens.models import encode, load_model, model_name
        from sitelens.models.attention import enable_fast_attention
        from sitelens.tasks import few_shot_prompts, load_task
        from sitelens.testing import tiny_model

        a = self.args
        if a.tiny:
            model, task = tiny_model(backend="hooked"), load_task("antonym")
        else:
            model = load_model(a.model, n_ctx=a.n_ctx, backend="hooked")
            task = load_task(a.task or a.data_root / "fv" / "squad_val", dedupe=True)
        load, rows = round(os.getloadavg()[0], 2), []
        for k in [int(s) for s in a.shots.split(",")]:
            prompts = few_shot_prompts(task, task.test[:2], k, seed=0)
            for batch in [int(b) for b in a.batches.split(",")]:
                enc = encode(model, prompts[:batch])
                res = {}
                for fast in (False, True):
                    enable_fast_attention(model, fast)
                    res[fast] = time_forward(model, enc, a.repeats)
                enable_fast_attention(model, True)
                diff = (res[False][2] - res[True][2]).abs().max().item()
                for fast in (False, True):
                    rows.append({"model": model_name(model), "task": task.name, "shots": k, "batch": batch,
                                 "tokens": int(enc.tokens.shape[1]),
                                 "path": "fused" if fast else "transformerlens",
                                 "threads": torch.get_num_threads(), "seconds": round(res[fast][0], 3),
                                 "peak_rss_gib": round(res[fast][1], 2), "max_abs_dlogprob": f"{diff:.2e}",
                                 "load_avg": load})
                    print(rows[-1], flush=True)
        return rows

    def report(self, df: pd.DataFrame) -> str:
        return (f"Every run appends; `seconds` is the median no-grad forward pass, `max_abs_dlogprob` the "
                f"largest last-position log-prob difference between the paths.\n\n{md_table(df)}\n")


if __name__ == "__main__":
    raise SystemExit(main(AttentionSpeed()))
