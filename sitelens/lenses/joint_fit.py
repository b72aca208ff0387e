"""Several head-weight fits run as one: SITE's stage 2 for R sets of logits at once, every
condition's rows in the same forward and backward passes.

The frontier fits many small α's on the same task, embedding and seed: the ``refit`` injection
(one per distinct head set), ``sparse`` (one per budget) and ``alpha-sparse`` (one per λ). Each is
SITE's stage 2 with the mix weights computed from the logits ``a`` by a function: the same seeded
batches, Adam, validation every ``eval_every`` steps and at the end, the logits of the best
validation loss kept. Run one after another, each spends most of its time reading the model's
weights for a pass of 8 rows. :func:`fit_many` runs them as the R conditions of
:func:`sitelens.site.training.run_training`: row ``r·n + i`` of a pass is item ``i`` under
condition ``r``'s weights, and condition r's loss reads only its own row of logits, so each fit
gets exactly its own gradient, Adam step and kept logits (strictly lower valid loss replaces, so
ties keep the earlier).

The numbers equal the separate fits' (``fit_many`` with one condition) up to float32 rounding (a
larger batch may sum in another order); where two validation checks tie to within that rounding
(e.g. a straight-through top-k mask that did not change between them) either fit may keep the
other check's logits. ``tests/test_frontier_pin.py`` checks that the sets and accuracies of a tiny
frontier are unchanged and ``tests/test_frontier_speed.py`` compares the kept logits with the
one-by-one fits.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor

from sitelens.errors import FitError
from sitelens.models import layer_devices, place_layer_rows
from sitelens.site import FitConfig
from sitelens.site.alpha import site_mix
from sitelens.site.training import (
    FitData,
    LastTokenSet,
    RunConfig,
    condition_groups,
    run_training,
    training_batches,
)
from sitelens.tasks import Task


def _condition_losses(model, items: LastTokenSet, conds: range, weights: Tensor, target) -> Tensor:
    """Mean first-token cross-entropy per condition ``[len(conds)]`` (items × conditions rows)."""
    n = len(items)
    rows = torch.arange(n).repeat(len(conds))  # [len(conds) * n], condition-major
    b = items.select(rows)
    w = weights[conds.start:conds.stop].repeat_interleave(n, dim=0)  # [rows, L, H]
    logits = b.logits(model, site_mix(w, target).hooks(model))  # [rows, d_vocab]
    ce = F.cross_entropy(logits, b.answers.to(logits.device), reduction="none")  # [rows]
    return ce.reshape(len(conds), n).mean(1)


def fit_many(
    model, task: Task, embedding: Float[Tensor, "n_layers n_heads d_head"], config: FitConfig,
    weights_of: Callable[[Tensor], Tensor], n_fits: int, *, template, what: str,
    init: Tensor | None = None, penalty: Callable[[Tensor], Tensor] | None = None,
    max_rows: int = 512, progress: bool = False,
) -> Float[Tensor, "n_fits n_layers n_heads"]:
    """``n_fits`` stage-2 fits at once (see the module docstring). ``weights_of(a)``: the mix
    weights ``[n_fits, n_layers * n_heads]`` of the flat logits ``a`` (same shape,
    differentiable; row r may read only row r); ``init``: starting logits ``[n_fits, L * H]``
    (default ``config.init``); ``penalty(a)``: a per-condition term ``[n_fits]`` added to the
    training loss (not to the validation loss, as SITE's sparsity); ``max_rows``: rows per forward
    pass (conditions are grouped to fit it; the gradients of the groups add up before the step).
    Returns the kept logits ``[n_fits, n_layers, n_heads]`` on the CPU."""
    if config.patience:  # one condition's stop would stop (or, waiting, outlive) the others'
        raise FitError(f"FitConfig.patience={config.patience} stops a single fit early; joint fits "
                       "run every batch (use patience=0).")
    L, H = model.cfg.n_layers, model.cfg.n_heads
    devs = layer_devices(model)
    start = (torch.full((n_fits, L * H), float(config.init)) if init is None
             else init.detach().float().reshape(n_fits, L * H))
    a = [start[:, i * H:(i + 1) * H].clone().to(d) for i, d in enumerate(devs)]  # L × [n_fits, H]
    target = place_layer_rows(embedding, model, dtype=torch.float32)  # L × [n_heads, d_head]
    batches = list(training_batches(list(range(len(task.train))), config))
    data = FitData.build(model, task, batches, n_valid=config.n_valid, template=template)

    def flat() -> Tensor:
        return torch.cat([r.to(devs[0]) for r in a], dim=1)  # [n_fits, L * H]

    def weights() -> Tensor:
        return weights_of(flat()).reshape(n_fits, L, H)

    def objective(batch: list[int], conds: range) -> tuple[Tensor, Tensor]:
        ce = _condition_losses(model, data.batch(batch), conds, weights(), target)  # [len(conds)]
        if penalty is None:
            return ce, ce.detach()
        return ce + penalty(flat())[conds.start:conds.stop].to(ce.device), ce.detach()

    def valid_loss() -> Tensor:
        with torch.no_grad():
            w = weights()
            groups = condition_groups(n_fits, max(1, max_rows // len(data.valid)))
            return torch.cat([_condition_losses(model, data.valid, c, w, target).cpu()
                              for c in groups])  # [n_fits]

    runs = run_training(
        a, batches, objective, valid_loss, snapshot=lambda r: flat()[r].detach().cpu().clone(),
        config=RunConfig(lr=config.step_lr, seed=config.seed, eval_every=config.eval_every, what=what,
                         task=task.name, progress=progress, check_params=True, conditions=n_fits,
                         per_pass=max(1, max_rows // config.batch_size)))
    return torch.stack([run.kept for run in runs]).reshape(n_fits, L, H)


__all__ = ["fit_many"]
