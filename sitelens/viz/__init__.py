"""Plots (every function returns a ``plotly.graph_objects.Figure``) and their static export."""

from __future__ import annotations

