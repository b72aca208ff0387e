"""SITE through the baseline interface: :func:`sitelens.site.fit_site`, α over all heads.

Intervention: the adapter's :class:`HeadMix` (last prompt token, prefill only).
Trainable parameters: ``n_layers × n_heads`` (α); the task embedding is a mean of activations.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import ClassVar

from sitelens.baselines.base import FitParts, Fitted, Method
from sitelens.site import FitConfig, fit_site
from sitelens.site.joint import fit_site_tasks
from sitelens.tasks import DEFAULT_TEMPLATE, Task, Template


@dataclass(kw_only=True)
class SITE(Method):
    name: str = "site"
    n_prompts: int = 50
    n_shots: int = 10
    config: FitConfig = field(default_factory=FitConfig)  # its seed is replaced by fit's seed

    fits_jointly: ClassVar[bool] = True

    def _fit(self, model, task: Task, seed: int, template: Template, progress: bool) -> FitParts:
        adapter = fit_site(
            model, task, n_prompts=self.n_prompts, n_shots=self.n_shots,
            config=replace(self.config, seed=seed), template=template, progress=progress,
        )
        return self._parts(adapter)

    def fit_tasks(self, model, tasks: Sequence[Task], *, seed: int = 0,
                  template: Template = DEFAULT_TEMPLATE, progress: bool = False) -> list[Fitted]:
        """The fits of ``tasks`` in one joint run (:func:`sitelens.site.joint.fit_site_tasks`:
        stage 1 pooled, stage 2 with every task's rows in each pass, each task its own α, Adam
        state and kept step); each equals its :meth:`fit` up to float rounding, and its
        ``fit_seconds`` is an even share of the joint run's wall time."""
        tasks = list(tasks)
        t0 = time.perf_counter()
        adapters = fit_site_tasks(model, tasks, n_prompts=self.n_prompts, n_shots=self.n_shots,
                                  config=replace(self.config, seed=seed), template=template,
                                  progress=progress)
        share = (time.perf_counter() - t0) / max(1, len(tasks))
        return [self._parts(adapter).fitted(self.name, share) for adapter in adapters]

    @staticmethod
    def _parts(adapter) -> FitParts:
        L, H, d = adapter.embedding.shape
        return FitParts(
            intervention=adapter.mix(),
            n_params=L * H,
            state={"adapter": adapter},
            meta={"stored_numbers": L * H * d, "best_step": adapter.meta.get("best_step"),
                  **({"joint_tasks": adapter.meta["joint_tasks"]} if "joint_tasks" in adapter.meta else {})},
        )
