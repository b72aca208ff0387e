"""Stage 2 of SITE: soft head selection, the learned α.

With the model frozen, one logit ``a[l, h]`` per head is trained; α = sigmoid(a) ∈ (0, 1). At the
last token of a zero-shot prompt every head's output is mixed toward the task embedding ``t``
(:mod:`sitelens.site.embedding`, the HeadMix of :mod:`sitelens.site.injection`):

    z[l, h, -1] ← (1 − α[l, h]) · z[l, h, -1] + α[l, h] · t[l, h]

and the loss is the cross-entropy of the first answer token y_1 plus an optional sparsity term,

    loss(a) = − log p(y_1 | prompt; α) + λ · mean(α)                (λ = 0: the paper's method)

minimised with Adam by :func:`sitelens.site.training.run_training`. :class:`FitConfig` keeps the
α with the best validation loss; :class:`OfficialFitConfig` reproduces the paper's public code
(i.i.d. batches of 1, the α of the last validation check). The prompt prefix is encoded once into a
KV cache and only the last token is re-run per step (:func:`first_token_loss`), which is exact
because the mix acts only at that token. Result: α [n_layers, n_heads] (:class:`FitResult`).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor

from sitelens.errors import FitError
from sitelens.format import array_summary
from sitelens.models import last_token_forward, layer_devices, place_layer_rows
from sitelens.site.config import FitConfig, OfficialFitConfig  # noqa: F401 (still importable here)
from sitelens.site.injection import HeadMix, apply_hooks
from sitelens.site.training import FitData, RunConfig, iid_batches, run_training, training_batches
from sitelens.tasks import DEFAULT_TEMPLATE, Task, Template, warn_shared_answer_token


def site_mix(alpha, embedding, seq_len: int | None = None) -> HeadMix:
    """The SITE intervention: α-weighted mix toward the task embedding at the last prompt token."""
    return HeadMix(weights=alpha, targets=embedding, positions=(-1,), seq_len=seq_len)


def first_token_loss(
    model,
    cache,
    last_tokens: Int[Tensor, "batch 1"],
    answer_ids: Int[Tensor, " batch"],
    mix: HeadMix | None,
) -> Tensor:
    """Mean cross-entropy of the first answer token, running only the last prompt token on top of a
    frozen prefix KV cache (the mix acts at that token, so the prefix is unaffected). Computed in
    float32 (float64 for a float64 model) on the device the logits come out on."""
    hooks = mix.hooks(model) if mix is not None else []
    with apply_hooks(model, hooks):
        logits = last_token_forward(model, cache, last_tokens)  # [batch, 1, d_vocab]
    logits = logits[:, -1].to(torch.promote_types(logits.dtype, torch.float32))  # [batch, d_vocab]
    return F.cross_entropy(logits, answer_ids.to(logits.device))


def alpha_logit_rows(model, init: float = 0.0) -> list[Tensor]:
    """SITE's trainable logits ``a`` (α = sigmoid(a)) as one float32 row ``[n_heads]`` per layer,
    each on that layer's device (:func:`sitelens.models.layer_devices`), filled with ``init``: the
    parameters of stage 2, whatever the model's dtype and however it is split over devices."""
    H = model.cfg.n_heads
    return [torch.full((H,), float(init), dtype=torch.float32, device=d, requires_grad=True)
            for d in layer_devices(model)]  # L × [n_heads]


def stack_rows(rows: Sequence[Tensor]) -> Float[Tensor, "n_layers n_heads"]:
    """Per-layer rows stacked on the first row's device (a detached copy)."""
    dev = rows[0].device
    return torch.stack([r.detach().to(dev) for r in rows])  # [n_layers, n_heads]


def mean_alpha(alpha: Sequence[Tensor], device) -> Tensor:
    """The mean of α over all heads (rows on any devices), on ``device``, differentiable."""
    return torch.cat([r.to(device) for r in alpha]).mean()  # []


@dataclass
class FitResult:
    alpha: Float[Tensor, "n_layers n_heads"]
    logits: Float[Tensor, "n_layers n_heads"]
    history: list[dict] = field(default_factory=list)
    best_step: int = 0
    seconds: float = 0.0
    data: dict = field(default_factory=dict)  # the items used: :func:`data_used`
    # tasks fitted in the same passes (:func:`sitelens.site.joint.fit_alpha_tasks`; 1: alone);
    # with several, ``seconds`` is the joint run's wall time divided evenly over them
    joint_tasks: int = 1

    def __repr__(self) -> str:
        return (f"FitResult(alpha={array_summary(self.alpha)}, best_step={self.best_step}, "
                f"steps={sum(1 for h in self.history if h.get('step'))}, seconds={self.seconds:.1f})")


def data_used(task: Task, n_valid_used: int, batches: Sequence[Sequence[int]], n_train_used: int) -> dict:
    """What stage 2 trained and validated on, as recorded in ``adapter.json`` (``meta["data"]``):
    the split sizes of the task (``n_train``, ``n_valid``, ``n_test``), the validation items used
    (``valid_items_used``, from ``valid_split_used``: ``"valid"``, or ``"train"`` for a task
    without a valid split), the distinct training items drawn (``train_items_used``), the training
    examples seen (``train_examples``, repeats counted) and the passes over the train split
    (``passes`` = train_examples / n_train)."""
    examples = sum(len(b) for b in batches)
    return {
        "n_train": len(task.train), "n_valid": len(task.valid), "n_test": len(task.test),
        "valid_items_used": n_valid_used, "valid_split_used": "valid" if task.valid else "train",
        "train_items_used": n_train_used, "train_examples": examples,
        "passes": round(examples / max(1, len(task.train)), 3),
    }


class StalledFitWarning(UserWarning):
    """A fit kept its starting α: no step improved the validation loss."""


def warn_stalled(task: Task, cfg: FitConfig) -> None:
    """:class:`StalledFitWarning` for a fit of ``task`` that kept its starting α (best step 0),
    pointing at the caller of the fit function that called this."""
    warnings.warn(
        f"Fit of {task.name!r}: no step improved the validation loss, so α stayed at its start "
        f"(sigmoid({cfg.init:g}) for every head) and the adapter injects that. Fit longer "
        "(n_examples), check the learning rate (lr), or give the task more items.",
        StalledFitWarning, stacklevel=3,
    )


def fit_alpha(
    model,
    task: Task,
    embedding: Float[Tensor, "n_layers n_heads d_head"],
    config: FitConfig | None = None,
    *,
    template: Template = DEFAULT_TEMPLATE,
    progress: bool = False,
) -> FitResult:
    """Stage 2: learn α = sigmoid(a) with the model frozen (only ``a`` gets gradients).

    What is SITE's own is here: the parameters ``a``, the α-mix toward the embedding at the last
    token and the first-token loss (+ λ·mean(α)). The loop — Adam, batches, validation, which α
    is kept — is :func:`sitelens.site.training.run_training`. Default: shuffled passes, validation every
    ``eval_every`` steps and at the end, the best α kept. :class:`OfficialFitConfig`: i.i.d.
    draws, validation every ``eval_every`` steps only, the α of the last validation kept (the
    final α for 400 steps checked every 50), and no space before all-digit answers in the answer
    token."""
    cfg = config or FitConfig()
    official = cfg.protocol == "official"
    if official:
        template = replace(template, bare_digits=True)
    t0 = time.perf_counter()
    a = alpha_logit_rows(model, cfg.init)  # L × [n_heads], float32, each on its layer's device
    if not torch.isfinite(embedding).all():
        bad = int((~torch.isfinite(embedding)).sum())
        raise FitError(
            f"The task embedding of {task.name!r} has {bad} non-finite value(s) (inf/nan), so the "
            "loss would be non-finite. Recompute it in float32 (task_embedding) or refit."
        )
    target = place_layer_rows(embedding, model, dtype=torch.float32)  # L × [n_heads, d_head]
    warn_shared_answer_token(model, task.name, [ex.output for ex in task.train], template)
    if official:
        batches = list(iid_batches(len(task.train), cfg))  # [steps][batch_size] indices
    else:
        batches = list(training_batches(list(range(len(task.train))), cfg))  # [steps][batch_size]
    data = FitData.build(model, task, batches, n_valid=cfg.n_valid, template=template)
    valid = data.valid

    def objective(batch: list[int], conds: range) -> tuple[Tensor, Tensor]:  # one condition
        alpha = [torch.sigmoid(r) for r in a]  # L × [n_heads], each on its layer's device
        b = data.batch(batch)
        loss = first_token_loss(model, b.cache, b.last, b.answers, site_mix(alpha, target))
        return loss + cfg.sparsity * mean_alpha(alpha, loss.device), loss.detach()

    def valid_loss() -> float:
        with torch.no_grad():
            mix = site_mix([torch.sigmoid(r.detach()) for r in a], target)
            return first_token_loss(model, valid.cache, valid.last, valid.answers, mix).item()

    (run,) = run_training(
        a, batches, objective, valid_loss, snapshot=lambda r: stack_rows(a),
        config=RunConfig(
            lr=cfg.step_lr, seed=cfg.seed, eval_every=cfg.eval_every, patience=cfg.patience,
            keep="last_check" if official else "best",  # official: the α of the last check
            what="α", task=task.name, progress=progress, check_params=True,
            hint="Lower the learning rate (lr), check the model dtype (float32 is safest), or "
                 "the embedding.",
        ),
    )
    kept = run.kept.cpu()  # [n_layers, n_heads], float32
    seen = batches[:max(h["step"] for h in run.history)]  # the batches run (patience may stop early)
    if run.best_step == 0 and not official:
        warn_stalled(task, cfg)
    return FitResult(
        alpha=torch.sigmoid(kept),
        logits=kept,
        history=run.history,
        best_step=run.best_step,
        seconds=time.perf_counter() - t0,
        data=data_used(task, len(valid), seen, len({i for b in seen for i in b})),
    )
