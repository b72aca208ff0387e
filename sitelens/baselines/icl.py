"""k-shot in-context learning: demonstrations from the train split (never the query) in the
prompt; no intervention, nothing fitted."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sitelens.baselines.base import FitParts, Method
from sitelens.tasks import Example, Task, Template, few_shot_prompts


@dataclass(kw_only=True)
class ICL(Method):
    name: str = "icl"
    n_shots: int = 10

    def _fit(self, model, task: Task, seed: int, template: Template, progress: bool) -> FitParts:
        n_shots = self.n_shots

        def prompt_fn(model, items: Sequence[Example]) -> list[str]:
            return few_shot_prompts(task, list(items), n_shots, seed=seed, template=template, model=model)

        meta = {"n_shots": n_shots, "stored_numbers": 0}
        return FitParts(prompt_fn=prompt_fn, meta=meta)
