"""Execute a notebook in place (its folder as the working directory) and keep the outputs:
how the committed notebooks get their outputs.

    python scripts/run_notebook.py notebooks/04_head_atlas.ipynb [--timeout 1800]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import nbclient
import nbformat


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("notebook")
    p.add_argument("--timeout", type=int, default=1800, help="seconds per cell")
    args = p.parse_args(argv)
    path = Path(args.notebook).resolve()
    nb = nbformat.read(path, as_version=4)
    nbclient.NotebookClient(nb, timeout=args.timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}}).execute()
    tmp = path.with_suffix(".ipynb.tmp")
    nbformat.write(nb, tmp)
    tmp.replace(path)
    print(f"executed {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
