"""Cross-model transfer of task vectors: a linear map between two models' residual streams, and
TV, LTV and SITE vectors carried through it.

Two models with different tokenizers and widths (Gemma-3-270M, ``d_model`` 640, 18 layers →
SmolLM2-135M, 576, 30 layers) read the same text. :func:`fit_hidden_map` fits an affine ridge
map ``h_dst ≈ A h_src + b`` between their residual-stream states at the **last token** of the same
unlabeled texts (the position where every task vector here acts), with the ridge penalty chosen on
a held-in validation split, and reports R² on held-out texts (:func:`r2_score`).

Residual points are indexed by *depth*: index ``i < n_layers`` is ``blocks.{i}.hook_resid_pre``
(the state after ``i`` blocks), ``i = n_layers`` is the final ``hook_resid_post``; relative depth is
``i / n_layers``, and :func:`corresponding_index` / :func:`corresponding_layer` match points and
blocks of two models by it.

What is carried, and how (:class:`HiddenMap`: ``state`` is affine, ``write`` linear):

- **TV** (a residual *state* that replaces ``resid_pre`` at a layer): ``A s + b``
  (:meth:`HiddenMap.state`).
- **LTV** ``h ← h + W h`` (a linear map on states at a layer): with the forward map
  ``h_dst ≈ A h_src + b_A`` and the backward map ``h_src ≈ B h_dst + b_B`` at the same depth,
  the shift is carried as ``Δh_dst = A Δh_src = A W (B h_dst + b_B)``, i.e. ``h ← h + W' h + c`` with
  ``W' = A W B`` and ``c = A W b_B`` (:func:`transfer_linear`). An additive vector ``v`` (a shift,
  not a state) is carried as ``A v`` (:meth:`HiddenMap.write`): the intercept cancels in a
  difference of states.
- **SITE's embedding** ``t [n_layers, n_heads, d_head]`` (per-head ``hook_z`` targets). A head-level
  transfer is undefined: (1) the heads of two models do not correspond (4 heads of 256 dimensions
  vs 9 of 64, at 18 vs 30 depths), so there is no "same head" to copy into; (2) in Gemma 3 the
  attention output is normalized before it joins the residual stream (``ln1_post``), so the
  residual write of a layer, ``RMSNorm(Σ_h z_h W_O[h] + b_O)``, is not a sum of per-head writes —
  only a whole layer's write is a residual-space vector; (3) per-head ``z`` has no coordinates in
  the residual space that the map connects. What *is* defined is a layer's write when the mix
  sets every head to ``t`` (α = 1): :func:`layer_write`. :func:`transfer_embedding` carries that
  write of the source block at the same relative depth into the destination (``A w``: a write is
  an additive term of the stream) and solves for the destination's per-head ``z`` that writes it,
  by least squares through the destination's stacked ``W_O [n_heads·d_head, d_model]``
  (:func:`solve_z`; exact and unique when that matrix is square and invertible, as in SmolLM2,
  576 = 9·64; the minimum-norm solution when it has more rows than columns). The split of the
  write over the destination's heads is whatever reproduces it, not a claim about which head does
  what; SITE's α must then be fitted (or taken) on the destination model.

The transfer methods as interventions (:mod:`sitelens.pipelines.transfer.methods`: TV carried at
its layer or chosen on valid, LTV, SITE's embedding; :class:`MapBank`, the maps fitted on demand)
and the unlabeled texts the maps are fitted on (:func:`unlabeled_texts`). Modules:
:mod:`~sitelens.pipelines.transfer.maps`, :mod:`~sitelens.pipelines.transfer.embedding`,
:mod:`~sitelens.pipelines.transfer.methods`.

Everything here returns tensors, maps and DataFrames; nothing writes files.
"""

from sitelens.pipelines.transfer.embedding import layer_write, solve_z, transfer_embedding
from sitelens.pipelines.transfer.maps import (
    RIDGE_GRID,
    HiddenMap,
    corresponding_index,
    corresponding_layer,
    fit_hidden_map,
    fit_ridge_map,
    map_grid,
    r2_score,
    resid_hook,
    resid_points,
    resid_states,
    task_states,
    transfer_linear,
    transfer_state,
    tv_fitted,
)
from sitelens.pipelines.transfer.methods import (
    MapBank,
    ltv_transfer,
    site_transfer_embedding,
    tv_transfer,
    tv_transfer_valid,
    unlabeled_texts,
)

__all__ = [
    "RIDGE_GRID", "HiddenMap", "corresponding_index", "corresponding_layer", "fit_hidden_map",
    "fit_ridge_map", "layer_write", "map_grid", "r2_score", "resid_hook", "resid_points",
    "resid_states", "solve_z", "task_states", "transfer_embedding", "transfer_linear",
    "transfer_state", "tv_fitted", "MapBank", "ltv_transfer", "site_transfer_embedding", "tv_transfer",
    "tv_transfer_valid", "unlabeled_texts",
]
