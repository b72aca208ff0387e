"""Model load times: the first load (GGUF dequantized and converted, weights written to a fresh
cache) and the second load (from that cache), for both bundled models, in fresh processes.

    python benchmarks/load_time.py            # appends to results/load_time.csv, writes load_time.md

Each measurement runs in its own Python process (so nothing is shared through memory) with
``SITELENS_CACHE`` pointed at a new temporary directory; the first load fills it, the second reads
it. The load average before each run is recorded: the two cores may be shared.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import torch

from sitelens.pipelines.experiment import md_table
from sitelens.pipelines.store import ResultsStore

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
FIELDS = ["model", "load", "seconds", "import_seconds", "threads", "load_average", "torch", "date"]
CHILD = (
    "import json, time, torch; torch.set_num_threads({threads}); t = time.perf_counter(); "
    "import sitelens; t1 = time.perf_counter(); m = sitelens.load_model({name!r}); "
    "print(json.dumps({{'seconds': time.perf_counter() - t1, 'import_seconds': t1 - t}}))"
)


def measure(name: str, cache: str, threads: int) -> dict:
    env = dict(os.environ, SITELENS_CACHE=cache)
    out = subprocess.run([sys.executable, "-c", CHILD.format(name=name, threads=threads)],
                         env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--models", default="smollm2-135m-instruct,gemma-3-270m")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    RESULTS.mkdir(exist_ok=True)
    csv_path = RESULTS / "load_time.csv"
    for name in args.models.split(","):
        with tempfile.TemporaryDirectory() as cache:
            for kind in ("first (convert + write cache)", "second (from cache)"):
                la = os.getloadavg()[0]
                m = measure(name, cache, args.threads)
                s = m["seconds"]
                ResultsStore(csv_path, FIELDS, key=None).append([{
                    "model": name, "load": kind, "seconds": round(s, 2),
                    "import_seconds": round(m["import_seconds"], 2), "threads": args.threads,
                    "load_average": round(la, 2), "torch": torch.__version__,
                    "date": time.strftime("%Y-%m-%d"),
                }])
                print(f"{name} {kind}: {s:.2f}s (load average {la:.1f})")
    df = pd.read_csv(csv_path)
    (RESULTS / "load_time.md").write_text(
        "# Model load times\n\nMade by `python benchmarks/load_time.py` (each load in a fresh "
        "process, `SITELENS_CACHE` a new temporary directory; the second load reads what the first "
        "wrote). `seconds` is `load_model` alone; `import_seconds` is `import sitelens` before "
        "it. Every run is appended; the load average before each is recorded.\n\n"
        + md_table(df) + "\n"
    )


if __name__ == "__main__":
    main()
