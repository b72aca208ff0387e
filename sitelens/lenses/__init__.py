"""Head-importance lenses: several independent answers to "which heads matter?", each as
:class:`HeadScores` with its uncertainty and its cost.

- ``alpha`` (:mod:`~sitelens.lenses.alpha`): SITE's learned α, mean and 95% interval over seeds;
  one fit per seed.
- ``alpha-grad`` (:mod:`~sitelens.lenses.attribution`): ``−∂loss/∂α`` at α = 0 on zero-shot
  prompts; one forward and one backward pass per batch.
- ``atp`` (:mod:`~sitelens.lenses.attribution`): attribution patching, the linear estimate of
  ``effect``; one forward and one backward pass per batch.
- ``atp-star``: AtP with GradDrop (Kramár et al. 2024); ``n_layers`` forward and backward passes.
- ``ablation-mean`` / ``ablation-zero`` (:mod:`~sitelens.lenses.ablation`): the drop in
  P(answer) on clean few-shot prompts when one head is ablated; one forward row per head and prompt.
- ``effect`` (:mod:`sitelens.patching.effects`): exact activation patching on corrupted prompts (the FV
  indirect effect); one forward row per head and prompt.
- ``dla`` (:mod:`~sitelens.lenses.logit_lens`): direct logit attribution of each head's injected
  write; one forward pass per batch.

Higher = more important in every lens. :func:`head_scores` runs any subset on one model and task
with shared inputs (one embedding, the same corrupted prompts for ``atp`` and ``effect``);
:func:`exact_effects` wraps :func:`sitelens.patching.effects.head_causal_effects` as a lens;
:mod:`~sitelens.lenses.compare` compares lenses (rank agreement, certified top-k).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from jaxtyping import Float
from torch import Tensor

from sitelens.eval.metrics import bootstrap_ci
from sitelens.lenses.ablation import AblationConfig, head_ablation
from sitelens.lenses.alpha import AlphaSeeds, alpha_over_seeds, rank_stability
from sitelens.lenses.attribution import (
    AttributionConfig,
    alpha_gradient,
    attribution_patching,
    mix_gradients,
)
from sitelens.lenses.logit_lens import direct_logit_attribution, head_logit_lens, head_write_logits
from sitelens.lenses.scores import HeadScores
from sitelens.models import model_name
from sitelens.patching.effects import head_causal_effects
from sitelens.site import FitConfig, SiteAdapter
from sitelens.tasks import Task

LENSES = ("alpha", "alpha-grad", "atp", "atp-star", "ablation-mean", "ablation-zero", "effect", "dla")
ALIASES = {"ablation": ("ablation-mean", "ablation-zero")}


def parse_lenses(names: Sequence[str]) -> list[str]:
    """Lens names with ``ablation`` expanded to both references; unknown names raise
    ``ValueError`` naming the known ones."""
    out: list[str] = []
    for n in names:
        for m in ALIASES.get(n, (n,)):
            if m not in LENSES:
                raise ValueError(f"Unknown lens {n!r}; use {', '.join(LENSES)} (or 'ablation' for both).")
            if m not in out:
                out.append(m)
    return out


def exact_effects(
    model, task: Task, embedding: Float[Tensor, "n_layers n_heads d_head"] | None = None,
    config: AttributionConfig | None = None, **overrides,
) -> HeadScores:
    """Lens ``effect``: :func:`~sitelens.patching.effects.head_causal_effects` (exact, batched) with a
    percentile bootstrap CI over prompts. ``config`` is shared with :func:`attribution_patching`
    (an :class:`AttributionConfig` is an :class:`~sitelens.patching.effects.EffectsConfig`)."""
    cfg = replace(config or AttributionConfig(), **overrides)
    effects, st = head_causal_effects(model, task, cfg, embedding=embedding, return_stats=True)
    per = st["per_prompt"]  # [n_prompts, n_layers, n_heads]
    lo, hi = bootstrap_ci(per.permute(1, 2, 0).numpy(), n_boot=cfg.n_boot, seed=cfg.seed)
    return HeadScores.from_map(
        effects, ci_low=lo, ci_high=hi, model=model_name(model), task=task.name, lens="effect",
        forward_passes=st["forward_passes"], backward_passes=0, seconds=st["seconds"],
        meta={"n_prompts": st["n_prompts"], "n_shots": cfg.n_shots, "seed": cfg.seed,
              "rows": st["rows"], "baseline_prob": st["baseline_prob"]},
    )


@dataclass
class LensRun:
    """What :func:`head_scores` produced: the table plus what a caller may reuse (the α fits of
    every seed, the embedding the other lenses used)."""

    scores: HeadScores
    alpha: AlphaSeeds | None = None
    embedding: Tensor | None = None
    extras: dict = field(default_factory=dict)


def head_scores(
    model,
    task: Task,
    lenses: Sequence[str] = LENSES,
    *,
    seeds: Sequence[int] = (0,),
    fit_config: FitConfig | None = None,
    attribution: AttributionConfig | None = None,
    ablation: AblationConfig | None = None,
    adapter: SiteAdapter | None = None,
    progress: bool = False,
) -> LensRun:
    """Run ``lenses`` on one model and task and return one :class:`HeadScores` table.

    ``alpha`` fits SITE once per seed (:func:`alpha_over_seeds`); the other lenses use the
    embedding of the first seed's fit (or of ``adapter``, or :func:`sitelens.task_embedding` with
    ``attribution.seed`` when no α is fitted), so ``atp``, ``atp-star`` and ``effect`` see the
    same embedding and the same corrupted prompts. ``dla`` needs α: ``adapter``, else the first
    seed's fit (fitted for it when ``alpha`` is not requested)."""
    from sitelens.site import task_embedding

    lenses = parse_lenses(lenses)
    att = attribution or AttributionConfig()
    parts: list[HeadScores] = []
    seeds_run = None
    if "alpha" in lenses or ("dla" in lenses and adapter is None):
        seeds_run = alpha_over_seeds(model, task, seeds if "alpha" in lenses else seeds[:1],
                                     fit_config, n_prompts=att.n_mean_prompts, n_shots=att.n_shots,
                                     progress=progress)
        if "alpha" in lenses:
            parts.append(seeds_run.scores)
        adapter = adapter or seeds_run.adapters[0]
    if adapter is not None:
        emb = adapter.embedding
    else:
        emb = task_embedding(model, task, n_prompts=att.n_mean_prompts, n_shots=att.n_shots,
                             seed=att.seed, template=att.template)  # [n_layers, n_heads, d_head]
    for lens in lenses:
        if lens == "alpha-grad":
            parts.append(alpha_gradient(model, task, emb, att, progress=progress))
        elif lens in ("atp", "atp-star"):
            parts.append(attribution_patching(model, task, emb, att, grad_drop=lens == "atp-star",
                                              progress=progress))
        elif lens == "effect":
            parts.append(exact_effects(model, task, emb, att))
        elif lens.startswith("ablation-"):
            parts.append(head_ablation(model, task, ablation, reference=lens.split("-", 1)[1]))
        elif lens == "dla":
            parts.append(direct_logit_attribution(model, task, adapter, seed=att.seed))
    return LensRun(HeadScores.concat(parts), seeds_run, emb)


__all__ = [
    "LENSES", "AblationConfig", "AlphaSeeds", "AttributionConfig", "HeadScores", "LensRun",
    "alpha_gradient", "alpha_over_seeds", "attribution_patching", "direct_logit_attribution",
    "exact_effects", "head_ablation", "head_logit_lens", "head_scores", "head_write_logits",
    "mix_gradients", "parse_lenses", "rank_stability",
]
