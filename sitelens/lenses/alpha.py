"""Lens ``alpha``: SITE's learned α with its uncertainty over seeds.

:func:`alpha_over_seeds` fits SITE (both stages) once per seed — the seed draws stage 1's prompts
and stage 2's batches, so the spread is what a rerun of the method would give — and optionally on
a bootstrap resample of the training items per seed (``bootstrap_items=True``). Per head it
reports the mean α over seeds and a 95% t-interval of that mean (clipped to [0, 1]); the
stability of the ranking is measured by the Spearman correlation and the top-10 Jaccard overlap
of every pair of seeds (:func:`rank_stability`).
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import combinations

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from scipy import stats
from torch import Tensor

from sitelens.eval.metrics import correlation
from sitelens.format import array_summary, progress_bar
from sitelens.heads import ranking
from sitelens.lenses.scores import HeadScores
from sitelens.models import model_name
from sitelens.site import FitConfig, SiteAdapter, fit_site
from sitelens.stats import jaccard
from sitelens.tasks import Task


def rank_stability(maps: Sequence[Tensor], k: int = 10) -> pd.DataFrame:
    """Every pair of ``[n_layers, n_heads]`` maps: ``i, j, spearman, top{k}_jaccard``."""
    rows = []
    for i, j in combinations(range(len(maps)), 2):
        rows.append({"i": i, "j": j,
                     "spearman": correlation(maps[i], maps[j], "spearman"),
                     f"top{k}_jaccard": jaccard(ranking(maps[i])[:k], ranking(maps[j])[:k])})
    return pd.DataFrame(rows)


@dataclass
class AlphaSeeds:
    """The fits of :func:`alpha_over_seeds`: ``adapters`` (one per seed), ``alphas``
    ``[n_seeds, n_layers, n_heads]``, ``scores`` (lens ``alpha``: mean and 95% interval) and
    ``stability`` (pairwise Spearman and top-10 Jaccard)."""

    adapters: list[SiteAdapter]
    alphas: Float[Tensor, "n_seeds n_layers n_heads"]
    scores: HeadScores
    stability: pd.DataFrame

    @property
    def mean(self) -> Float[Tensor, "n_layers n_heads"]:
        return self.alphas.mean(0)

    def __repr__(self) -> str:
        task = self.adapters[0].meta.get("task") if self.adapters else None
        rho = self.stability["spearman"].mean() if len(self.stability) else float("nan")
        return (f"AlphaSeeds(task={task!r}, seeds={len(self.adapters)}, "
                f"alphas={array_summary(self.alphas)}, mean pairwise Spearman {rho:.3f})")

    def uncertain(self, threshold: float = 0.5) -> Tensor:
        """``[n_layers, n_heads]`` bool: heads whose interval contains ``threshold``."""
        lo, hi = self.scores.map(column="ci_low"), self.scores.map(column="ci_high")
        return (lo <= threshold) & (hi >= threshold)


def interval(x: np.ndarray, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """t-interval of the mean over axis 0 (``nan`` with one value)."""
    n = x.shape[0]
    m = x.mean(0)
    if n < 2:
        return np.full_like(m, np.nan), np.full_like(m, np.nan)
    half = stats.t.ppf(0.5 + level / 2, n - 1) * x.std(0, ddof=1) / np.sqrt(n)
    return m - half, m + half


def alpha_over_seeds(
    model,
    task: Task,
    seeds: Sequence[int] = (0, 1, 2, 3, 4),
    config: FitConfig | None = None,
    *,
    bootstrap_items: bool = False,
    n_prompts: int = 50,
    n_shots: int = 10,
    k: int = 10,
    progress: bool = False,
    lens: str = "alpha",
) -> AlphaSeeds:
    """Fit SITE once per seed (``config`` with its ``seed`` replaced) and summarize α per head.
    ``bootstrap_items``: each seed trains on a resample (with replacement, seeded) of the training
    items. Cost columns: ``seconds`` of all fits; passes are not counted for fits."""
    base = config or FitConfig()
    adapters, t0 = [], time.perf_counter()
    for s in progress_bar(list(seeds), desc=f"{lens} [{task.name}]: seeds", enabled=progress,
                          leave=True):
        tk = task
        if bootstrap_items:
            rng = random.Random(10_000 + s)
            tk = replace(task, train=[rng.choice(task.train) for _ in task.train])
        adapters.append(fit_site(model, tk, n_prompts=n_prompts, n_shots=n_shots,
                                 config=replace(base, seed=s), progress=progress))
    alphas = torch.stack([a.alpha.detach().float().cpu() for a in adapters])  # [S, L, H]
    lo, hi = interval(alphas.numpy())
    scores = HeadScores.from_map(
        alphas.mean(0), ci_low=np.clip(lo, 0, 1), ci_high=np.clip(hi, 0, 1),
        model=model_name(model), task=task.name, lens=lens, seconds=time.perf_counter() - t0,
        meta={"seeds": list(seeds), "protocol": base.protocol, "steps": base.steps,
              "batch_size": base.batch_size, "sparsity": base.sparsity,
              "bootstrap_items": bootstrap_items},
    )
    return AlphaSeeds(adapters, alphas, scores, rank_stability(list(alphas), k))


def alpha_from_adapter(model, task: Task, adapter: SiteAdapter, *, k: int = 10,
                       lens: str = "alpha") -> AlphaSeeds:
    """The ``alpha`` lens of one adapter already fitted: its α as the one seed, no fit. With one
    value per head there is no interval (``ci_low``/``ci_high`` NaN) and no stability; the lens's
    ``meta`` says ``"source": "adapter"`` with the adapter's fit settings."""
    alphas = adapter.alpha.detach().float().cpu()[None]  # [1, L, H]
    lo, hi = interval(alphas.numpy())
    hp = adapter.meta.get("hyperparameters") or {}
    scores = HeadScores.from_map(
        alphas[0], ci_low=lo, ci_high=hi, model=model_name(model), task=task.name, lens=lens,
        seconds=0.0,
        meta={"source": "adapter", "seeds": [hp.get("seed")], "adapter_task": adapter.meta.get("task"),
              "protocol": adapter.meta.get("protocol", "default"), "n_examples": hp.get("n_examples"),
              "batch_size": hp.get("batch_size"), "sparsity": hp.get("sparsity"),
              "bootstrap_items": False},
    )
    return AlphaSeeds([adapter], alphas, scores, rank_stability(list(alphas), k))


def alpha_lens(x) -> HeadScores:
    """Lens ``alpha`` of the registry: the α fits of its shared inputs
    (:class:`~sitelens.lenses.registry.LensInputs`), made by :func:`head_scores` once per seed."""
    return x.alpha.scores
