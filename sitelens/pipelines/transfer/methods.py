"""The transfer methods as interventions on the destination model, and the unlabeled texts the
maps are fitted on. :class:`MapBank` fits the ridge map of any pair of residual points once, on
demand, from both models' captured states; each method takes the bank and the source model's
states or fits and returns the destination's :class:`~sitelens.baselines.base.Fitted` with what
it reports (the layers it acted at, its map's held-out R²):

- :func:`tv_transfer`: the source's TV state at its chosen layer, carried to the point at the same
  relative depth (``shuffled``: a map fitted on shuffled pairs, the control);
- :func:`tv_transfer_valid`: the source's TV state carried to every destination layer, the layer
  chosen on the destination's valid split as TV chooses its own;
- :func:`ltv_transfer`: the source's LTV map ``W`` carried as ``A W B`` (:func:`transfer_linear`);
- :func:`site_transfer_embedding`: SITE's embedding carried block by block
  (:func:`~sitelens.pipelines.transfer.embedding.transfer_embedding`); α is then fitted or taken
  on the destination.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from sitelens.pipelines.transfer.embedding import transfer_embedding
from sitelens.pipelines.transfer.maps import (
    HiddenMap,
    corresponding_index,
    corresponding_layer,
    fit_ridge_map,
    r2_score,
    transfer_linear,
    tv_fitted,
)

CLS_TEXT_SOURCES = ("dbpedia", "rte", "cb", "mr", "cr", "subj")  # cls tasks whose inputs are texts
CLS_HELDOUT = ("cr",)
FV_EXCLUDED = ("ag_news", "sentiment")  # the sources of cls/agnews and cls/sst2


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


def _cut(text: str, n: int = 200) -> str:
    """``text`` cut at the last space before ``n`` characters (whole when shorter)."""
    text = " ".join(text.split())
    if len(text) <= n:
        return text
    cut = text[:n]
    return cut[: cut.rfind(" ")] if " " in cut else cut


def unlabeled_texts(data_root: str | Path, eval_tasks: Sequence, *, texts_per_task: int = 24,
                    texts_per_cls: int = 80) -> tuple[list[str], list[str], dict]:
    """(fit prompts, held-out prompts, provenance): zero-shot prompts of the inputs of tasks not
    evaluated (every FV task under ``{data_root}/fv`` but the evaluated ones and
    :data:`FV_EXCLUDED`, ``texts_per_task`` each; the :data:`CLS_TEXT_SOURCES`, ``texts_per_cls``
    each), cut to 200 characters, none equal to an evaluated task's input; held out by source (every
    fifth FV task and :data:`CLS_HELDOUT`). Seeded per source; ``texts_hash`` names the draw."""
    from sitelens.tasks import load_task, zero_shot_prompt

    data_root = Path(data_root)
    banned = {_norm(ex.input) for t in eval_tasks for s in ("train", "valid", "test") for ex in t.split(s)}
    eval_names = {t.name for t in eval_tasks}
    fv_pool = sorted(p.name for p in (data_root / "fv").iterdir() if (p / "train.json").exists()
                     and p.name not in eval_names and p.name not in FV_EXCLUDED)
    held_fv = set(fv_pool[4::5])
    sources = [("fv", n, texts_per_task, n in held_fv) for n in fv_pool]
    sources += [("cls", n, texts_per_cls, n in CLS_HELDOUT) for n in CLS_TEXT_SOURCES]
    fit, held, prov = [], [], {"fit_sources": [], "heldout_sources": []}
    for coll, name, k, is_held in sources:
        inputs = list(dict.fromkeys(_cut(ex.input) for ex in load_task(data_root / coll / name,
                                                                      dedupe=True).train))
        inputs = [x for x in inputs if x and _norm(x) not in banned]
        picked = random.Random(f"{coll}/{name}").sample(inputs, min(k, len(inputs)))
        (held if is_held else fit).extend(zero_shot_prompt(x) for x in picked)
        prov["heldout_sources" if is_held else "fit_sources"].append(f"{coll}/{name}")
    prov["texts_hash"] = hashlib.sha256(json.dumps([fit, held]).encode()).hexdigest()[:12]
    return fit, held, prov


class MapBank:
    """Ridge maps (:func:`fit_ridge_map`) between residual point ``i`` of the source and ``j`` of
    the destination, fitted on the ``fit`` states with R² on the ``held`` ones, each once:
    ``bank(i, j)``; ``reverse=True`` maps destination point ``j`` back to source point ``i``;
    ``shuffled=True`` fits on the fit pairs with the destination rows permuted (``seed``)."""

    def __init__(self, src_fit: Float[Tensor, "n points_src d_src"],
                 dst_fit: Float[Tensor, "n points_dst d_dst"], src_held: Float[Tensor, "m points_src d_src"],
                 dst_held: Float[Tensor, "m points_dst d_dst"], *, seed: int = 0):
        self.src_fit, self.dst_fit, self.src_held, self.dst_held = src_fit, dst_fit, src_held, dst_held
        self.n_src, self.n_dst = src_fit.shape[1] - 1, dst_fit.shape[1] - 1  # n_layers of each model
        self.perm = torch.randperm(len(src_fit), generator=torch.Generator().manual_seed(seed))
        self.maps: dict = {}

    def __call__(self, i: int, j: int, *, reverse: bool = False, shuffled: bool = False) -> HiddenMap:
        if (key := (i, j, reverse, shuffled)) not in self.maps:
            X, Y = self.src_fit[:, i], self.dst_fit[:, j]
            Xh, Yh = self.src_held[:, i], self.dst_held[:, j]
            if reverse:
                X, Y, Xh, Yh = Y, X, Yh, Xh
            m = fit_ridge_map(X, Y[self.perm] if shuffled else Y, X_heldout=Xh, Y_heldout=Yh)
            m.src_index, m.dst_index = (j, i) if reverse else (i, j)
            self.maps[key] = m
        return self.maps[key]


def tv_transfer(bank: MapBank, src: dict, dst: dict, layer_src: int, device, *,
                method: str = "tv-transfer", shuffled: bool = False):
    """The source's TV state at ``layer_src`` carried to the point at the same relative depth.
    ``src``/``dst``: :func:`task_states` of each model. Reports ``map_r2_task`` (the map's R² on the
    task's own prompts) and ``tv_rel_err`` (distance of the carried state from the destination's
    own TV state, relative to the destination's own from its mean state)."""
    from sitelens.baselines import Fitted
    from sitelens.baselines.tv import tv_intervention

    ls, Ld = layer_src, bank.n_dst
    ld = corresponding_index(ls, bank.n_src, Ld)
    m = bank(ls, ld, shuffled=shuffled)
    carried = m.state(src["tv"][ls].double()).float()  # [d_dst]
    own_dst, mu = (dst["tv"][ld] if ld < Ld else None), bank.dst_fit[:, ld].mean(0)
    fitted = Fitted(method, intervention=tv_intervention(carried.to(device), ld))
    return fitted, {"layer_src": ls, "layer_dst": ld, "map_r2_heldout": m.r2_heldout,
                    "map_r2_task": r2_score(dst["resid"][:, ld], m.state(src["resid"][:, ls].double())),
                    "tv_rel_err": float((carried - own_dst).norm() / (own_dst - mu).norm())
                    if own_dst is not None else float("nan")}


def tv_transfer_valid(model, task, bank: MapBank, src: dict, *, n_valid: int,
                      method: str = "tv-transfer-valid"):
    """The source's TV state carried to every destination layer (each from the source point at
    the same relative depth), the layer chosen on ``model``'s valid split (:func:`tv_fitted`)."""
    Ls, Ld = bank.n_src, bank.n_dst
    carried = torch.stack([
        bank(corresponding_index(ld, Ld, Ls), ld).state(
            src["tv"][min(corresponding_index(ld, Ld, Ls), Ls - 1)].double()).float()
        for ld in range(Ld)])  # [n_layers_dst, d_dst]
    fitted = tv_fitted(model, task, carried, n_valid=n_valid, name=method)
    ld = fitted.state["layer"]
    return fitted, {"layer_src": corresponding_index(ld, Ld, Ls), "layer_dst": ld,
                    "map_r2_heldout": bank(corresponding_index(ld, Ld, Ls), ld).r2_heldout}


def ltv_transfer(bank: MapBank, W: Float[Tensor, "d_src d_src"], layer_src: int, *,
                 method: str = "ltv-transfer"):
    """The source's LTV map ``W`` at block ``layer_src`` (its ``resid_post``: residual point
    ``layer_src + 1``) carried with the forward and backward maps at the same relative depth."""
    from sitelens.baselines import Fitted
    from sitelens.baselines.ltv import affine_intervention

    jd = corresponding_index(layer_src + 1, bank.n_src, bank.n_dst)
    fwd = bank(layer_src + 1, jd)
    Wd, c = transfer_linear(W, fwd, bank(layer_src + 1, jd, reverse=True))
    fitted = Fitted(method, intervention=affine_intervention(Wd, jd - 1, bias=c))
    return fitted, {"layer_src": layer_src, "layer_dst": jd - 1, "map_r2_heldout": fwd.r2_heldout}


def site_transfer_embedding(src_model, dst_model, bank: MapBank,
                            embedding: Float[Tensor, "n_layers_src n_heads_src d_head_src"], *,
                            shuffled: bool = False):
    """SITE's embedding carried block by block: each destination block gets the α = 1 write of the
    source block at its relative depth, through the map of the states after the blocks. Returns
    the destination embedding, :func:`transfer_embedding`'s table and the mean held-out R² of the
    maps used."""
    Ls, Ld = bank.n_src, bank.n_dst
    maps = {ld: (corresponding_layer(ld, Ld, Ls), bank(corresponding_layer(ld, Ld, Ls) + 1, ld + 1,
                                                        shuffled=shuffled)) for ld in range(Ld)}
    t, table = transfer_embedding(src_model, dst_model, embedding, maps)
    r2 = float(np.mean([bank(r.src_layer + 1, r.dst_layer + 1, shuffled=shuffled).r2_heldout
                        for r in table.itertuples()]))
    return t, table, r2
