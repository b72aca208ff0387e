"""Stage 2's settings, :class:`FitConfig` and :class:`OfficialFitConfig` (the paper's public code):
plain dataclasses with their own checks, kept apart from :mod:`sitelens.site.alpha` so that the
command line checks ``--lr`` and the other fit options without importing torch."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import ClassVar

from sitelens.errors import FitError
from sitelens.provenance import OMIT_DEFAULT, at_omitted_default

# A schedule option added after the first records were written: at its default (the schedule
# before it) it is left out of records and settings hashes (FitConfig.settings, canonical).
_NEW = {OMIT_DEFAULT: True}


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
    # Schedule options (docs/benchmarks.md, benchmarks/schedule_compare.py); the defaults are the
    # schedule above. patience: stop after this many validation checks in a row without a lower
    # validation loss (0: never stop early; the best α so far is kept either way).
    patience: int = field(default=0, metadata=_NEW)
    # lr_rule: the learning rate actually used for this batch size, from ``lr`` set for a batch of
    # LR_BATCH: "fixed" (lr as given), "sqrt" (lr·√(batch_size/LR_BATCH)) or "linear"
    # (lr·batch_size/LR_BATCH). :attr:`step_lr` is the result.
    lr_rule: str = field(default="fixed", metadata=_NEW)

    LR_BATCH: ClassVar[int] = 8  # the batch the default lr was chosen for
    LR_RULES: ClassVar[tuple[str, ...]] = ("fixed", "sqrt", "linear")

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
        if self.patience < 0:
            raise FitError(f"FitConfig.patience must be >= 0 (0: never stop early), got {self.patience!r}.")
        if self.lr_rule not in self.LR_RULES:
            raise FitError(f"FitConfig.lr_rule must be one of {self.LR_RULES}, got {self.lr_rule!r}.")
        if not 0 <= self.seed <= 2**32 - 1:
            raise FitError(f"FitConfig.seed must be in [0, 4294967295], got {self.seed!r}.")

    @property
    def steps(self) -> int:
        return max(1, math.ceil(self.n_examples / self.batch_size))

    def settings(self) -> dict:
        """The fields as records hold them (``adapter.json``'s ``hyperparameters``, ``sitelens
        run``'s ``run.json``): a schedule option at its default is left out, as in
        :func:`sitelens.provenance.canonical`, so that records made before it existed still
        match."""
        return {f.name: getattr(self, f.name) for f in fields(self) if not at_omitted_default(self, f)}

    @property
    def step_lr(self) -> float:
        """The learning rate Adam uses: ``lr`` scaled for ``batch_size`` by ``lr_rule``."""
        ratio = self.batch_size / self.LR_BATCH
        return self.lr * {"fixed": 1.0, "sqrt": math.sqrt(ratio), "linear": ratio}[self.lr_rule]

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
