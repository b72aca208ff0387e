"""Zero-shot: the query alone, no intervention, nothing fitted."""

from __future__ import annotations

from dataclasses import dataclass

from sitelens.baselines.base import Fitted, Method
from sitelens.tasks import DEFAULT_TEMPLATE, Task, Template


@dataclass(kw_only=True)
class ZeroShot(Method):
    name: str = "zero-shot"

    def fit(
        self,
        model,
        task: Task,
        *,
        seed: int = 0,
        template: Template = DEFAULT_TEMPLATE,
        progress: bool = False,
    ) -> Fitted:
        return Fitted(self.name, meta={"stored_numbers": 0})
