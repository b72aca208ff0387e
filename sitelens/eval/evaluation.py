"""Evaluation of methods on a task split: per-item DataFrames of predictions, first-token and
exact-match scores, and label ranks for tasks with a closed label set.

Methods: ``zero-shot``, ``icl`` (k-shot, demonstrations from train) and ``site`` (zero-shot prompt,
adapter injected once at the last prompt token during prefill), plus any named intervention.
When asked (``label_metrics=True``), or when the task declares its labels, items are also scored by
ranking the labels of the task's closed label set (:func:`sitelens.eval.labels.wanted_label_set`:
classification, multiple choice) under the same intervention (:mod:`sitelens.eval.labels`), with the
chance level beside each item.

:func:`summarize` gives each accuracy with its 95% Wilson score interval over items
(:func:`sitelens.stats.wilson_interval`): ``<metric>_ci_low`` and ``<metric>_ci_high``.

Every item runs through the one generate-and-score loop, :func:`sitelens.eval.scoring.score_items`.
Two protocols (:class:`~sitelens.eval.scoring.Protocol`) decide how answers are formatted,
generated and scored: ``default`` (sitelens's own) and ``official`` (the public SITE code's, for
parity with the paper). Generation (:mod:`sitelens.eval.generation`) and scoring
(:mod:`sitelens.eval.scoring`) names are importable from here too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pandas as pd
import torch

from sitelens.eval.generation import (
    last_logits,
)
from sitelens.eval.labels import LABEL_COLUMNS, LabelSet, label_set, nan_mean, wanted_label_set
from sitelens.eval.methods import METHODS
from sitelens.eval.scoring import (
    Protocol,
    get_protocol,
    score_items,
)
from sitelens.models import encode
from sitelens.stats import wilson_interval
from sitelens.tasks import (
    DEFAULT_TEMPLATE,
    Example,
    Task,
    Template,
    check_labels,
    few_shot_prompts,
    warn_shared_answer_token,
    zero_shot_prompts,
)


def run_method(
    model,
    task: Task,
    items: Sequence[Example],
    method: str,
    *,
    prompts: list[str],
    intervention=None,
    batch_size: int = 16,
    template: Template = DEFAULT_TEMPLATE,
    max_new_tokens: int | None = None,
    protocol: str | Protocol | None = None,
    labels: LabelSet | None = None,
    progress: bool = False,
) -> pd.DataFrame:
    """Generate for each prompt and score it (:func:`sitelens.eval.scoring.score_items`). One row
    per item. ``protocol`` sets the generation length and the scoring (the caller builds
    ``prompts`` and ``template`` for it). With ``labels``, each item is also scored by ranking its
    labels under the same intervention (:data:`sitelens.eval.labels.LABEL_COLUMNS`;
    ``label_seconds_per_item`` is their cost, apart from ``seconds_per_item``, the generation's).
    ``progress``: a bar ``eval {method} [task]`` over the items."""
    s = score_items(model, task, items, prompts, intervention=intervention, template=template,
                    batch_size=batch_size, protocol=protocol, max_new_tokens=max_new_tokens,
                    labels=labels, progress=progress, desc=f"eval {method} [{task.name}]")
    df = pd.DataFrame([{
        "task": task.name,
        "method": method,
        "input": ex.input,
        "target": ex.output,
        "prediction": s.texts[i].strip().split("\n")[0].strip(),
        "first_token_correct": bool(s.first_token_correct[i]),
        "correct": bool(s.correct[i]),
    } for i, ex in enumerate(items)])
    df["seconds_per_item"] = s.seconds_per_item
    if s.labels is not None:
        for c in LABEL_COLUMNS:
            df[c] = [row[c] for row in s.labels]
        df["label_seconds_per_item"] = s.label_seconds / max(1, len(items))
    return df


def resolve_labels(task: Task, labels=None, label_metrics: bool | None = None) -> LabelSet | None:
    """``labels`` and ``label_metrics`` of :func:`evaluate` as a
    :class:`~sitelens.eval.labels.LabelSet`, or None for no label ranking. ``label_metrics=False``
    or ``labels=False``: none. ``labels``: ``"auto"`` detects the task's
    (:func:`sitelens.eval.labels.label_set`; None for an open-ended task), a sequence of strings is
    the label set itself. ``labels=None``: the task's declared labels, or with
    ``label_metrics=True`` its detected ones (:func:`sitelens.eval.labels.wanted_label_set`)."""
    if labels is False or label_metrics is False:
        return None
    if labels is None:
        return wanted_label_set(task, label_metrics)
    if isinstance(labels, LabelSet):
        return labels
    if isinstance(labels, str):
        if labels != "auto":
            raise ValueError(f"labels must be 'auto', None, a LabelSet or a list of labels, got {labels!r}.")
        return label_set(task)
    return LabelSet(check_labels(list(labels), "evaluate(labels=...)"), source="given")


def evaluate(
    model,
    task: Task,
    *,
    methods: Sequence[str] = METHODS,
    adapter=None,
    split: str = "test",
    limit: int | None = None,
    n_shots: int = 10,
    seed: int = 0,
    batch_size: int = 16,
    template: Template | None = None,
    interventions: dict | None = None,
    protocol: str | Protocol | None = None,
    labels: str | LabelSet | Sequence[str] | None = None,
    label_metrics: bool | None = None,
    progress: bool = False,
) -> pd.DataFrame:
    """Evaluate methods on a split. ``interventions`` maps extra method names to interventions
    applied on zero-shot prompts (a :class:`HeadMix` or a ``(model, seq_len) -> hooks`` callable).
    ``protocol``: ``"default"``, ``"official"`` or a :class:`Protocol`; ``None`` takes the
    adapter's (``adapter.meta["protocol"]``, written by an official fit), else the default. It also
    sets the template's digit formatting (demonstrations, answer tokens).
    Label metrics only when asked (:func:`resolve_labels`): ``label_metrics=True`` ranks the labels
    of the task's closed label set (an open-ended task raises :class:`~sitelens.errors.TaskError`),
    ``False`` never; the default ranks only a task that declares its labels (``labels.json``,
    ``Task(labels=...)``). ``labels``: a list of label strings (or ``"auto"``, detect them) asks too.
    ``progress``: a bar per method, ``eval {method} [task]``, over the items
    (:func:`sitelens.format.progress_bar`: plain lines when stderr is not a terminal).
    Returns the per-item DataFrame (columns: task, method, input, target, prediction,
    first_token_correct, correct (bool), seconds_per_item; with labels also n_labels, chance,
    label_pred, and the floats label_rank_first, label_rank_full, label_rank_full_norm (1.0 / 0.0
    hit, NaN undefined), label_seconds_per_item)."""
    if protocol is None and adapter is not None:
        protocol = adapter.meta.get("protocol")
    proto = get_protocol(protocol)
    template = template or (adapter.template if adapter is not None else DEFAULT_TEMPLATE)
    template = replace(template, bare_digits=proto.bare_digits)
    items = task.split(split)[:limit] if limit else task.split(split)
    label_space = resolve_labels(task, labels, label_metrics)
    warn_shared_answer_token(model, task.name, [ex.output for ex in items], template)
    zs = zero_shot_prompts(model, items, template)
    frames = []
    extra = dict(interventions or {})
    for method in methods:
        if method in extra:  # caller-supplied interventions win over built-in names
            prompts, inter = zs, extra[method]
        elif method == "zero-shot":
            prompts, inter = zs, None
        elif method == "icl":
            prompts = few_shot_prompts(task, list(items), n_shots, seed=seed, template=template,
                                       model=model)
            inter = None
        elif method == "site":
            if adapter is None:
                raise ValueError("method 'site' needs an adapter (fit one with fit_site).")
            # the digit formatting follows the protocol; the rest must be the adapter's
            adapter.check_model(model, replace(template, bare_digits=adapter.template.bare_digits))
            prompts, inter = zs, adapter.mix().placed(model)  # rows on their layers' devices
        else:
            raise ValueError(
                f"Unknown method {method!r}; use zero-shot, icl, site"
                + (", " + ", ".join(extra) if extra else "")
            )
        frames.append(
            run_method(model, task, items, method, prompts=prompts, intervention=inter,
                       batch_size=batch_size, template=template, protocol=proto, labels=label_space,
                       progress=progress)
        )
    return pd.concat(frames, ignore_index=True)


# each accuracy of summarize() and the per-item column it is the mean of
ACCURACIES = {"first_token_acc": "first_token_correct", "exact_match": "correct"}
LABEL_ACCURACIES = {"label_acc_first": "label_rank_first", "label_acc_full": "label_rank_full",
                    "label_acc_full_norm": "label_rank_full_norm"}


def _wilson_bounds(values) -> tuple[float, float]:
    """The 95% Wilson interval of the mean of the finite 0/1 ``values``."""
    x = pd.to_numeric(pd.Series(values), errors="coerce").astype(float)
    x = x[x.notna()]
    return wilson_interval(float(x.sum()), len(x))


def summarize(df: pd.DataFrame) -> pd.DataFrame:
    """Per (task,) method: first_token_acc, exact_match, n, seconds_per_item; where the rows carry
    label ranks, also label_acc_first (over the items where it is defined), label_acc_full,
    label_acc_full_norm and chance (the mean of 1 / n_labels). Then, for every accuracy ``m``
    of these, ``m_ci_low`` and ``m_ci_high``: its 95% Wilson score interval over the items
    (:func:`sitelens.stats.wilson_interval`; over the items where it is defined). Rows read from
    an ``items.csv`` (the method's time as ``method_seconds_per_item``) are summarized alike."""
    if "seconds_per_item" not in df.columns and "method_seconds_per_item" in df.columns:
        df = df.rename(columns={"method_seconds_per_item": "seconds_per_item"})  # an items.csv
    keys = [k for k in ("model", "task", "method") if k in df.columns]
    g = df.groupby(keys, sort=False)
    aggs = dict(
        first_token_acc=("first_token_correct", "mean"),
        exact_match=("correct", "mean"),
        n=("correct", "size"),
        seconds_per_item=("seconds_per_item", "first"),
    )
    accs = dict(ACCURACIES)
    if "label_rank_full" in df.columns:
        aggs.update(
            label_acc_first=("label_rank_first", nan_mean),
            label_acc_full=("label_rank_full", nan_mean),
            label_acc_full_norm=("label_rank_full_norm", nan_mean),
            chance=("chance", nan_mean),
        )
        accs.update(LABEL_ACCURACIES)
    out = g.agg(**aggs).reset_index()
    for metric, col in accs.items():
        bounds = [_wilson_bounds(part[col]) for _, part in g]  # groups in the order of `out`
        out[f"{metric}_ci_low"] = [lo for lo, _ in bounds]
        out[f"{metric}_ci_high"] = [hi for _, hi in bounds]
    return out


def first_token_accuracy(model, prompts: list[str], answers: list[int], intervention=None,
                         batch_size: int = 32) -> float:
    """Fraction of prompts whose argmax next token is the answer's first token (no generation)."""
    hits = 0
    for s in range(0, len(prompts), batch_size):
        enc = encode(model, prompts[s : s + batch_size])
        top = last_logits(model, enc, intervention).argmax(-1)  # [batch]
        hits += int((top == torch.tensor(answers[s : s + batch_size], device=top.device)).sum())
    return hits / max(1, len(prompts))


__all__ = [
    "run_method", "resolve_labels", "evaluate", "summarize", "first_token_accuracy", "ACCURACIES",
    "LABEL_ACCURACIES",
]
