"""The thread count of ``sitelens run`` (issue 43, point 4): torch's own default (one thread per
core), one thread, and the CLI's default (``sitelens.threads.default_threads``: the usable cores
minus the busy ones), each on a quiet machine and beside one busy process (a second process
spinning on one core, as another job on a shared machine would).

    python benchmarks/threads.py            # appends to results/threads.csv, rewrites threads.md

Each cell is a whole ``sitelens run --methods site`` process (load, stage 1, the α fit, SITE's
evaluation on the first ``--limit`` test items) on a fresh output folder; the load average before
it is recorded, since a machine that is not quiet makes every number here larger. The accuracy
column shows that the threads change the time, not the result.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time

import pandas as pd

from sitelens.pipelines import experiment as xp
from sitelens.pipelines.experiment import Experiment, Job, main, md_table

SETTINGS = {"torch default": None, "1": "1", "CLI default (auto)": "auto"}
BUSY = "while True: pass"


class Threads(Experiment):
    name, title, key = "threads", "Threads: torch's default, one, and the CLI's default", None
    columns = ["setting", "threads_flag", "busy_processes", "wall_s", "exact_match", "load_average",
               "cores", "host", "torch", "date"]
    models, tasks, limit = ("smollm2-135m-instruct",), ("antonym",), 20

    def add_arguments(self, p) -> None:
        p.add_argument("--repeats", type=int, default=1, help="runs per cell")
        p.add_argument("--tiny", action="store_true", help="the tiny random model (a smoke test)")

    def cells(self, args):
        for busy in (0, 1):
            for setting in SETTINGS:
                yield Job(f"{setting}/{busy}", f"{setting}, {busy} busy process(es)",
                          {"setting": setting, "busy": busy})

    def command(self, out: str, setting: str) -> list[str]:
        model = "tiny-random" if self.args.tiny else self.args.models[0]
        argv = [sys.executable, "-m", "sitelens.cli", "run", "--model", model, "--task",
                self.args.tasks[0], "--methods", "site", "--limit", str(self.args.limit), "--out", out,
                "--json"]
        flag = SETTINGS[setting]
        if flag == "auto":
            return argv  # the CLI's default
        if flag is None:  # torch's own default: one thread per core, as before the CLI chose
            import os

            return argv + ["--threads", str(os.cpu_count() or 1)]
        return argv + ["--threads", flag]

    def run(self, job: Job) -> list[dict]:
        import torch

        from sitelens.threads import usable_cores

        cores = usable_cores()
        n_cores = len(cores) if isinstance(cores, set) else cores

        spinners = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(job["busy"])]
        rows = []
        try:
            if spinners:
                time.sleep(5)  # let the spinner reach its core before timing
            for _ in range(self.args.repeats):
                with tempfile.TemporaryDirectory() as out:
                    la, t0 = xp.load_avg(), time.perf_counter()
                    done = subprocess.run(self.command(out, job["setting"]), env=xp.worker_env(None),
                                          capture_output=True, text=True, check=True)
                    wall = time.perf_counter() - t0
                site = json.loads(done.stdout.strip().splitlines()[-1])["site"]
                rows.append({"setting": job["setting"], "threads_flag": SETTINGS[job["setting"]] or "",
                             "busy_processes": job["busy"], "wall_s": round(wall, 2),
                             "exact_match": site["exact_match"], "load_average": la,
                             "cores": n_cores, "host": xp.host_name(), "torch": torch.__version__,
                             "date": xp.now()})
        finally:
            for p in spinners:
                p.kill()
                p.wait()
        return rows

    def report(self, df: pd.DataFrame) -> str:
        t = (df.groupby(["busy_processes", "setting"], sort=False)
             .agg(runs=("wall_s", "size"), wall_s=("wall_s", "median"), exact_match=("exact_match", "first"),
                  load_average=("load_average", lambda s: f"{s.min():.1f}–{s.max():.1f}"),
                  cores=("cores", "first"))
             .reset_index().round({"wall_s": 1}))
        return ("Whole `sitelens run --methods site` processes, wall seconds (median of the runs); "
                "`load_average`: the 1-minute load average before each run (the quiet rows are only as "
                "quiet as that). `torch default` passes `--threads` = the core count (torch's own choice "
                "before the CLI chose); `CLI default (auto)` passes nothing.\n\n"
                f"{md_table(t)}\n\nEvery run: `threads.csv`.\n")


if __name__ == "__main__":
    raise SystemExit(main(Threads()))
