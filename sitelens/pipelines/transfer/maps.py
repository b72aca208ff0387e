"""Residual states of two models on the same texts and the ridge maps between them: residual
points and relative depth, state capture, :class:`HiddenMap` and its fits, the R² grid, and TV / LTV
carried through a map. The definitions: :mod:`sitelens.pipelines.transfer`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from sitelens.errors import UsageError
from sitelens.models import act_name

# Ridge penalties, as multiples of the mean eigenvalue of the centered scatter XcᵀXc (so the grid
# means the same for residual streams of any scale; 0 is ordinary least squares, pseudo-inverse).
RIDGE_GRID = (0.0, 1e-4, 1e-3, 1e-2, 1e-1, 1.0)


# ----------------------------------------------------------------------------------------------
# residual points and depth


def resid_points(model) -> int:
    """Number of residual points of ``model``: ``n_layers + 1`` (see the module docstring)."""
    return model.cfg.n_layers + 1


def resid_hook(model, index: int) -> str:
    """The hook of residual point ``index``: ``blocks.{i}.hook_resid_pre`` for ``i < n_layers``,
    the last block's ``hook_resid_post`` for ``i = n_layers``."""
    L = model.cfg.n_layers
    if not 0 <= index <= L:
        raise UsageError(f"residual index must be in [0, {L}] (n_layers + 1 points), got {index}.")
    return act_name("resid_pre", index) if index < L else act_name("resid_post", L - 1)


def corresponding_index(index: int, n_src: int, n_dst: int) -> int:
    """The destination residual point at the relative depth of ``index`` (``index / n_src``):
    ``round(index · n_dst / n_src)``, with points ``0..n`` for a model of ``n`` layers."""
    return int(math.floor(index * n_dst / n_src + 0.5))


def corresponding_layer(layer: int, n_src: int, n_dst: int) -> int:
    """The destination block whose centre ``(l + 0.5) / n_dst`` is nearest the relative depth of
    block ``layer``'s centre: ``floor((layer + 0.5) · n_dst / n_src)``."""
    return min(n_dst - 1, int(math.floor((layer + 0.5) * n_dst / n_src)))


def resid_states(
    model, prompts: Sequence[str], indices: Sequence[int] | None = None, *, batch_size: int = 8
) -> Float[Tensor, "n n_points d_model"]:
    """Last-token residual states of ``prompts`` at the residual points ``indices`` (all by
    default), float32 on the CPU, in the order of ``prompts`` (:func:`sitelens.site.capture_last`)."""
    from sitelens.site import capture_last

    idx = list(range(resid_points(model))) if indices is None else list(indices)
    names = [resid_hook(model, i) for i in idx]
    acts = capture_last(model, list(prompts), names, batch_size=batch_size)  # {name: [n, d_model]}
    return torch.stack([acts[n] for n in names], dim=1)  # [n, n_points, d_model]


def task_states(
    model, task, *, n_prompts: int = 50, n_shots: int = 10, seed: int = 0, template=None,
    batch_size: int = 8,
) -> dict[str, Tensor]:
    """One pass over stage 1's few-shot prompts (:func:`sitelens.tasks.embedding_prompts`, the
    prompts of both :func:`sitelens.baselines.tv.task_vectors` and
    :func:`sitelens.site.task_embedding` with the same arguments) capturing what both need:
    ``resid [n_prompts, n_layers + 1, d_model]`` (last-token states at every residual point),
    ``tv [n_layers, d_model]`` (their mean at each ``hook_resid_pre``: the TV states) and
    ``embedding [n_layers, n_heads, d_head]`` (the mean last-token ``hook_z``: SITE's stage 1)."""
    from sitelens.models import check_z_shape, z_hook_name
    from sitelens.site import capture_last
    from sitelens.tasks import DEFAULT_TEMPLATE, embedding_prompts

    template = template or DEFAULT_TEMPLATE
    c = model.cfg
    prompts = embedding_prompts(task, n_prompts, n_shots, seed=seed, template=template, model=model)
    rnames = [resid_hook(model, i) for i in range(resid_points(model))]
    znames = [z_hook_name(model, layer) for layer in range(c.n_layers)]
    acts = capture_last(model, prompts, [*rnames, *znames], batch_size=batch_size)
    for name in znames:
        check_z_shape(acts[name][:, None], c.n_heads, c.d_head, name)
    resid = torch.stack([acts[n] for n in rnames], dim=1)  # [n_prompts, n_layers + 1, d_model]
    z = torch.stack([acts[n] for n in znames], dim=1)  # [n_prompts, n_layers, n_heads, d_head]
    return {"resid": resid, "tv": resid[:, : c.n_layers].mean(0), "embedding": z.mean(0)}


def tv_fitted(
    model, task, states: Float[Tensor, "n_layers d_model"], *, layers: Sequence[int] | None = None,
    n_valid: int = 64, template=None, name: str = "tv",
):
    """:class:`sitelens.baselines.TV`'s fit with its states given (own states from
    :func:`task_states`, or states carried from another model): the layer among ``layers`` (all
    by default) with the best validation first-token accuracy, its state replacing
    ``hook_resid_pre`` at the last prompt token. Returns a :class:`sitelens.baselines.Fitted`."""
    from sitelens.baselines.base import Fitted, select_layer
    from sitelens.baselines.tv import tv_intervention
    from sitelens.site.training import valid_items
    from sitelens.tasks import DEFAULT_TEMPLATE

    template = template or DEFAULT_TEMPLATE
    states = states.to(model.cfg.device)  # [n_layers, d_model]
    layers = list(layers) if layers is not None else list(range(model.cfg.n_layers))
    layer, table = select_layer(
        model, valid_items(task, n_valid), lambda lay: tv_intervention(states[lay], lay)(model, None),
        layers, template=template,
    )
    return Fitted(name, intervention=tv_intervention(states[layer], layer),
                  state={"vector": states[layer], "layer": layer, "all_layers": states},
                  meta={"stored_numbers": model.cfg.d_model, "layer_table": table})


# ----------------------------------------------------------------------------------------------
# the map


def r2_score(Y: Float[Tensor, "n d"], Y_hat: Float[Tensor, "n d"]) -> float:
    """``1 − Σ‖y − ŷ‖² / Σ‖y − ȳ‖²`` over all rows and dimensions (ȳ: the mean row of ``Y``): the
    share of the total variance of ``Y`` explained (1 exact, 0 no better than the mean, < 0 worse)."""
    Y64, P64 = torch.as_tensor(Y).double(), torch.as_tensor(Y_hat).double()
    ss_res = ((Y64 - P64) ** 2).sum()
    ss_tot = ((Y64 - Y64.mean(0)) ** 2).sum()
    return float(1 - ss_res / ss_tot) if ss_tot > 0 else float("nan")


class _RidgeBasis:
    """The SVD of centered ``X`` (float64), reused for every target and penalty."""

    def __init__(self, X: Tensor):
        X64 = torch.as_tensor(X).double()
        self.x_mean = X64.mean(0)  # [d_in]
        U, S, Vh = torch.linalg.svd(X64 - self.x_mean, full_matrices=False)
        self.U, self.S, self.Vh = U, S, Vh  # [n, r], [r], [r, d_in]
        self.scale = float((S**2).sum() / X64.shape[1])  # the mean eigenvalue of XcᵀXc

    def project(self, Y: Tensor) -> tuple[Tensor, Tensor]:
        """``(Uᵀ (Y − ȳ), ȳ)``: what every penalty's fit of ``Y`` shares."""
        Y64 = torch.as_tensor(Y).double()
        y_mean = Y64.mean(0)  # [d_out]
        return self.U.T @ (Y64 - y_mean), y_mean  # [r, d_out], [d_out]

    def fit(self, Y: Tensor | tuple[Tensor, Tensor], rho: float) -> tuple[Tensor, Tensor]:
        """``A [d_out, d_in]``, ``b [d_out]`` of the ridge fit of ``Y`` (or of its
        :meth:`project`) with penalty ``rho · scale``."""
        UtY, y_mean = Y if isinstance(Y, tuple) else self.project(Y)
        lam = rho * self.scale
        tol = self.S.max() * max(self.U.shape[0], self.Vh.shape[1]) * torch.finfo(torch.float64).eps
        if lam > 0:
            shrink = self.S / (self.S**2 + lam)
        else:  # least squares: the pseudo-inverse, tiny singular values dropped
            shrink = torch.where(self.S > tol, 1 / self.S.clamp_min(tol), torch.zeros_like(self.S))
        coef = self.Vh.T @ (shrink[:, None] * UtY)  # [d_in, d_out]
        A = coef.T  # [d_out, d_in]
        return A, y_mean - A @ self.x_mean


@dataclass
class HiddenMap:
    """An affine map ``h_dst ≈ A h_src + b`` between two residual spaces.

    ``rho``: the ridge penalty chosen (× the mean eigenvalue of the centered scatter);
    ``r2_valid``: R² of that choice on the held-in validation rows; ``r2_heldout``: R² on held-out
    texts (NaN when none were given); ``src_index`` / ``dst_index``: the residual points (see the
    module docstring); ``table``: validation R² per penalty."""

    A: Float[Tensor, "d_dst d_src"]
    b: Float[Tensor, " d_dst"]
    rho: float
    r2_valid: float = float("nan")
    r2_heldout: float = float("nan")
    src_index: int | None = None
    dst_index: int | None = None
    table: list[dict] = field(default_factory=list)

    def state(self, x: Float[Tensor, "... d_src"]) -> Float[Tensor, "... d_dst"]:
        """A state carried across: ``A x + b``."""
        return x.double() @ self.A.T + self.b if x.dtype == torch.float64 else (
            x.float() @ self.A.float().T + self.b.float())

    def write(self, v: Float[Tensor, "... d_src"]) -> Float[Tensor, "... d_dst"]:
        """A shift or a write into the stream carried across: ``A v`` (no intercept: it cancels
        in a difference of states)."""
        return v.double() @ self.A.T if v.dtype == torch.float64 else v.float() @ self.A.float().T


def fit_ridge_map(
    X: Float[Tensor, "n d_src"],
    Y: Float[Tensor, "n d_dst"],
    *,
    grid: Sequence[float] = RIDGE_GRID,
    valid_frac: float = 0.2,
    seed: int = 0,
    X_heldout: Tensor | None = None,
    Y_heldout: Tensor | None = None,
) -> HiddenMap:
    """The affine ridge map from ``X`` to ``Y`` (rows are paired: the same text in both models).
    The penalty (``grid``, multiples of the mean eigenvalue of the centered ``XᵀX``) is chosen by
    R² on a seeded ``valid_frac`` of the rows, fitted on the rest; the map is then refitted on all
    rows. With ``X_heldout``/``Y_heldout``, ``r2_heldout`` is its R² there."""
    X, Y = torch.as_tensor(X), torch.as_tensor(Y)
    if X.dim() != 2 or Y.dim() != 2 or X.shape[0] != Y.shape[0]:
        raise UsageError(f"fit_ridge_map needs paired [n, d] matrices, got {list(X.shape)} and "
                         f"{list(Y.shape)}.")
    n = X.shape[0]
    n_val = int(round(valid_frac * n))
    if n_val < 1 or n - n_val < 2 or not grid:
        raise UsageError(f"fit_ridge_map needs a non-empty grid and rows for both a fit and a "
                         f"validation part; got {n} rows with valid_frac={valid_frac}.")
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    val, fit = perm[:n_val], perm[n_val:]
    basis = _RidgeBasis(X[fit])
    table = []
    for rho in grid:
        A, b = basis.fit(Y[fit], rho)
        table.append({"rho": float(rho), "r2_valid": r2_score(Y[val], X[val].double() @ A.T + b)})
    best = max(table, key=lambda r: r["r2_valid"])  # ties: the first in grid order
    A, b = _RidgeBasis(X).fit(Y, best["rho"])
    m = HiddenMap(A=A, b=b, rho=best["rho"], r2_valid=best["r2_valid"], table=table)
    if X_heldout is not None and Y_heldout is not None:
        m.r2_heldout = r2_score(Y_heldout, m.state(torch.as_tensor(X_heldout).double()))
    return m


def fit_hidden_map(
    src_model,
    dst_model,
    texts: Sequence[str],
    layer_src: int,
    layer_dst: int,
    *,
    heldout: Sequence[str] | None = None,
    grid: Sequence[float] = RIDGE_GRID,
    valid_frac: float = 0.2,
    seed: int = 0,
    batch_size: int = 8,
) -> HiddenMap:
    """Fit ``h_dst ≈ A h_src + b`` between residual point ``layer_src`` of ``src_model`` and
    ``layer_dst`` of ``dst_model`` (indices as in the module docstring) on the last-token states
    of ``texts`` (each model tokenizes them itself); R² on ``heldout`` texts when given."""
    X = resid_states(src_model, texts, [layer_src], batch_size=batch_size)[:, 0]  # [n, d_src]
    Y = resid_states(dst_model, texts, [layer_dst], batch_size=batch_size)[:, 0]  # [n, d_dst]
    Xh = Yh = None
    if heldout:
        Xh = resid_states(src_model, heldout, [layer_src], batch_size=batch_size)[:, 0]
        Yh = resid_states(dst_model, heldout, [layer_dst], batch_size=batch_size)[:, 0]
    m = fit_ridge_map(X, Y, grid=grid, valid_frac=valid_frac, seed=seed, X_heldout=Xh, Y_heldout=Yh)
    m.src_index, m.dst_index = layer_src, layer_dst
    return m


def map_grid(
    X: Float[Tensor, "n p_src d_src"],
    Y: Float[Tensor, "n p_dst d_dst"],
    X_heldout: Float[Tensor, "m p_src d_src"],
    Y_heldout: Float[Tensor, "m p_dst d_dst"],
    pairs: Sequence[tuple[int, int]] | None = None,
    *,
    grid: Sequence[float] = RIDGE_GRID,
    valid_frac: float = 0.2,
    seed: int = 0,
) -> pd.DataFrame:
    """Held-out R² of the map for each ``(src_index, dst_index)`` pair (all pairs by default) of
    residual states already captured (``[n, points, d]``, e.g. by :func:`resid_states`); the
    same fits as :func:`fit_ridge_map`, sharing one SVD per source point. Columns: src_index,
    dst_index, rho, r2_valid, r2_heldout, r2_train."""
    if pairs is None:
        pairs = [(i, j) for i in range(X.shape[1]) for j in range(Y.shape[1])]
    n = X.shape[0]
    n_val = int(round(valid_frac * n))
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    val, fit = perm[:n_val], perm[n_val:]
    rows = []
    for i in sorted({p[0] for p in pairs}):
        Xi, Xh = X[:, i].double(), X_heldout[:, i].double()
        part, full = _RidgeBasis(Xi[fit]), _RidgeBasis(Xi)
        for j in [p[1] for p in pairs if p[0] == i]:
            Yj = Y[:, j].double()
            proj = part.project(Yj[fit])
            scores = []
            for rho in grid:
                A, b = part.fit(proj, rho)
                scores.append(r2_score(Yj[val], Xi[val] @ A.T + b))
            k = int(np.argmax(scores))
            A, b = full.fit(Yj, grid[k])
            rows.append({"src_index": i, "dst_index": j, "rho": grid[k], "r2_valid": scores[k],
                         "r2_heldout": r2_score(Y_heldout[:, j], Xh @ A.T + b),
                         "r2_train": r2_score(Yj, Xi @ A.T + b)})
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------------------------
# carrying vectors across


def transfer_state(state: Float[Tensor, "... d_src"], m: HiddenMap) -> Float[Tensor, "... d_dst"]:
    """A residual state (a TV) carried across: ``A s + b``."""
    return m.state(state)


def transfer_linear(
    W: Float[Tensor, "d_src d_src"], forward: HiddenMap, backward: HiddenMap
) -> tuple[Float[Tensor, "d_dst d_dst"], Float[Tensor, " d_dst"]]:
    """A shift ``Δh_src = W h_src`` (LTV) carried across as ``Δh_dst = W' h_dst + c``:
    ``W' = A W B``, ``c = A W b_B`` with ``forward`` = (A, b_A): src → dst and ``backward`` =
    (B, b_B): dst → src, fitted at the same depths (module docstring)."""
    A, B, bB = forward.A.double(), backward.A.double(), backward.b.double()
    if A.shape[1] != W.shape[0] or B.shape[0] != W.shape[1] or B.shape[1] != A.shape[0]:
        raise UsageError(f"transfer_linear: W {list(W.shape)} does not fit the maps A "
                         f"{list(A.shape)} (src → dst) and B {list(B.shape)} (dst → src).")
    AW = A @ W.double()  # [d_dst, d_src]
    return (AW @ B).float(), (AW @ bB).float()
