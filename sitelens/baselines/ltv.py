"""Linear task vectors (LTV): a closed-form ridge map from the zero-shot last-token hidden state to
the shift that the demonstrations cause.

Source: Kwon, Choi and Sohn, "Distributional Alignment as a Criterion for Designing Task Vectors in
In-Context Learning" (arXiv:2605.20730, 2026), which introduces dNTP (the divergence of the
next-token distribution from ICL's; :func:`sitelens.eval.metrics.dntp_per_item`) and LTV, "a closed-form
linear mapping that estimates demonstration effects through regression" chosen to minimize dNTP.
Only the paper's abstract was available when this was written (no method section, no code), so
the choices below are pinned from that sentence and the issue that asked for LTV ("ridge map from
the zero-shot hidden state to h_icl − h_zs"), each with its reason, and each is measured by
``benchmarks/ltv_sweep.py`` (:file:`benchmarks/results/ltv_sweep.md`).

Over ``n_queries`` train queries (inputs only; their labels are never read), with ``h`` the
hidden state below:

    X = h_zs,  Y = h_icl − h_zs                                       [N, d_model] each
    W* = argmin ‖X Wᵀ − Y‖² + λ‖W‖²  =  Yᵀ X (Xᵀ X + λ I)⁻¹           [d_model, d_model]

Intervention: ``h ← h + W*·h`` at the last prompt token of layer ℓ, prefill only.
Trainable parameters: ``d_model²`` (fitted in closed form).

=========  ====================================  ==================================================
choice     value (default)                        reason
=========  ====================================  ==================================================
state      ``blocks.{ℓ}.hook_resid_post``         the residual stream after block ℓ: the "hidden
                                                  state" of task-vector work (Hugging Face's
                                                  ``hidden_states[ℓ + 1]``), the whole input of what
                                                  follows, so a map on it can reproduce any shift
position   the last prompt token                  where the next token is predicted: the position
                                                  whose distribution dNTP compares with ICL's
layer ℓ    the final block (``layer=None``)       dNTP is a function of the final block's state
                                                  alone (through ``ln_final`` and the unembedding),
                                                  so regressing that state's shift aims at dNTP most
                                                  directly; ``layer="sweep"`` fits every block and
                                                  keeps the best on the valid split (below)
N          256 queries (``n_queries``)            enough to fit the map in seconds of forward
                                                  passes; fewer than ``d_model`` (576 / 640), so λ
                                                  decides the map off the queries' span — measured
λ          5.0 (``lam``)                          a light penalty: the paper reports LTV robust to
                                                  λ; the sweep measures it over seven decades
k          10 demonstrations (``n_shots``)        the ICL reference of dNTP in ``sitelens bench``
                                                  is 10-shot: the regression target is the shift to
                                                  exactly the distribution dNTP is measured against
demos      a fresh seeded draw per query          the target is the demonstrations' effect on
                                                  average, not one fixed demonstration set's
=========  ====================================  ==================================================

``layer="sweep"``: ``X`` and ``Y`` are captured at every block in the same forward passes, one map
is fitted per block, and the block with the best first-token accuracy on the first
:data:`SWEEP_N_VALID` validation items wins (ties: lower loss, then the earlier block;
:func:`sitelens.baselines.base.select_layer`, as for TV). The table is in ``meta["layer_table"]``.
The default (``layer=None``) is unchanged, so cells keyed before the sweep existed keep their keys;
a sweep cell's hyperparameters say ``"layer":"sweep"``.

At the final block the intervention changes only the first answer token's distribution: no later
position reads the last block's output (keys and values of every layer come from earlier states),
so an answer's second token onward is the unsteered model's. A block ℓ < L − 1 also changes the
keys and values that the decode steps attend to.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor

from sitelens.baselines.base import (
    FitParts,
    HookIntervention,
    Method,
    last_token_hook,
    sample_items,
    select_layer,
)
from sitelens.errors import TaskError
from sitelens.models import act_name
from sitelens.site import capture_last
from sitelens.site.training import valid_items
from sitelens.tasks import DEFAULT_TEMPLATE, Task, Template, few_shot_prompts, zero_shot_prompts

# The version of LTV's numerics that benchmark rows are keyed on (the ``ltv_source`` column of
# benchmarks/results/regression.csv and cross_model.csv): the sha256[:12]@commit of this file when
# those rows were made. Bump it (e.g. to the new file hash @ commit) whenever a change here moves
# LTV's numbers; a change that moves nothing (imports, comments, names) keeps it, so committed
# rows stay valid.
LTV_NUMERICS = "3cabdc341926@8894b38"


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


def affine_intervention(
    W: Float[Tensor, "d_model d_model"], layer: int, *, x_mean: Float[Tensor, " d_model"] | None = None,
    bias: Float[Tensor, " d_model"] | None = None,
) -> HookIntervention:
    """``h ← h + W·(h − x_mean) + bias`` at the last prompt token of block ``layer``'s
    ``resid_post`` (prefill only; a missing ``x_mean`` or ``bias`` is left out): a ridge map with an
    intercept (fitted on centred states, ``bias`` their mean shift), or a map carried from another
    model (:func:`sitelens.pipelines.transfer.transfer_linear`). Without both it is
    :func:`ltv_intervention`."""
    name = act_name("resid_post", layer)

    def build(model, seq_len):
        dev = model.cfg.device
        Wd, xd, bd = (None if t is None else t.to(dev) for t in (W, x_mean, bias))

        def update(h: Float[Tensor, "batch d_model"]) -> Float[Tensor, "batch d_model"]:
            out = h + (h if xd is None else h - xd.to(h.dtype)) @ Wd.to(h.dtype).T
            return out if bd is None else out + bd.to(h.dtype)

        return [(name, last_token_hook(update, seq_len))]

    return HookIntervention(build)


SWEEP = "sweep"
SWEEP_N_VALID = 64  # validation items that choose the block of layer="sweep" (as TV's n_valid)


def fit_maps(
    X: Float[Tensor, "n n_layers d_model"], Y: Float[Tensor, "n n_layers d_model"], lam: float
) -> Float[Tensor, "n_layers d_model d_model"]:
    """One ridge map per block: ``W[ℓ] = ridge_closed_form(X[:, ℓ], Y[:, ℓ], lam)``."""
    return torch.stack([ridge_closed_form(X[:, i], Y[:, i], lam) for i in range(X.shape[1])])


def ltv_layers(layer, n_layers: int) -> list[int]:
    """The layers an LTV fit reads: every one for :data:`SWEEP`, the last for ``None``, or the
    given index (negative counts from the end)."""
    if layer == SWEEP:
        return list(range(n_layers))
    if layer is None or (isinstance(layer, int) and not isinstance(layer, bool)):
        at = n_layers - 1 if layer is None else layer
        if not -n_layers <= at < n_layers:
            raise ValueError(f"layer must be in [0, {n_layers}), got {at}")
        return [at % n_layers]
    raise ValueError(f"layer must be None, an int or {SWEEP!r}, got {layer!r}")


def ltv_data(
    model, task: Task, layers: Sequence[int], *, n_queries: int, n_shots: int, seed: int,
    template: Template = DEFAULT_TEMPLATE,
) -> tuple[Float[Tensor, "n n_layers d_model"], Float[Tensor, "n n_layers d_model"]]:
    """``X`` = the zero-shot and ``Y`` = the ``n_shots``-shot minus zero-shot
    ``hook_resid_post`` of each block in ``layers`` at the last token of ``n_queries`` seeded
    train queries (module docstring)."""
    queries = sample_items(task.train, n_queries, seed)
    if len(queries) < 2:
        raise TaskError(f"LTV needs at least 2 training queries; {task.name!r} has "
                        f"{len(queries)}.")
    names = [act_name("resid_post", layer) for layer in layers]
    zs = zero_shot_prompts(model, queries, template)
    icl = few_shot_prompts(task, queries, n_shots, seed=seed + 1, template=template, model=model)
    hz = capture_last(model, zs, names)  # {name: [n, d_model]}
    hi = capture_last(model, icl, names)  # {name: [n, d_model]}
    X = torch.stack([hz[n] for n in names], dim=1)  # [n, n_layers, d_model]
    Y = torch.stack([hi[n] for n in names], dim=1) - X  # [n, n_layers, d_model]
    return X, Y


@dataclass(kw_only=True)
class LTV(Method):
    """LTV: the ridge map (penalty ``lam``) fitted on ``n_queries`` train queries, zero-shot vs
    ``n_shots``-shot, at block ``layer`` (None: the final block; an int; ``"sweep"``: every
    block, the best on the valid split kept). Module docstring: the definition and why."""

    name: str = "ltv"
    lam: float = 5.0
    n_queries: int = 256
    n_shots: int = 10
    layer: int | str | None = None  # None: the final block; "sweep": chosen on valid

    def _fit(self, model, task: Task, seed: int, template: Template, progress: bool) -> FitParts:
        L = model.cfg.n_layers
        layers = ltv_layers(self.layer, L)
        X, Y = ltv_data(model, task, layers, n_queries=self.n_queries, n_shots=self.n_shots,
                        seed=seed, template=template)
        Ws = fit_maps(X, Y, self.lam).to(model.cfg.device)  # [n_layers, d_model, d_model]
        meta = {"stored_numbers": Ws[0].numel(), "lam": self.lam, "n_queries": X.shape[0]}
        if len(layers) == 1:
            i, layer = 0, layers[0]
        else:
            layer, table = select_layer(
                model, valid_items(task, SWEEP_N_VALID),
                lambda lay: ltv_intervention(Ws[lay], lay)(model, None), layers, template=template,
            )
            i = layers.index(layer)
            meta["layer_table"] = table
        W = Ws[i]  # [d_model, d_model]
        return FitParts(
            intervention=ltv_intervention(W, layer),
            n_params=W.numel(),
            state={"W": W, "layer": layer, "X": X[:, i], "Y": Y[:, i]},
            meta=meta,
        )
