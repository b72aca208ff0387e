"""What ``sitelens eval``, ``demo`` and ``fit`` print about their numbers: each accuracy with its 95%
interval over items, a warning when there are few items, and the data a fit actually used.

- :func:`summary_text`: the :func:`sitelens.eval.evaluation.summarize` table for people, every
  accuracy as ``0.833 [0.552, 0.953]`` (its 95% Wilson score interval over the items, from the
  ``<metric>_ci_low`` / ``_ci_high`` columns) beside ``n``;
- :func:`summary_json`: the same as one JSON object per method (``<metric>_ci``: ``[low, high]``);
- :func:`few_items_warning`: one line when an accuracy rests on fewer than :data:`FEW_ITEMS` items;
- :func:`fit_data_lines`: the split sizes and passes over the training data of ``adapter.json``'s
  ``data`` (written since sitelens records it; None for an older adapter), with a warning when
  the validation set is tiny (fewer than :data:`FEW_VALID` items).
"""

from __future__ import annotations

import json

from sitelens.format import round_or_none

FEW_ITEMS = 100  # fewer test items than this: the intervals are wide, say so
FEW_VALID = 20  # fewer validation items than this: the kept α rests on few items, say so
# the accuracies of summarize(), in the order printed; each has <name>_ci_low / <name>_ci_high
ACCURACY_COLUMNS = ("first_token_acc", "exact_match", "label_acc_first", "label_acc_full",
                    "label_acc_full_norm")
_CI_SUFFIXES = ("_ci_low", "_ci_high")


def _cell(value: float, lo: float, hi: float) -> str:
    """``0.833 [0.552, 0.953]``; ``nan`` when the accuracy is undefined."""
    if value != value:  # NaN: e.g. label_acc_first where the labels share a first token
        return "nan"
    return f"{value:.3f} [{lo:.3f}, {hi:.3f}]"


def summary_text(summary) -> str:
    """The summary table with each accuracy and its interval in one cell (the interval columns
    folded in), then a line saying what the brackets are."""
    table = summary.copy()
    folded = [c for c in ACCURACY_COLUMNS if c in table.columns and f"{c}_ci_low" in table.columns]
    for c in folded:
        table[c] = [_cell(v, lo, hi) for v, lo, hi in
                    zip(table[c], table[f"{c}_ci_low"], table[f"{c}_ci_high"])]
    table = table.drop(columns=[f"{c}{s}" for c in folded for s in _CI_SUFFIXES])
    note = "[low, high]: 95% Wilson score interval over the n items"
    return table.to_string(index=False) + "\n" + note


def summary_json(summary) -> str:
    """``{method: {"first_token_acc", "first_token_acc_ci", "exact_match", "exact_match_ci", "n",
    "seconds_per_item"}}`` as one line, ``<metric>_ci`` being ``[low, high]``, the 95% Wilson score
    interval over the items; plus ``label_acc_first``, ``label_acc_full``, ``label_acc_full_norm``
    (each with its ``_ci``) and ``chance`` when label metrics were computed (None where
    undefined)."""
    labelled = [c for c in ("label_acc_first", "label_acc_full", "label_acc_full_norm", "chance")
                if c in summary.columns]

    def interval(r, c) -> dict:
        if f"{c}_ci_low" not in summary.columns:
            return {}
        return {f"{c}_ci": [round_or_none(getattr(r, f"{c}_ci_low")),
                            round_or_none(getattr(r, f"{c}_ci_high"))]}

    obj = {
        r.method: {
            "first_token_acc": round(float(r.first_token_acc), 4),
            **interval(r, "first_token_acc"),
            "exact_match": round(float(r.exact_match), 4),
            **interval(r, "exact_match"),
            "n": int(r.n),
            "seconds_per_item": round(float(r.seconds_per_item), 5),
            **{k: v for c in labelled
               for k, v in {c: round_or_none(getattr(r, c)), **interval(r, c)}.items()},
        }
        for r in summary.itertuples()
    }
    return json.dumps(obj)


def few_items_warning(summary) -> str | None:
    """``warning: few items: ...`` when the smallest ``n`` of the summary is under
    :data:`FEW_ITEMS`, else None."""
    n = int(summary["n"].min()) if len(summary) else 0
    if n >= FEW_ITEMS:
        return None
    return (f"warning: few items: interval over {n} items (95% Wilson score); a difference between "
            "methods inside their intervals is not evidence, evaluate on more items to tell them apart")


def fit_data_lines(meta: dict) -> list[str]:
    """What a fit used, from ``meta["data"]`` (:func:`sitelens.site.alpha.data_used`): the split
    sizes, the training examples and passes over the train split, the validation items; then a
    warning line when there are fewer than :data:`FEW_VALID` validation items. Empty for an
    adapter saved before the data were recorded."""
    d = meta.get("data")
    if not d:
        return []
    official = meta.get("protocol") == "official"
    lines = [
        f"data: {d['n_train']} train / {d['n_valid']} valid / {d['n_test']} test items; stage 2 saw "
        f"{d['train_examples']} training examples drawn from {d['train_items_used']} of the "
        f"{d['n_train']} train items ({d['passes']:.1f} passes); validation on "
        f"{d['valid_items_used']} {d['valid_split_used']} items"
    ]
    if d["valid_items_used"] < FEW_VALID:
        what = ("the reported validation loss rests" if official
                else "early stopping (which α is kept) rests")
        lines.append(f"warning: only {d['valid_items_used']} validation items: {what} on few items; "
                     "give the task more validation items (a valid.json, or a larger task)")
    return lines


__all__ = ["FEW_ITEMS", "FEW_VALID", "ACCURACY_COLUMNS", "summary_text", "summary_json",
           "few_items_warning", "fit_data_lines"]
