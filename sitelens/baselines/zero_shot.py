"""Zero-shot: the query alone, no intervention, nothing fitted."""

from __future__ import annotations

from dataclasses import dataclass

from sitelens.baselines.base import FitParts, Method
from sitelens.tasks import Task, Template


@dataclass(kw_only=True)
class ZeroShot(Method):
    name: str = "zero-shot"

    def _fit(self, model, task: Task, seed: int, template: Template, progress: bool) -> FitParts:
        return FitParts(meta={"stored_numbers": 0})
