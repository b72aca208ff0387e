"""Model load times: the first load (GGUF dequantized and converted, weights written to a fresh
cache) and the second (from that cache), for both bundled models, each in a fresh process with
``SITELENS_CACHE`` a new temporary directory; the load average before each is recorded.

    python benchmarks/load_time.py            # appends to results/load_time.csv, writes load_time.md
"""

from __future__ import annotations

import subprocess
import sys
import tempfile

import pandas as pd

from sitelens.pipelines import experiment as xp
from sitelens.pipelines.experiment import Experiment, Job, main, md_table

CHILD = (
    "import json, time, torch; torch.set_num_threads({threads}); t = time.perf_counter(); "
    "import sitelens; t1 = time.perf_counter(); m = sitelens.load_model({name!r}); "
    "print(json.dumps({{'seconds': time.perf_counter() - t1, 'import_seconds': t1 - t}}))"
)


class LoadTime(Experiment):
    name, title = "load_time", "Model load times"
    columns = ["model", "load", "seconds", "import_seconds", "threads", "load_average", "torch", "date"]
    key = None
    models = ("smollm2-135m-instruct", "gemma-3-270m")
    threads = 2

    def cells(self, args):
        return [Job(m, m, {"model": m}) for m in args.models]

    def run(self, job: Job) -> list[dict]:
        import torch

        rows, name, threads = [], job["model"], self.args.threads
        with tempfile.TemporaryDirectory() as cache:
            for kind in ("first (convert + write cache)", "second (from cache)"):
                la = xp.load_avg()
                out = subprocess.run([sys.executable, "-c", CHILD.format(name=name, threads=threads)],
                                     env=xp.worker_env(None, SITELENS_CACHE=cache), capture_output=True,
                                     text=True, check=True).stdout
                m = xp.json_lines(out)[-1]
                rows.append({"model": name, "load": kind, "seconds": round(m["seconds"], 2),
                             "import_seconds": round(m["import_seconds"], 2), "threads": threads,
                             "load_average": la, "torch": torch.__version__, "date": xp.now("%Y-%m-%d")})
                print(f"{name} {kind}: {m['seconds']:.2f}s (load average {la:.1f})")
        return rows

    def report(self, df: pd.DataFrame) -> str:
        return (f"Each load in a fresh process with a new `SITELENS_CACHE`; every run appends.\n\n"
                f"{md_table(df)}\n")


if __name__ == "__main__":
    raise SystemExit(main(LoadTime()))
