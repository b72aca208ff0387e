"""The whole frontier's time per selector: ``python benchmarks/frontier_time.py --threads 2``."""

from sitelens.pipelines.experiment import main
from sitelens.pipelines.frontier_time import FrontierTime

if __name__ == "__main__":
    raise SystemExit(main(FrontierTime()))
