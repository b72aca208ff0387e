"""Where ``load_model`` spends its time after the imports: cProfile of one load from the
processed-weight cache per bundled model, each in a fresh process (after one untimed process that
builds a missing cache), the top 25 entries by cumulative time -> benchmarks/results/load_profile.md.

    python scripts/profile_load.py [--threads 2] [--models a,b] [--out FILE]

``--out`` with another checkout's sitelens first on ``PYTHONPATH`` profiles that code (the
``load_profile_before.md`` of issue 33: main at eba3f8c, before the load was reworked).
"""

import argparse
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

from sitelens.io import atomic_write_text

OUT = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "load_profile.md"
CHILD = """import cProfile, io, pstats, torch
torch.set_num_threads({threads})
import sitelens, transformer_lens, transformers, safetensors, tokenizers
from sitelens.models import load_model
if {profile}:
    print(sitelens.__file__)
    p = cProfile.Profile(); p.enable(); load_model({name!r}); p.disable(); s = io.StringIO()
    pstats.Stats(p, stream=s).sort_stats("cumulative").print_stats(25); print(s.getvalue())
else:
    load_model({name!r})"""


def _commit(root: Path) -> str:
    out = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True)
    return out.stdout.strip() or "?"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--models", default="smollm2-135m-instruct,gemma-3-270m")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "PYTHONWARNINGS": "ignore"}
    parts = []
    for name in args.models.split(","):
        run = [sys.executable, "-c", CHILD.format(threads=args.threads, name=name, profile=False)]
        subprocess.run(run, env=env, check=True, capture_output=True)  # builds a missing cache
        la = round(os.getloadavg()[0], 2)
        run[-1] = CHILD.format(threads=args.threads, name=name, profile=True)
        where, stats = subprocess.run(run, env=env, check=True, capture_output=True,
                                      text=True).stdout.strip().split("\n", 1)
        code = Path(where).resolve().parents[1]  # the sitelens the children import
        for prefix in (sysconfig.get_paths()["purelib"], str(code), sys.base_prefix):  # shorter paths
            stats = stats.replace(prefix + "/", "")
        parts += [f"## {name} (1-minute load average before: {la})", "", "```", stats, "```", ""]
    atomic_write_text(args.out, "\n".join([
        "# Where `load_model` spends its time (after the imports)", "",
        f"Made by `python scripts/profile_load.py --threads {args.threads}` (sitelens from "
        f"`{code.name}`, commit {_commit(code)}): cProfile of one `load_model` "
        "from the processed-weight cache in a fresh process, top 25 entries by cumulative time "
        "(profiling inflates the times; the load average says how busy the machine was).", "", *parts]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
