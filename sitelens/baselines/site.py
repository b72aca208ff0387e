"""SITE through the baseline interface: :func:`sitelens.site.fit_site`, α over all heads.

Intervention: the adapter's :class:`HeadMix` (last prompt token, prefill only).
Trainable parameters: ``n_layers × n_heads`` (α); the task embedding is a mean of activations.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from sitelens.baselines.base import FitParts, Method
from sitelens.site import FitConfig, fit_site
from sitelens.tasks import Task, Template


@dataclass(kw_only=True)
class SITE(Method):
    name: str = "site"
    n_prompts: int = 50
    n_shots: int = 10
    config: FitConfig = field(default_factory=FitConfig)  # its seed is replaced by fit's seed

    def _fit(self, model, task: Task, seed: int, template: Template, progress: bool) -> FitParts:
        adapter = fit_site(
            model, task, n_prompts=self.n_prompts, n_shots=self.n_shots,
            config=replace(self.config, seed=seed), template=template, progress=progress,
        )
        L, H, d = adapter.embedding.shape
        return FitParts(
            intervention=adapter.mix(),
            n_params=L * H,
            state={"adapter": adapter},
            meta={"stored_numbers": L * H * d, "best_step": adapter.meta.get("best_step")},
        )
