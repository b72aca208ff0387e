"""Activation patching: check the learned α against what the heads causally do.

1. :func:`intra_task`: inject a task's embedding with α = 1 into only the top-k / bottom-k /
   k random heads (by the fitted α), and the reverse (the full SITE α with the top-k or bottom-k
   heads set to 0); first-token accuracy on zero-shot prompts with bootstrap CIs over items.
2. :func:`inter_task`: inject task B's embedding through task A's α (and A's top-k heads);
   :func:`alpha_similarity` compares α maps across tasks and :func:`transfer_similarity_correlation`
   relates the two (Spearman, with a Mantel permutation test).
3. :func:`head_causal_effects`: Function-Vectors-style per-head causal effect: in corrupted
   (shuffled-label) few-shot prompts, replace one head's last-token ``z`` by the task-mean
   activation and measure the change in probability of the correct first answer token. Batched
   across heads
   (one head per row of one forward pass, on top of a frozen prefix KV cache);
   ``batched=False`` is the reference one-full-forward-pass-per-head loop.

Every intervention acts only at the last prompt token, so the prompt prefix is encoded once into a
frozen KV cache (:func:`sitelens.models.prefix_cache`) and only the last token is re-run per
condition; many conditions share one forward pass through per-row :class:`HeadMix` weights
``[batch, n_layers, n_heads]``. All functions return data (tensors, DataFrames, dicts) and are
seeded.
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from sitelens.errors import AdapterError, TaskError
from sitelens.evaluate import evaluate, last_logits
from sitelens.injection import HeadMix, apply_hooks
from sitelens.metrics import bootstrap_ci
from sitelens.models import (
    cache_rows_per_batch,
    encode,
    last_token_forward,
    model_name,
    prefix_cache,
    select_cache,
)
from sitelens.site import SiteAdapter, task_embedding
from sitelens.tasks import (
    DEFAULT_TEMPLATE,
    Task,
    Template,
    answer_token_ids,
    few_shot_prompts,
    zero_shot_prompt,
)

SELECTIONS = ("top", "bottom", "random", "full_minus_top", "full_minus_bottom")
REFERENCES = ("zero_shot", "site")

# Families of the built-in task suite (sitelens/data/tasks/README.md), for within- vs
# between-family comparisons of α maps and transfer.
TASK_FAMILIES: dict[str, str] = {
    "antonym": "lexical", "synonym": "lexical",
    "singular_plural": "morphology", "present_past": "morphology",
    "adjective_comparative": "morphology",
    "country_capital": "knowledge", "country_currency": "knowledge",
    "landmark_country": "knowledge", "person_occupation": "knowledge",
    "country_language": "knowledge", "animal_young": "knowledge",
    "english_french": "translation", "english_german": "translation",
    "english_spanish": "translation", "english_italian": "translation",
    "capitalize": "string", "uppercase": "string", "first_letter": "string",
    "last_letter": "string", "capitalize_first_letter": "string",
    "lowercase_first_letter": "string", "word_length": "string",
    "choose_first_of_3": "list", "choose_middle_of_3": "list", "choose_last_of_3": "list",
    "alphabetically_first_3": "list", "alphabetically_last_3": "list",
    "next_item": "sequence", "prev_item": "sequence",
}


# ----------------------------------------------------------------------------------------------
# statistics helpers (numpy only; no scipy needed)


def _ranks(x: np.ndarray) -> np.ndarray:
    """Ranks with ties averaged (as scipy.stats.rankdata)."""
    return pd.Series(np.asarray(x, dtype=float)).rank(method="average").to_numpy()


def _flat(x) -> np.ndarray:
    if isinstance(x, Tensor):
        x = x.detach().float().cpu().numpy()
    return np.asarray(x, dtype=float).ravel()


def spearman(x, y) -> float:
    """Spearman's ρ of two equally long sequences (tensors or arrays are flattened); NaN if either
    is constant."""
    x, y = _flat(x), _flat(y)
    if x.shape != y.shape:
        raise ValueError(f"spearman needs equally long inputs, got {x.shape} and {y.shape}.")
    rx, ry = _ranks(x), _ranks(y)
    if rx.std() == 0 or ry.std() == 0:
        return float("nan")
    return float(np.corrcoef(rx, ry)[0, 1])


# ----------------------------------------------------------------------------------------------
# the patching engine: many (item, head-mix) rows on top of one frozen prefix KV cache


def _device(model):
    return model.cfg.device


def _prefix(model, prompts: list[str], answers: list[int], *, batch_size: int = 64):
    enc = encode(model, prompts)
    cache, last = prefix_cache(model, enc, batch_size=batch_size)  # last: [n, 1]
    ans = torch.tensor(answers, dtype=torch.long, device=last.device)  # [n]
    return cache, last, ans


def _run_rows(
    model,
    cache,
    last: Int[Tensor, "n 1"],
    answers: Int[Tensor, " n"],
    item_idx: Int[Tensor, " rows"],
    cond_idx: Int[Tensor, " rows"],
    cond_weights: Float[Tensor, "n_cond n_layers n_heads"],
    targets: Float[Tensor, "... n_layers n_heads d_head"],
    *,
    batch_size: int = 128,
) -> tuple[Bool[Tensor, " rows"], Float[Tensor, " rows"]]:
    """Row ``r`` runs item ``item_idx[r]``'s last token with the mix ``cond_weights[cond_idx[r]]``
    toward ``targets`` (shared ``[L, H, d_head]`` or per condition ``[n_cond, L, H, d_head]``).
    Returns per row: is the argmax the answer's first token, and that token's probability."""
    dev = _device(model)
    R = len(item_idx)
    correct = torch.empty(R, dtype=torch.bool)  # [rows]
    prob = torch.empty(R)  # [rows]
    cond_weights = cond_weights.to(dev)
    targets = targets.to(dev)
    per_cond_targets = targets.dim() == 4
    batch_size = cache_rows_per_batch(cache, batch_size)  # bounded copy of long prefixes
    for s in range(0, R, batch_size):
        items = item_idx[s : s + batch_size]
        conds = cond_idx[s : s + batch_size].to(dev)
        w = cond_weights[conds]  # [b, n_layers, n_heads]
        t = targets[conds] if per_cond_targets else targets  # [(b,) n_layers, n_heads, d_head]
        mix = HeadMix(weights=w, targets=t, positions=(-1,))
        sub = select_cache(cache, items)
        with torch.no_grad(), apply_hooks(model, mix.hooks(model)):
            logits = last_token_forward(model, sub, last[items])[:, -1].float()  # [b, d_vocab]
        ans = answers[items.to(answers.device)]  # [b]
        logp = torch.log_softmax(logits, dim=-1).gather(1, ans[:, None])[:, 0]  # [b]
        correct[s : s + len(items)] = (logits.argmax(-1) == ans).cpu()
        prob[s : s + len(items)] = logp.exp().cpu()
    return correct, prob


def _grid(n_cond: int, n_items: int) -> tuple[Tensor, Tensor]:
    """Condition-major rows: (cond 0, item 0..n-1), (cond 1, item 0..n-1), ..."""
    cond = torch.arange(n_cond).repeat_interleave(n_items)  # [n_cond * n_items]
    item = torch.arange(n_items).repeat(n_cond)  # [n_cond * n_items]
    return item, cond


def patched_last_logits(
    model,
    prompts: list[str],
    weights: Float[Tensor, "... n_layers n_heads"] | None = None,
    targets: Float[Tensor, "... n_layers n_heads d_head"] | None = None,
    *,
    use_cache: bool = True,
) -> Float[Tensor, "batch d_vocab"]:
    """Logits at the last prompt position with ``z[:, -1, h] ← (1 − w)·z + w·t`` at every head.

    ``weights`` is ``[n_layers, n_heads]`` (all prompts) or ``[batch, n_layers, n_heads]`` (one row
    per prompt); ``None`` runs the model unpatched. ``use_cache=True`` runs only the last token on a
    frozen prefix KV cache (what the experiments use); ``False`` runs the full prompt."""
    dev = _device(model)
    mix = None
    if weights is not None:
        if targets is None:
            raise ValueError("patched_last_logits: weights need targets.")
        mix = HeadMix(weights=weights.to(dev), targets=targets.to(dev), positions=(-1,))
    enc = encode(model, prompts)
    if not use_cache:
        return last_logits(model, enc, mix).cpu()  # [batch, d_vocab]
    cache, last = prefix_cache(model, enc)
    hooks = mix.hooks(model) if mix is not None else []
    with torch.no_grad(), apply_hooks(model, hooks):
        return last_token_forward(model, cache, last)[:, -1].float().cpu()  # [batch, d_vocab]


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
    """Flat head indices (``layer * n_heads + head``) sorted by α (stable: ties keep index
    order)."""
    return torch.argsort(alpha.detach().flatten().cpu(), descending=descending, stable=True)


def _mask_from_flat(flat_idx: Tensor, shape) -> Float[Tensor, "n_layers n_heads"]:
    m = torch.zeros(int(np.prod(shape)))  # [n_layers * n_heads]
    m[flat_idx] = 1.0
    return m.reshape(shape)  # [n_layers, n_heads]


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
        mask = _mask_from_flat(ranked_heads(alpha, descending=True)[:k], shape)
    elif selection in ("bottom", "full_minus_bottom"):
        mask = _mask_from_flat(ranked_heads(alpha, descending=False)[:k], shape)
    elif selection == "random":
        mask = _mask_from_flat(_random_perm(n, seed, random_seed)[:k], shape)
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
    prompts = [zero_shot_prompt(ex.input, template) for ex in items]
    answers = answer_token_ids(model, [ex.output for ex in items], template)
    cache, last, ans = _prefix(model, prompts, answers)
    item_idx, cond_idx = _grid(n_cond, len(items))
    correct, prob = _run_rows(
        model, cache, last, ans, item_idx, cond_idx, weights, embedding, batch_size=batch_size
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
    also generates greedily under each condition (:func:`sitelens.evaluate.evaluate`; slow) and adds
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
        interventions={"patched": mix},
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
) -> pd.DataFrame:
    """Inject task B's embedding through task A's head weights, for every ordered pair (A, B).

    ``mode="alpha"``: weights = A's α; ``mode="topk"``: α = 1 on A's top-k heads (``k`` defaults
    to min(10, all heads)). Accuracy: first-token accuracy on B's zero-shot ``split`` prompts
    (B's template). The diagonal (A = B) is SITE itself (alpha) or B's own top-k.

    Returns a long DataFrame: ``model, source_task, target_task, mode, k`` (``<NA>`` for alpha),
    ``accuracy, ci_low, ci_high, answer_prob, n, zero_shot`` (B's accuracy without injection)."""
    tasks = _as_task_list(tasks)
    amap = _adapter_map(tasks, adapters)
    for t in tasks:
        _check_adapter(model, amap[t.name], t.name)
    names = [t.name for t in tasks]
    alpha0 = amap[names[0]].alpha
    n_total = _n_total(alpha0)
    k = min(10, n_total) if k is None else int(k)
    if not 1 <= k <= n_total:
        raise ValueError(f"k must lie in [1, {n_total}] (the number of heads), got {k}.")

    # conditions (the same for every target B): zero-shot, then per source A: alpha, topk
    conds: list[tuple[str | None, str]] = [(None, "zero_shot")]
    weights = [torch.zeros_like(alpha0, dtype=torch.float32).cpu()]
    for a in names:
        alpha_a = amap[a].alpha.detach().float().cpu()
        conds += [(a, "alpha"), (a, "topk")]
        weights += [alpha_a, selection_weights(alpha_a, "top", k)]
    weights = torch.stack(weights)  # [n_cond, n_layers, n_heads]

    rows = []
    for tb in tasks:
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
    df = pd.DataFrame(rows)
    df["k"] = pd.array(df["k"], dtype="Int64")
    return df


def transfer_matrix(
    df: pd.DataFrame, *, mode: str = "alpha", value: str = "accuracy", normalize: str = "none"
) -> pd.DataFrame:
    """The inter-task result as a square matrix: rows = source task A (whose heads), columns =
    target task B (whose embedding and test split). ``normalize``: ``"none"``; ``"diagonal"``
    divides each column by B's own (diagonal) value; ``"zero_shot"`` subtracts B's zero-shot
    accuracy."""
    sub = df[df["mode"] == mode]
    if sub.empty:
        present = sorted(df["mode"].unique())
        raise ValueError(f"No rows with mode {mode!r}; modes present: {present}.")
    order = list(dict.fromkeys(sub["source_task"].tolist() + sub["target_task"].tolist()))
    m = sub.pivot(index="source_task", columns="target_task", values=value)
    m = m.reindex(index=order, columns=order)
    if normalize == "diagonal":
        diag = pd.Series(np.diag(m.to_numpy()), index=order)
        m = m / diag.replace(0, np.nan)
    elif normalize == "zero_shot":
        zs = sub.groupby("target_task")["zero_shot"].first().reindex(order)
        m = m - zs
    elif normalize != "none":
        raise ValueError(f"normalize must be 'none', 'diagonal' or 'zero_shot', got {normalize!r}.")
    m.index.name, m.columns.name = "source_task", "target_task"
    return m


def _alpha_of(x) -> Tensor:
    if isinstance(x, SiteAdapter):
        return x.alpha.detach().float().cpu()
    return torch.as_tensor(x).detach().float().cpu()


def alpha_similarity(
    adapters: Mapping[str, SiteAdapter | Tensor], *, k: int = 10
) -> dict[str, pd.DataFrame]:
    """Pairwise similarity of α maps (adapters or plain ``[n_layers, n_heads]`` tensors, keyed by
    task). Returns ``{"cosine", "spearman", "jaccard_topk"}`` → square DataFrames indexed by task
    (``jaccard_topk``: |top-k ∩ top-k'| / |top-k ∪ top-k'|). The diagonal is 1 (a map is identical
    to itself), even where a measure is undefined (a constant α has no Spearman ρ)."""
    names = list(adapters)
    if not names:
        raise ValueError("alpha_similarity needs at least one α map.")
    A = torch.stack([_alpha_of(adapters[n]).flatten() for n in names]).double().numpy()  # [T, N]
    T, N = A.shape
    k = min(k, N)
    norms = np.linalg.norm(A, axis=1, keepdims=True)
    unit = A / np.where(norms == 0, 1, norms)
    cos = unit @ unit.T  # [T, T]
    R = np.stack([_ranks(a) for a in A])  # [T, N]
    R = R - R.mean(1, keepdims=True)
    rn = np.linalg.norm(R, axis=1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        rho = (R @ R.T) / (rn @ rn.T)  # [T, T]
    tops = [set(np.argsort(-a, kind="stable")[:k].tolist()) for a in A]
    jac = np.array([[len(s & t) / len(s | t) for t in tops] for s in tops])  # [T, T]
    out = {}
    for key, mat in (("cosine", cos), ("spearman", rho), ("jaccard_topk", jac)):
        mat = np.clip(mat, -1.0, 1.0)
        np.fill_diagonal(mat, 1.0)
        frame = pd.DataFrame(mat, index=names, columns=names)
        frame.index.name = frame.columns.name = "task"
        out[key] = frame
    return out


def transfer_similarity_correlation(
    similarity: pd.DataFrame,
    transfer: pd.DataFrame,
    *,
    mode: str = "alpha",
    normalize: str = "none",
    n_perm: int = 1000,
    seed: int = 0,
) -> dict:
    """Spearman ρ between α similarity and transfer accuracy over the off-diagonal ordered pairs
    (A, B), A ≠ B, of the tasks present in both.

    ``similarity``: a square DataFrame (one of :func:`alpha_similarity`'s). ``transfer``: the long
    output of :func:`inter_task` (``mode`` and ``normalize`` as in :func:`transfer_matrix`) or a
    square matrix (rows = source). The p-value is a two-sided Mantel permutation test (task labels
    of the similarity matrix permuted jointly on rows and columns, ``n_perm`` seeded permutations),
    since pairs sharing a task are not independent.

    Returns ``{"rho", "p_value", "n_pairs", "n_tasks", "mode", "normalize"}``."""
    if {"source_task", "target_task"} <= set(transfer.columns):
        tm = transfer_matrix(transfer, mode=mode, normalize=normalize)
    else:
        tm = transfer
    names = [n for n in tm.index if n in similarity.index and n in tm.columns]
    if len(names) < 3:
        raise ValueError(
            f"Need at least 3 tasks present in both matrices for a correlation, got {len(names)}."
        )
    S = similarity.loc[names, names].to_numpy(dtype=float)  # [T, T]
    M = tm.loc[names, names].to_numpy(dtype=float)  # [T, T]
    off = ~np.eye(len(names), dtype=bool)
    ok = off & np.isfinite(M) & np.isfinite(S)

    def rho_of(Sm: np.ndarray) -> float:
        keep = ok & np.isfinite(Sm)
        return spearman(Sm[keep], M[keep])

    rho = rho_of(S)
    p = float("nan")
    if n_perm > 0 and np.isfinite(rho):
        rng = np.random.default_rng(seed)
        hits = 0
        for _ in range(n_perm):
            perm = rng.permutation(len(names))
            r = rho_of(S[np.ix_(perm, perm)])
            hits += bool(np.isfinite(r) and abs(r) >= abs(rho) - 1e-12)
        p = (hits + 1) / (n_perm + 1)
    return {
        "rho": rho,
        "p_value": p,
        "n_pairs": int(ok.sum()),
        "n_tasks": len(names),
        "mode": mode,
        "normalize": normalize,
    }


def within_between(
    matrix: pd.DataFrame, groups: Mapping[str, str] | None = None
) -> dict:
    """Mean off-diagonal value of a square task × task matrix for pairs in the same group (family)
    vs different groups. ``groups`` defaults to :data:`TASK_FAMILIES`; tasks without a group are
    left out. Returns ``{"within", "between", "gap", "n_within", "n_between"}``."""
    groups = TASK_FAMILIES if groups is None else groups
    names = [n for n in matrix.index if n in groups and n in matrix.columns]
    M = matrix.loc[names, names].to_numpy(dtype=float)
    g = np.array([groups[n] for n in names])
    same = (g[:, None] == g[None, :]) & ~np.eye(len(names), dtype=bool)
    diff = g[:, None] != g[None, :]
    same &= np.isfinite(M)
    diff &= np.isfinite(M)
    within = float(M[same].mean()) if same.any() else float("nan")
    between = float(M[diff].mean()) if diff.any() else float("nan")
    return {
        "within": within,
        "between": between,
        "gap": within - between,
        "n_within": int(same.sum()),
        "n_between": int(diff.sum()),
    }


# ----------------------------------------------------------------------------------------------
# 3. per-head causal effects (Function Vectors style)


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
        task, queries, n_shots, seed=seed + 1, template=template, shuffle_labels=True
    )
    return prompts, answer_token_ids(model, [q.output for q in queries], template)


def head_causal_effects(
    model,
    task: Task,
    *,
    n_prompts: int = 16,
    n_shots: int = 10,
    seed: int = 0,
    batched: bool = True,
    embedding: Float[Tensor, "n_layers n_heads d_head"] | None = None,
    n_mean_prompts: int = 50,
    split: str = "train",
    template: Template = DEFAULT_TEMPLATE,
    batch_size: int = 64,
    return_stats: bool = False,
):
    """Per-head causal effect ``[n_layers, n_heads]`` (the Function Vectors paper's indirect
    effect).

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
    ``rows``, ``baseline_prob``, ``mode``."""
    cfg = model.cfg
    L, H = cfg.n_layers, cfg.n_heads
    dev = _device(model)
    if embedding is None:
        embedding = task_embedding(
            model, task, n_prompts=n_mean_prompts, n_shots=n_shots, seed=seed, template=template
        )  # [n_layers, n_heads, d_head]
    if tuple(embedding.shape) != (L, H, cfg.d_head):
        raise AdapterError(
            f"embedding has shape {tuple(embedding.shape)} but the model needs "
            f"[n_layers={L}, n_heads={H}, d_head={cfg.d_head}]."
        )
    embedding = embedding.to(dev)
    with _ForwardPassCounter(model) as passes:
        effects, base, patched, rows, n, N = _head_effects(
            model, task, embedding, n_prompts=n_prompts, n_shots=n_shots, seed=seed,
            batched=batched, split=split, template=template, batch_size=batch_size,
        )
    if not return_stats:
        return effects
    stats = {
        "mode": "batched" if batched else "serial",
        "seconds": passes.seconds,
        "forward_passes": passes.count,
        "rows": int(rows),
        "n_prompts": n,
        "n_heads_total": N,
        "baseline_prob": float(base.mean()),
        "per_prompt": (patched - base[:, None]).reshape(n, L, H),  # [n_prompts, L, H]
    }
    return effects, stats


class _ForwardPassCounter:
    """Counts the calls of ``model`` (a forward pre-hook on it: every ``model(...)``, including
    passes that stop early, e.g. :func:`sitelens.models.forward_until`) and times the block.
    ``.count`` and ``.seconds`` are set on exit."""

    def __init__(self, model):
        self.model, self.count, self.seconds = model, 0, 0.0

    def _pre(self, module, args) -> None:
        self.count += 1

    def __enter__(self):
        self._handle = self.model.register_forward_pre_hook(self._pre)
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.seconds = time.perf_counter() - self._t0
        self._handle.remove()


def _head_effects(
    model, task: Task, embedding, *, n_prompts: int, n_shots: int, seed: int, batched: bool,
    split: str, template: Template, batch_size: int,
):
    """The work of :func:`head_causal_effects` (its forward passes are counted around this)."""
    cfg = model.cfg
    L, H = cfg.n_layers, cfg.n_heads
    dev = _device(model)
    prompts, answers = corrupted_prompts(
        model, task, n_prompts=n_prompts, n_shots=n_shots, split=split, seed=seed,
        template=template,
    )
    n, N = len(prompts), L * H
    onehots = torch.eye(N).reshape(N, L, H)  # [N, n_layers, n_heads]: row j patches head j
    if batched:
        cache, last, ans = _prefix(model, prompts, answers)
        # condition 0 = unpatched, then one condition per head; rows are prompt-major
        weights = torch.cat([torch.zeros(1, L, H), onehots])  # [N + 1, n_layers, n_heads]
        item_idx = torch.arange(n).repeat_interleave(N + 1)  # [n * (N + 1)]
        cond_idx = torch.arange(N + 1).repeat(n)  # [n * (N + 1)]
        _, prob = _run_rows(
            model, cache, last, ans, item_idx, cond_idx, weights, embedding,
            batch_size=batch_size,
        )
        prob = prob.reshape(n, N + 1)  # [n_prompts, N + 1]
        base, patched = prob[:, 0], prob[:, 1:]  # [n_prompts], [n_prompts, N]
        rows = len(item_idx)
    else:
        chunks = [
            (encode(model, prompts[s : s + batch_size]),
             torch.tensor(answers[s : s + batch_size], device=dev))
            for s in range(0, n, batch_size)
        ]

        def probs(mix) -> Tensor:
            out = []
            for enc, ans in chunks:
                logits = last_logits(model, enc, mix)  # [b, d_vocab]
                logp = torch.log_softmax(logits, -1).gather(1, ans[:, None])[:, 0]  # [b]
                out.append(logp.exp().cpu())
            return torch.cat(out)  # [n_prompts]

        base = probs(None)
        patched = torch.stack(
            [probs(HeadMix(weights=onehots[j].to(dev), targets=embedding)) for j in range(N)],
            dim=1,
        )  # [n_prompts, N]
        rows = (N + 1) * n
    effects = (patched - base[:, None]).mean(0).reshape(L, H)  # [n_layers, n_heads]
    return effects, base, patched, rows, n, N


def effect_alpha_correlation(
    effects: Float[Tensor, "n_layers n_heads"], alpha: Float[Tensor, "n_layers n_heads"]
) -> float:
    """Spearman ρ between a causal-effect map and an α map (over all heads)."""
    if tuple(effects.shape) != tuple(alpha.shape):
        raise ValueError(
            f"effects {tuple(effects.shape)} and alpha {tuple(alpha.shape)} must have the same "
            "[n_layers, n_heads] shape."
        )
    return spearman(effects, alpha)


__all__ = [
    "SELECTIONS", "REFERENCES", "TASK_FAMILIES",
    "spearman", "bootstrap_ci", "patched_last_logits", "default_ks", "ranked_heads",
    "selection_weights", "intra_task", "inter_task", "transfer_matrix", "alpha_similarity",
    "transfer_similarity_correlation", "within_between", "corrupted_prompts",
    "head_causal_effects", "effect_alpha_correlation",
]
