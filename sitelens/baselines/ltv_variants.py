"""Variants of LTV's ridge map and a one-pass first-token scorer, for measuring LTV's choices
(``benchmarks/ltv_sweep.py``, :file:`benchmarks/results/ltv_sweep.md`).

A variant predicts the demonstrations' shift ``Y`` from the zero-shot state ``X`` as
``W (X − x̄) + ȳ`` (:func:`fit_variant`, :func:`predict`):

- ``ltv``: ``W`` = ridge(X, Y, λ), x̄ = ȳ = 0; the method itself (:class:`~sitelens.baselines.ltv.LTV`);
- ``ltv+b``: ``W`` = ridge(X − x̄, Y − ȳ, λ) with x̄, ȳ the means; the same map with an intercept;
- ``shift``: ``W`` = 0 with x̄, ȳ the means; the mean shift alone (a constant vector).

:class:`FirstTokens` scores a last-token intervention at the answer position only (first-token
accuracy, dNTP against reference logits, label accuracy on first tokens) in one one-position
pass over a frozen prefix cache: cheap enough to score every cell of a grid.
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor

from sitelens.baselines.ltv import ridge_closed_form
from sitelens.eval.labels import continuation_ids
from sitelens.eval.metrics import dntp_per_item
from sitelens.site.training import LastTokenSet

VARIANTS = ("ltv", "ltv+b", "shift")


def fit_variant(X: Float[Tensor, "n d_model"], Y: Float[Tensor, "n d_model"], lam: float, variant: str):
    """``(W, x̄, ȳ)`` with ``shift = W (h − x̄) + ȳ`` (ltv: x̄ = ȳ = 0)."""
    d = X.shape[1]
    if variant == "ltv":
        return ridge_closed_form(X, Y, lam), torch.zeros(d), torch.zeros(d)
    xm, ym = X.mean(0), Y.mean(0)  # [d_model]
    if variant == "shift":
        return torch.zeros(d, d), xm, ym
    return ridge_closed_form(X - xm, Y - ym, lam), xm, ym  # ltv+b


def predict(W, xm, ym, X: Float[Tensor, "n d_model"]) -> Float[Tensor, "n d_model"]:
    """The shift a :func:`fit_variant` fit predicts for the states ``X``."""
    return (X - xm) @ W.T + ym  # [n, d_model]


def r2(Y: Float[Tensor, "n d_model"], P: Float[Tensor, "n d_model"]) -> float:
    """1 − ‖Y − P‖² / ‖Y − Ȳ‖² (the share of the shift's variance the prediction explains)."""
    return float(1 - ((Y - P) ** 2).sum() / ((Y - Y.mean(0)) ** 2).sum())


class FirstTokens:
    """The zero-shot test prompts as a frozen prefix cache, their gold first tokens and the label
    set's first tokens: the answer-position metrics of a last-token intervention in one
    one-position pass. Label accuracy is scored only when every label starts with its own token."""

    def __init__(self, model, items, labels):
        self.model, self.data = model, LastTokenSet.build(model, items)
        self.labels = labels
        if labels is not None and labels.options is None:
            starts = [c[0] for c in continuation_ids(model, labels.labels)]
            self.label_first = torch.tensor(starts) if len(set(starts)) == len(starts) else None
            self.gold = torch.tensor([labels.labels.index(ex.output) for ex in items])
        else:
            self.label_first = None

    def score(self, hooks, reference: Float[Tensor, "n d_vocab"]) -> dict:
        """``n``, ``first_token_acc`` and ``dntp`` (mean against ``reference``) under ``hooks``; with
        distinct label first tokens also ``label_acc_first`` and ``chance``."""
        with torch.no_grad():
            logits = self.data.logits(self.model, hooks).cpu()  # [n, d_vocab]
        out = {"n": len(self.data),
               "first_token_acc": float((logits.argmax(-1) == self.data.answers.cpu()).float().mean()),
               "dntp": float(dntp_per_item(reference, logits).mean())}
        if self.label_first is not None:
            pick = logits[:, self.label_first].argmax(-1)  # [n]
            out["label_acc_first"] = float((pick == self.gold).float().mean())
            out["chance"] = 1 / len(self.labels.labels)
        return out
