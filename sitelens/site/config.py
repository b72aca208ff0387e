"""Stage 2's settings, :class:`FitConfig` and :class:`OfficialFitConfig` (the paper's public code):
plain dataclasses with their own checks, kept apart from :mod:`sitelens.site.alpha` so that the
command line checks ``--lr`` and the other fit options without importing torch."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from sitelens.errors import FitError


@dataclass
class FitConfig:
    """Stage-2 hyperparameters. The reference: a = 0, lr 0.2, 400 steps of batch 1. The default
    here spends the same 400 training examples in batches (``n_examples / batch_size`` steps):
    shuffled passes over the train split, the α with the best validation loss kept.
    :meth:`official` is the reference's own protocol."""

    protocol: ClassVar[str] = "default"  # a class attribute: not in asdict() or settings hashes

    lr: float = 0.2
    init: float = 0.0
    n_examples: int = 400
    batch_size: int = 8
    sparsity: float = 0.0  # λ in loss + λ·mean(α); 0 = the paper's method
    eval_every: int = 10  # steps between validation-loss checks (and at the end)
    n_valid: int = 64  # validation items used for model selection
    seed: int = 0

    def __post_init__(self):
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise FitError(f"FitConfig.lr must be a positive finite number, got {self.lr!r}.")
        if not math.isfinite(self.init) or not math.isfinite(self.sparsity):
            raise FitError(
                f"FitConfig.init and .sparsity must be finite, got {self.init!r}, {self.sparsity!r}."
            )
        if self.sparsity < 0:  # λ·mean(α) with λ < 0 rewards large α instead of penalizing it
            raise FitError(f"FitConfig.sparsity must be >= 0 (a negative λ rewards large α), got "
                           f"{self.sparsity!r}.")
        if min(self.n_examples, self.batch_size, self.eval_every, self.n_valid) < 1:
            raise FitError("FitConfig.n_examples, .batch_size, .eval_every and .n_valid must be at "
                           f"least 1, got {self.n_examples!r}, {self.batch_size!r}, "
                           f"{self.eval_every!r}, {self.n_valid!r}.")
        if not 0 <= self.seed <= 2**32 - 1:
            raise FitError(f"FitConfig.seed must be in [0, 4294967295], got {self.seed!r}.")

    @property
    def steps(self) -> int:
        return max(1, math.ceil(self.n_examples / self.batch_size))

    @classmethod
    def official(cls, **overrides) -> OfficialFitConfig:
        """The public SITE code's stage 2 (:class:`OfficialFitConfig`); ``overrides`` set fields."""
        return OfficialFitConfig(**overrides)


@dataclass
class OfficialFitConfig(FitConfig):
    """Stage 2 as the paper's public code runs it (github.com/SNU-DRL/Soft_Injection, commit
    01bd5d6: ``optimize_head_selection`` and ``validate_head_selection`` in ``utils.py``,
    ``format_icl`` in ``preprocess.py``, run by ``eval_scripts/eval_site.sh`` with ``--epoch 400
    --lr 0.2 --batch_size 1 --test_batch_size 1``):

    - 400 steps of batch 1; each step draws its item i.i.d. (with replacement) from the train
      split (there ``random.sample(range(n), 1)``, unseeded; here seeded with ``seed``);
    - after every 50th step the validation loss on the first 100 valid items is computed (the
      mean first-token cross-entropy, there one item at a time) and recorded;
    - the α of the last check is kept: there the check ``val_loss < best_val_loss`` never updates
      ``best_val_loss`` (it stays ``inf``), so every check saves the current α. With 400 steps and
      checks every 50 that is the final α; with no check at all, the final α too;
    - no space before an all-digit answer (:attr:`sitelens.tasks.Template.bare_digits`), set by
      :func:`fit_site`, which records ``meta["protocol"] = "official"``.
    """

    batch_size: int = 1
    eval_every: int = 50
    n_valid: int = 100

    protocol: ClassVar[str] = "official"


__all__ = ["FitConfig", "OfficialFitConfig"]
