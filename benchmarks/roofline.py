"""Roofline of SITE's stages (sitelens.pipelines.roofline): ``python benchmarks/roofline.py`` ->
results/roofline.csv, .md (and model_reuse.csv: seconds per bench cell, model reused or reloaded)."""
from sitelens.pipelines.experiment import main
from sitelens.pipelines.roofline import Roofline

if __name__ == "__main__":
    raise SystemExit(main(Roofline()))
