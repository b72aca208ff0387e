"""Exact activation patching: check the learned α against what the heads causally do.

1. :func:`intra_task`: inject a task's embedding with α = 1 into only the top-k / bottom-k /
   k random heads (by the fitted α), and the reverse (the full SITE α with the top-k or bottom-k
   heads set to 0); first-token accuracy on zero-shot prompts with bootstrap CIs over items.
2. :func:`inter_task`: inject task B's embedding through task A's α (and A's top-k heads).
3. Per-head causal effects (:func:`head_causal_effects`) live in :mod:`sitelens.patching.effects`; the
   statistics over these results (:func:`transfer_matrix`, :func:`alpha_similarity`,
   :func:`transfer_similarity_correlation`, :func:`within_between`, :data:`TASK_FAMILIES`,
   :func:`effect_alpha_correlation`) in :mod:`sitelens.patching.analysis`; all are names of
   :mod:`sitelens.patching`.

Every intervention acts only at the last prompt token, so the prompt prefix is encoded once into a
frozen KV cache (:func:`sitelens.models.prefix_cache`) and only the last token is re-run per
condition; many conditions share one forward pass through per-row :class:`HeadMix` weights
``[batch, n_layers, n_heads]`` (the engine below, also used by :mod:`sitelens.patching.effects`). All
functions return data (tensors, DataFrames, dicts) and are seeded.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from sitelens.errors import AdapterError, TaskError
from sitelens.eval.evaluation import evaluate
from sitelens.heads import HeadSet, order
from sitelens.models import (
    model_name,
)
from sitelens.patching.engine import row_grid, run_rows
from sitelens.site import SiteAdapter
from sitelens.site.injection import HeadMix
from sitelens.site.training import LastTokenSet
from sitelens.stats import bootstrap_ci
from sitelens.tasks import Task

SELECTIONS = ("top", "bottom", "random", "full_minus_top", "full_minus_bottom")
REFERENCES = ("zero_shot", "site")

# ----------------------------------------------------------------------------------------------
# head selections


def _n_total(alpha: Tensor) -> int:
    return int(alpha.numel())


def default_ks(n_total: int) -> list[int]:
    """1, 2, 4, … (powers of two below ``n_total``), then ``n_total``."""
    ks, k = [], 1
    while k < n_total:
        ks.append(k)
        k *= 2
    return ks + [n_total]


def ranked_heads(alpha: Float[Tensor, "n_layers n_heads"], *, descending: bool = True) -> Tensor:
    """Flat head indices (``layer * n_heads + head``) sorted by α, on the CPU
    (:func:`sitelens.heads.order`: stable, ties keep index order)."""
    return order(alpha.detach().cpu(), descending=descending)


def _random_perm(n_total: int, seed: int, s: int) -> Tensor:
    return torch.as_tensor(np.random.default_rng([seed, s]).permutation(n_total))


def selection_weights(
    alpha: Float[Tensor, "n_layers n_heads"],
    selection: str,
    k: int,
    *,
    seed: int = 0,
    random_seed: int = 0,
) -> Float[Tensor, "n_layers n_heads"]:
    """The mixing weights of one intra-task condition.

    ``top``/``bottom``/``random``: a binary mask (α = 1) on the k heads with the largest / smallest
    α / the first k of a permutation seeded by ``(seed, random_seed)`` (nested across k).
    ``full_minus_top``/``full_minus_bottom``: α with those k heads set to 0.
    ``zero_shot``: all zeros. ``site``: α."""
    alpha = alpha.detach().float().cpu()
    shape, n = alpha.shape, _n_total(alpha)
    if not 0 <= k <= n:
        raise ValueError(f"k must be between 0 and the number of heads ({n}), got {k}.")
    if selection == "zero_shot":
        return torch.zeros(shape)
    if selection == "site":
        return alpha.clone()
    if selection in ("top", "full_minus_top"):
        mask = HeadSet.top_k(alpha, k).mask()
    elif selection in ("bottom", "full_minus_bottom"):
        mask = HeadSet.top_k(alpha, k, descending=False).mask()
    elif selection == "random":
        mask = HeadSet(*shape, _random_perm(n, seed, random_seed)[:k].tolist()).mask()
    else:
        known = ", ".join(SELECTIONS + REFERENCES)
        raise ValueError(f"Unknown selection {selection!r}; use {known}.")
    if selection.startswith("full_minus_"):
        return alpha * (1 - mask)  # [n_layers, n_heads]
    return mask


def _check_adapter(model, adapter: SiteAdapter, name: str = "") -> None:
    if not isinstance(adapter, SiteAdapter):
        raise AdapterError(
            f"Expected a SiteAdapter{f' for {name!r}' if name else ''}, got "
            f"{type(adapter).__name__}. Fit one with sitelens.fit_site or load one with "
            "SiteAdapter.load(dir)."
        )
    adapter.check_model(model)


def _items(task: Task, split: str, limit: int | None):
    items = task.split(split)
    items = items[:limit] if limit else items
    if not items:
        raise TaskError(f"Task {task.name!r} has no items in its {split!r} split.")
    return items


# ----------------------------------------------------------------------------------------------
# 1. intra-task patching


def _score_conditions(
    model, task: Task, weights: Float[Tensor, "n_cond n_layers n_heads"], embedding, *, split: str,
    limit: int | None, template, batch_size: int, n_boot: int, seed: int,
):
    """Every (condition, item) row of ``weights`` × the task's zero-shot items on one frozen prefix
    cache: ``(items, correct, prob, ci_lo, ci_hi)``, arrays ``[n_cond, n_items]`` / ``[n_cond]``."""
    n_cond = weights.shape[0]
    items = _items(task, split, limit)
    data = LastTokenSet.build(model, items, template)
    item_idx, cond_idx = row_grid(n_cond, len(items))
    correct, prob = run_rows(
        model, data.cache, data.last, data.answers, item_idx, cond_idx, weights, embedding,
        batch_size=batch_size,
    )
    correct = correct.reshape(n_cond, len(items)).numpy()  # [n_cond, n_items]
    prob = prob.reshape(n_cond, len(items)).numpy()  # [n_cond, n_items]
    lo, hi = bootstrap_ci(correct, n_boot=n_boot, seed=seed)
    return items, correct, prob, lo, hi


def intra_task(
    model,
    task: Task,
    adapter: SiteAdapter,
    *,
    ks: Sequence[int] | None = None,
    n_random_seeds: int = 3,
    split: str = "test",
    limit: int | None = None,
    seed: int = 0,
    n_boot: int = 1000,
    reverse: bool = True,
    references: bool = True,
    exact_match: bool = False,
    batch_size: int = 128,
) -> pd.DataFrame:
    """Intra-task patching on the zero-shot prompts of ``split``.

    For each k in ``ks`` (default 1, 2, 4, …, all heads): inject ``adapter.embedding`` with α = 1
    into only the top-k heads by α (``top``), the bottom-k (``bottom``) and k random heads
    (``random``, ``n_random_seeds`` seeds); with ``reverse``, the full SITE α with the top-k
    (``full_minus_top``) or bottom-k (``full_minus_bottom``) heads set to 0. With ``references``,
    two extra rows: ``zero_shot`` (k = 0, no injection) and ``site`` (the full α, k = all heads).

    Accuracy is first-token accuracy (argmax of the next-token logits equals the answer's first
    token), computed on a frozen prefix KV cache, many conditions per forward pass. ``exact_match``
    also generates greedily under each condition (:func:`sitelens.eval.evaluation.evaluate`; slow) and adds
    ``exact_match, em_ci_low, em_ci_high``. CIs: percentile bootstrap over items (``n_boot``
    resamples, seeded, shared across conditions).

    Returns one row per condition: ``model, task, k, selection, seed`` (the random-selection seed
    index, ``<NA>`` otherwise), ``accuracy, ci_low, ci_high`` (first-token accuracy and its CI),
    ``answer_prob`` (mean probability of the answer's first token; smoother than accuracy on small
    test splits), ``n`` (items).
    """
    _check_adapter(model, adapter, task.name)
    template = adapter.template
    alpha = adapter.alpha.detach().float().cpu()  # [n_layers, n_heads]
    n_total = _n_total(alpha)
    ks = default_ks(n_total) if ks is None else [int(k) for k in ks]
    for k in ks:
        if not 0 <= k <= n_total:
            raise ValueError(f"ks must lie in [0, {n_total}] (the number of heads), got {k}.")

    conds: list[tuple[str, int, int | None]] = []
    if references:
        conds += [("zero_shot", 0, None), ("site", n_total, None)]
    for k in ks:
        conds += [("top", k, None), ("bottom", k, None)]
        conds += [("random", k, s) for s in range(n_random_seeds)]
        if reverse:
            conds += [("full_minus_top", k, None), ("full_minus_bottom", k, None)]
    weights = torch.stack(
        [selection_weights(alpha, sel, k, seed=seed, random_seed=s or 0) for sel, k, s in conds]
    )  # [n_cond, n_layers, n_heads]

    items, correct, prob, lo, hi = _score_conditions(
        model, task, weights, adapter.embedding, split=split, limit=limit, template=template,
        batch_size=batch_size, n_boot=n_boot, seed=seed,
    )
    df = pd.DataFrame(
        {
            "model": model_name(model),
            "task": task.name,
            "k": [k for _, k, _ in conds],
            "selection": [sel for sel, _, _ in conds],
            "seed": pd.array([s for _, _, s in conds], dtype="Int64"),
            "accuracy": correct.mean(1),
            "ci_low": lo,
            "ci_high": hi,
            "answer_prob": prob.mean(1),
            "n": len(items),
        }
    )
    if exact_match:
        mixes = [HeadMix(w, adapter.embedding) for w in weights]
        em = np.stack(
            [_exact_match_items(model, task, mix, split, limit, template) for mix in mixes]
        )  # [n_cond, n_items]
        elo, ehi = bootstrap_ci(em, n_boot=n_boot, seed=seed)
        df["exact_match"], df["em_ci_low"], df["em_ci_high"] = em.mean(1), elo, ehi
    return df


def _exact_match_items(model, task, mix: HeadMix, split, limit, template) -> np.ndarray:
    res = evaluate(
        model, task, methods=("patched",), split=split, limit=limit, template=template,
        interventions={"patched": mix}, label_metrics=False,
    )
    return res["correct"].to_numpy(dtype=float)  # [n_items], in split order


# ----------------------------------------------------------------------------------------------
# 2. inter-task patching and α-map similarity


def _as_task_list(tasks) -> list[Task]:
    return list(tasks.values()) if isinstance(tasks, Mapping) else list(tasks)


def _adapter_map(tasks: list[Task], adapters) -> dict[str, SiteAdapter]:
    if isinstance(adapters, Mapping):
        amap = dict(adapters)
    else:
        adapters = list(adapters)
        if len(adapters) != len(tasks):
            raise AdapterError(
                f"Got {len(adapters)} adapters for {len(tasks)} tasks; pass one adapter per task "
                "(or a dict task name -> adapter)."
            )
        amap = {t.name: a for t, a in zip(tasks, adapters, strict=True)}
    missing = [t.name for t in tasks if t.name not in amap]
    if missing:
        raise AdapterError(
            f"No adapter for task(s) {', '.join(missing)}; fit them with sitelens.fit_site (keys "
            "of `adapters` must be task names)."
        )
    return amap


def inter_task(
    model,
    tasks: Sequence[Task] | Mapping[str, Task],
    adapters: Mapping[str, SiteAdapter] | Sequence[SiteAdapter],
    *,
    k: int | None = None,
    split: str = "test",
    limit: int | None = None,
    seed: int = 0,
    n_boot: int = 1000,
    batch_size: int = 128,
    sources: Sequence[str] | None = None,
    targets: Sequence[str] | None = None,
) -> pd.DataFrame:
    """Inject task B's embedding through task A's head weights, for every ordered pair (A, B).

    ``mode="alpha"``: weights = A's α; ``mode="topk"``: α = 1 on A's top-k heads (``k`` defaults
    to min(10, all heads)). Accuracy: first-token accuracy on B's zero-shot ``split`` prompts
    (B's template). The diagonal (A = B) is SITE itself (alpha) or B's own top-k. ``sources`` /
    ``targets``: only the pairs whose A / B is among these task names (default: all); a row is the
    same whichever other pairs are measured, up to float rounding of the batched products.

    Returns a long DataFrame: ``model, source_task, target_task, mode, k`` (``<NA>`` for alpha),
    ``accuracy, ci_low, ci_high, answer_prob, n, zero_shot`` (B's accuracy without injection)."""
    tasks = _as_task_list(tasks)
    amap = _adapter_map(tasks, adapters)
    for t in tasks:
        _check_adapter(model, amap[t.name], t.name)
    names = [t.name for t in tasks]
    for which, given in (("sources", sources), ("targets", targets)):
        unknown = sorted(set(given or ()) - set(names))
        if unknown:
            raise TaskError(f"inter_task {which} {', '.join(map(repr, unknown))} are not among the "
                            "tasks; pass names of tasks in `tasks`.")
    alpha0 = amap[names[0]].alpha
    n_total = _n_total(alpha0)
    k = min(10, n_total) if k is None else int(k)
    if not 1 <= k <= n_total:
        raise ValueError(f"k must lie in [1, {n_total}] (the number of heads), got {k}.")

    # conditions (the same for every target B): zero-shot, then per source A: alpha, topk
    conds: list[tuple[str | None, str]] = [(None, "zero_shot")]
    weights = [torch.zeros_like(alpha0, dtype=torch.float32).cpu()]
    for a in names:
        if sources is not None and a not in sources:
            continue
        alpha_a = amap[a].alpha.detach().float().cpu()
        conds += [(a, "alpha"), (a, "topk")]
        weights += [alpha_a, selection_weights(alpha_a, "top", k)]
    weights = torch.stack(weights)  # [n_cond, n_layers, n_heads]

    rows = []
    for tb in tasks:
        if targets is not None and tb.name not in targets:
            continue
        ad_b = amap[tb.name]
        template = ad_b.template
        items, correct, prob, lo, hi = _score_conditions(
            model, tb, weights, ad_b.embedding, split=split, limit=limit, template=template,
            batch_size=batch_size, n_boot=n_boot, seed=seed,
        )
        zs = float(correct[0].mean())
        for c, (src, mode) in enumerate(conds):
            if src is None:
                continue
            rows.append(
                {
                    "model": model_name(model),
                    "source_task": src,
                    "target_task": tb.name,
                    "mode": mode,
                    "k": k if mode == "topk" else None,
                    "accuracy": float(correct[c].mean()),
                    "ci_low": float(lo[c]),
                    "ci_high": float(hi[c]),
                    "answer_prob": float(prob[c].mean()),
                    "n": len(items),
                    "zero_shot": zs,
                }
            )
    df = pd.DataFrame(rows, columns=["model", "source_task", "target_task", "mode", "k", "accuracy",
                                     "ci_low", "ci_high", "answer_prob", "n", "zero_shot"])
    df["k"] = pd.array(df["k"], dtype="Int64")
    return df


__all__ = [
    "SELECTIONS", "REFERENCES",
    "default_ks", "ranked_heads",
    "selection_weights", "intra_task", "inter_task",
]
