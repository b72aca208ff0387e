"""sitelens: SITE (soft head selection for ICL-derived task embeddings) on TransformerLens,
with mechanistic checks of the learned head weights."""

from sitelens import baselines, metrics, patching, plotting  # noqa: E402  (submodules)
from sitelens.attention import enable_fast_attention, fast_attention_enabled
from sitelens.baselines import available_methods, get_method
from sitelens.bench import run_bench, summary_markdown
from sitelens.errors import (
    AdapterError,
    FitError,
    ModelError,
    OutputError,
    PromptTooLongError,
    SitelensError,
    TaskError,
    TokenizationError,
)
from sitelens.evaluate import evaluate, exact_match, greedy_generate, last_logits, summarize
from sitelens.injection import HeadMix, apply_hooks, head_mask
from sitelens.metrics import dntp
from sitelens.models import (
    DEFAULT_MODEL,
    available_models,
    encode,
    fingerprint,
    load_model,
    tiny_model,
    z_hook_name,
)
from sitelens.patching import (
    alpha_similarity,
    effect_alpha_correlation,
    head_causal_effects,
    inter_task,
    intra_task,
    transfer_similarity_correlation,
)
from sitelens.site import FitConfig, SiteAdapter, fit_alpha, fit_site, task_embedding
from sitelens.tasks import (
    DEFAULT_TEMPLATE,
    Example,
    Task,
    Template,
    answer_token_id,
    builtin_tasks,
    few_shot_prompts,
    load_task,
    task_from_pairs,
    zero_shot_prompt,
)

__version__ = "0.1.0"

__all__ = [
    "AdapterError", "FitError", "ModelError", "OutputError", "PromptTooLongError",
    "SitelensError", "TaskError", "TokenizationError",
    "evaluate", "exact_match", "greedy_generate", "last_logits", "summarize",
    "HeadMix", "apply_hooks", "head_mask",
    "DEFAULT_MODEL", "available_models", "encode", "fingerprint", "load_model", "tiny_model",
    "z_hook_name", "enable_fast_attention", "fast_attention_enabled",
    "FitConfig", "SiteAdapter", "fit_alpha", "fit_site", "task_embedding",
    "DEFAULT_TEMPLATE", "Example", "Task", "Template", "answer_token_id", "builtin_tasks",
    "few_shot_prompts", "load_task", "task_from_pairs", "zero_shot_prompt",
    "baselines", "metrics", "patching", "plotting", "available_methods", "get_method", "run_bench",
    "summary_markdown", "dntp", "alpha_similarity", "effect_alpha_correlation", "head_causal_effects",
    "inter_task", "intra_task", "transfer_similarity_correlation",
]
