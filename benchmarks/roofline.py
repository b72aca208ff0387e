"""Roofline of SITE's stages (stage 1, the α fit, each evaluation method) per model: FLOPs and bytes
counted op by op from the real shapes (:class:`sitelens.pipelines.roofline.OpCounter`, a second,
untimed run), the wall seconds of a plain run, and this machine's float32 matmul rate at the shapes
each stage uses and its memory bandwidth (STREAM-like triad), at ``--threads`` (default 2).

    python benchmarks/roofline.py            # replaces results/roofline.csv and .md
"""
from sitelens.pipelines.experiment import main
from sitelens.pipelines.roofline import Roofline

if __name__ == "__main__":
    raise SystemExit(main(Roofline()))
