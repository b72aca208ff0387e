"""Gradient lenses: every head at once from one forward and one backward pass per batch.

All three differentiate the same intervention as the exact experiments, the per-head mix of
:class:`~sitelens.site.injection.HeadMix` at the last prompt token,

    z[l, h] ← (1 − w[l, h]) · z[l, h] + w[l, h] · t[l, h],

with respect to the weights ``w`` at ``w = 0``: ``∂m/∂w[l, h] = ∂m/∂z[l, h] · (t[l, h] − z[l, h])``,
the first-order (Taylor) estimate of what setting ``w[l, h] = 1`` does to a metric ``m``.
Weights of shape ``[batch, n_layers, n_heads]`` give one gradient per prompt in the same backward
pass, hence per-prompt values and bootstrap intervals.

- :func:`alpha_gradient`: ``m`` = log-probability of the answer's first token on **zero-shot**
  prompts, ``t`` = the task embedding: the first-order effect of injecting the embedding into each
  head, i.e. ``−∂loss/∂α`` at α = 0 of SITE's own stage-2 loss (first-token cross-entropy).
- :func:`attribution_patching` (AtP; Nanda 2023, Kramár et al. 2024): ``m`` = probability of the
  answer's first token on **corrupted** (shuffled-label) few-shot prompts, ``t`` = the task-mean
  activation: the linear estimate of :func:`sitelens.patching.effects.head_causal_effects`, which measures
  the same quantity exactly with one forward row per head.
- :func:`attribution_patching` with ``grad_drop=True`` (AtP*'s GradDrop, Kramár et al. 2024 §3.1.2):
  the backward pass is repeated ``n_layers`` times, each time with the gradient through layer
  ℓ's residual-stream writes (``hook_attn_out`` and ``hook_mlp_out``) dropped; the estimate is
  ``(1/(L − 1)) Σ_ℓ |AtP_ℓ|`` (heads of layer ℓ get 0 from that term, hence ``L − 1``), with the
  sign of plain AtP kept so that it ranks like the other lenses. AtP*'s other fix, recomputing the
  attention softmax exactly for *query and key* nodes whose attention saturates, does not apply
  here: the patched node is ``z``, which lies *after* its head's softmax, so the path from ``z`` to
  the residual stream is already linear (``W_O``); the nonlinearity that remains (later layers'
  attention and MLPs, the final softmax) is what GradDrop addresses.
- :func:`exact_effects`: the lens ``effect``, the exact quantity AtP estimates
  (:func:`~sitelens.patching.effects.head_causal_effects` with a bootstrap interval over prompts).

Costs are counted, not assumed: ``forward_passes`` counts calls of the model (prefix-cache passes
included, :class:`~sitelens.patching.engine.ForwardPassCounter`), ``backward_passes`` the backward
passes that reach the model's output (:class:`~sitelens.patching.engine.BackwardPassCounter`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from sitelens.format import progress_bar
from sitelens.lenses.scores import HeadScores
from sitelens.models import act_name, model_name
from sitelens.patching.effects import EffectsConfig, corrupted_prompts, head_causal_effects
from sitelens.patching.engine import BackwardPassCounter, ForwardPassCounter
from sitelens.site import task_embedding
from sitelens.site.injection import HeadMix
from sitelens.site.training import LastTokenSet, valid_items
from sitelens.stats import bootstrap_ci
from sitelens.tasks import Task, Template

METRICS = ("prob", "logprob", "logit")


def _metric(logits: Float[Tensor, "b d_vocab"], answers, metric: str) -> Float[Tensor, " b"]:
    """Per row: the answer token's probability, log-probability or logit."""
    answers = answers.to(logits.device)  # [b]
    if metric == "logit":
        return logits.gather(1, answers[:, None])[:, 0]  # [b]
    logp = torch.log_softmax(logits, -1).gather(1, answers[:, None])[:, 0]  # [b]
    if metric == "logprob":
        return logp
    if metric == "prob":
        return logp.exp()
    raise ValueError(f"metric must be one of {METRICS}, got {metric!r}.")


def _drop_grad(x: Tensor, hook=None) -> Tensor:
    return x.detach()  # same value, no gradient through this layer's write


def mix_gradients(
    model,
    data: LastTokenSet,
    targets: Float[Tensor, "n_layers n_heads d_head"],
    *,
    metric: str = "prob",
    drop_layers: list[int | None] | None = None,
    batch_size: int = 32,
    progress: bool = False,
    desc: str = "mix gradients",
) -> Float[Tensor, "n_drop n n_layers n_heads"]:
    """Per prompt and head, ``∂m/∂w[l, h]`` at ``w = 0`` of the mix toward ``targets`` at the last
    prompt token (see the module docstring), for each entry of ``drop_layers``: ``None`` = the
    plain gradient, ``ℓ`` = with the gradient through layer ℓ's ``attn_out`` and ``mlp_out``
    dropped. One forward pass per batch and entry, one backward each. ``progress``: a bar over
    the batches named ``desc`` (the lenses name it after themselves)."""
    cfg, dev = model.cfg, model.cfg.device
    L, H = cfg.n_layers, cfg.n_heads
    drops = [None] if drop_layers is None else list(drop_layers)
    targets = targets.to(dev)  # [n_layers, n_heads, d_head]
    n = len(data)
    out = torch.empty(len(drops), n, L, H)  # [n_drop, n, n_layers, n_heads]
    steps = [(i, s) for i in range(len(drops)) for s in range(0, n, batch_size)]
    for i, s in progress_bar(steps, desc=desc, enabled=progress):
        e = min(s + batch_size, n)
        b = data.select(torch.arange(s, e, device=data.last.device))
        w = torch.zeros(e - s, L, H, device=dev, requires_grad=True)  # [b, n_layers, n_heads]
        hooks = HeadMix(weights=w, targets=targets).hooks(model)
        if drops[i] is not None:
            hooks += [(act_name(k, drops[i], model), _drop_grad) for k in ("attn_out", "mlp_out")]
        with torch.enable_grad():
            m = _metric(b.logits(model, hooks), b.answers, metric)  # [b]
            (g,) = torch.autograd.grad(m.sum(), w)  # [b, n_layers, n_heads]
        out[i, s:e] = g.detach().float().cpu()
    return out


@dataclass(frozen=True)
class AttributionConfig(EffectsConfig):
    """:class:`~sitelens.patching.effects.EffectsConfig` (the corrupted prompts and the embedding, so that
    AtP and the exact effects see the same inputs) plus the gradient lenses' own knobs."""

    grad_batch_size: int = 32  # prompts per forward + backward pass
    n_boot: int = 1000  # bootstrap resamples of prompts for the intervals
    n_alpha_items: int = 64  # zero-shot items of alpha_gradient (train split)


def _scores(per_item: Tensor, stat, *, n_boot: int, seed: int):
    """``stat`` of per-item values ``[n, ...]`` and its percentile bootstrap CI over items."""
    x = per_item.numpy()
    est = stat(x)
    if n_boot <= 0:
        return est, None, None
    rng = np.random.default_rng(seed)
    boots = np.stack([stat(x[rng.integers(0, len(x), len(x))]) for _ in range(n_boot)])
    return est, np.quantile(boots, 0.025, axis=0), np.quantile(boots, 0.975, axis=0)


def _config_and_embedding(model, task: Task, embedding, config: AttributionConfig | None, overrides,
                          template: Template | None = None, progress: bool = False,
                          ) -> tuple[AttributionConfig, Tensor]:
    """``config`` with ``overrides`` set, and ``embedding`` or, when it is None,
    :func:`~sitelens.site.task_embedding` with the config's ``n_mean_prompts``, ``n_shots`` and
    ``seed`` (and ``template``, else the config's), so every lens of one config sees the same
    embedding."""
    cfg = replace(config or AttributionConfig(), **overrides)
    if embedding is None:
        template = cfg.template if template is None else template
        embedding = task_embedding(model, task, n_prompts=cfg.n_mean_prompts, n_shots=cfg.n_shots,
                                   seed=cfg.seed, template=template,
                                   progress=progress)  # [n_layers, n_heads, d_head]
    return cfg, embedding


def alpha_gradient(
    model, task: Task, embedding: Float[Tensor, "n_layers n_heads d_head"] | None = None,
    config: AttributionConfig | None = None, *, template: Template | None = None,
    progress: bool = False, **overrides,
) -> HeadScores:
    """Lens ``alpha-grad``: ``−∂CE/∂α[l, h]`` at α = 0 (= ``∂ log p(answer)/∂α``), the first-order
    effect of injecting the task embedding into each head alone, averaged over
    ``n_alpha_items`` zero-shot train items; bootstrap CI over items. ``embedding`` defaults to
    :func:`~sitelens.site.task_embedding` with the config's ``n_mean_prompts`` and ``seed``.
    ``template``: of the prompts and answer tokens; ``None`` takes the config's (as every other
    lens does)."""
    cfg, embedding = _config_and_embedding(model, task, embedding, config, overrides, template,
                                           progress)
    template = cfg.template if template is None else template
    with ForwardPassCounter(model) as passes, BackwardPassCounter(model) as backward:
        data = LastTokenSet.build(model, list(task.train[: cfg.n_alpha_items]) or
                                  valid_items(task, cfg.n_alpha_items), template)
        g = mix_gradients(model, data, embedding, metric="logprob", batch_size=cfg.grad_batch_size,
                          progress=progress, desc=f"alpha-grad [{task.name}]")[0]  # [n, L, H]
    est, lo, hi = _scores(g, lambda x: x.mean(0), n_boot=cfg.n_boot, seed=cfg.seed)
    return HeadScores.from_map(
        est, ci_low=lo, ci_high=hi, model=model_name(model), task=task.name, lens="alpha-grad",
        forward_passes=passes.count, backward_passes=backward.count, seconds=passes.seconds,
        meta={"metric": "logprob", "n_items": len(data), "seed": cfg.seed},
    )


def attribution_patching(
    model, task: Task, embedding: Float[Tensor, "n_layers n_heads d_head"] | None = None,
    config: AttributionConfig | None = None, *, grad_drop: bool = False, progress: bool = False,
    **overrides,
) -> HeadScores:
    """Lens ``atp`` (``grad_drop=False``) or ``atp-star`` (``True``): the first-order estimate of
    :func:`~sitelens.patching.effects.head_causal_effects` (same corrupted prompts, same embedding, same
    metric: the answer's first-token probability) for every head from one forward and one
    backward pass per batch (GradDrop: ``n_layers`` of each). Bootstrap CI over prompts."""
    cfg, embedding = _config_and_embedding(model, task, embedding, config, overrides,
                                           progress=progress)
    L = model.cfg.n_layers
    lens = "atp-star" if grad_drop else "atp"
    t0 = time.perf_counter()
    with ForwardPassCounter(model) as passes, BackwardPassCounter(model) as backward:
        prompts, answers = corrupted_prompts(
            model, task, n_prompts=cfg.n_prompts, n_shots=cfg.n_shots, split=cfg.split,
            seed=cfg.seed, template=cfg.template,
        )
        data = LastTokenSet.from_prompts(model, prompts, answers, batch_size=cfg.batch_size)
        drops = [None] + (list(range(L)) if grad_drop else [])
        g = mix_gradients(model, data, embedding, metric="prob", drop_layers=drops,
                          batch_size=cfg.grad_batch_size, progress=progress,
                          desc=f"{lens} [{task.name}]")  # [n_drop, n, L, H]
    g = g.transpose(0, 1)  # [n, n_drop, n_layers, n_heads]

    if grad_drop:
        def stat(x: np.ndarray) -> np.ndarray:
            m = x.mean(0)  # [n_drop, L, H]
            return np.sign(m[0]) * np.abs(m[1:]).sum(0) / max(L - 1, 1)  # [L, H]
    else:
        def stat(x: np.ndarray) -> np.ndarray:
            return x[:, 0].mean(0)  # [L, H]

    est, lo, hi = _scores(g, stat, n_boot=cfg.n_boot, seed=cfg.seed)
    return HeadScores.from_map(
        est, ci_low=lo, ci_high=hi, model=model_name(model), task=task.name, lens=lens,
        forward_passes=passes.count, backward_passes=backward.count,
        seconds=time.perf_counter() - t0,
        meta={"metric": "prob", "n_prompts": len(data), "n_shots": cfg.n_shots, "seed": cfg.seed,
              "grad_drop": grad_drop},
    )


def exact_effects(
    model, task: Task, embedding: Float[Tensor, "n_layers n_heads d_head"] | None = None,
    config: AttributionConfig | None = None, *, progress: bool = False, **overrides,
) -> HeadScores:
    """Lens ``effect``: :func:`~sitelens.patching.effects.head_causal_effects` (exact, batched) with a
    percentile bootstrap CI over prompts. ``config`` is shared with :func:`attribution_patching`
    (an :class:`AttributionConfig` is an :class:`~sitelens.patching.effects.EffectsConfig`)."""
    cfg = replace(config or AttributionConfig(), **overrides)
    effects, st = head_causal_effects(model, task, cfg, embedding=embedding, return_stats=True,
                                      progress=progress)
    per = st["per_prompt"]  # [n_prompts, n_layers, n_heads]
    lo, hi = bootstrap_ci(per.permute(1, 2, 0).numpy(), n_boot=cfg.n_boot, seed=cfg.seed)
    return HeadScores.from_map(
        effects, ci_low=lo, ci_high=hi, model=model_name(model), task=task.name, lens="effect",
        forward_passes=st["forward_passes"], backward_passes=0, seconds=st["seconds"],
        meta={"n_prompts": st["n_prompts"], "n_shots": cfg.n_shots, "seed": cfg.seed,
              "rows": st["rows"], "baseline_prob": st["baseline_prob"]},
    )


def alpha_grad_lens(x) -> HeadScores:
    """Lens ``alpha-grad`` of the registry, on its shared inputs
    (:class:`~sitelens.lenses.registry.LensInputs`: one embedding for every lens)."""
    return alpha_gradient(x.model, x.task, x.embedding, x.attribution, progress=x.progress)


def atp_lens(x) -> HeadScores:
    """Lens ``atp`` of the registry, on its shared inputs."""
    return attribution_patching(x.model, x.task, x.embedding, x.attribution, progress=x.progress)


def atp_star_lens(x) -> HeadScores:
    """Lens ``atp-star`` of the registry (AtP with GradDrop), on its shared inputs."""
    return attribution_patching(x.model, x.task, x.embedding, x.attribution, grad_drop=True,
                                progress=x.progress)


def effect_lens(x) -> HeadScores:
    """Lens ``effect`` of the registry, on its shared inputs (the same corrupted prompts as atp)."""
    return exact_effects(x.model, x.task, x.embedding, x.attribution, progress=x.progress)
