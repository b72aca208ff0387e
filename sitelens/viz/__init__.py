"""Plots (every function returns a ``plotly.graph_objects.Figure``) and their static export."""

from __future__ import annotations

from sitelens.lazy import lazy_names

# no names of its own: its modules, imported on first access
__getattr__, __dir__ = lazy_names(__name__, {})
