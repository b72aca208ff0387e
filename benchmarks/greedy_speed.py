"""One greedy step of the frontier, batched vs one pass per candidate
(:mod:`sitelens.pipelines.greedy_speed`). ``python benchmarks/greedy_speed.py --threads 2``;
``--tiny --out /tmp/gs``: a smoke test."""

from sitelens.pipelines.experiment import main
from sitelens.pipelines.greedy_speed import GreedySpeed

if __name__ == "__main__":
    raise SystemExit(main(GreedySpeed()))
