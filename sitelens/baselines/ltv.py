"""Linear task vectors: a closed-form ridge map from the zero-shot last-token hidden state to the
shift that the demonstrations cause.

Over ``n_queries`` unlabeled train queries (inputs only), with
``h`` = ``blocks.{ℓ}.hook_resid_post`` at the last token (ℓ = the final block by default):

    X = h_zs,  Y = h_icl − h_zs                                       [n, d_model] each
    W* = argmin ‖X Wᵀ − Y‖² + λ‖W‖²  =  Yᵀ X (Xᵀ X + λ I)⁻¹           [d_model, d_model]

Intervention: ``h ← h + W*·h`` at the last prompt token of layer ℓ, prefill only.
Trainable parameters: ``d_model²`` (fitted in closed form).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor

from sitelens.baselines.base import FitParts, HookIntervention, Method, last_token_hook, sample_items
from sitelens.errors import TaskError
from sitelens.models import act_name
from sitelens.site import capture_last
from sitelens.tasks import Task, Template, few_shot_prompts, zero_shot_prompt


def ridge_closed_form(
    X: Float[Tensor, "n d_in"], Y: Float[Tensor, "n d_out"], lam: float
) -> Float[Tensor, "d_out d_in"]:
    """``W = Yᵀ X (Xᵀ X + λ I)⁻¹`` (float64 solve, returned as float32): the ridge regression of
    ``Y`` on ``X`` without intercept, so that ``y ≈ W x``."""
    X64, Y64 = X.double(), Y.double()
    A = X64.T @ X64 + lam * torch.eye(X.shape[1], dtype=torch.float64)  # [d_in, d_in]
    Wt = torch.linalg.solve(A, X64.T @ Y64)  # [d_in, d_out]
    return Wt.T.float()


def ltv_hook(W: Float[Tensor, "d_model d_model"], seq_len: int | None) -> Callable:
    """``h ← h + W·h`` at the last position (prefill only)."""
    return last_token_hook(lambda h: h + h @ W.to(h.dtype).T, seq_len)  # [batch, d_model]


def ltv_intervention(W: Tensor, layer: int) -> HookIntervention:
    name = act_name("resid_post", layer)
    return HookIntervention(lambda model, seq_len: [(name, ltv_hook(W, seq_len))])


@dataclass(kw_only=True)
class LTV(Method):
    """LTV: the ridge map (penalty ``lam``) fitted on ``n_queries`` train queries, zero-shot vs
    ``n_shots``-shot, at block ``layer``."""

    name: str = "ltv"
    lam: float = 5.0
    n_queries: int = 256
    n_shots: int = 10
    layer: int | None = None  # None: the final block

    def _fit(self, model, task: Task, seed: int, template: Template, progress: bool) -> FitParts:
        L = model.cfg.n_layers
        layer = L - 1 if self.layer is None else self.layer
        if not -L <= layer < L:
            raise ValueError(f"layer must be in [0, {L}), got {layer}")
        layer = layer % L
        queries = sample_items(task.train, self.n_queries, seed)
        if len(queries) < 2:
            raise TaskError(f"LTV needs at least 2 training queries; {task.name!r} has "
                            f"{len(queries)}.")
        name = act_name("resid_post", layer)
        zs = [zero_shot_prompt(q.input, template) for q in queries]
        icl = few_shot_prompts(task, queries, self.n_shots, seed=seed + 1, template=template)
        X = capture_last(model, zs, [name])[name]  # [n, d_model]
        Y = capture_last(model, icl, [name])[name] - X  # [n, d_model]
        W = ridge_closed_form(X, Y, self.lam).to(model.cfg.device)  # [d_model, d_model]
        return FitParts(
            intervention=ltv_intervention(W, layer),
            n_params=W.numel(),
            state={"W": W, "layer": layer, "X": X, "Y": Y},
            meta={"stored_numbers": W.numel(), "lam": self.lam, "n_queries": len(queries)},
        )
