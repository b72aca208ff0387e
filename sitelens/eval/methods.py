"""The method names :func:`sitelens.eval.evaluation.evaluate` runs (``sitelens eval --methods``):
a module of its own, so the command line checks ``--methods`` without importing torch."""

from __future__ import annotations

METHODS = ("zero-shot", "icl", "site")

__all__ = ["METHODS"]
