"""Which tasks a numerics bump moved (:data:`sitelens.provenance.NUMERICS_VERSION`), as data.

A bump may name the tasks it can move as a rule over (model, task, template): a task its rule does
not touch has the same numbers before and after it, so a table made before the bump can be
brought up to date by measuring only the touched tasks (:func:`sitelens.atlas.carry.carry_atlas_data`).
A version without a rule in :data:`NUMERICS_TOUCHES` touched everything (its change, e.g. of the
attention path, reaches every task); version 2 changed no number.
"""

from __future__ import annotations

from sitelens import provenance
from sitelens.tasks.core import DEFAULT_TEMPLATE, answer_parts


def _answers_with_leading_whitespace(model, task, template) -> bool:
    """Version 3's rule: it moved only prompts and answer tokens of items whose answer starts with a
    whitespace-only token (:func:`sitelens.tasks.answer_parts` gives a non-empty ``lead``)."""
    return any(answer_parts(model, ex.output, template)[0]
               for split in ("train", "valid", "test") for ex in getattr(task, split))


NUMERICS_TOUCHES = {2: lambda model, task, template: False, 3: _answers_with_leading_whitespace}


def numerics_touches(model, task, since: int, template=None) -> bool:
    """Whether a result of ``task`` on ``model`` made at numerics version ``since`` can differ at
    the current :data:`sitelens.provenance.NUMERICS_VERSION`: whether some bump after ``since`` has
    no rule in :data:`NUMERICS_TOUCHES`, or its rule touches the task (``template``: of its prompts
    and answer tokens, default :data:`sitelens.tasks.DEFAULT_TEMPLATE`)."""
    template = DEFAULT_TEMPLATE if template is None else template
    for version in range(int(since) + 1, provenance.NUMERICS_VERSION + 1):
        rule = NUMERICS_TOUCHES.get(version)
        if rule is None or rule(model, task, template):
            return True
    return False


__all__ = ["NUMERICS_TOUCHES", "numerics_touches"]
