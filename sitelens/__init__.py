"""sitelens: SITE (soft head selection for ICL-derived task embeddings) on TransformerLens, with
mechanistic checks of the learned head weights.

``import sitelens as sl`` gives the public API, :data:`__all__`, grouped below as in the source:
models, tasks, SITE (stage 1, stage 2, the adapter, the intervention primitive), evaluation,
baselines, patching and analysis, head-importance lenses, bench and figures, provenance, errors.
The modules behind the names hold more (``sitelens.models``, ``sitelens.patching``,
``sitelens.lenses``, ...; see the API reference).

Every name is imported on first access (PEP 562, :mod:`sitelens.lazy`): ``import sitelens``
loads none of torch, TransformerLens, transformers or plotly; ``sl.load_model`` imports the model
code when first used, ``sl.make_figures`` plotly. The plots are :mod:`sitelens.viz.plotting`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sitelens.lazy import lazy_names

if TYPE_CHECKING:  # for type checkers; at run time each name is imported on first access
    from sitelens import atlas, baselines, lenses, patching
    from sitelens.atlas import explore
    from sitelens.baselines import Fitted, HookIntervention, Method, available_methods, get_method
    from sitelens.errors import (
        AdapterError,
        ExecutorError,
        FitError,
        LensError,
        MethodError,
        ModelError,
        OutputError,
        PromptTooLongError,
        SitelensError,
        TaskError,
        TokenizationError,
        UsageError,
    )
    from sitelens.eval.evaluation import evaluate, summarize
    from sitelens.eval.generation import greedy_generate, last_logits
    from sitelens.eval.labels import LabelSet, label_set
    from sitelens.eval.metrics import dntp
    from sitelens.eval.scoring import Protocol, exact_match
    from sitelens.lenses import FrontierResult, HeadScores, head_scores
    from sitelens.lenses.frontier import frontier
    from sitelens.models import (
        DEFAULT_MODEL,
        available_models,
        encode,
        fingerprint,
        load_model,
        prepare_bridge,
        z_hook_name,
    )
    from sitelens.models.attention import enable_fast_attention, fast_attention_enabled
    from sitelens.patching import (
        alpha_similarity,
        effect_alpha_correlation,
        inter_task,
        intra_task,
        transfer_similarity_correlation,
    )
    from sitelens.patching.effects import EffectsConfig, head_causal_effects
    from sitelens.pipelines.bench import BenchConfig, run_bench
    from sitelens.pipelines.bench_summary import summary_markdown
    from sitelens.pipelines.figure_config import FigureConfig
    from sitelens.pipelines.figures import make_figures
    from sitelens.provenance import NUMERICS_VERSION
    from sitelens.site import FitConfig, SiteAdapter, fit_alpha, fit_site, task_embedding
    from sitelens.site.injection import HeadMix, apply_hooks, head_mask
    from sitelens.stats import bootstrap_ci
    from sitelens.tasks import (
        DEFAULT_TEMPLATE,
        Example,
        Task,
        Template,
        answer_token_id,
        builtin_tasks,
        few_shot_prompts,
        load_collection,
        load_task,
        task_from_pairs,
        zero_shot_prompt,
    )
    from sitelens.tasks.regression import regression_mse, regression_task
    from sitelens.testing import tiny_model
    from sitelens.viz.export import notebook_setup

__version__ = "0.1.0"

# name -> the module that defines it (PEP 562: imported when first used)
__getattr__, __dir__ = lazy_names(__name__, {
    "sitelens": ("atlas", "baselines", "lenses", "patching"),
    "sitelens.atlas": ("explore",),
    "sitelens.baselines": ("Fitted", "HookIntervention", "Method", "available_methods", "get_method"),
    "sitelens.errors": ("AdapterError", "ExecutorError", "FitError", "LensError", "MethodError",
        "ModelError", "OutputError", "PromptTooLongError", "SitelensError", "TaskError",
        "TokenizationError", "UsageError"),
    "sitelens.eval.evaluation": ("evaluate", "summarize"),
    "sitelens.eval.generation": ("greedy_generate", "last_logits"),
    "sitelens.eval.labels": ("LabelSet", "label_set"),
    "sitelens.eval.metrics": ("dntp",),
    "sitelens.stats": ("bootstrap_ci",),
    "sitelens.eval.scoring": ("Protocol", "exact_match"),
    "sitelens.lenses": ("FrontierResult", "HeadScores", "head_scores"),
    "sitelens.lenses.frontier": ("frontier",),
    "sitelens.models": ("DEFAULT_MODEL", "available_models", "encode", "fingerprint", "load_model",
        "prepare_bridge", "z_hook_name"),
    "sitelens.models.attention": ("enable_fast_attention", "fast_attention_enabled"),
    "sitelens.patching": ("alpha_similarity", "effect_alpha_correlation", "inter_task", "intra_task",
        "transfer_similarity_correlation"),
    "sitelens.patching.effects": ("EffectsConfig", "head_causal_effects"),
    "sitelens.pipelines.bench": ("BenchConfig", "run_bench"),
    "sitelens.pipelines.bench_summary": ("summary_markdown",),
    "sitelens.pipelines.figure_config": ("FigureConfig",),
    "sitelens.pipelines.figures": ("make_figures",),
    "sitelens.provenance": ("NUMERICS_VERSION",),
    "sitelens.site": ("FitConfig", "SiteAdapter", "fit_alpha", "fit_site", "task_embedding"),
    "sitelens.site.injection": ("HeadMix", "apply_hooks", "head_mask"),
    "sitelens.tasks": ("DEFAULT_TEMPLATE", "Example", "Task", "Template", "answer_token_id",
        "builtin_tasks", "few_shot_prompts", "load_collection", "load_task", "task_from_pairs",
        "zero_shot_prompt"),
    "sitelens.tasks.regression": ("regression_mse", "regression_task"),
    "sitelens.testing": ("tiny_model",),
    "sitelens.viz.export": ("notebook_setup",),
})

__all__ = [
    # models: loading, tiny test models, tokens, the per-head z hook, fused attention
    "DEFAULT_MODEL", "available_models", "load_model", "tiny_model", "prepare_bridge",
    "fingerprint", "encode", "z_hook_name", "enable_fast_attention", "fast_attention_enabled",
    # tasks: splits, prompt templates, prompts, answer tokens
    "Task", "Example", "Template", "DEFAULT_TEMPLATE", "builtin_tasks", "load_task",
    "load_collection", "task_from_pairs", "few_shot_prompts", "zero_shot_prompt", "answer_token_id",
    # in-context regression tasks (linear / ReLU, seeded) and their mean squared error
    "regression_task", "regression_mse",
    # SITE: stage 1 (task embedding), stage 2 (α), the adapter, the intervention primitive
    "task_embedding", "fit_alpha", "FitConfig", "fit_site", "SiteAdapter",
    "HeadMix", "apply_hooks", "head_mask",
    # evaluation: generation, scoring, protocols, metrics
    "evaluate", "summarize", "greedy_generate", "last_logits", "exact_match", "Protocol",
    "dntp", "bootstrap_ci",
    # closed label sets (classification, multiple choice): ranked labels and the chance level
    "label_set", "LabelSet",
    # baselines: one Method per approach, fitted into a Fitted intervention
    "Method", "Fitted", "HookIntervention", "available_methods", "get_method",
    # patching and analysis: intra / inter-task patching, per-head causal effects, α statistics
    "intra_task", "inter_task", "head_causal_effects", "EffectsConfig", "alpha_similarity",
    "effect_alpha_correlation", "transfer_similarity_correlation",
    # lenses: which heads matter, several answers (α, gradients, ablation, effects, logit
    # attribution) in one table with their intervals and cost
    "head_scores", "HeadScores",
    # minimal head sets: the accuracy-vs-heads frontier of several selectors, k* and stability
    "frontier", "FrontierResult",
    # the head atlas in Jupyter (sitelens.atlas; the page: `sitelens atlas`), on first access
    "explore",
    # bench and figures (the figures names load plotly, on first access)
    "run_bench", "BenchConfig", "summary_markdown", "make_figures", "FigureConfig",
    # Jupyter: figures saved as plotly JSON and a static PNG (shown on GitHub and nbviewer)
    "notebook_setup",
    # provenance: the version of the numerics that every cached result is keyed on
    "NUMERICS_VERSION",
    # errors: SitelensError and its subclasses, each message naming the fix
    "SitelensError", "AdapterError", "ExecutorError", "FitError", "LensError", "MethodError",
    "ModelError", "OutputError", "PromptTooLongError", "TaskError", "TokenizationError", "UsageError",
    # subpackages
    "atlas", "baselines", "lenses", "patching",
]
