"""Closed label sets: which tasks have one, and scoring by ranking the label words.

Classification and multiple-choice tasks (the ``cls/`` collection, ANLI, MMLU-Pro's letters
A–J, BIG-Bench Hard's multiple-choice tasks) answer with one of a few label words. Greedy
generation then measures the format as much as the choice, so such tasks are also scored by
*ranking the labels*: each label is appended to the prompt as the answer and scored by the model;
the best-scoring label is the prediction, and chance is 1 / (number of labels).

When (:func:`wanted_label_set`): only when asked. A task that declares its labels (below, 1.) is
ranked by default; any other only with ``label_metrics=True`` (``--label-metrics`` on ``sitelens
eval`` and ``sitelens bench``), which detects them by rules 2 and 3 and refuses an open-ended task.

Which labels (:func:`label_set`):

1. ``task.labels``, when the task defines them (a ``labels.json`` list beside ``train.json`` in an
   FV-layout directory, or ``Task(..., labels=...)``);
2. otherwise the distinct outputs of train + valid + test, when there are between 2 and
   :data:`MAX_LABELS` (20) of them and they are not all numbers. 20 covers every closed set of
   the datasets (dbpedia's 14 classes, BBH's up to 18 options) and leaves out free-form tasks
   (BBH's word_sorting has 250 distinct outputs, multistep_arithmetic_two 185, dyck_languages 59).
   All-number outputs are counts or results, an open range (BBH's object_counting has 17
   distinct counts, 2–18), not a label set: ranking the counts that happen to occur would set a
   chance level by accident.
3. Multiple choice with the options listed in the input: when most items' gold output is an
   option marker that its own input lists — ``(A)`` at the start of a line (BBH) or ``A.`` at
   the start of a line (MMLU-Pro) — each item is ranked over *its own* listed options
   (:meth:`LabelSet.for_item`). MMLU-Pro questions with fewer than 10 options and BBH questions
   whose options never occur as a gold answer (geometric_shapes' ``(A)``) get their true chance
   level. An item whose gold answer is not among its labels (upstream quirks: one
   movie_recommendation and two ruin_names targets are option text) is always ranked wrong.

Scores (:func:`score_labels`), for each item and each of its labels ``c`` with answer tokens
``t_1 .. t_T`` (``template.prefix_for(c) + c`` tokenized alone, as the answer token of
:func:`sitelens.tasks.answer_token_id`):

- ``first``: ``log p(t_1 | prompt)``; undefined (NaN) for an item whose labels do not all start
  with different tokens (BBH's ``(A)``, ``(B)`` all start with ``" ("``);
- ``full``: ``Σ_k log p(t_k | prompt, t_<k)``, and ``full_norm`` = ``full / T`` (length-normalized).

Interventions act exactly as in generation: the prompt is run once with the intervention's hooks
pinned to the prompt length (a prefill-scoped intervention — SITE's :class:`~sitelens.site.injection.HeadMix`,
TV, FV, LTV, State Vector — injects at the prompt's last token only), and the label tokens
continue from its KV cache with the hooks still in place, like decode steps: prefill-scoped hooks
leave them alone, every-position ones (I2CL, LoRA, (IA)3) act on them. The continuation of a batch
is never as long as the prompt (it is padded one column further if it would be), so a prefill
hook cannot fire on it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from jaxtyping import Float, Int
from torch import Tensor

from sitelens.errors import TaskError
from sitelens.models import (
    SELECT_BUDGET_BYTES,
    cache_rows_per_batch,
    encode,
    kv_forward,
    length_batches,
    memory_budget,
    new_kv_cache,
    select_cache,
    token_ids,
)
from sitelens.site.injection import apply_hooks
from sitelens.tasks import DEFAULT_TEMPLATE, Example, Task, Template

MAX_LABELS = 20
# option markers listed in an input, by style: "(A) text" (BBH) and "A. text" (MMLU-Pro)
_OPTION_STYLES = {
    "parenthesized": (re.compile(r"^\(([A-Z])\)$"), re.compile(r"(?m)^\(([A-Z])\)\s"), "({})"),
    "dotted": (re.compile(r"^([A-Z])$"), re.compile(r"(?m)^([A-Z])\.\s"), "{}"),
}
_NUMBER = re.compile(r"^[-+]?(?:\d+(?:\.\d*)?|\.\d+)$")

Hook = tuple[str, Callable]


# ----------------------------------------------------------------------------------------------
# which labels


@dataclass(frozen=True)
class LabelSet:
    """A task's closed label set. ``source``: ``"task"`` (defined by the task) or ``"outputs"``
    (detected from its outputs). ``options``: ``None``, or the option style
    (``"parenthesized"``, ``"dotted"``) whose markers each item's input lists (then
    :meth:`for_item` ranks an item over its own options)."""

    labels: tuple[str, ...]
    source: str = "outputs"
    options: str | None = None

    def for_item(self, ex: Example) -> tuple[str, ...]:
        """The labels ``ex`` is ranked over: the option markers its input lists (in the order
        listed) in options mode, else :attr:`labels`."""
        if self.options is None:
            return self.labels
        _, listed, fmt = _OPTION_STYLES[self.options]
        found = tuple(dict.fromkeys(fmt.format(m) for m in listed.findall(ex.input)))
        return found or self.labels

    @property
    def chance(self) -> float:
        """1 / (number of labels) of the task-level set (per item: :func:`item_chance`)."""
        return 1.0 / len(self.labels)


def _is_number(text: str) -> bool:
    return bool(_NUMBER.match(text.strip()))


def _option_style(items: Sequence[Example]) -> str | None:
    """The option style in which more than half of ``items`` answer with a marker their own
    input lists, or None."""
    for style, (marker, listed, _) in _OPTION_STYLES.items():
        hits = 0
        for ex in items:
            m = marker.match(ex.output.strip())
            hits += bool(m) and m.group(1) in listed.findall(ex.input)
        if hits * 2 > len(items):
            return style
    return None


def label_set(task: Task, *, max_labels: int = MAX_LABELS) -> LabelSet | None:
    """The task's closed label set by the rules of the module docstring, or None for an
    open-ended task."""
    items = [*task.train, *task.valid, *task.test]
    if task.labels:
        labels, source = tuple(task.labels), "task"
    else:
        distinct = sorted({ex.output for ex in items})
        if not 2 <= len(distinct) <= max_labels or all(_is_number(o) for o in distinct):
            return None
        labels, source = tuple(distinct), "outputs"
    return LabelSet(labels, source, _option_style(items))


def wanted_label_set(task: Task, label_metrics: bool | None = None) -> LabelSet | None:
    """The label set that evaluation ranks over, only when asked for: ``label_metrics=None``
    (the default) ranks a task that declares its labels (``task.labels``: ``labels.json``,
    ``Task(labels=...)``) and no other; ``True`` also detects them from the outputs
    (:func:`label_set`), raising :class:`~sitelens.errors.TaskError` for an open-ended task;
    ``False`` never ranks."""
    if label_metrics is False or not (label_metrics or task.labels):
        return None
    found = label_set(task)
    if found is None:
        n = len({ex.output for ex in [*task.train, *task.valid, *task.test]})
        raise TaskError(
            f"Task {task.name!r} has no closed label set ({n} distinct outputs; label metrics need "
            f"2 to {MAX_LABELS} that are not all numbers, or a labels.json beside train.json); "
            "drop --label-metrics (label_metrics=True) or give the labels."
        )
    return found


def item_chance(labels: Sequence[str]) -> float:
    return 1.0 / len(labels) if labels else float("nan")


# ----------------------------------------------------------------------------------------------
# scoring


@dataclass
class LabelScores:
    """One item's label scores (module docstring): per label, in ``labels`` order."""

    labels: tuple[str, ...]
    first: Float[Tensor, " n_labels"]
    full: Float[Tensor, " n_labels"]
    n_tokens: Int[Tensor, " n_labels"]
    first_distinct: bool = field(default=True)

    @property
    def full_norm(self) -> Float[Tensor, " n_labels"]:
        return self.full / self.n_tokens  # [n_labels]

    def predict(self, score: str = "full") -> str | None:
        """The best label by ``"first"``, ``"full"`` or ``"full_norm"`` (ties: the first label);
        None for ``"first"`` when the labels' first tokens are not distinct."""
        if score == "first" and not self.first_distinct:
            return None
        values = {"first": self.first, "full": self.full, "full_norm": self.full_norm}[score]
        return self.labels[int(torch.argmax(values))]


def continuation_ids(model, labels: Sequence[str], template: Template = DEFAULT_TEMPLATE) -> list[list[int]]:
    """Each label as the answer tokens that follow the prompt (its answer prefix + the label,
    tokenized alone)."""
    from sitelens.errors import TokenizationError

    out = []
    for label in labels:
        ids = token_ids(model, template.prefix_for(label) + label)
        if not ids:
            raise TokenizationError(f"The label {label!r} tokenizes to nothing; give non-empty labels.")
        out.append(ids)
    return out


def score_labels(
    model,
    prompts: Sequence[str],
    labels: Sequence[Sequence[str]],
    *,
    hooks_for: Callable[[int], list[Hook]] = lambda seq_len: [],
    template: Template = DEFAULT_TEMPLATE,
    batch_size: int = 16,
) -> list[LabelScores]:
    """:class:`LabelScores` of each prompt over its labels, under the hooks ``hooks_for(seq_len)``
    (the intervention pinned to a prompt batch of ``seq_len`` positions; module docstring)."""
    conts = [continuation_ids(model, labs, template) for labs in labels]
    out: list[LabelScores | None] = [None] * len(prompts)
    for idx in length_batches(model, list(prompts), batch_size):  # memory-bounded
        enc = encode(model, [prompts[i] for i in idx])
        rows = _batch_logprobs(model, enc, [conts[i] for i in idx], hooks_for(enc.tokens.shape[1]),
                               batch_size)
        for j, i in enumerate(idx):
            first, full, n_tok = rows[j]
            starts = [c[0] for c in conts[i]]
            out[i] = LabelScores(tuple(labels[i]), first, full, n_tok,
                                 first_distinct=len(set(starts)) == len(starts))
    return out


def _batch_logprobs(
    model, enc, conts: list[list[list[int]]], hooks: list[Hook], batch_size: int
) -> list[tuple[Tensor, Tensor, Tensor]]:
    """Per prompt of ``enc``: (first-token log-probs, full log-likelihoods, token counts) of its
    continuations. One prefill with ``hooks`` into a KV cache, then the continuations' remaining
    tokens on copies of its rows, right-padded, with the same hooks in place."""
    B, P = enc.tokens.shape
    cache = new_kv_cache(model, B)
    with torch.no_grad(), apply_hooks(model, hooks):
        last = kv_forward(model, enc.tokens, enc.attention_mask, cache, last_only=True)  # [B, 1, V]
        logp_last = torch.log_softmax(last[:, -1].float(), dim=-1).cpu()  # [B, d_vocab]
        first = [logp_last[j, [c[0] for c in conts[j]]] for j in range(B)]  # [n_labels] each
        rest = [torch.zeros(len(conts[j])) for j in range(B)]  # Σ log p of tokens 2..T
        pending = [(j, c) for j in range(B) for c in range(len(conts[j])) if len(conts[j][c]) > 1]
        step = cache_rows_per_batch(cache, batch_size,
                                    budget_bytes=memory_budget(model, SELECT_BUDGET_BYTES))
        for s in range(0, len(pending), step):
            chunk = pending[s : s + step]
            sums = _continue(model, cache, [conts[j][c] for j, c in chunk], [j for j, _ in chunk], P)
            for (j, c), v in zip(chunk, sums.tolist()):
                rest[j][c] = v
    return [(first[j], first[j] + rest[j], torch.tensor([len(c) for c in conts[j]]))
            for j in range(B)]


def _continue(
    model, cache, seqs: list[list[int]], rows: list[int], prompt_len: int
) -> Float[Tensor, " chunk"]:
    """Σ_{k ≥ 2} log p(t_k | prompt, t_<k) of each token sequence ``seqs[r]``, continuing the
    prompt row ``rows[r]`` of ``cache`` (copied): tokens ``t_1 .. t_{T−1}`` are fed, right-padded,
    never as many columns as the prompt (so prefill-pinned hooks leave them alone)."""
    width = max(len(t) - 1 for t in seqs)
    width += width == prompt_len  # one more pad column: a prefill hook must not fire here
    dev = model.cfg.device
    tokens = torch.zeros(len(seqs), width, dtype=torch.long)  # [chunk, width], pad id 0
    mask = torch.zeros(len(seqs), width, dtype=torch.long)  # [chunk, width]
    for r, t in enumerate(seqs):
        tokens[r, : len(t) - 1] = torch.tensor(t[:-1])
        mask[r, : len(t) - 1] = 1
    sub = select_cache(cache, rows)  # frozen copies: the prompt rows stay as they were
    logits = kv_forward(model, tokens.to(dev), mask.to(dev), sub)  # [chunk, width, d_vocab]
    logp = torch.log_softmax(logits.float(), dim=-1).cpu()  # [chunk, width, d_vocab]
    sums = torch.zeros(len(seqs))  # [chunk]
    for r, t in enumerate(seqs):
        k = torch.arange(len(t) - 1)
        sums[r] = logp[r, k, torch.tensor(t[1:])].sum()
    return sums


# ----------------------------------------------------------------------------------------------
# per-item columns


LABEL_COLUMNS = ("n_labels", "chance", "label_pred", "label_rank_first", "label_rank_full",
                 "label_rank_full_norm")


def label_columns(scores: LabelScores, gold: str) -> dict:
    """The per-item columns of :func:`sitelens.eval.evaluation.evaluate` for one item: ``n_labels``,
    ``chance`` (1 / n_labels), ``label_pred`` (the full-likelihood argmax) and one hit column per
    score, ``label_rank_first``, ``label_rank_full``, ``label_rank_full_norm``: each a float, 1.0
    when that score ranks the gold label first, 0.0 when not, NaN when the score is undefined for
    the item (``first`` where the labels' first tokens are not distinct), so that a column's
    mean over its finite values is the accuracy."""
    first = scores.predict("first")
    return {
        "n_labels": len(scores.labels),
        "chance": item_chance(scores.labels),
        "label_pred": scores.predict("full"),
        "label_rank_first": float("nan") if first is None else float(first == gold),
        "label_rank_full": float(scores.predict("full") == gold),
        "label_rank_full_norm": float(scores.predict("full_norm") == gold),
    }


def nan_mean(values) -> float:
    """The mean of the finite values (NaN when there are none)."""
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    return sum(vals) / len(vals) if vals else float("nan")


# The label metrics of a set of items: the means of their label columns (and of the chance level).
LABEL_METRICS = ["label_acc_first", "label_acc_full", "label_acc_full_norm", "chance"]


def label_metrics_of(cols: list[dict] | None) -> dict:
    """The :data:`LABEL_METRICS` of per-item :func:`label_columns`: means over the items where each
    is finite (:func:`nan_mean`); all NaN for ``None`` (no closed label set)."""
    if cols is None:
        return dict.fromkeys(LABEL_METRICS, float("nan"))
    return {
        "label_acc_first": nan_mean(c["label_rank_first"] for c in cols),
        "label_acc_full": nan_mean(c["label_rank_full"] for c in cols),
        "label_acc_full_norm": nan_mean(c["label_rank_full_norm"] for c in cols),
        "chance": nan_mean(c["chance"] for c in cols),
    }


__all__ = [
    "LABEL_COLUMNS", "LABEL_METRICS", "MAX_LABELS", "LabelScores", "LabelSet", "continuation_ids",
    "item_chance", "label_columns", "label_metrics_of", "label_set", "nan_mean", "score_labels",
    "wanted_label_set",
]
