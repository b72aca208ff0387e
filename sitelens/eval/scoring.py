"""The one generate-and-score loop: :func:`score_items` generates greedily for each prompt under an
intervention and scores it (first-token accuracy, exact match, dNTP against reference logits, the
label ranks of a closed label set). :func:`sitelens.eval.evaluation.evaluate` (through
:func:`~sitelens.eval.evaluation.run_method`) and the bench (:func:`sitelens.pipelines.bench.score_fitted`,
every baseline's cells) run it.

A :class:`Protocol` decides how answers are generated and scored: ``default`` (sitelens's own) and
``official`` (the public SITE code's, for parity with the paper). The default generates up to
``min(ANSWER_ROOM, longest answer in tokens + 2)`` new tokens per batch
(:data:`sitelens.tasks.core.ANSWER_ROOM`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from sitelens.eval.generation import cut_at_eos, greedy_generate, intervention_hooks
from sitelens.eval.labels import LabelSet, label_columns, score_labels
from sitelens.eval.metrics import dntp_per_item
from sitelens.format import progress_bar
from sitelens.models import encode, length_batches, token_ids
from sitelens.tasks import (
    ANSWER_ROOM,
    DEFAULT_TEMPLATE,
    Example,
    Task,
    Template,
    answer_token_ids,
    few_shot_prompts,
)

# ----------------------------------------------------------------------------------------------
# protocols


@dataclass(frozen=True)
class Protocol:
    """How answers are formatted, generated and scored.

    ``default``: up to ``min(ANSWER_ROOM, longest answer in tokens + 2)`` new tokens per batch, stopping at a
    newline or EOS; :func:`exact_match` (first line, lowercased unless the task is case-sensitive,
    prefix match); a space before every answer.

    ``official``: the paper's public code, github.com/SNU-DRL/Soft_Injection (commit 01bd5d6):
    ``eval_scripts/eval_site.sh`` runs ``eval.py --exact_match --max_token 20 --test_batch_size 1``;
    the ``generate`` of ``models.py`` is Hugging Face ``generate(max_new_tokens=20,
    min_new_tokens=1, top_k=1)``, greedy, so EOS cannot be the first token, a newline does not stop
    it and the text ends at EOS; ``eval.py`` scores it as :func:`official_exact_match`;
    ``preprocess.py`` puts no space before an all-digit answer
    (:attr:`sitelens.tasks.Template.bare_digits`). Its stage 2 is
    :meth:`sitelens.site.FitConfig.official`.

    Two details follow sitelens rather than the reference: the answer token is the first token of
    the (prefixed) answer tokenized alone, where the reference diffs the tokenizations of the prompt
    and prompt + answer (the same token on all 9,724 FV test items checked with SmolLM2's
    tokenizer, the first 200 per task); and EOS is the tokenizer's ``eos_token_id``, where
    ``generate`` uses the model's generation config.
    """

    name: str = "default"
    max_new_tokens: int | None = None  # None: min(ANSWER_ROOM, longest answer in tokens + 2) per batch
    min_new_tokens: int = 0  # the first steps on which EOS cannot be chosen
    stop_at_newline: bool = True
    scoring: str = "default"  # "default": exact_match; "official": official_exact_match
    bare_digits: bool = False  # no space before an all-digit answer (demonstrations, answer token)

    def __post_init__(self):
        if self.scoring not in ("default", "official"):
            raise ValueError(f"Protocol.scoring must be 'default' or 'official', got {self.scoring!r}.")


PROTOCOLS = {
    "default": Protocol(),
    "official": Protocol("official", max_new_tokens=20, min_new_tokens=1, stop_at_newline=False,
                         scoring="official", bare_digits=True),
}


def get_protocol(spec: str | Protocol | None = None) -> Protocol:
    """A :class:`Protocol` from its name (``"default"``, ``"official"``); ``None`` is the default."""
    if isinstance(spec, Protocol):
        return spec
    name = spec or "default"
    if name not in PROTOCOLS:
        raise ValueError(f"Unknown protocol {name!r}; use one of {', '.join(PROTOCOLS)}.")
    return PROTOCOLS[name]

# ----------------------------------------------------------------------------------------------
# scoring


def exact_match(prediction: str, target: str, *, case_sensitive: bool = False) -> bool:
    """The reference's criterion: the first generated line (stripped), lowercased unless the task
    is case-sensitive, counts if it starts with the target."""
    line = prediction.strip().split("\n")[0].strip()
    target = target.strip()
    if not case_sensitive:
        line, target = line.lower(), target.lower()
    return line.startswith(target)


def official_exact_match(prediction: str, target: str, task_name: str) -> bool:
    """The exact match of the public SITE code (``eval.py`` of SNU-DRL/Soft_Injection, its
    ``--exact_match`` branch): ``St.`` becomes ``Saint`` in the prediction and the target, both are
    cut at the first ``(``, the prediction also at its first newline (after stripping); both are
    lowercased unless the task's name contains ``capitalize`` or ``lowercase`` (``uppercase``
    tasks are lowercased too); the prediction counts if it starts with the target (so an empty
    target, e.g. one that starts with ``(``, always counts)."""
    target = target.replace("St.", "Saint").split("(")[0].strip()
    line = prediction.strip().replace("St.", "Saint").split("\n")[0].split("(")[0].strip()
    if "capitalize" not in task_name.lower() and "lowercase" not in task_name.lower():
        target, line = target.lower(), line.lower()
    return line[: len(target)] == target


def answer_lengths(model, items: Sequence[Example], template: Template = DEFAULT_TEMPLATE, *,
                   bare_digits: bool = True) -> list[int]:
    """Token count of each item's answer with what precedes it, which sizes the generation room:
    :meth:`~sitelens.tasks.Template.prefix_for` (no space before an all-digit answer under
    ``template.bare_digits``, as the answer token is formed); with ``bare_digits=False``,
    ``template.answer_prefix`` before every answer, whatever ``template.bare_digits`` says."""
    if bare_digits:
        return [len(token_ids(model, template.prefix_for(ex.output) + ex.output)) for ex in items]
    return [len(token_ids(model, template.answer_prefix + ex.output)) for ex in items]


@dataclass
class ItemScores:
    """What :func:`score_items` measured, one entry per item, in item order."""

    texts: list[str]  # the decoded generations (official scoring: cut at the first EOS)
    first_token_correct: np.ndarray  # [n] bool: the first step's argmax is the answer's first token
    correct: np.ndarray  # [n] bool: exact match under the protocol's scoring
    dntp: np.ndarray  # [n] KL(reference ‖ first step); NaN without reference logits
    seconds: float  # wall time of generation and scoring (label ranking not included)
    labels: list[dict] | None = None  # the label columns of each item (rank_labels); None: no labels
    label_seconds: float = 0.0  # wall time of the label ranking

    @property
    def seconds_per_item(self) -> float:
        return self.seconds / max(1, len(self.texts))


def score_items(
    model,
    task: Task,
    items: Sequence[Example],
    prompts: list[str],
    *,
    intervention=None,
    template: Template = DEFAULT_TEMPLATE,
    batch_size: int = 16,
    protocol: str | Protocol | None = None,
    max_new_tokens: int | None = None,
    reference: Float[Tensor, "n d_vocab"] | None = None,
    labels: LabelSet | None = None,
    bare_digit_room: bool = True,
    progress: bool = False,
    desc: str = "generate",
) -> ItemScores:
    """Generate greedily for each prompt under ``intervention`` (its hooks in place for the whole
    generation: prefill-scoped hooks skip the decode steps by themselves, every-position hooks act
    on them) and score each item: whether the first step's argmax is the answer's first token, exact
    match under ``protocol`` (:func:`exact_match` or :func:`official_exact_match`), and with
    ``reference`` (ICL logits of the same items, :func:`reference_logits`) the per-item dNTP.
    With ``labels``, each item's labels are also ranked under the same intervention and prompts
    (:func:`rank_labels`, timed apart).

    New tokens per batch: ``max_new_tokens``, else the protocol's, else
    ``min(ANSWER_ROOM, longest answer in tokens + 2)`` with the answers measured by
    :func:`answer_lengths` (``bare_digits=bare_digit_room``).

    ``progress``: a bar over the items named ``desc`` (:func:`sitelens.format.progress_bar`)."""
    proto = get_protocol(protocol)
    official = proto.scoring == "official"
    answers = answer_token_ids(model, [ex.output for ex in items], template)
    n_tok = answer_lengths(model, items, template, bare_digits=bare_digit_room)
    eos = model.tokenizer.eos_token_id
    texts = [""] * len(items)
    first_ok = np.zeros(len(items), dtype=bool)
    correct = np.zeros(len(items), dtype=bool)
    kl = np.full(len(items), np.nan)
    t0 = time.perf_counter()
    bar = progress_bar(total=len(items), desc=desc, enabled=progress)
    for idx in length_batches(model, prompts, batch_size):  # memory-bounded for long prompts
        enc = encode(model, [prompts[i] for i in idx])
        limit = max_new_tokens or proto.max_new_tokens or min(ANSWER_ROOM, max(n_tok[i] for i in idx) + 2)
        gen, first = greedy_generate(
            model, enc, intervention=intervention, max_new_tokens=limit,
            stop_at_newline=proto.stop_at_newline, min_new_tokens=proto.min_new_tokens,
        )  # [batch, new], [batch, d_vocab]
        top = first.argmax(-1).cpu()  # [batch]
        if reference is not None:
            kl[idx] = dntp_per_item(reference[idx], first.cpu()).numpy()
        for j, i in enumerate(idx):
            ids = gen[j].tolist()
            if official:  # the reference generates one prompt at a time: its text ends at EOS
                ids = cut_at_eos(ids, eos)
            texts[i] = model.tokenizer.decode(ids, skip_special_tokens=True)
            first_ok[i] = int(top[j]) == answers[i]
            if official:
                correct[i] = official_exact_match(texts[i], items[i].output, task.name)
            else:
                correct[i] = exact_match(texts[i], items[i].output, case_sensitive=task.case_sensitive)
        bar.update(len(idx))
    bar.close()
    scores = ItemScores(texts, first_ok, correct, kl, time.perf_counter() - t0)
    if labels is not None:
        t0 = time.perf_counter()
        scores.labels = rank_labels(model, items, prompts, labels, intervention=intervention,
                                    template=template, batch_size=batch_size)
        scores.label_seconds = time.perf_counter() - t0
    return scores


def reference_logits(
    model, task: Task, items: Sequence[Example], *, n_shots: int = 10, seed: int = 0,
    template: Template = DEFAULT_TEMPLATE, batch_size: int = 16,
) -> Float[Tensor, "n d_vocab"]:
    """P_icl as logits: the ``n_shots``-shot ICL next-token logits at the answer position (CPU,
    float32), computed on the same code path and batches as :func:`score_items` (so the ICL
    method's dNTP against them is exactly 0)."""
    prompts = few_shot_prompts(task, list(items), n_shots, seed=seed, template=template, model=model)
    out: list[Tensor | None] = [None] * len(items)
    for idx in length_batches(model, prompts, batch_size):
        enc = encode(model, [prompts[i] for i in idx])
        _, first = greedy_generate(model, enc, max_new_tokens=1)
        first = first.cpu()  # [batch, d_vocab]
        for j, i in enumerate(idx):
            out[i] = first[j]
    return torch.stack(out)


def rank_labels(
    model, items: Sequence[Example], prompts: list[str], labels: LabelSet, *, intervention=None,
    template: Template = DEFAULT_TEMPLATE, batch_size: int = 16,
) -> list[dict]:
    """Per item, the label-ranking columns (:func:`sitelens.eval.labels.label_columns`) of its prompt
    under ``intervention``, pinned to each prompt batch as in generation
    (:func:`~sitelens.eval.generation.intervention_hooks`)."""
    sets = [labels.for_item(ex) for ex in items]
    scores = score_labels(model, prompts, sets, template=template, batch_size=batch_size,
                          hooks_for=lambda seq_len: intervention_hooks(model, intervention, seq_len))
    return [label_columns(s, ex.output) for s, ex in zip(scores, items)]
