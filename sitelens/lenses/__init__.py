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
- ``effect`` (:mod:`~sitelens.lenses.attribution`, on :mod:`sitelens.patching.effects`): exact
  activation patching on corrupted prompts (the FV indirect effect); one forward row per head and
  prompt.
- ``dla`` (:mod:`~sitelens.lenses.logit_lens`): direct logit attribution of each head's injected
  write; one forward pass per batch.

Higher = more important in every lens. :mod:`~sitelens.lenses.registry` holds them by name
(:func:`get_lens`, :func:`available_lenses`, with close-name suggestions for a typo);
:func:`head_scores` runs any subset on one model and task with shared inputs (one embedding, the
same corrupted prompts for ``atp`` and ``effect``); :func:`exact_effects` wraps
:func:`sitelens.patching.effects.head_causal_effects` as a lens;
:mod:`~sitelens.lenses.compare` compares lenses (rank agreement, verified top-k with a heuristic
stopping rule); :func:`sitelens.lenses.frontier.frontier` (``sitelens.frontier``) answers "how
few heads carry the task?" (the accuracy-vs-heads frontier of several selectors, with k* and the
stability of each set).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sitelens.lazy import lazy_names

if TYPE_CHECKING:  # for type checkers; at run time each name is imported on first access
    from sitelens.lenses.ablation import AblationConfig, head_ablation
    from sitelens.lenses.alpha import AlphaSeeds, alpha_from_adapter, alpha_over_seeds, rank_stability
    from sitelens.lenses.attribution import (
        AttributionConfig,
        alpha_gradient,
        attribution_patching,
        exact_effects,
        mix_gradients,
    )
    from sitelens.lenses.frontier import FrontierResult, k_star
    from sitelens.lenses.logit_lens import direct_logit_attribution, head_logit_lens, head_write_logits
    from sitelens.lenses.registry import (
        ALIASES,
        LENSES,
        REGISTRY,
        SELECTOR_REGISTRY,
        SELECTORS,
        Lens,
        LensInputs,
        LensRun,
        Selector,
        available_lenses,
        get_lens,
        get_selector,
        head_scores,
        parse_lenses,
        parse_selectors,
    )
    from sitelens.lenses.scores import HeadScores
    from sitelens.lenses.selectors import FrontierConfig

# name -> the module that defines it (PEP 562: imported when first used)
__getattr__, __dir__ = lazy_names(__name__, {
    "sitelens.lenses.ablation": ("AblationConfig", "head_ablation"),
    "sitelens.lenses.alpha": ("AlphaSeeds", "alpha_from_adapter", "alpha_over_seeds", "rank_stability"),
    "sitelens.lenses.attribution": ("AttributionConfig", "alpha_gradient", "attribution_patching",
        "exact_effects", "mix_gradients"),
    "sitelens.lenses.frontier": ("FrontierResult", "k_star"),
    "sitelens.lenses.logit_lens": ("direct_logit_attribution", "head_logit_lens", "head_write_logits"),
    "sitelens.lenses.registry": ("ALIASES", "LENSES", "REGISTRY", "SELECTOR_REGISTRY", "SELECTORS", "Lens",
        "LensInputs", "LensRun", "Selector", "available_lenses", "get_lens", "get_selector", "head_scores",
        "parse_lenses", "parse_selectors"),
    "sitelens.lenses.scores": ("HeadScores",),
    "sitelens.lenses.selectors": ("FrontierConfig",),
})

__all__ = [
    "ALIASES", "LENSES", "REGISTRY", "SELECTORS", "SELECTOR_REGISTRY", "AblationConfig", "AlphaSeeds",
    "AttributionConfig", "FrontierConfig", "FrontierResult", "HeadScores", "k_star",
    "Lens", "LensInputs", "LensRun", "Selector", "alpha_from_adapter", "alpha_gradient", "alpha_over_seeds",
    "attribution_patching", "available_lenses", "direct_logit_attribution", "exact_effects",
    "get_lens", "get_selector", "head_ablation", "head_logit_lens", "head_scores", "head_write_logits",
    "mix_gradients", "parse_lenses", "parse_selectors", "rank_stability",
]
