"""The figures' intra-task gap (top-k − bottom-k heads by α) paired over tasks, from the committed
per-task table of each model (``figures/{model}/patching_gaps.csv``, written by ``sitelens
figures``) into ``figures/{model}/patching_gaps_paired.csv``, by the function ``sitelens figures``
now runs itself (:func:`sitelens.patching.analysis.paired_gaps`, seed 0 as the figures' config).

    python benchmarks/figures_paired.py
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from sitelens.io import atomic_write_csv
from sitelens.patching.analysis import paired_gaps

FIGURES = Path(__file__).resolve().parents[1] / "figures"


def main() -> int:
    for gaps in sorted(FIGURES.glob("*/patching_gaps.csv")):
        out = gaps.with_name("patching_gaps_paired.csv")
        atomic_write_csv(out, paired_gaps(pd.read_csv(gaps), seed=0))
        print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
