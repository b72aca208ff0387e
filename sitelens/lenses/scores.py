"""``HeadScores``: the one result type of every head-importance lens.

A tidy table, one row per (lens, layer, head): ``model, task, lens, layer, head, score, ci_low,
ci_high`` plus the lens's metadata and its cost (``forward_passes``, ``backward_passes``,
``seconds``, the same on every row of a lens). Heatmaps, lens comparisons, the CLI and the
notebooks all read this table; :meth:`HeadScores.concat` stacks lenses, :meth:`HeadScores.map`
gives one lens back as a ``[n_layers, n_heads]`` tensor.

Convention: a higher score means *more important for the task* in every lens (an effect that
restores the answer, a loss gradient with its sign flipped, an ablation that hurts), so lenses can
be ranked and compared without a sign table.

Grouped-query models (GQA/MQA) keep scores per query head (``hook_z`` has query heads);
:meth:`HeadScores.by_kv_group` aggregates them per key/value group (query head ``h`` reads group
``h // (n_heads // n_key_value_heads)``, as TransformerLens repeats the K/V heads).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from sitelens.errors import OutputError

COLUMNS = [
    "model", "task", "lens", "layer", "head", "score", "ci_low", "ci_high",
    "forward_passes", "backward_passes", "seconds", "meta",
]


def _np(x) -> np.ndarray:
    if isinstance(x, Tensor):
        x = x.detach().float().cpu().numpy()
    return np.asarray(x, dtype=float)


@dataclass
class HeadScores:
    """Per-head scores of one or more lenses (see the module docstring). ``df`` has
    :data:`COLUMNS`; ``meta`` is a JSON string per row (the lens's settings)."""

    df: pd.DataFrame

    @classmethod
    def from_map(
        cls,
        score: Float[Tensor, "n_layers n_heads"] | np.ndarray,
        *,
        model: str,
        task: str,
        lens: str,
        ci_low=None,
        ci_high=None,
        forward_passes: int = 0,
        backward_passes: int = 0,
        seconds: float = 0.0,
        meta: Mapping | None = None,
    ) -> HeadScores:
        """One lens from a ``[n_layers, n_heads]`` map (and optional CI maps of the same shape)."""
        s = _np(score)
        if s.ndim != 2:
            raise ValueError(f"HeadScores.from_map needs a [n_layers, n_heads] map, got {s.shape}.")
        L, H = s.shape
        lo = np.full_like(s, np.nan) if ci_low is None else _np(ci_low).reshape(L, H)
        hi = np.full_like(s, np.nan) if ci_high is None else _np(ci_high).reshape(L, H)
        layer, head = np.meshgrid(np.arange(L), np.arange(H), indexing="ij")  # [L, H] each
        df = pd.DataFrame({
            "model": model, "task": task, "lens": lens,
            "layer": layer.ravel(), "head": head.ravel(),
            "score": s.ravel(), "ci_low": lo.ravel(), "ci_high": hi.ravel(),
            "forward_passes": int(forward_passes), "backward_passes": int(backward_passes),
            "seconds": float(seconds),
            "meta": json.dumps(dict(meta or {}), sort_keys=True, default=str),
        })
        return cls(df[COLUMNS])

    @classmethod
    def concat(cls, parts: Iterable[HeadScores]) -> HeadScores:
        """Stack several results (lenses, tasks, models) into one table."""
        frames = [p.df for p in parts]
        if not frames:
            return cls(pd.DataFrame(columns=COLUMNS))
        return cls(pd.concat(frames, ignore_index=True)[COLUMNS])

    # ------------------------------------------------------------------------------------------
    @property
    def lenses(self) -> list[str]:
        return list(dict.fromkeys(self.df["lens"]))

    @property
    def shape(self) -> tuple[int, int]:
        """``(n_layers, n_heads)``."""
        return int(self.df["layer"].max()) + 1, int(self.df["head"].max()) + 1

    def lens(self, lens: str, *, task: str | None = None, model: str | None = None) -> HeadScores:
        """The rows of one lens (and task / model when the table holds several)."""
        m = self.df["lens"] == lens
        if task is not None:
            m &= self.df["task"] == task
        if model is not None:
            m &= self.df["model"] == model
        if not m.any():
            raise KeyError(f"No rows for lens {lens!r}; this table has {self.lenses}.")
        return HeadScores(self.df[m].reset_index(drop=True))

    def _one(self, lens: str | None) -> pd.DataFrame:
        if lens is None:
            if len(self.lenses) != 1:
                raise ValueError(f"Name the lens: this table has {self.lenses}.")
            lens = self.lenses[0]
        d = self.lens(lens).df
        if d.duplicated(["layer", "head"]).any():
            raise ValueError(f"Lens {lens!r} has several rows per head (several tasks or "
                             "models); select one with .lens(lens, task=..., model=...).")
        return d

    def map(self, lens: str | None = None, column: str = "score") -> Float[Tensor, "n_layers n_heads"]:
        """One lens as a ``[n_layers, n_heads]`` float32 tensor (``column``: score, ci_low, ...)."""
        d = self._one(lens)
        L, H = int(d["layer"].max()) + 1, int(d["head"].max()) + 1
        out = torch.full((L, H), float("nan"))  # [n_layers, n_heads]
        rows, cols = torch.tensor(d["layer"].tolist()), torch.tensor(d["head"].tolist())
        out[rows, cols] = torch.tensor(d[column].tolist(), dtype=torch.float32)
        return out

    def top(self, k: int = 10, lens: str | None = None) -> list[tuple[int, int, float]]:
        """The ``k`` highest-scoring heads of one lens as ``[(layer, head, score), ...]``."""
        d = self._one(lens).sort_values("score", ascending=False, kind="stable").head(k)
        return [(int(r.layer), int(r.head), float(r.score)) for r in d.itertuples()]

    def by_kv_group(self, n_key_value_heads: int, how: str = "sum") -> pd.DataFrame:
        """Scores aggregated per key/value group (GQA/MQA): one row per (model, task, lens, layer,
        kv_group) with the ``how`` (``sum`` / ``mean`` / ``max``) of the query heads' scores."""
        if how not in ("sum", "mean", "max"):
            raise ValueError(f"how must be 'sum', 'mean' or 'max', got {how!r}.")
        n_heads = self.shape[1]
        if n_key_value_heads <= 0 or n_heads % n_key_value_heads:
            raise ValueError(f"n_key_value_heads={n_key_value_heads} does not divide n_heads={n_heads}.")
        d = self.df.assign(kv_group=self.df["head"] // (n_heads // n_key_value_heads))
        keys = ["model", "task", "lens", "layer", "kv_group"]
        return d.groupby(keys, sort=False)["score"].agg(how).reset_index()

    # ------------------------------------------------------------------------------------------
    def to_csv(self, path: str | Path) -> Path:
        """Write the table atomically (:func:`sitelens.io.atomic_write_text`)."""
        from sitelens.io import atomic_write_text

        return atomic_write_text(path, self.df.to_csv(index=False))

    @classmethod
    def read_csv(cls, path: str | Path) -> HeadScores:
        df = pd.read_csv(path)
        missing = [c for c in COLUMNS if c not in df.columns]
        if missing:
            raise OutputError(f"{path} is not a HeadScores table: it lacks the columns {missing}.")
        return cls(df[COLUMNS])

    def __len__(self) -> int:
        return len(self.df)

    def __repr__(self) -> str:
        models = sorted(set(self.df["model"]))
        tasks = sorted(set(self.df["task"]))
        return f"HeadScores(lenses={self.lenses}, models={models}, tasks={len(tasks)}, rows={len(self)})"
