"""Load from the processed-weight cache in parts (imports, ``load_model``, first forward, then a
warm second load and forward in the same process), ``--repeats`` fresh processes per bundled
model, medians and the load average before each (``scripts/profile_load.py`` profiles a load).

    python benchmarks/load_time.py            # replaces results/load_time.csv and .md
"""
import subprocess
import sys

import pandas as pd

from sitelens.pipelines import experiment as xp
from sitelens.pipelines.experiment import Experiment, Job, main, md_table

CHILD = """import gc, json, time
t0 = time.perf_counter()
import torch; torch.set_num_threads({threads})
import sitelens, transformer_lens, transformers, safetensors, tokenizers
from sitelens.models import encode, load_model
r = dict(imports_s=time.perf_counter() - t0)
def timed(key, f):
    c, t = time.process_time(), time.perf_counter(); out = f()
    r[key], r[key[:-2] + "_cpu_s"] = time.perf_counter() - t, time.process_time() - c; return out
def forward(m):
    enc = encode(m, ["Q: France\\nA:"])
    with torch.no_grad(): m(enc.tokens, attention_mask=enc.attention_mask)
m = timed("load_s", lambda: load_model({name!r})); timed("first_forward_s", lambda: forward(m))
del m; gc.collect()
m = timed("warm_load_s", lambda: load_model({name!r})); timed("warm_first_forward_s", lambda: forward(m))
print(json.dumps(r))"""
PHASES = ["imports_s", "load_s", "load_cpu_s", "first_forward_s", "warm_load_s", "warm_first_forward_s"]


class LoadTime(Experiment):
    name, title, key, replace, threads = "load_time", "Model load times", None, True, 2
    columns = ["model", "run", *PHASES, "threads", "load_average", "torch", "date"]
    models = ("smollm2-135m-instruct", "gemma-3-270m")

    def add_arguments(self, parser) -> None:
        parser.add_argument("--repeats", type=int, default=5, help="fresh processes per model")

    def cells(self, args):
        return [Job(m, m, {"model": m}) for m in args.models]

    def child(self, name: str) -> str:
        code = CHILD.format(name=name, threads=self.args.threads)
        return subprocess.run([sys.executable, "-c", code], env=xp.worker_env(self.args.threads),
                              capture_output=True, text=True, check=True).stdout

    def run(self, job: Job) -> list[dict]:
        import torch

        self.child(job["model"])  # builds a missing cache; warms the page cache
        runs = [(xp.load_avg(), xp.json_lines(self.child(job["model"]))[-1])
                for _ in range(self.args.repeats)]
        return [{"model": job["model"], "run": i, **{k: round(m[k], 3) for k in PHASES},
                 "threads": self.args.threads, "load_average": la, "torch": torch.__version__,
                 "date": xp.now("%Y-%m-%d")} for i, (la, m) in enumerate(runs)]

    def report(self, df: pd.DataFrame) -> str:
        med = df.groupby("model", sort=False)[PHASES].median().round(2).reset_index()
        med["load average"] = df.groupby("model", sort=False)["load_average"].agg(
            lambda s: f"{s.min():.1f}–{s.max():.1f}").values
        return ("Seconds, median of the fresh processes (every run below). `load average`: the 1-minute "
                "load average before each run; other jobs on the machine inflate wall times (`load_cpu_s` "
                f"much less).\n\n{md_table(med)}\n\nEvery run:\n\n{md_table(df)}\n")


if __name__ == "__main__":
    raise SystemExit(main(LoadTime()))
