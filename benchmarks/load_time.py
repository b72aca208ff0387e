"""Load from the processed-weight cache in parts (imports, ``load_model``, first forward, warm second load
and forward) per bundled model, and start-up (``python -c "import sitelens"``, ``python -m sitelens.cli
--help``): ``--repeats`` fresh processes each, medians, load averages (``scripts/profile_load.py``).

    python benchmarks/load_time.py            # replaces results/load_time.csv and .md
"""
import subprocess
import sys

import pandas as pd
import torch

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
STARTUP = {"import sitelens": ["-c", "import sitelens"], "sitelens --help": ["-m", "sitelens.cli", "--help"]}
PHASES = ["imports_s", "load_s", "load_cpu_s", "first_forward_s", "warm_load_s", "warm_first_forward_s"]


class LoadTime(Experiment):
    name, title, key, replace, threads = "load_time", "Model load times", None, True, 2
    columns = ["model", "run", *PHASES, "command", "wall_s", "threads", "load_average", "torch", "date"]
    models = ("smollm2-135m-instruct", "gemma-3-270m")

    def add_arguments(self, parser) -> None:
        parser.add_argument("--repeats", type=int, default=5, help="fresh processes per model and command")

    def cells(self, args):
        return [*(Job(m, m, {"model": m}) for m in args.models), Job("start-up", "start-up")]

    def child(self, name: str) -> str:
        code = CHILD.format(name=name, threads=self.args.threads)
        return subprocess.run([sys.executable, "-c", code], env=xp.worker_env(self.args.threads),
                              capture_output=True, text=True, check=True).stdout

    def run(self, job: Job) -> list[dict]:
        common = {"threads": self.args.threads, "torch": torch.__version__, "date": xp.now("%Y-%m-%d")}
        if job.key == "start-up":  # interpreter start included
            return [{**r, **common} for r in xp.time_commands(STARTUP, self.args.repeats, self.args.threads)]
        self.child(job["model"])  # builds a missing cache; warms the page cache
        runs = [(xp.load_avg(), xp.json_lines(self.child(job.key))[-1]) for _ in range(self.args.repeats)]
        return [{"model": job["model"], "run": i, **{k: round(m[k], 3) for k in PHASES}, "load_average": la,
                 **common} for i, (la, m) in enumerate(runs)]

    def report(self, df: pd.DataFrame) -> str:
        def medians(d, by, cols):
            return md_table(d.groupby(by, sort=False).agg(**{c: (c, "median") for c in cols}, load_average=(
                "load_average", lambda s: f"{s.min():.1f}–{s.max():.1f}")).round(2).reset_index())
        up, df = df[df.command.notna()], df[df.model.notna()].drop(columns=["command", "wall_s"])
        return ("Seconds, median of the fresh processes (every run below). `load_average`: the 1-minute "
                "load average before each run; other jobs on the machine inflate wall times (`load_cpu_s` "
                f"much less).\n\n{medians(df, 'model', PHASES)}\n\nStart-up, each command a whole fresh "
                f"process (`wall_s`):\n\n{medians(up, 'command', ['wall_s'])}\n\nEvery run:\n\n"
                f"{md_table(df)}\n\n{md_table(up[['command', 'run', 'wall_s', 'load_average', 'date']])}\n")


if __name__ == "__main__":
    raise SystemExit(main(LoadTime()))
