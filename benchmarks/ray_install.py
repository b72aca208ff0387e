"""What the optional Ray dependency adds to an install: wall-clock seconds of ``pip install`` of the
pinned ``ray`` into a fresh virtual environment (no pip cache, so the wheel is downloaded: what CI's
``.venv`` rebuild pays), the download size of the wheel and the disk size of the installed package.

    python benchmarks/ray_install.py [--spec ray==2.60.0] [--repeats 1]

Needs the package registry (as ``scripts/setup.sh`` does). Each run appends one row per repeat to
``benchmarks/results/ray_install.csv`` (with the load average, since the machine is shared) and
rewrites ``ray_install.md`` from all rows.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sitelens.pipelines.experiment import md_table
from sitelens.pipelines.store import ResultsStore

RESULTS = Path(__file__).resolve().parent / "results"
CSV = RESULTS / "ray_install.csv"
FIELDS = ["spec", "python", "install_seconds", "wheel_mb", "installed_mb", "packages_added",
          "load_avg_1m", "date"]


def _du_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 1e6


def measure(spec: str) -> dict:
    """One fresh venv: ``pip install --no-cache-dir SPEC`` timed; sizes of the wheel and the
    installed ``ray`` directory; how many distributions the install added."""
    with tempfile.TemporaryDirectory() as d:
        venv = Path(d) / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(venv / "bin" / "python"), "-m", "pip"]
        env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1")
        before = subprocess.run(pip + ["list", "--format=freeze"], capture_output=True, text=True,
                                env=env, check=True).stdout.split()
        load = os.getloadavg()[0]
        t0 = time.perf_counter()
        subprocess.run(pip + ["install", "-q", "--no-cache-dir", spec], env=env, check=True)
        seconds = time.perf_counter() - t0
        after = subprocess.run(pip + ["list", "--format=freeze"], capture_output=True, text=True,
                               env=env, check=True).stdout.split()
        site = next((venv / "lib").glob("python*/site-packages"))
        wheels = Path(d) / "wheels"
        subprocess.run(pip + ["download", "-q", "--no-deps", "--no-cache-dir", "-d", str(wheels),
                              spec], env=env, check=True)
        wheel_mb = sum(f.stat().st_size for f in wheels.glob("*.whl")) / 1e6
        return {"spec": spec, "python": platform.python_version(),
                "install_seconds": round(seconds, 1), "wheel_mb": round(wheel_mb, 1),
                "installed_mb": round(_du_mb(site / "ray"), 1),
                "packages_added": len(set(after) - set(before)), "load_avg_1m": round(load, 1),
                "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M")}


def report() -> str:
    df = pd.read_csv(CSV)
    lines = [
        "# The cost of the optional Ray dependency",
        "",
        "`python benchmarks/ray_install.py`: `pip install --no-cache-dir SPEC` into a fresh virtual",
        "environment (the wheel downloaded from the registry, its dependencies too), on the shared",
        "2-core machine (`load_avg_1m`: the load when the install started). `installed_mb`: the",
        "`ray` package directory; `packages_added`: distributions the install added to an empty venv",
        "(into the project's `.venv` fewer: most of them are there already).",
        "",
        md_table(df),
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spec", default="ray==2.60.0")
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args()
    for _ in range(args.repeats):
        row = measure(args.spec)
        print(row)
        ResultsStore(CSV, FIELDS, key=None).append([row])
    (RESULTS / "ray_install.md").write_text(report())


if __name__ == "__main__":
    main()
