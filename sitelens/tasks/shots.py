"""How many demonstrations fit the context: the shot count of long-input collections.

BIG-Bench Hard and MMLU-Pro inputs run to 1,500 characters (the datasets' cleaning cap), so a
10-shot prompt of them does not fit the bundled models' context of ``n_ctx`` = 2048 tokens
(:data:`sitelens.models.registry.DEFAULT_N_CTX`). The shot count of a (model, task) is the largest
``k ≤ max_shots`` for which every ``k``-shot prompt of the task, plus the tokens the bench may
generate after it, fits (:func:`shots_that_fit`):

    prompt_tokens(k) + reserve ≤ n_ctx,     reserve = :data:`RESERVE` = 32

``reserve`` is :data:`sitelens.tasks.core.ANSWER_ROOM`, the cap on new tokens of
:func:`sitelens.eval.scoring.score_items` (it generates ``min(ANSWER_ROOM, longest answer + 2)``;
a label continuation of :mod:`sitelens.eval.labels` is never longer).
``prompt_tokens(k)`` is, with ``guaranteed=True`` (the default), the bound that holds for *every*
seed: the prompt made of the ``k`` longest training shots (each tokenized alone) and the longest
query of any split, tokenized whole, with BOS where the model prepends one. It is tokenized
whole because the parts do not simply add up: SmolLM2's byte-level BPE turns a shot's closing
``"\\n\\n"`` into one token alone but into two before the next ``"Q:"`` (one token more per
demonstration); Gemma's tokenizer keeps it one token. Every boundary is the same (``"\\n\\n"``
then ``"Q:"``), so the longest parts make the longest prompt. ``guaranteed=False`` measures the seeded prompts
that :func:`sitelens.tasks.few_shot_prompts` builds for the test split instead (what a bench run
with that seed sees; a larger ``k`` can pass).

Measured (``python benchmarks/shot_counts.py``, :file:`benchmarks/results/shot_counts.md`;
``n_ctx`` = 2048, ``reserve`` = 32, at most 10 shots). One ``k`` per collection and model, the
smallest over its tasks, so that one shot count serves the whole collection
(``run_bench(..., n_shots=k)`` with the methods' ``n_shots=k``); "seed 0" is the
seeded test prompts' ``k`` (a bench run with seed 0), "every seed" the guaranteed bound:

==========  ==============  ==============  =============================================
collection  SmolLM2-135M    Gemma-3-270M    set by (longest zero-shot prompt, tokens)
            every / seed 0  every / seed 0
==========  ==============  ==============  =============================================
cls         4 / 10          6 / 10          dbpedia (629) on SmolLM2, rte (301) on Gemma
bbh         4 / 5           5 / 6           salient_translation_error_detection (378 / 339)
mmlu_pro    1 / 2           1 / 2           five subjects; questions up to 957 / 944
anli        9 / 10          9 / 10          r3 (235 / 216)
==========  ==============  ==============  =============================================

So: cls runs 10-shot for the seed-0 test prompts on both models (every ICL prompt of the bench
fits), though a 10-shot prompt of dbpedia's or rte's longest items would not; BBH takes 4 shots
(5 on Gemma), MMLU-Pro 1 (its questions reach 957 tokens alone), ANLI 9. Per task, most BBH and
MMLU-Pro tasks fit more (the md's table); SmolLM2 needs more tokens than Gemma for the same text
(one more per demonstration alone: see above). :data:`MEASURED` holds the guaranteed column.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from sitelens.errors import TaskError
from sitelens.models import BUNDLED, prepends_bos, token_ids
from sitelens.tasks import (
    ANSWER_ROOM,
    DEFAULT_TEMPLATE,
    Example,
    Task,
    Template,
    few_shot_prompt,
    few_shot_prompts,
    sample_demos,
)

RESERVE = ANSWER_ROOM  # the context kept free after a prompt: the most new tokens generation takes
MAX_SHOTS = 10  # the SITE / LTV papers' k

# benchmarks/results/shot_counts.md: the guaranteed k per collection and bundled model (n_ctx 2048,
# reserve 32), held by each model's record (BundledModel.shots)
MEASURED: dict[str, dict[str, int]] = {
    c: {m.name: m.shots[c] for m in BUNDLED.values() if m.shots}
    for c in dict.fromkeys(c for m in BUNDLED.values() for c in (m.shots or {}))
}


@dataclass(frozen=True)
class ShotFit:
    """The shot count of one (model, task): ``k`` (0 when not even a zero-shot prompt fits:
    then ``k`` is -1), the prompt length at ``k`` and at ``k + 1`` (``None`` past
    ``max_shots``), and the settings."""

    task: str
    k: int
    tokens_at_k: int
    tokens_at_next: int | None
    n_ctx: int
    reserve: int
    guaranteed: bool


def _bos(model) -> int:
    return 1 if prepends_bos(model) else 0


def shot_lengths(model, task: Task, template: Template = DEFAULT_TEMPLATE) -> list[int]:
    """Token count of each training item formatted as a demonstration (tokenized alone)."""
    return [len(token_ids(model, template.format_shot(ex))) for ex in task.train]


def query_lengths(model, items: Sequence[Example], template: Template = DEFAULT_TEMPLATE) -> list[int]:
    """Token count of each item formatted as the query (tokenized alone, no BOS)."""
    return [len(token_ids(model, template.format_query(ex.input))) for ex in items]


def guaranteed_lengths(model, task: Task, max_shots: int = MAX_SHOTS,
                       template: Template = DEFAULT_TEMPLATE) -> list[int]:
    """For ``k`` = 0..``max_shots`` (while the train split has ``k + 1`` items), the length of the
    longest ``k``-shot prompt any seed can build: the ``k`` longest shots and the longest query,
    tokenized whole, + BOS (module docstring)."""
    by_len = sorted(zip(shot_lengths(model, task, template), range(len(task.train))), reverse=True)
    queries = [*task.train, *task.valid, *task.test]
    q_len = query_lengths(model, queries, template)
    query = queries[max(range(len(queries)), key=q_len.__getitem__)]
    out = []
    for k in range(0, min(max_shots, len(task.train) - 1) + 1):
        demos = [task.train[i] for _, i in by_len[:k]]
        out.append(_bos(model) + len(token_ids(model, few_shot_prompt(demos, query.input, template))))
    return out


def boundary_tokens(model, task: Task, template: Template = DEFAULT_TEMPLATE) -> int:
    """Tokens a prompt gains at each shot boundary over its parts tokenized alone (SmolLM2: +1,
    the closing ``"\\n\\n"`` split in two before ``"Q:"``; Gemma: 0)."""
    shot, query = template.format_shot(task.train[0]), template.format_query(task.train[-1].input)
    return len(token_ids(model, shot + query)) - len(token_ids(model, shot)) - len(token_ids(model, query))


def seeded_lengths(model, task: Task, max_shots: int = MAX_SHOTS, *, seed: int = 0,
                   split: str = "test", template: Template = DEFAULT_TEMPLATE,
                   n_checked: int = 3) -> list[int]:
    """For ``k`` = 0..``max_shots``, the longest ``k``-shot prompt that
    :func:`~sitelens.tasks.few_shot_prompts` builds for ``split`` with ``seed`` (with BOS).

    Counted from the parts (each shot and query tokenized once, + :func:`boundary_tokens` per
    demonstration) on the same seeded draws, because tokenizing every whole prompt of MMLU-Pro
    takes minutes; the first ``n_checked`` prompts of each ``k`` are tokenized whole and must
    agree (else ``AssertionError``)."""
    items = getattr(task, split)
    shot_len = dict(zip(task.train, shot_lengths(model, task, template)))
    q_len = query_lengths(model, items, template)
    delta, bos = boundary_tokens(model, task, template), _bos(model)
    out = []
    for k in range(0, min(max_shots, len(task.train) - 1) + 1):
        rng = random.Random(seed)  # the draws of few_shot_prompts(task, items, k, seed=seed)
        lengths = [bos + q + sum(shot_len[d] + delta for d in sample_demos(task.train, k, rng,
                                                                           exclude=ex.input))
                   for ex, q in zip(items, q_len)]
        whole = few_shot_prompts(task, items[:n_checked], k, seed=seed, template=template)
        for got, prompt in zip(lengths, whole):
            if got != bos + len(token_ids(model, prompt)):
                raise AssertionError(f"{task.name}: {k}-shot prompt length counted from its parts "
                                     f"({got}) differs from the whole prompt's")
        out.append(max(lengths))
    return out


def shots_that_fit(
    model,
    task: Task,
    *,
    n_ctx: int | None = None,
    reserve: int = RESERVE,
    max_shots: int = MAX_SHOTS,
    guaranteed: bool = True,
    seed: int = 0,
    template: Template = DEFAULT_TEMPLATE,
) -> ShotFit:
    """The largest ``k ≤ max_shots`` whose ``k``-shot prompts + ``reserve`` fit ``n_ctx``
    (default: the model's); module docstring. ``k = -1`` when not even the zero-shot prompt
    fits."""
    n_ctx = int(model.cfg.n_ctx if n_ctx is None else n_ctx)
    if not task.train:
        raise TaskError(f"Task {task.name!r} has no training items to use as demonstrations.")
    lengths = (guaranteed_lengths(model, task, max_shots, template) if guaranteed
               else seeded_lengths(model, task, max_shots, seed=seed, template=template))
    fits = [k for k, n in enumerate(lengths) if n + reserve <= n_ctx]
    k = max(fits) if fits else -1
    return ShotFit(
        task=task.name, k=k, tokens_at_k=lengths[k] if k >= 0 else lengths[0],
        tokens_at_next=lengths[k + 1] if k + 1 < len(lengths) else None,
        n_ctx=n_ctx, reserve=reserve, guaranteed=guaranteed,
    )


def collection_shots(model, tasks: Sequence[Task], **kw) -> int:
    """One shot count for a whole collection: the smallest :func:`shots_that_fit` ``k`` over
    ``tasks`` (one shot count for them all)."""
    return min(shots_that_fit(model, t, **kw).k for t in tasks)


__all__ = [
    "MAX_SHOTS", "MEASURED", "RESERVE", "ShotFit", "boundary_tokens", "collection_shots",
    "guaranteed_lengths",
    "query_lengths", "seeded_lengths", "shot_lengths", "shots_that_fit",
]
