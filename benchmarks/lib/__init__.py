"""What the benchmark scripts share and the library does not ship. A script runs as
``python benchmarks/NAME.py`` from the repository root, so ``benchmarks/`` is first on its path and
this package imports as ``lib`` (the tests load the scripts the same way: ``tests/bench_util.py``).

- :mod:`lib.shapes`: published architecture shapes as data (``SHAPES``) and random-weight models of
  them (``random_model``), for ``benchmarks/scaling.py``.
- :mod:`lib.cited`: numbers measured elsewhere (papers, runs no command here repeats), read from
  ``benchmarks/cited.csv`` with their source, model and setting, for the reports that show them as
  cited (``benchmarks/frontier_study.py``, ``scripts/run_time.py``).
- :mod:`lib.paired`: method A − method B paired over tasks, for the site_fv and baselines reports.
- :mod:`lib.study`: the ``--model`` / ``--task`` / ``--tiny`` options and model of the one-task
  studies (``frontier_time``, ``greedy_speed``).
"""
