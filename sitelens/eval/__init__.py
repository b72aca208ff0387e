"""Evaluation: the one generate-and-score loop, protocols, closed label sets, metrics (dNTP,
exact match). ``sitelens.eval.evaluate`` is the function (also :func:`sitelens.evaluate`); its module
is ``sitelens.eval.evaluation``, named apart so that importing it never hides the function."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sitelens.lazy import lazy_names

if TYPE_CHECKING:  # for type checkers; at run time each name is imported on first access
    from sitelens.eval.evaluation import (
        evaluate,
        first_token_accuracy,
        resolve_labels,
        run_method,
        summarize,
    )
    from sitelens.eval.generation import (
        cut_at_eos,
        greedy_generate,
        intervention_hooks,
        last_logits,
        newline_ids,
        stop_ids,
    )
    from sitelens.eval.labels import (
        LABEL_COLUMNS,
        MAX_LABELS,
        LabelScores,
        LabelSet,
        continuation_ids,
        item_chance,
        label_columns,
        label_set,
        nan_mean,
        score_labels,
    )
    from sitelens.eval.methods import METHODS
    from sitelens.eval.metrics import (
        accuracy,
        correlation,
        dntp,
        dntp_per_item,
        mean_over_tasks,
    )
    from sitelens.eval.scoring import (
        PROTOCOLS,
        ItemScores,
        Protocol,
        answer_lengths,
        exact_match,
        get_protocol,
        official_exact_match,
        rank_labels,
        reference_logits,
        score_items,
    )

# name -> the module that defines it (PEP 562: imported when first used)
__getattr__, __dir__ = lazy_names(__name__, {
    "sitelens.eval.evaluation": ("evaluate", "first_token_accuracy", "resolve_labels", "run_method",
        "summarize"),
    "sitelens.eval.generation": ("cut_at_eos", "greedy_generate", "intervention_hooks", "last_logits",
        "newline_ids", "stop_ids"),
    "sitelens.eval.labels": ("LABEL_COLUMNS", "MAX_LABELS", "LabelScores", "LabelSet", "continuation_ids",
        "item_chance", "label_columns", "label_set", "nan_mean", "score_labels"),
    "sitelens.eval.methods": ("METHODS",),
    "sitelens.eval.metrics": ("accuracy", "correlation", "dntp", "dntp_per_item", "mean_over_tasks"),
    "sitelens.eval.scoring": ("PROTOCOLS", "ItemScores", "Protocol", "answer_lengths", "exact_match",
        "get_protocol", "official_exact_match", "rank_labels", "reference_logits", "score_items"),
})

__all__ = [
    "evaluate",
    "dntp_per_item",
    "dntp",
    "accuracy",
    "correlation",
    "mean_over_tasks",
    "LABEL_COLUMNS",
    "MAX_LABELS",
    "LabelScores",
    "LabelSet",
    "continuation_ids",
    "item_chance",
    "label_columns",
    "label_set",
    "nan_mean",
    "score_labels",
    "Protocol",
    "PROTOCOLS",
    "get_protocol",
    "intervention_hooks",
    "last_logits",
    "greedy_generate",
    "stop_ids",
    "newline_ids",
    "exact_match",
    "official_exact_match",
    "cut_at_eos",
    "run_method",
    "ItemScores",
    "answer_lengths",
    "score_items",
    "reference_logits",
    "rank_labels",
    "resolve_labels",
    "METHODS",
    "summarize",
    "first_token_accuracy",
]
