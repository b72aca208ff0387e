"""Runners that write results: the bench table, the figures pipeline, the cell store, executors
and cross-model transfer."""

from __future__ import annotations

