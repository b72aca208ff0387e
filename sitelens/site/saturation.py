"""When α is saturated its top-k is no ranking: many heads sit at the ceiling of (0, 1).

Without a sparsity penalty (λ = 0) nothing pushes an unneeded head's α down, and stage 2 often
ends with dozens of heads near 1 (e.g. 52 of SmolLM2's 270 heads above 0.95). The ``k`` heads with
the largest α are then a pick among near-ties, set by where the optimization stopped rather than by
what the heads do. :func:`alpha_saturation` counts those heads; :meth:`AlphaSaturation.message`
says so in one line and names what ranks heads better: a sparsity penalty (``--sparsity 5``,
``FitConfig(sparsity=5)``), which pushes the α of heads the task does not need towards 0, or a
lens that does not saturate (``alpha-grad``, ``atp``, ``effect``; :mod:`sitelens.lenses`).

The threshold, :data:`SATURATION_THRESHOLD` = 0.95: α = sigmoid(a), and above 0.95 the head's
last-token output is at least 95% the task embedding (injected nearly in full) while the slope
dα/da = α(1 − α) is below 0.0475, under a fifth of its value at α = 0.5; the loss no longer
separates two such heads, so their order is noise. A top-k is called saturated when more than
``k`` heads exceed the threshold: some of the tied heads are then left out at random.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

SATURATION_THRESHOLD = 0.95

# what ranks heads better than a saturated α, for the messages
BETTER_RANKINGS = ("a sparsity penalty (--sparsity 5: λ·mean(α) pushes the α of heads the task "
                   "does not need towards 0) or a lens that does not saturate (sitelens heads "
                   "--lenses alpha-grad,atp,effect)")


class AlphaSaturationWarning(UserWarning):
    """:meth:`sitelens.site.SiteAdapter.top_heads` asked for ``k`` heads while more than ``k``
    have α above :data:`SATURATION_THRESHOLD`."""


@dataclass(frozen=True)
class AlphaSaturation:
    """How many of ``n_heads`` heads have α above ``threshold``, judged for a top-``k``."""

    n_saturated: int
    n_heads: int
    k: int
    threshold: float = SATURATION_THRESHOLD

    @property
    def saturated(self) -> bool:
        """More than ``k`` heads above the threshold: the top-``k`` by α is a pick among ties."""
        return self.n_saturated > self.k

    def message(self, what: str | None = None) -> str:
        """One line: the count, what it makes meaningless (``what``, default "the top-k heads by
        α") and what ranks heads better."""
        what = what or f"the top-{self.k} heads by α"
        return (f"α is saturated: {self.n_saturated} of {self.n_heads} heads have α > "
                f"{self.threshold:g}, so {what} are a pick among near-ties, not a ranking; rank "
                f"heads with {BETTER_RANKINGS}.")


def alpha_saturation(alpha: Tensor, k: int = 10, threshold: float = SATURATION_THRESHOLD
                     ) -> AlphaSaturation:
    """Count the heads of ``alpha`` (any shape, e.g. ``[n_layers, n_heads]``) above ``threshold``,
    judged for a top-``k``: ``.saturated`` is true when more than ``k`` exceed it."""
    flat = alpha.detach().float().flatten()
    return AlphaSaturation(n_saturated=int((flat > threshold).sum()), n_heads=int(flat.numel()),
                           k=int(k), threshold=float(threshold))
