"""Runners that write results: the bench table, the figures pipeline, the cell store, executors
and cross-model transfer."""

from __future__ import annotations

from sitelens.lazy import attach

# no names of its own; lazy so that importing its modules binds the names packages take from them
__getattr__, __dir__ = attach(__name__, __file__)
