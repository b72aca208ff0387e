"""Greedy step, batched vs one pass per candidate: ``python benchmarks/greedy_speed.py --threads 2``."""

from sitelens.pipelines.experiment import main
from sitelens.pipelines.greedy_speed import GreedySpeed

if __name__ == "__main__":
    raise SystemExit(main(GreedySpeed()))
