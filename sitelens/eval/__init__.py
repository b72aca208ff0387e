"""Evaluation: the one generate-and-score loop, protocols, closed label sets, metrics (dNTP,
exact match, Wilson and bootstrap intervals)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sitelens.lazy import attach

if TYPE_CHECKING:  # imported on first access (sitelens.lazy)
    from sitelens.eval.evaluate import (
        PROTOCOLS,
        Protocol,
        cut_at_eos,
        evaluate,
        exact_match,
        first_token_accuracy,
        get_protocol,
        greedy_generate,
        intervention_hooks,
        last_logits,
        newline_ids,
        official_exact_match,
        rank_labels,
        resolve_labels,
        run_method,
        stop_ids,
        summarize,
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
        bootstrap_ci,
        correlation,
        dntp,
        dntp_per_item,
        mean_over_tasks,
        wilson_interval,
    )
    from sitelens.eval.scoring import (
        ItemScores,
        answer_lengths,
        reference_logits,
        score_items,
    )

__getattr__, __dir__ = attach(__name__, __file__)

__all__ = [
    "dntp_per_item",
    "dntp",
    "accuracy",
    "bootstrap_ci",
    "correlation",
    "mean_over_tasks",
    "wilson_interval",
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
    "evaluate",
    "summarize",
    "first_token_accuracy",
]
