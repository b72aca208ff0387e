"""Statistics over experiment results: task families, transfer matrices, α-map similarity,
within- vs between-family means, and the intra-task aggregates behind ``figures/``.

Everything here takes data (DataFrames, ``[n_layers, n_heads]`` tensors, adapters) and returns
data; numpy and pandas only (no scipy). Rank correlations are
:func:`sitelens.eval.metrics.correlation` with ``method="spearman"``.

- :data:`TASK_FAMILIES`: the family of each built-in task.
- :func:`transfer_matrix`: :func:`sitelens.patching.inter_task` rows as a source × target matrix;
  :func:`target_centred` removes how easy each target is for any α.
- :func:`alpha_similarity`: cosine / Spearman / top-k Jaccard between α maps.
- :func:`within_between`, :func:`by_target_family`: means within vs between families.
- :func:`transfer_similarity_correlation`: α similarity vs transfer (Spearman, Mantel test).
- :func:`effect_alpha_correlation`: a per-head score map vs an α map (Spearman).
- :func:`intra_mean`, :func:`intra_gaps`: :func:`sitelens.patching.intra_task` rows averaged
  over tasks, and the high- vs low-α gap per k.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from sitelens import format as fmt
from sitelens.eval.metrics import correlation
from sitelens.heads import ranking
from sitelens.site import SiteAdapter
from sitelens.stats import jaccard

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



def _ranks(x: np.ndarray) -> np.ndarray:
    """Ranks with ties averaged (as scipy.stats.rankdata)."""
    return pd.Series(np.asarray(x, dtype=float)).rank(method="average").to_numpy()


# ----------------------------------------------------------------------------------------------
# inter-task transfer and α-map similarity


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
    tops = [ranking(a)[:k] for a in A]
    jac = np.array([[jaccard(s, t) for t in tops] for s in tops])  # [T, T]
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
        return correlation(Sm[keep], M[keep], "spearman")

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


def target_centred(matrix: pd.DataFrame) -> pd.DataFrame:
    """A transfer matrix (rows = source A, columns = target B) minus, per target B, the mean over
    the other sources A ≠ B (the diagonal becomes NaN). Removes how easy B is for any α, so that
    what is left is how much better A's heads carry B than other tasks' heads do."""
    A = matrix.to_numpy(dtype=float).copy()  # [T, T]
    np.fill_diagonal(A, np.nan)
    with np.errstate(invalid="ignore"):
        A = A - np.nanmean(A, axis=0, keepdims=True)
    return pd.DataFrame(A, index=matrix.index, columns=matrix.columns)


def by_target_family(matrix: pd.DataFrame, groups: dict[str, str]) -> dict:
    """Per family with ≥ 2 tasks: mean transfer to its tasks from sources of the same family
    (A ≠ B) vs from sources of other families."""
    names = [n for n in matrix.index if n in groups and n in matrix.columns]
    out = {}
    for fam in dict.fromkeys(groups[n] for n in names):
        members = [n for n in names if groups[n] == fam]
        if len(members) < 2:
            continue
        same = [matrix.loc[a, b] for b in members for a in members if a != b]
        other = [matrix.loc[a, b] for b in members for a in names if groups[a] != fam]
        out[fam] = {"from_same_family": fmt.round_or_none(np.nanmean(same)),
                    "from_other_families": fmt.round_or_none(np.nanmean(other) if other else float("nan"))}
    return out




def effect_alpha_correlation(
    effects: Float[Tensor, "n_layers n_heads"], alpha: Float[Tensor, "n_layers n_heads"]
) -> float:
    """Spearman ρ between a causal-effect map and an α map (over all heads)."""
    if tuple(effects.shape) != tuple(alpha.shape):
        raise ValueError(
            f"effects {tuple(effects.shape)} and alpha {tuple(alpha.shape)} must have the same "
            "[n_layers, n_heads] shape."
        )
    return correlation(effects, alpha, "spearman")


# ----------------------------------------------------------------------------------------------
# intra-task aggregates


def intra_mean(intra: pd.DataFrame, label: Callable[[float], str] | None = None) -> pd.DataFrame:
    """Intra-task rows averaged over tasks, per (sparsity, selection, k, seed). The CI of the mean
    combines the per-task bootstrap CIs by a normal approximation (independent tasks):
    half-width = sqrt(Σ halfwidth²) / n_tasks. ``task`` becomes ``label(λ)`` (one panel row per λ
    in :func:`sitelens.viz.plotting.patching_curves`)."""
    label = label or (lambda lam: f"mean over tasks, λ = {lam:g}")
    df = intra.copy()
    df["seed"] = df["seed"].astype("Int64")
    df["half"] = (df["ci_high"] - df["ci_low"]) / 2
    keys = ["sparsity", "selection", "k", "seed"]
    g = df.groupby(keys, dropna=False, sort=False)
    out = g.agg(accuracy=("accuracy", "mean"), answer_prob=("answer_prob", "mean"),
                n=("n", "sum"), n_tasks=("task", "nunique"),
                half=("half", lambda h: float(np.sqrt((h**2).sum()) / len(h)))).reset_index()
    out["ci_low"] = (out["accuracy"] - out["half"]).clip(lower=0.0)
    out["ci_high"] = (out["accuracy"] + out["half"]).clip(upper=1.0)
    out["task"] = [label(lam) for lam in out["sparsity"]]
    out["model"] = df["model"].iloc[0] if "model" in df else ""
    cols = ["model", "task", "sparsity", "k", "selection", "seed", "accuracy", "ci_low",
            "ci_high", "answer_prob", "n", "n_tasks"]
    return out[cols]


def intra_gaps(intra: pd.DataFrame, ks: Sequence[int]) -> pd.DataFrame:
    """Per (sparsity, task, k): accuracy of top-k, bottom-k, random-k (mean over seeds), the gap
    top − bottom, and the zero-shot / SITE references. Includes a ``task = "mean"`` row per k."""
    rows = []
    for (lam, task), sub in intra.groupby(["sparsity", "task"], sort=False):
        zs = float(sub.loc[sub.selection == "zero_shot", "accuracy"].mean())
        site = float(sub.loc[sub.selection == "site", "accuracy"].mean())
        for k in ks:
            at = sub[sub["k"] == k]
            acc = {s: float(at.loc[at.selection == s, "accuracy"].mean())
                   for s in ("top", "bottom", "random")}
            rows.append({"sparsity": lam, "task": task, "k": k, **acc,
                         "gap": acc["top"] - acc["bottom"], "zero_shot": zs, "site": site,
                         "n": int(sub["n"].iloc[0])})
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    mean = (df.groupby(["sparsity", "k"], sort=False)
            [["top", "bottom", "random", "gap", "zero_shot", "site"]].mean().reset_index())
    mean["task"] = "mean"
    mean["n"] = df.groupby(["sparsity", "k"], sort=False)["n"].sum().to_numpy()
    return pd.concat([df, mean[df.columns]], ignore_index=True)


def paired_gaps(gaps: pd.DataFrame, *, n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Per (sparsity, k) of :func:`intra_gaps`'s per-task rows: top − bottom paired over the tasks
    (both selections are scored on each task's same items), by
    :func:`sitelens.stats.paired_difference`: the mean difference, its 95% bootstrap interval over
    tasks, n and the tasks where top / bottom is ahead."""
    from sitelens.stats import paired_difference

    rows = []
    for (lam, k), d in gaps[gaps.task != "mean"].groupby(["sparsity", "k"], sort=False):
        r = paired_difference(d.top.to_numpy(float), d.bottom.to_numpy(float), over="tasks",
                              n_boot=n_boot, seed=seed)
        rows.append({"sparsity": lam, "k": k, "diff": r.diff, "ci_low": r.ci_low, "ci_high": r.ci_high,
                     "n": r.n, "over": r.over, "top_ahead": r.a_ahead, "bottom_ahead": r.b_ahead})
    return pd.DataFrame(rows)


__all__ = [
    "TASK_FAMILIES", "transfer_matrix", "alpha_similarity", "transfer_similarity_correlation",
    "within_between", "target_centred", "by_target_family", "effect_alpha_correlation",
    "intra_mean", "intra_gaps", "paired_gaps",
]
