"""What the optional Ray dependency adds to an install: wall seconds of ``pip install
--no-cache-dir`` of the pinned ``ray`` into a fresh virtual environment (the wheel downloaded: what
CI's ``.venv`` rebuild pays), the wheel's download size and the installed package's disk size.

    python benchmarks/ray_install.py [--spec ray==2.60.0] [--repeats 1]

Needs the package registry. Appends a row per repeat to ``results/ray_install.csv`` (with the load
average) and rewrites ``ray_install.md`` from all rows.
"""

from __future__ import annotations

import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from sitelens.pipelines import experiment as xp
from sitelens.pipelines.experiment import Experiment, Job, main, md_table


def measure(spec: str) -> dict:
    """One fresh venv: ``pip install --no-cache-dir SPEC`` timed; sizes of the wheel and the
    installed ``ray`` directory; how many distributions the install added."""
    with tempfile.TemporaryDirectory() as d:
        venv, env = Path(d) / "venv", xp.worker_env(None, PIP_DISABLE_PIP_VERSION_CHECK="1")
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(venv / "bin" / "python"), "-m", "pip"]

        def freeze() -> list[str]:
            return subprocess.run(pip + ["list", "--format=freeze"], capture_output=True, text=True,
                                  env=env, check=True).stdout.split()

        before, load = freeze(), xp.load_avg()
        t0 = time.perf_counter()
        subprocess.run(pip + ["install", "-q", "--no-cache-dir", spec], env=env, check=True)
        seconds, after = time.perf_counter() - t0, freeze()
        site = next((venv / "lib").glob("python*/site-packages"))
        wheels = Path(d) / "wheels"
        subprocess.run(pip + ["download", "-q", "--no-deps", "--no-cache-dir", "-d", str(wheels), spec],
                       env=env, check=True)
        return {"spec": spec, "python": platform.python_version(), "install_seconds": round(seconds, 1),
                "wheel_mb": round(sum(f.stat().st_size for f in wheels.glob("*.whl")) / 1e6, 1),
                "installed_mb": round(sum(f.stat().st_size for f in (site / "ray").rglob("*")
                                          if f.is_file()) / 1e6, 1),
                "packages_added": len(set(after) - set(before)), "load_avg_1m": round(load, 1),
                "date": xp.now()}


class RayInstall(Experiment):
    name, title = "ray_install", "The cost of the optional Ray dependency"
    columns = ["spec", "python", "install_seconds", "wheel_mb", "installed_mb", "packages_added",
               "load_avg_1m", "date"]
    key = None

    def add_arguments(self, p) -> None:
        p.add_argument("--spec", default="ray==2.60.0")
        p.add_argument("--repeats", type=int, default=1)

    def cells(self, args):
        return [Job(f"repeat {i}") for i in range(args.repeats)]

    def run(self, job: Job) -> dict:
        return measure(self.args.spec)

    def report(self, df: pd.DataFrame) -> str:
        return (f"`pip install --no-cache-dir SPEC` into a fresh venv; `packages_added`: distributions added "
                f"to an empty venv.\n\n{md_table(df)}\n")


if __name__ == "__main__":
    raise SystemExit(main(RayInstall()))
