"""Runners that write results: the bench table, the figures pipeline, the cell store, executors,
cross-model transfer and the benchmark harness (:mod:`~sitelens.pipelines.experiment`; the
studies themselves are scripts in ``benchmarks/``)."""

from __future__ import annotations

from sitelens.lazy import lazy_names

# no names of its own: its modules, imported on first access
__getattr__, __dir__ = lazy_names(__name__, {})
