"""SITE, the method: stage 1 (:mod:`~sitelens.site.embedding`, the task embedding), stage 2
(:mod:`~sitelens.site.alpha`, α), the adapter and :func:`fit_site` (:mod:`~sitelens.site.adapter`),
the :class:`HeadMix` injection (:mod:`~sitelens.site.injection`), the one training runner
(:mod:`~sitelens.site.training`) and when α is saturated (:mod:`~sitelens.site.saturation`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sitelens.lazy import lazy_names

if TYPE_CHECKING:  # for type checkers; at run time each name is imported on first access
    from sitelens.site.adapter import SiteAdapter, fit_site
    from sitelens.site.alpha import (
        FitResult,
        StalledFitWarning,
        alpha_logit_rows,
        first_token_loss,
        fit_alpha,
        mean_alpha,
        site_mix,
        stack_rows,
    )
    from sitelens.site.config import FitConfig, OfficialFitConfig
    from sitelens.site.embedding import capture_last, last_token_z, task_embedding
    from sitelens.site.injection import (
        HeadMix,
        apply_hooks,
        head_mask,
    )
    from sitelens.site.joint import fit_alpha_tasks, fit_site_tasks, task_embeddings
    from sitelens.site.saturation import (
        SATURATION_THRESHOLD,
        AlphaSaturation,
        AlphaSaturationWarning,
        alpha_saturation,
    )
    from sitelens.site.training import (
        KEEP,
        BatchPlan,
        BatchRows,
        Hook,
        LastTokenSet,
        RunConfig,
        T,
        TrainRun,
        iid_batches,
        run_training,
        training_batches,
        valid_items,
    )

# name -> the module that defines it (PEP 562: imported when first used)
__getattr__, __dir__ = lazy_names(__name__, {
    "sitelens.site.adapter": ("SiteAdapter", "fit_site"),
    "sitelens.site.alpha": ("FitResult", "StalledFitWarning", "alpha_logit_rows", "first_token_loss",
        "fit_alpha", "mean_alpha", "site_mix", "stack_rows"),
    "sitelens.site.config": ("FitConfig", "OfficialFitConfig"),
    "sitelens.site.embedding": ("capture_last", "last_token_z", "task_embedding"),
    "sitelens.site.injection": ("HeadMix", "apply_hooks", "head_mask"),
    "sitelens.site.joint": ("fit_alpha_tasks", "fit_site_tasks", "task_embeddings"),
    "sitelens.site.saturation": ("SATURATION_THRESHOLD", "AlphaSaturation", "AlphaSaturationWarning",
        "alpha_saturation"),
    "sitelens.site.training": ("KEEP", "BatchPlan", "BatchRows", "Hook", "LastTokenSet", "RunConfig", "T",
        "TrainRun", "iid_batches", "run_training", "training_batches", "valid_items"),
})

__all__ = [
    "HeadMix",
    "apply_hooks",
    "head_mask",
    "Hook",
    "T",
    "LastTokenSet",
    "valid_items",
    "BatchPlan",
    "training_batches",
    "iid_batches",
    "BatchRows",
    "KEEP",
    "RunConfig",
    "TrainRun",
    "run_training",
    "capture_last",
    "last_token_z",
    "task_embedding",
    "site_mix",
    "first_token_loss",
    "FitConfig",
    "OfficialFitConfig",
    "alpha_logit_rows",
    "stack_rows",
    "mean_alpha",
    "FitResult",
    "StalledFitWarning",
    "fit_alpha",
    "fit_alpha_tasks",
    "SiteAdapter",
    "fit_site",
    "fit_site_tasks",
    "task_embeddings",
    "SATURATION_THRESHOLD",
    "AlphaSaturation",
    "AlphaSaturationWarning",
    "alpha_saturation",
]
