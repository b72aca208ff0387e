"""The frontier on the figures' 8 FV tasks, resumable: ``python benchmarks/frontier_study.py``."""

from sitelens.pipelines.experiment import main
from sitelens.pipelines.frontier_study import FrontierStudy

if __name__ == "__main__":
    raise SystemExit(main(FrontierStudy()))
