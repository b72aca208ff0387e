"""Sets of attention heads: the vocabulary the adapter, patching, the lenses, the selectors, the
frontier and the atlas share.

A head is named three ways: ``(layer, head)``, its flat index ``layer * n_heads + head`` into a
``[n_layers, n_heads]`` map (TransformerLens's order), and its label ``L{layer}H{head}``.

- :func:`order` / :func:`ranking`: flat indices by score, highest first (stable: ties keep index
  order; a NaN score counts as the lowest, so it is chosen last).
- :class:`HeadSet`: which heads (frozen; the order given is kept, e.g. rank order), built from a
  mask, labels, pairs or the top-k of a score map; as a mask, labels or pairs; Jaccard overlap.

torch is imported by the functions that compute, so a label or an overlap (the atlas page) loads
no tensor library.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sitelens.stats import jaccard

if TYPE_CHECKING:
    import torch
    from jaxtyping import Float
    from torch import Tensor

_LABEL = re.compile(r"L(\d+)H(\d+)")


def order(scores, *, descending: bool = True) -> Tensor:
    """Flat indices of ``scores`` (a tensor or array of any shape, flattened row-major) sorted by
    score, highest first (``descending=False``: lowest first); stable, so ties keep index order;
    NaN sorts last (below an infinite score, which counts as the dtype's largest finite value).
    Compared in the scores' own dtype, on their device."""
    import numpy as np
    import torch

    s = scores if isinstance(scores, torch.Tensor) else torch.from_numpy(np.array(scores))
    s = s.detach().flatten()
    if s.is_floating_point():
        s = torch.nan_to_num(s, nan=float("-inf") if descending else float("inf"))
    return torch.argsort(s, descending=descending, stable=True)


def ranking(scores, *, descending: bool = True) -> list[int]:
    """:func:`order` as a list of ints (computed on the CPU)."""
    import torch

    on_cpu = scores.detach().cpu() if isinstance(scores, torch.Tensor) else scores
    return order(on_cpu, descending=descending).tolist()


def head_label(flat: int, n_heads: int) -> str:
    """``L{layer}H{head}`` of flat index ``flat``."""
    return f"L{flat // n_heads}H{flat % n_heads}"


@dataclass(frozen=True, eq=False)
class HeadSet:
    """Heads of an ``n_layers × n_heads`` model as flat indices, in the order given (no repeats).
    Two head sets are equal when they hold the same heads of the same shape, in any order."""

    n_layers: int
    n_heads: int
    flat: tuple[int, ...] = ()

    def __post_init__(self):
        flat = tuple(int(i) for i in self.flat)
        n = self.n_layers * self.n_heads
        bad = [i for i in flat if not 0 <= i < n]
        if bad:
            raise ValueError(f"Head index {bad[0]} is outside [0, {n}) ({self.n_layers} layers × "
                             f"{self.n_heads} heads).")
        if len(set(flat)) != len(flat):
            raise ValueError(f"A head set holds each head once, got {flat}.")
        object.__setattr__(self, "flat", flat)

    # -- building -------------------------------------------------------------------------------

    @classmethod
    def from_pairs(cls, pairs: Iterable[tuple[int, int]], n_layers: int, n_heads: int) -> HeadSet:
        """From ``(layer, head)`` pairs (a repeated pair counts once)."""
        out: list[int] = []
        for layer, head in pairs:
            if not (0 <= layer < n_layers and 0 <= head < n_heads):
                raise ValueError(f"Head (layer={layer}, head={head}) is outside {n_layers} layers × "
                                 f"{n_heads} heads.")
            out.append(layer * n_heads + head)
        return cls(n_layers, n_heads, tuple(dict.fromkeys(out)))

    @classmethod
    def from_labels(cls, labels: str | Iterable[str], n_layers: int, n_heads: int) -> HeadSet:
        """From labels ``L{l}H{h}``, a sequence or one string joined by ``;`` (the frontier's
        ``heads`` column; ``""`` is the empty set)."""
        if isinstance(labels, str):
            labels = [x for x in labels.split(";") if x]
        pairs = []
        for x in labels:
            m = _LABEL.fullmatch(x.strip())
            if m is None:
                raise ValueError(f"Not a head label: {x!r} (use L{{layer}}H{{head}}, e.g. L0H3).")
            pairs.append((int(m[1]), int(m[2])))
        return cls.from_pairs(pairs, n_layers, n_heads)

    @classmethod
    def from_mask(cls, mask: Float[Tensor, "n_layers n_heads"]) -> HeadSet:
        """The heads where ``mask`` is nonzero, in index order."""
        import torch

        m = torch.as_tensor(mask).detach().cpu()
        L, H = m.shape
        return cls(L, H, tuple(torch.nonzero(m.flatten()).flatten().tolist()))

    @classmethod
    def top_k(cls, scores: Float[Tensor, "n_layers n_heads"], k: int, *, descending: bool = True
              ) -> HeadSet:
        """The ``k`` highest-scoring heads of a ``[n_layers, n_heads]`` map in rank order
        (:func:`ranking`; ``descending=False``: the ``k`` lowest)."""
        L, H = scores.shape
        return cls(L, H, tuple(ranking(scores, descending=descending)[:k]))

    # -- reading --------------------------------------------------------------------------------

    @property
    def shape(self) -> tuple[int, int]:
        return self.n_layers, self.n_heads

    def __len__(self) -> int:
        return len(self.flat)

    def __iter__(self) -> Iterator[int]:
        return iter(self.flat)

    def __contains__(self, flat: object) -> bool:
        return flat in self.flat

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, HeadSet):
            return NotImplemented
        return self.shape == other.shape and set(self.flat) == set(other.flat)

    def __hash__(self) -> int:
        return hash((self.shape, frozenset(self.flat)))

    def pairs(self) -> list[tuple[int, int]]:
        """``(layer, head)`` of each head."""
        return [(i // self.n_heads, i % self.n_heads) for i in self.flat]

    def labels(self) -> list[str]:
        """``L{layer}H{head}`` of each head."""
        return [head_label(i, self.n_heads) for i in self.flat]

    def mask(self, device=None, dtype: torch.dtype | None = None) -> Float[Tensor, "n_layers n_heads"]:
        """``[n_layers, n_heads]``: 1 on the set's heads, 0 elsewhere (float32 unless ``dtype``)."""
        import torch

        m = torch.zeros(self.n_layers * self.n_heads, dtype=dtype or torch.float32, device=device)
        m[list(self.flat)] = 1
        return m.reshape(self.n_layers, self.n_heads)

    def jaccard(self, other: HeadSet | Iterable[int]) -> float:
        """:func:`sitelens.stats.jaccard` of the two sets of flat indices."""
        return jaccard(self.flat, other)

    def __repr__(self) -> str:
        return f"HeadSet({self.n_layers}×{self.n_heads}: {labels_line(self.labels()) or 'no heads'})"


SHOWN_LABELS = 12  # heads a repr names before it counts the rest


def labels_line(labels: Sequence[str], shown: int = SHOWN_LABELS) -> str:
    """``L{l}H{h}`` labels joined by spaces, the first ``shown`` of a longer set then ``… (+N)``,
    so a repr stays one short line."""
    labels = list(labels)
    more = len(labels) - shown
    return " ".join(labels[:shown]) + (f" … (+{more})" if more > 0 else "")


def mask_of(heads: Sequence[int], shape: tuple[int, int]) -> Float[Tensor, "n_layers n_heads"]:
    """The ``[n_layers, n_heads]`` 0/1 mask of flat indices ``heads``."""
    return HeadSet(shape[0], shape[1], tuple(heads)).mask()


__all__ = ["HeadSet", "head_label", "labels_line", "mask_of", "order", "ranking"]
