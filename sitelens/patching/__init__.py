"""Exact activation patching: intra / inter-task patching of head sets, per-head causal effects
and the statistics over their results."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sitelens.lazy import lazy_names

if TYPE_CHECKING:  # for type checkers; at run time each name is imported on first access
    from sitelens.patching.analysis import (
        TASK_FAMILIES,
        alpha_similarity,
        by_target_family,
        effect_alpha_correlation,
        intra_gaps,
        intra_mean,
        target_centred,
        transfer_matrix,
        transfer_similarity_correlation,
        within_between,
    )
    from sitelens.patching.core import (
        REFERENCES,
        SELECTIONS,
        default_ks,
        inter_task,
        intra_task,
        ranked_heads,
        selection_weights,
    )
    from sitelens.patching.effects import EffectsConfig, corrupted_prompts, head_causal_effects
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

# name -> the module that defines it (PEP 562: imported when first used)
__getattr__, __dir__ = lazy_names(__name__, {
    "sitelens.patching.analysis": ("TASK_FAMILIES", "alpha_similarity", "by_target_family",
        "effect_alpha_correlation", "intra_gaps", "intra_mean", "target_centred", "transfer_matrix",
        "transfer_similarity_correlation", "within_between"),
    "sitelens.patching.core": ("REFERENCES", "SELECTIONS", "default_ks", "inter_task", "intra_task",
        "ranked_heads", "selection_weights"),
    "sitelens.patching.effects": ("EffectsConfig", "corrupted_prompts", "head_causal_effects"),
    "sitelens.patching.engine": ("BackwardPassCounter", "ForwardPassCounter", "RowCounter",
        "batched_answer_probs", "patched_last_logits", "prefix_rows", "row_grid", "run_rows",
        "serial_answer_probs"),
})

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
    "SELECTIONS",
    "REFERENCES",
    "default_ks",
    "ranked_heads",
    "selection_weights",
    "intra_task",
    "inter_task",
    "EffectsConfig",
    "corrupted_prompts",
    "head_causal_effects",
]
