"""Start-up cost (issue 33): wall seconds of ``import sitelens`` and ``sitelens --help``, each a
fresh process (interpreter start included), median of 5, the load average before each, and the
heavy libraries the process had loaded (none expected). Target: at most 0.5 s each.

    python benchmarks/import_time.py          # appends to results/import_time.csv, writes the .md
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

from sitelens.pipelines import experiment as xp
from sitelens.pipelines.experiment import Experiment, Job, main, md_table

HEAVY = "[m for m in ('torch', 'transformer_lens', 'transformers', 'plotly') if m in sys.modules]"
WHAT = {"import sitelens": f"import sys, sitelens; print({HEAVY})",
        "sitelens --help": "import sys; from sitelens.cli import main; main(['--help'])"
                           f"; print({HEAVY}, file=sys.stderr)"}


class ImportTime(Experiment):
    name, title = "import_time", "Import and --help times"
    columns = ["what", "median_s", "runs_s", "load_average", "heavy_loaded", "date"]
    key = None

    def cells(self, args):
        return [Job(w, w, {"what": w}) for w in WHAT]

    def run(self, job: Job) -> dict:
        times, la = [], xp.load_avg()
        for _ in range(5):
            t = time.perf_counter()
            r = subprocess.run([sys.executable, "-c", WHAT[job["what"]]], cwd=xp.REPO, check=True,
                               env=xp.worker_env(None), capture_output=True, text=True)
            times.append(time.perf_counter() - t)
        heavy = (r.stdout if job["what"] == "import sitelens" else r.stderr).strip().splitlines()[-1]
        print(f"{job['what']}: median {statistics.median(times):.2f}s (load average {la})")
        return {"what": job["what"], "median_s": round(statistics.median(times), 2),
                "runs_s": " ".join(f"{s:.2f}" for s in times), "load_average": la,
                "heavy_loaded": heavy, "date": xp.now("%Y-%m-%d %H:%M")}

    def report(self, df) -> str:
        return ("Fresh processes, median of 5; `load_average`: the 1-minute load average before "
                f"the five (2 cores; other jobs inflate the seconds). Every run appends.\n\n{md_table(df)}\n")


if __name__ == "__main__":
    raise SystemExit(main(ImportTime()))
