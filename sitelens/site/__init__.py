"""SITE, the method: stage 1 (task embedding), stage 2 (α), the adapter, the :class:`HeadMix`
injection and the one training runner."""

from __future__ import annotations

from sitelens.site.core import (
    FitConfig,
    FitResult,
    OfficialFitConfig,
    SiteAdapter,
    alpha_logit_rows,
    capture_last,
    ensure_writable_dir,
    first_token_loss,
    fit_alpha,
    fit_site,
    last_token_z,
    mean_alpha,
    site_mix,
    stack_rows,
    task_embedding,
)
from sitelens.site.injection import (
    HeadMix,
    apply_hooks,
    head_mask,
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
    "fit_alpha",
    "SiteAdapter",
    "ensure_writable_dir",
    "fit_site",
]
