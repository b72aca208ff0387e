"""The settings of a figures run and what it computed: :class:`FigureConfig`, the one list of
its cells (:func:`figure_cells`, run in this process by :func:`sitelens.pipelines.figures.run_model`
and on workers by :func:`sitelens.pipelines.figures.run_cells`) and :class:`ModelRun`, which
:mod:`sitelens.pipelines.report` summarizes and plots.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, NamedTuple

from sitelens.models import FIGURE_MODELS
from sitelens.site import FitConfig

if TYPE_CHECKING:  # annotations only: the CLI reads FIGURE_TASKS without pandas or torch
    import pandas as pd

    from sitelens.site import SiteAdapter

DEFAULT_MODELS = FIGURE_MODELS  # the bundled models marked for figures (sitelens.models.registry)

# the inter-task set: three families plus dissimilar singletons
FIGURE_TASKS = (
    "english_french", "english_german", "english_spanish", "english_italian",
    "first_letter", "last_letter", "capitalize_first_letter", "lowercase_first_letter",
    "choose_first_of_3", "choose_middle_of_3", "choose_last_of_3",
    "antonym", "country_capital", "present_past",
)
# intra-task patching (with and without sparsity): 8 tasks spanning all families
INTRA_TASKS = (
    "antonym", "country_capital", "present_past", "english_french", "english_spanish",
    "first_letter", "capitalize_first_letter", "choose_first_of_3",
)
HEATMAP_TASK = "antonym"
EFFECT_TASKS = ("antonym", "english_french")
DEFAULT_SPARSITY = (0.0, 5.0)
_TUPLE_FIELDS = ("tasks", "intra_tasks", "effect_tasks", "sparsity", "gap_ks", "formats")


@dataclass
class FigureConfig:
    """Sizes and seeds of one figures run (see :func:`sitelens.pipelines.figures.make_figures`,
    which also takes each field as a keyword argument). Sequences given as lists are stored as
    tuples."""

    tasks: tuple[str, ...] = FIGURE_TASKS
    intra_tasks: tuple[str, ...] | None = INTRA_TASKS  # None: the first 8 of tasks
    effect_tasks: tuple[str, ...] = EFFECT_TASKS
    heatmap_task: str = HEATMAP_TASK
    sparsity: tuple[float, ...] = DEFAULT_SPARSITY
    main_sparsity: float | None = None  # λ of the α maps, inter-task, effects; None: max(sparsity)
    limit: int | None = 40  # test items per task
    seed: int = 0
    # Stage 2 is a FitConfig (fit_config): these three are its fields of the same names; its seed is
    # `seed`, its sparsity the λ of each cell, its other fields keep FitConfig's defaults.
    n_examples: int = 200  # half of FitConfig's 400: a run of minutes per model
    n_prompts: int = 20  # stage-1 few-shot prompts
    n_shots: int = 10
    lr: float = FitConfig.lr
    batch_size: int = FitConfig.batch_size
    effect_prompts: int = 8  # corrupted prompts for the causal effects
    n_random_seeds: int = 3
    n_boot: int = 1000
    inter_k: int = 10  # top-k heads of the inter-task "topk" mode (and the Jaccard similarity)
    gap_ks: tuple[str | int, ...] = (10, "5%")  # k at which the high- vs low-α gap is reported
    formats: tuple[str, ...] = ("png", "html")
    # True: the missing fits of each λ run all their tasks in one joint stage 2
    # (:func:`sitelens.site.joint.fit_alpha_tasks`), each equal to its one-task fit up to float
    # rounding and saved in the same cell (its adapter's meta says ``joint_tasks``).
    joint: bool = False

    def __post_init__(self) -> None:
        for name in _TUPLE_FIELDS:
            value = getattr(self, name)
            if value is not None and not isinstance(value, tuple):
                setattr(self, name, tuple(value))

    def resolved(self) -> FigureConfig:
        """This config made consistent: duplicates dropped, ``intra_tasks`` / ``effect_tasks`` /
        ``heatmap_task`` restricted to ``tasks`` (with fallbacks), λ as floats, and
        ``main_sparsity`` set and included in ``sparsity``."""
        tasks = tuple(dict.fromkeys(self.tasks))
        intra = self.intra_tasks
        intra = tuple(t for t in intra if t in tasks) if intra is not None else tasks[:8]
        intra = intra or tasks[:8]
        effects = tuple(t for t in self.effect_tasks if t in tasks) or tasks[:1]
        heat = self.heatmap_task if self.heatmap_task in tasks else tasks[0]
        sparsity = tuple(float(s) for s in dict.fromkeys(self.sparsity))
        main = float(max(sparsity) if self.main_sparsity is None else self.main_sparsity)
        if main not in sparsity:
            sparsity = sparsity + (main,)
        return replace(self, tasks=tasks, intra_tasks=intra, effect_tasks=effects,
                       heatmap_task=heat, sparsity=sparsity, main_sparsity=main)

    def fit_config(self, sparsity: float) -> FitConfig:
        """The stage-2 settings of the fits of λ = ``sparsity``."""
        return FitConfig(lr=self.lr, n_examples=self.n_examples, batch_size=self.batch_size,
                         sparsity=sparsity, seed=self.seed)


@dataclass
class ModelRun:
    """What :func:`sitelens.pipelines.figures.run_model` computed (or reused) for one model."""

    model: str
    n_layers: int
    n_heads: int
    config: FigureConfig
    adapters: dict[float, dict[str, SiteAdapter]] = field(default_factory=dict)  # λ -> task -> ad
    intra: pd.DataFrame | None = None  # intra_task rows of every task and λ, column "sparsity"
    inter: pd.DataFrame | None = None  # inter_task rows (main λ)
    similarity: dict[str, pd.DataFrame] = field(default_factory=dict)
    effects: dict[str, pd.DataFrame] = field(default_factory=dict)  # task -> layer, head, effect
    effect_stats: dict[str, dict] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def n_total(self) -> int:
        return self.n_layers * self.n_heads


class FigureCell(NamedTuple):
    """One cell of a model's run: its kind (``fit``, ``intra``, ``effects``, ``inter``), task
    (None for ``inter``: all tasks) and λ (None for ``effects`` and ``inter``: the main λ)."""

    kind: str
    task: str | None = None
    sparsity: float | None = None


def figure_cells(cfg: FigureConfig) -> list[FigureCell]:
    """Every cell of one model's run under the resolved ``cfg``, each once, in the order their
    inputs need: the fits (the main λ on every task, the other λ on the intra tasks), the
    intra-task cell of every (λ, intra task), the effects cell of every effect task, and the one
    inter-task cell. The stage-1 embedding of a task is part of its first fit."""
    main = cfg.main_sparsity
    fits = [FigureCell("fit", n, lam) for lam in cfg.sparsity
            for n in (cfg.tasks if lam == main else cfg.intra_tasks)]
    intra = [FigureCell("intra", n, lam) for lam in cfg.sparsity for n in cfg.intra_tasks]
    effects = [FigureCell("effects", n) for n in cfg.effect_tasks]
    return [*fits, *intra, *effects, FigureCell("inter")]


__all__ = [
    "DEFAULT_MODELS", "FIGURE_TASKS", "INTRA_TASKS", "HEATMAP_TASK", "EFFECT_TASKS",
    "DEFAULT_SPARSITY", "FigureConfig", "ModelRun", "FigureCell", "figure_cells",
]
