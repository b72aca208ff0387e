"""sitelens.pipelines.transfer.methods (the maps fitted on demand, the transfer methods, the
unlabeled texts) and sitelens.atlas.data.depth_enrichment."""

import json

import numpy as np
import pandas as pd
import pytest
import torch

from sitelens.models import has_hooked_transformer
from sitelens.pipelines.transfer import (
    MapBank,
    corresponding_index,
    fit_ridge_map,
    ltv_transfer,
    site_transfer_embedding,
    transfer_linear,
    tv_transfer,
    unlabeled_texts,
)


def _bank(n=80, m=30, Ls=3, Ld=2, ds=12, dd=10, seed=0):
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(dd, ds, generator=g)
    x = torch.randn(n + m, ds, generator=g)  # [n, d_src]
    src = torch.stack([x * (i + 1) for i in range(Ls + 1)], 1)  # [n, points_src, d_src]
    dst = torch.stack([x @ A.T + j for j in range(Ld + 1)], 1)  # every pair of points is affine
    return MapBank(src[:n], dst[:n], src[n:], dst[n:])


def test_map_bank_fits_each_map_once_and_matches_fit_ridge_map():
    bank = _bank()
    assert (bank.n_src, bank.n_dst) == (3, 2)
    m = bank(1, 1)
    assert bank(1, 1) is m and len(bank.maps) == 1
    ref = fit_ridge_map(bank.src_fit[:, 1], bank.dst_fit[:, 1], X_heldout=bank.src_held[:, 1],
                        Y_heldout=bank.dst_held[:, 1])
    assert torch.equal(m.A, ref.A) and m.r2_heldout == ref.r2_heldout > 0.99
    back = bank(1, 1, reverse=True)
    assert (back.src_index, back.dst_index) == (1, 1) and back.A.shape == (12, 10)
    assert bank(1, 1, shuffled=True).r2_heldout < m.r2_heldout


def test_tv_transfer_carries_the_state_through_the_map():
    bank = _bank()
    src = {"tv": bank.src_fit[:, :3].mean(0), "resid": bank.src_fit[:8]}
    dst = {"tv": bank.dst_fit[:4, :2].mean(0), "resid": bank.dst_fit[:8]}
    fitted, extra = tv_transfer(bank, src, dst, 2, "cpu")
    ld = corresponding_index(2, 3, 2)
    assert fitted.method == "tv-transfer" and (extra["layer_src"], extra["layer_dst"]) == (2, ld)
    assert extra["map_r2_task"] > 0.99 and extra["map_r2_heldout"] == bank(2, ld).r2_heldout
    assert np.isfinite(extra["tv_rel_err"]) and extra["tv_rel_err"] >= 0


def test_ltv_transfer_is_transfer_linear_at_the_matching_point():
    bank = _bank()
    W = torch.randn(12, 12, generator=torch.Generator().manual_seed(1)) * 0.1
    fitted, extra = ltv_transfer(bank, W, 1)
    jd = corresponding_index(2, 3, 2)
    Wd, _ = transfer_linear(W, bank(2, jd), bank(2, jd, reverse=True))
    assert fitted.method == "ltv-transfer" and extra == {"layer_src": 1, "layer_dst": jd - 1,
                                                         "map_r2_heldout": bank(2, jd).r2_heldout}
    assert Wd.shape == (10, 10)


@pytest.mark.skipif(not has_hooked_transformer(),
                    reason="HookedTransformer only: the tiny source and target models are HookedTransformers")
def test_site_transfer_embedding_on_tiny_models():
    from sitelens.pipelines.transfer import resid_states
    from sitelens.testing import tiny_model

    src = tiny_model(n_layers=3, n_heads=4, d_head=10, seed=0, backend="hooked")
    dst = tiny_model(n_layers=2, n_heads=3, d_head=8, seed=1, backend="hooked")
    texts = [f"Q: {w}{i}\nA:" for i in range(30) for w in ("ab", "cd")]
    S = {k: resid_states(m, t) for k, m, t in (("sf", src, texts[:40]), ("df", dst, texts[:40]),
                                               ("sh", src, texts[40:]), ("dh", dst, texts[40:]))}
    bank = MapBank(S["sf"], S["df"], S["sh"], S["dh"])
    emb = torch.randn(3, 4, 10, generator=torch.Generator().manual_seed(2))  # [n_layers, n_heads, d_head]
    t, table, r2 = site_transfer_embedding(src, dst, bank, emb)
    assert t.shape == (2, 3, 8) and list(table.dst_layer) == [0, 1]
    assert r2 == pytest.approx(np.mean([bank(s + 1, d + 1).r2_heldout
                                        for s, d in zip(table.src_layer, table.dst_layer)]))


def _write(d, inputs):
    d.mkdir(parents=True)
    for s in ("train", "valid", "test"):
        (d / f"{s}.json").write_text(json.dumps([{"input": x, "output": "y"} for x in inputs]))


def test_unlabeled_texts_hold_out_by_source_and_skip_evaluated_inputs(tmp_path):
    from sitelens.tasks import load_task

    for i in range(6):
        _write(tmp_path / "fv" / f"t{i}", [f"word{i} {j}" for j in range(10)] + ["shared input"])
    for name in ("dbpedia", "rte", "cb", "mr", "cr", "subj"):
        _write(tmp_path / "cls" / name, [f"{name} text {j}" for j in range(10)])
    evaluated = load_task(tmp_path / "fv" / "t0")
    fit, held, prov = unlabeled_texts(tmp_path, [evaluated], texts_per_task=3, texts_per_cls=2)
    assert "fv/t0" not in prov["fit_sources"] + prov["heldout_sources"]
    assert prov["heldout_sources"] == ["fv/t5", "cls/cr"]  # every fifth FV task, and cr
    assert len(fit) == 4 * 3 + 5 * 2 and len(held) == 3 + 2
    assert not any("shared input" in p for p in fit + held)
    assert unlabeled_texts(tmp_path, [evaluated], texts_per_task=3, texts_per_cls=2)[2] == prov


def test_depth_enrichment():
    from sitelens.atlas.data import AtlasData, depth_enrichment, depth_profile

    L, H = 5, 2
    alpha = pd.DataFrame([{"task": t, "layer": ell, "head": h, "alpha": float(ell + 1 if t == "a" else 1)}
                          for t in ("a", "b") for ell in range(L) for h in range(H)])
    data = AtlasData(model="m", n_layers=L, n_heads=H, alpha=alpha, similarity=pd.DataFrame(),
                     transfer=pd.DataFrame(), tokens=pd.DataFrame(), lenses=pd.DataFrame())
    e = depth_enrichment(data)
    assert list(e.mass) == list(depth_profile(data).mass)
    assert e.layer_share.sum() == pytest.approx(1.0) and (e.layer_share > 0).sum() == L
    assert e.enrichment.isna().sum() == 10 - L
    assert np.nansum(e.mass) == pytest.approx(1.0)
    com_a = sum((ell + 1) * (ell + 0.5) / L for ell in range(L)) / sum(range(1, L + 1))
    assert e.centre_of_mass.iloc[0] == pytest.approx((com_a + 0.5) / 2)  # uniform task b: 0.5
