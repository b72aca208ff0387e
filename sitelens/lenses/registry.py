"""The registries of head-importance lenses and of the frontier's head-set selectors, and
:func:`head_scores`, which runs any subset of the lenses on one model and task.

A :class:`Lens` is a name, one line on what it measures, and the function that turns the shared
:class:`LensInputs` (model, task, one task embedding, the configs, the α fits) into a
:class:`~sitelens.lenses.scores.HeadScores`. A :class:`Selector` is a name, one line on how it picks
a set of k heads per budget, and its function (:mod:`sitelens.lenses.selectors`). An entry names its
function as ``"package.module:function"``, imported when it first runs, so this module imports no
tensor library and ``sitelens --help`` reads the choices here. :data:`REGISTRY` and
:data:`SELECTOR_REGISTRY` are the one list of each: :func:`get_lens`, :func:`parse_lenses`,
:func:`head_scores`, ``sitelens heads --lenses``, :func:`get_selector`, :func:`parse_selectors`,
:func:`~sitelens.lenses.selectors.select`, the frontier's default and ``sitelens frontier
--selectors`` read them, so a new lens or selector is its module and one entry here.
:data:`ALIASES` names groups of lenses (``ablation`` = both ablation references).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sitelens.errors import LensError
from sitelens.format import array_summary
from sitelens.lazy import resolve

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
    """One head-importance lens: its name, one line on what it measures, and ``impl``, the
    function ``(LensInputs) -> HeadScores`` that computes it, named as ``"package.module:function"``
    (imported when the lens first runs) or given itself. ``reads``: the settings it reads beyond
    the shared embedding (``sitelens heads`` refuses an option that no lens asked for reads):
    ``"fit"`` (the SITE fit's stage 2), ``"seeds"`` (one fit per seed), ``"corrupted"`` (the
    configs' ``n_prompts``), ``"alpha-grad"`` (``n_alpha_items``), ``"intervals"`` (``n_boot``).
    ``needs_adapter``: the lens reads a fitted α (an adapter, or the first seed's fit when none is
    given). ``backends``: the model backends it runs on (``sitelens heads`` refuses another before
    the model loads)."""

    name: str
    what: str
    impl: str | Callable[[LensInputs], HeadScores]
    reads: tuple[str, ...] = ()
    needs_adapter: bool = False
    backends: tuple[str, ...] = ("hooked", "bridge")

    def run(self, x: LensInputs) -> HeadScores:
        return resolve(self.impl)(x)


# The one list of lenses: one entry per lens, its function in its module
_LENSES = [
    Lens("alpha", "SITE's learned α, mean and 95% interval over seeds",
         "sitelens.lenses.alpha:alpha_lens", reads=("fit", "seeds")),
    Lens("alpha-grad", "−∂loss/∂α at α = 0 on zero-shot prompts",
         "sitelens.lenses.attribution:alpha_grad_lens", reads=("alpha-grad", "intervals")),
    Lens("atp", "attribution patching, the linear estimate of effect",
         "sitelens.lenses.attribution:atp_lens", reads=("corrupted", "intervals")),
    Lens("atp-star", "AtP with GradDrop (Kramár et al. 2024)",
         "sitelens.lenses.attribution:atp_star_lens", reads=("corrupted", "intervals")),
    Lens("ablation-mean", "drop in P(answer) when one head is mean-ablated",
         "sitelens.lenses.ablation:mean_ablation_lens", reads=("corrupted", "intervals")),
    Lens("ablation-zero", "drop in P(answer) when one head is zero-ablated",
         "sitelens.lenses.ablation:zero_ablation_lens", reads=("corrupted", "intervals")),
    Lens("effect", "exact activation patching on corrupted prompts",
         "sitelens.lenses.attribution:effect_lens", reads=("corrupted", "intervals")),
    Lens("dla", "direct logit attribution of each head's injected write",
         "sitelens.lenses.logit_lens:dla_lens", reads=("fit",), needs_adapter=True,
         backends=("hooked",)),  # W_O, W_U and the norms of a HookedTransformer
]
REGISTRY: dict[str, Lens] = {lens.name: lens for lens in _LENSES}
LENSES: tuple[str, ...] = tuple(REGISTRY)
ALIASES: dict[str, tuple[str, ...]] = {"ablation": ("ablation-mean", "ablation-zero")}



@dataclass(frozen=True)
class Selector:
    """One head-set selector of the frontier (:mod:`sitelens.lenses.selectors`): its name, one line
    on how it picks S_k, and ``impl``, the function ``(ctx, budgets) -> (sets, meta)`` that picks
    them (``ctx`` a :class:`~sitelens.lenses.selectors.SelectionContext`; ``sets[k]``: S_k's flat
    head indices, ``None`` where not reached), named as ``"package.module:function"`` (imported
    when the selector first runs) or given itself. ``budgetwise``: S_k does not depend on which
    other budgets are asked for, so a frontier resumes it budget by budget (a rerun with one more
    budget runs the selector for that budget only); not for selectors that choose across budgets
    (``alpha-sparse``'s λ is the best on average over them) or fit them jointly (``sparse``: equal
    to one fit per budget only up to float rounding)."""

    name: str
    what: str
    impl: str | Callable[..., tuple[dict, dict]]
    budgetwise: bool = False

    def run(self, ctx, budgets: list[int]) -> tuple[dict, dict]:
        return resolve(self.impl)(ctx, budgets)


# The one list of selectors: :func:`~sitelens.lenses.selectors.select`, :func:`parse_selectors`,
# the frontier's default and ``sitelens frontier --selectors`` read it
SELECTOR_REGISTRY: tuple[Selector, ...] = (
    Selector("alpha", "the top-k of the full SITE fit's α",
             "sitelens.lenses.selectors:alpha_sets", budgetwise=True),
    Selector("alpha-sparse", "the top-k of α refitted with the sparsity λ (of sparsity_grid) chosen "
             "on valid", "sitelens.lenses.selectors:alpha_sparse_sets"),
    Selector("alpha-grad", "the top-k of lens alpha-grad",
             "sitelens.lenses.selectors:alpha_grad_sets", budgetwise=True),
    Selector("atp", "the top-k of lens atp (attribution patching)",
             "sitelens.lenses.selectors:atp_sets", budgetwise=True),
    Selector("effect", "the top-k of lens effect (exact activation patching)",
             "sitelens.lenses.selectors:effect_sets", budgetwise=True),
    Selector("greedy", "forward selection by valid accuracy, then answer probability",
             "sitelens.lenses.selectors:greedy_sets", budgetwise=True),
    Selector("sparse", "a learned k-sparse α per budget (straight-through top-k)",
             "sitelens.lenses.selectors:sparse_sets"),
)
SELECTORS: tuple[str, ...] = tuple(s.name for s in SELECTOR_REGISTRY)

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



def get_selector(name: str) -> Selector:
    """The selector called ``name``; an unknown name raises :class:`LensError` naming the closest
    (difflib)."""
    for s in SELECTOR_REGISTRY:
        if s.name == name:
            return s
    close = difflib.get_close_matches(str(name), [s.name for s in SELECTOR_REGISTRY], n=1, cutoff=0.0)
    raise LensError(f"Unknown selector {name!r}; use {', '.join(s.name for s in SELECTOR_REGISTRY)}."
                    + (f" Did you mean {close[0]!r}?" if close else ""))


def parse_selectors(names: Sequence[str]) -> list[str]:
    """Selector names in order, without repeats; an unknown one raises :class:`LensError` naming
    the closest (difflib)."""
    out = [get_selector(n).name for n in names]
    if not out:
        raise LensError(f"No selector given; use some of {', '.join(s.name for s in SELECTOR_REGISTRY)}.")
    return list(dict.fromkeys(out))

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
