"""The lens registry: every head-importance lens by name, and :func:`head_scores`, which runs any
subset of them on one model and task.

A :class:`Lens` is a name, one line on what it measures, and a ``run`` that turns the shared
:class:`LensInputs` (model, task, one task embedding, the configs, the α fits) into a
:class:`~sitelens.lenses.scores.HeadScores`. :data:`REGISTRY` is the one list of lens names:
:func:`get_lens`, :func:`parse_lenses`, :func:`head_scores` and ``sitelens heads --lenses`` all read
it, so a new lens is one entry here (and its module). :data:`ALIASES` names groups of lenses
(``ablation`` = both ablation references).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sitelens.errors import LensError
from sitelens.format import array_summary

if TYPE_CHECKING:  # the lens modules (torch) are imported when a lens runs, not with the names
    from torch import Tensor

    from sitelens.lenses.ablation import AblationConfig
    from sitelens.lenses.alpha import AlphaSeeds
    from sitelens.lenses.attribution import AttributionConfig
    from sitelens.lenses.scores import HeadScores
    from sitelens.site import FitConfig, SiteAdapter
    from sitelens.tasks import Task


# The head budgets k a frontier tries unless told (:mod:`sitelens.lenses.frontier`, the atlas's
# minimal table, the command line); here because this module imports no tensor library.
DEFAULT_BUDGETS: tuple[int, ...] = (1, 2, 5, 10, 20, 50)


@dataclass
class LensInputs:
    """What every lens of one :func:`head_scores` call shares: one embedding (so ``atp``,
    ``atp-star`` and ``effect`` see the same one and the same corrupted prompts), the configs,
    the adapter that ``dla`` reads and the α fits of the ``alpha`` lens."""

    model: object
    task: Task
    embedding: Tensor  # [n_layers, n_heads, d_head]
    attribution: AttributionConfig
    ablation: AblationConfig | None = None
    adapter: SiteAdapter | None = None
    alpha: AlphaSeeds | None = None
    progress: bool = False


@dataclass(frozen=True)
class Lens:
    """One head-importance lens. ``needs_adapter``: the lens reads a fitted α (an adapter, or the
    first seed's fit when none is given)."""

    name: str
    what: str
    run: Callable[[LensInputs], HeadScores]
    needs_adapter: bool = False


def _ablation(reference: str) -> Callable[[LensInputs], HeadScores]:
    def run(x: LensInputs) -> HeadScores:
        from sitelens.lenses.ablation import head_ablation

        return head_ablation(x.model, x.task, x.ablation, reference=reference, progress=x.progress)
    return run


def _atp(grad_drop: bool) -> Callable[[LensInputs], HeadScores]:
    def run(x: LensInputs) -> HeadScores:
        from sitelens.lenses.attribution import attribution_patching

        return attribution_patching(x.model, x.task, x.embedding, x.attribution,
                                    grad_drop=grad_drop, progress=x.progress)
    return run


def _alpha_grad(x: LensInputs) -> HeadScores:
    from sitelens.lenses.attribution import alpha_gradient

    return alpha_gradient(x.model, x.task, x.embedding, x.attribution, progress=x.progress)


def _effect(x: LensInputs) -> HeadScores:
    from sitelens.lenses.attribution import exact_effects

    return exact_effects(x.model, x.task, x.embedding, x.attribution, progress=x.progress)


def _dla(x: LensInputs) -> HeadScores:
    from sitelens.lenses.logit_lens import direct_logit_attribution

    return direct_logit_attribution(x.model, x.task, x.adapter, seed=x.attribution.seed)


_LENSES = [
    Lens("alpha", "SITE's learned α, mean and 95% interval over seeds", lambda x: x.alpha.scores),
    Lens("alpha-grad", "−∂loss/∂α at α = 0 on zero-shot prompts", _alpha_grad),
    Lens("atp", "attribution patching, the linear estimate of effect", _atp(False)),
    Lens("atp-star", "AtP with GradDrop (Kramár et al. 2024)", _atp(True)),
    Lens("ablation-mean", "drop in P(answer) when one head is mean-ablated", _ablation("mean")),
    Lens("ablation-zero", "drop in P(answer) when one head is zero-ablated", _ablation("zero")),
    Lens("effect", "exact activation patching on corrupted prompts", _effect),
    Lens("dla", "direct logit attribution of each head's injected write", _dla, needs_adapter=True),
]
REGISTRY: dict[str, Lens] = {lens.name: lens for lens in _LENSES}
LENSES: tuple[str, ...] = tuple(REGISTRY)
ALIASES: dict[str, tuple[str, ...]] = {"ablation": ("ablation-mean", "ablation-zero")}


def available_lenses() -> list[str]:
    return list(REGISTRY)


def _unknown(name) -> LensError:
    known = [*REGISTRY, *ALIASES]
    close = difflib.get_close_matches(str(name), known, n=3, cutoff=0.5)
    return LensError(
        f"Unknown lens {name!r}; use {', '.join(REGISTRY)} (or 'ablation' for both)."
        + (f" Did you mean: {', '.join(close)}?" if close else "")
    )


def get_lens(name: str) -> Lens:
    """The :class:`Lens` registered as ``name``; an unknown name raises :class:`LensError` naming
    the closest ones, and an alias (``ablation``) one naming the lenses it stands for."""
    if isinstance(name, str) and name in ALIASES:
        raise LensError(f"{name!r} stands for several lenses ({', '.join(ALIASES[name])}); "
                        "get_lens takes one of them (parse_lenses expands aliases).")
    try:
        return REGISTRY[name]
    except (KeyError, TypeError):  # TypeError: an unhashable "name"
        raise _unknown(name) from None


def parse_lenses(names: Sequence[str]) -> list[str]:
    """Lens names in order, without repeats, aliases expanded (``ablation`` = both references);
    an unknown name raises :class:`LensError` (a ``ValueError``) naming the closest ones."""
    out: list[str] = []
    for n in names:
        for m in ALIASES[n] if n in ALIASES else (get_lens(n).name,):
            if m not in out:
                out.append(m)
    return out


@dataclass
class LensRun:
    """What :func:`head_scores` produced: the table plus what a caller may reuse (the α fits of
    every seed, the embedding the other lenses used)."""

    scores: HeadScores
    alpha: AlphaSeeds | None = None
    embedding: Tensor | None = None
    extras: dict = field(default_factory=dict)

    def __repr__(self) -> str:
        emb = None if self.embedding is None else array_summary(self.embedding)
        return (f"LensRun(scores={self.scores!r}, alpha={self.alpha!r}, embedding={emb}, "
                f"extras={sorted(self.extras)})")


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

    ``alpha`` fits SITE once per seed (:func:`alpha_over_seeds`), or, given ``adapter``, reads
    its α as the one seed and fits nothing (:func:`alpha_from_adapter`); the other lenses use the
    embedding of the first seed's fit (or of ``adapter``, or :func:`sitelens.task_embedding` with
    ``attribution.seed`` when no α is fitted), so ``atp``, ``atp-star`` and ``effect`` see the
    same embedding and the same corrupted prompts. ``dla`` needs α: ``adapter``, else the first
    seed's fit (fitted for it when ``alpha`` is not requested). The ``alpha`` rows come first,
    the others in the order asked."""
    from sitelens.lenses.alpha import alpha_from_adapter, alpha_over_seeds
    from sitelens.lenses.attribution import AttributionConfig
    from sitelens.lenses.scores import HeadScores
    from sitelens.site import task_embedding

    lenses = parse_lenses(lenses)
    att = attribution or AttributionConfig()
    seeds_run = None
    needs_fit = adapter is None and any(REGISTRY[n].needs_adapter for n in lenses)
    if adapter is not None and "alpha" in lenses:  # the adapter's α: no fit, no seeds
        seeds_run = alpha_from_adapter(model, task, adapter)
    elif "alpha" in lenses or needs_fit:
        seeds_run = alpha_over_seeds(model, task, seeds if "alpha" in lenses else seeds[:1],
                                     fit_config, n_prompts=att.n_mean_prompts, n_shots=att.n_shots,
                                     progress=progress)
        adapter = adapter or seeds_run.adapters[0]
    if adapter is not None:
        emb = adapter.embedding
    else:
        emb = task_embedding(model, task, n_prompts=att.n_mean_prompts, n_shots=att.n_shots,
                             seed=att.seed, template=att.template,
                             progress=progress)  # [n_layers, n_heads, d_head]
    inputs = LensInputs(model, task, emb, att, ablation, adapter, seeds_run, progress)
    order = sorted(lenses, key=lambda n: n != "alpha")  # stable: alpha first, then as asked
    parts = [REGISTRY[n].run(inputs) for n in order]
    return LensRun(HeadScores.concat(parts), seeds_run, emb)
