"""Exact activation patching: intra / inter-task patching of head sets, per-head causal effects
and the statistics over their results."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sitelens.lazy import attach

if TYPE_CHECKING:  # imported on first access (sitelens.lazy)
    from sitelens.patching.analysis import (
        TASK_FAMILIES,
        alpha_similarity,
        by_target_family,
        effect_alpha_correlation,
        intra_gaps,
        intra_mean,
        round_or_none,
        target_centred,
        transfer_matrix,
        transfer_similarity_correlation,
        within_between,
    )
    from sitelens.patching.core import (
        REFERENCES,
        SELECTIONS,
        bootstrap_ci,
        default_ks,
        inter_task,
        intra_task,
        ranked_heads,
        selection_weights,
        spearman,
    )
    from sitelens.patching.effects import (
        EffectsConfig,
        corrupted_prompts,
        head_causal_effects,
    )
    from sitelens.patching.engine import (
        BackwardPassCounter,
        ForwardPassCounter,
        RowCounter,
        batched_answer_probs,
        patched_last_logits,
        prefix_rows,
        row_grid,
        run_rows,
        serial_answer_probs,
    )

__getattr__, __dir__ = attach(__name__, __file__)

__all__ = [
    "prefix_rows",
    "run_rows",
    "row_grid",
    "patched_last_logits",
    "ForwardPassCounter",
    "BackwardPassCounter",
    "RowCounter",
    "batched_answer_probs",
    "serial_answer_probs",
    "TASK_FAMILIES",
    "transfer_matrix",
    "alpha_similarity",
    "transfer_similarity_correlation",
    "within_between",
    "target_centred",
    "by_target_family",
    "effect_alpha_correlation",
    "intra_mean",
    "intra_gaps",
    "round_or_none",
    "SELECTIONS",
    "REFERENCES",
    "spearman",
    "bootstrap_ci",
    "default_ks",
    "ranked_heads",
    "selection_weights",
    "intra_task",
    "inter_task",
    "EffectsConfig",
    "corrupted_prompts",
    "head_causal_effects",
]
