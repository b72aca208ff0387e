"""Per-head causal effects (the Function Vectors paper's indirect effect): which heads, patched
alone with the task-mean activation, restore the task in corrupted prompts.

:func:`head_causal_effects`: in corrupted (shuffled-label) few-shot prompts
(:func:`corrupted_prompts`), replace one head's last-token ``z`` by the task-mean activation and
measure the change in probability of the correct first answer token. Batched across heads: one
head per row of one forward pass, on top of a frozen prefix KV cache (the engine of
:mod:`sitelens.patching`); ``batched=False`` is the reference one-full-forward-pass-per-head
loop. The knobs live in :class:`EffectsConfig` (keyword arguments override its fields).
:func:`sitelens.patching.analysis.effect_alpha_correlation` compares the result with an α map.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor

from sitelens.errors import AdapterError, TaskError
from sitelens.patching.engine import (
    ForwardPassCounter,
    RowCounter,
    batched_answer_probs,
    serial_answer_probs,
)
from sitelens.provenance import config_with_overrides
from sitelens.site import task_embedding
from sitelens.tasks import (
    DEFAULT_TEMPLATE,
    Task,
    Template,
    answer_token_ids,
    few_shot_prompts,
)


@dataclass(frozen=True)
class EffectsConfig:
    """The knobs of :func:`head_causal_effects` (every field can also be passed as a keyword
    argument of that function, overriding the config)."""

    n_prompts: int = 16  # corrupted prompts
    n_shots: int = 10  # demonstrations per corrupted prompt
    seed: int = 0  # draws the queries and shuffles the labels; seeds the default embedding
    batched: bool = True  # False: the reference loop, one full forward pass per head
    n_mean_prompts: int = 50  # clean prompts of the default embedding (task_embedding)
    split: str = "train"  # where the queries come from (the test split stays unseen)
    template: Template = DEFAULT_TEMPLATE
    batch_size: int = 64  # rows (prompt, patched head) per forward pass


def corrupted_prompts(
    model,
    task: Task,
    *,
    n_prompts: int = 16,
    n_shots: int = 10,
    split: str = "train",
    seed: int = 0,
    template: Template = DEFAULT_TEMPLATE,
) -> tuple[list[str], list[int]]:
    """``n_prompts`` shuffled-label ``n_shots``-shot prompts (queries drawn, seeded, from ``split``;
    demonstrations from train, never the query) and the first token of each query's answer."""
    pool = task.split(split)
    if not pool:
        raise TaskError(f"Task {task.name!r} has no items in its {split!r} split.")
    rng = random.Random(seed)
    if n_prompts <= len(pool):
        queries = rng.sample(pool, n_prompts)
    else:
        queries = rng.choices(pool, k=n_prompts)
    prompts = few_shot_prompts(
        task, queries, n_shots, seed=seed + 1, template=template, shuffle_labels=True, model=model
    )
    return prompts, answer_token_ids(model, [q.output for q in queries], template)


def head_causal_effects(
    model,
    task: Task,
    config: EffectsConfig | None = None,
    *,
    embedding: Float[Tensor, "n_layers n_heads d_head"] | None = None,
    return_stats: bool = False,
    progress: bool = False,
    **overrides,
):
    """Per-head causal effect ``[n_layers, n_heads]`` (the Function Vectors paper's indirect
    effect). ``config`` (default :class:`EffectsConfig`) sets the knobs; keyword ``overrides`` are
    :class:`EffectsConfig` field names (``n_prompts=8``, ``batched=False``, …; an unknown name
    raises ``TypeError``).

    For ``n_prompts`` corrupted (shuffled-label) ``n_shots``-shot prompts, replace head (l, h)'s
    last-token ``z`` by the task-mean activation ``embedding[l, h]`` (default:
    :func:`~sitelens.site.task_embedding` over ``n_mean_prompts`` clean prompts, seeded) and
    measure P(correct first answer token | patched) − P(… | unpatched corrupted), averaged over
    prompts. Queries come from ``split`` (default train, so the test split stays unseen).

    ``batched=True``: the prefix of each corrupted prompt is encoded once into a frozen KV cache;
    then each row of one forward pass re-runs only the last token with a different head patched
    (per-row HeadMix weights), ``batch_size`` rows per pass. ``batched=False``: the reference loop,
    one full forward pass (over all prompts) per head. Both give the same numbers (tested).

    ``return_stats=True`` returns ``(effects, stats)`` with timings: ``seconds`` (excluding the
    mean activation), ``forward_passes`` (the calls of ``model`` actually made, counted by a
    forward pre-hook on it: prefix-cache passes included, the mean activation excluded),
    ``rows`` (the (prompt, condition) rows run, ``(N + 1) × n_prompts``: last-token rows batched,
    whole-prompt rows serial; counted by :class:`~sitelens.patching.engine.RowCounter`),
    ``baseline_prob``, ``mode``.

    ``progress``: bars for the default embedding and the patched rows, ``effect [task]``."""
    cfg = config_with_overrides(EffectsConfig, config, overrides, "head_causal_effects")
    L, H, d_head = model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_head
    if embedding is None:
        embedding = task_embedding(
            model, task, n_prompts=cfg.n_mean_prompts, n_shots=cfg.n_shots, seed=cfg.seed,
            template=cfg.template, progress=progress,
        )  # [n_layers, n_heads, d_head]
    if tuple(embedding.shape) != (L, H, d_head):
        raise AdapterError(
            f"embedding has shape {tuple(embedding.shape)} but the model needs "
            f"[n_layers={L}, n_heads={H}, d_head={d_head}]."
        )
    embedding = embedding.to(model.cfg.device)  # [n_layers, n_heads, d_head]
    with ForwardPassCounter(model) as passes, RowCounter(model) as rows:
        effects, base, patched, n, N = _head_effects(model, task, embedding, cfg, progress)
    if not return_stats:
        return effects
    stats = {
        "mode": "batched" if cfg.batched else "serial",
        "seconds": passes.seconds,
        "forward_passes": passes.count,
        "rows": rows.count,
        "n_prompts": n,
        "n_heads_total": N,
        "baseline_prob": float(base.mean()),
        "per_prompt": (patched - base[:, None]).reshape(n, L, H),  # [n_prompts, L, H]
    }
    return effects, stats


def _head_effects(model, task: Task, embedding, cfg: EffectsConfig, progress: bool = False):
    """The work of :func:`head_causal_effects` (its forward passes and rows are counted around it):
    ``(effects, base, patched, n_prompts, n_heads_total)``, where ``base`` ``[n_prompts]``
    is the answer probability unpatched and ``patched`` ``[n_prompts, N]`` with head j patched."""
    L, H = model.cfg.n_layers, model.cfg.n_heads
    prompts, answers = corrupted_prompts(
        model, task, n_prompts=cfg.n_prompts, n_shots=cfg.n_shots, split=cfg.split,
        seed=cfg.seed, template=cfg.template,
    )
    n, N = len(prompts), L * H
    onehots = torch.eye(N).reshape(N, L, H)  # [N, n_layers, n_heads]: row j patches head j
    answer_probs = batched_answer_probs if cfg.batched else serial_answer_probs
    base, patched = answer_probs(model, prompts, answers, onehots, embedding, cfg.batch_size,
                                 progress=progress, desc=f"effect [{task.name}]")
    effects = (patched - base[:, None]).mean(0).reshape(L, H)  # [n_layers, n_heads]
    return effects, base, patched, n, N


__all__ = ["EffectsConfig", "corrupted_prompts", "head_causal_effects"]
