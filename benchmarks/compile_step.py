"""Stage 2's training step compiled with ``torch.compile`` against the eager step (issue 44: the
lever left for the official protocol's 400 batch-1 steps, whose eager ops each cost a dispatch).

    python benchmarks/compile_step.py --threads 1            # both bundled models
    python benchmarks/compile_step.py --report

The step is SITE's: the first-token loss of B zero-shot items under the α-mix, re-running only the
last token on the frozen prefix cache (:func:`sitelens.site.alpha.first_token_loss`), its backward
to α and an Adam step; B = 1 is the official protocol's batch, B = 8 the default's. Each cell runs
in a fresh process (the compile caches of one process would flatter the next): ``cold`` with an
empty Inductor cache folder (``TORCHINDUCTOR_CACHE_DIR``), ``warm`` a second process on the folder
the cold one filled, as a second run on the same machine would find it. In each process the eager
and the compiled step are timed interleaved (``--rounds`` rounds of ``--steps`` steps each, the
median of the rounds), so both see the same machine; ``compile_s`` is the first compiled call's
seconds (tracing, code generation, the C++ compiler) less one eager step; ``graphs`` and
``graph_breaks`` come from ``torch._dynamo.explain`` on the same call. The loss and α's gradient
of both at the same α are compared (``loss_abs_diff``, ``grad_max_abs_diff``): a compiled kernel
sums in another order, so they differ by float rounding. ``break_even_steps``: the steps after
which the compile has paid for itself (blank when the compiled step is not faster).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sitelens.pipelines.experiment import Experiment, Job, load_avg, main, md_table

BATCHES = (1, 8)


def inner(batch: int, steps: int, rounds: int, model_name: str, task_dir: str, threads: int) -> dict:
    """One process's measurement (its Inductor cache folder comes from the environment)."""
    import torch

    from sitelens.models import load_model, place_layer_rows
    from sitelens.site import task_embedding
    from sitelens.site.alpha import alpha_logit_rows, first_token_loss, site_mix
    from sitelens.site.training import LastTokenSet
    from sitelens.tasks import load_task

    torch.set_num_threads(threads)
    model = load_model(model_name)
    task = load_task(task_dir)
    target = place_layer_rows(task_embedding(model, task, n_prompts=8), model, dtype=torch.float32)
    rows = LastTokenSet.build(model, task.train[:batch])  # the same B items every step
    a = alpha_logit_rows(model, 0.0)  # L × [n_heads]
    opt = torch.optim.Adam(a, lr=0.2)

    def loss_of(a):
        return first_token_loss(model, rows.cache, rows.last, rows.answers,
                                site_mix([torch.sigmoid(r) for r in a], target))

    compiled = torch.compile(loss_of)

    def grads(fn) -> tuple[float, torch.Tensor]:
        loss = fn(a)
        g = torch.autograd.grad(loss, a)  # L × [n_heads]
        return float(loss), torch.stack(g)

    def step(fn) -> None:
        opt.zero_grad()
        fn(a).backward()
        opt.step()

    step(loss_of)  # first-call allocations, untimed
    t0 = time.perf_counter()
    step(loss_of)
    eager_one = time.perf_counter() - t0
    loss_e, grad_e = grads(loss_of)
    t0 = time.perf_counter()
    loss_c, grad_c = grads(compiled)  # the first compiled call: tracing and code generation
    first = time.perf_counter() - t0
    times: dict[str, list[float]] = {"eager": [], "compiled": []}
    for _ in range(rounds):
        for mode, fn in (("eager", loss_of), ("compiled", compiled)):
            t0 = time.perf_counter()
            for _ in range(steps):
                step(fn)
            times[mode].append((time.perf_counter() - t0) / steps * 1000)
    explained = torch._dynamo.explain(loss_of)(a)
    return {
        "eager_ms": statistics.median(times["eager"]), "compiled_ms": statistics.median(times["compiled"]),
        "compile_s": max(0.0, first - eager_one), "graphs": explained.graph_count,
        "graph_breaks": explained.graph_break_count,
        "loss_abs_diff": abs(loss_e - loss_c),
        "grad_max_abs_diff": float((grad_e - grad_c).abs().max()),
        "grad_max_abs": float(grad_e.abs().max()),
        "torch": torch.__version__,
    }


class CompileStep(Experiment):
    name, title = "compile_step", "Stage 2's step: torch.compile against eager"
    columns = ("key model task batch cache threads load_avg_1min eager_ms_per_step compiled_ms_per_step "
               "speedup compile_s break_even_steps graphs graph_breaks loss_abs_diff "
               "grad_max_abs_diff grad_max_abs torch").split()
    models = ("smollm2-135m-instruct", "gemma-3-270m")

    def add_arguments(self, p) -> None:
        p.add_argument("--task", default="country-capital")
        p.add_argument("--steps", type=int, default=10, help="steps per timed round")
        p.add_argument("--rounds", type=int, default=5)

    def cells(self, args):
        return [Job(f"{m}/{args.task}", params={"model": m}) for m in args.models]

    def run(self, job: Job) -> list[dict]:
        a = self.args
        task_dir = str(Path(a.data_root) / "fv" / a.task)
        out = []
        for batch in BATCHES:
            with tempfile.TemporaryDirectory(prefix="sitelens-inductor-") as cache:
                for kind in ("cold", "warm"):  # the warm process finds what the cold one wrote
                    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
                    load0 = load_avg()
                    spec = json.dumps([batch, a.steps, a.rounds, job["model"], task_dir, a.threads or 1])
                    proc = subprocess.run([sys.executable, __file__, "--inner", spec], env=env,
                                          capture_output=True, text=True, check=True)
                    r = json.loads(proc.stdout.strip().splitlines()[-1])
                    gain = r["eager_ms"] - r["compiled_ms"]
                    out.append(dict(
                        key=job.key, model=job["model"], task=a.task, batch=batch, cache=kind,
                        threads=a.threads or 1,
                        load_avg_1min=load0, eager_ms_per_step=round(r["eager_ms"], 1),
                        compiled_ms_per_step=round(r["compiled_ms"], 1),
                        speedup=round(r["eager_ms"] / r["compiled_ms"], 2),
                        compile_s=round(r["compile_s"], 1),
                        break_even_steps=round(r["compile_s"] * 1000 / gain) if gain > 0 else None,
                        graphs=r["graphs"], graph_breaks=r["graph_breaks"],
                        loss_abs_diff=f"{r['loss_abs_diff']:.2e}",
                        grad_max_abs_diff=f"{r['grad_max_abs_diff']:.2e}",
                        grad_max_abs=f"{r['grad_max_abs']:.2e}", torch=r["torch"]))
                    print(f"  batch {batch} {kind}: eager {r['eager_ms']:.1f} ms, compiled "
                          f"{r['compiled_ms']:.1f} ms, compile {r['compile_s']:.1f} s", flush=True)
        return out

    def report(self, df) -> str:
        c = df.iloc[0]
        return (f"`{c.task}`, {c.threads} torch thread(s), PyTorch {c.torch}; "
                f"{self.args.rounds} interleaved rounds of {self.args.steps} steps per process, "
                "medians. Each row is a fresh process; `cold`: an empty Inductor cache, `warm`: the "
                "cache the cold process filled. Load average: the 1-minute average before each "
                "process (a moving average that lags the machine).\n\n"
                f"{md_table(df.drop(columns=['key']))}\n\n"
                "What the columns mean: the script's docstring.\n")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--inner"]:
        print(json.dumps(inner(*json.loads(sys.argv[2]))))
        raise SystemExit(0)
    raise SystemExit(main(CompileStep()))
