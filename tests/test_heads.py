"""Head sets (:mod:`sitelens.heads`): the ranking every top-k in the package uses, and
:class:`HeadSet`'s conversions between flat indices, (layer, head) pairs, labels and masks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sitelens.heads import HeadSet, head_label, mask_of, order, ranking


def test_ranking_is_stable_highest_first_with_nan_last():
    s = torch.tensor([[0.5, float("nan"), 0.9], [0.5, float("inf"), -float("inf")]])
    assert ranking(s) == [4, 2, 0, 3, 5, 1]  # ties (0, 3) by index; NaN below -inf
    assert ranking(s, descending=False) == [5, 0, 3, 2, 4, 1]  # NaN last either way
    assert order(s).tolist() == ranking(s)


def test_ranking_matches_numpy_on_float64_without_rounding_to_float32():
    rng = np.random.default_rng(0)
    a = np.round(rng.normal(size=200), 1)  # many ties
    a[:3] = [10.0, 10.0 + 1e-11, np.nan]  # equal in float32, not in float64
    want = np.argsort(-np.nan_to_num(a, nan=-np.inf), kind="stable").tolist()
    assert ranking(a) == want
    assert ranking(torch.as_tensor(a)) == want
    assert ranking(a)[:2] == [1, 0]  # 10 + 1e-11 ranks above 10


def test_headset_conversions_round_trip():
    hs = HeadSet.from_labels("L2H3;L0H1", n_layers=3, n_heads=4)
    assert hs.flat == (11, 1) and hs.pairs() == [(2, 3), (0, 1)]
    assert hs.labels() == ["L2H3", "L0H1"] and repr(hs) == "HeadSet(3×4: L2H3 L0H1)"
    m = hs.mask()
    assert m.shape == (3, 4) and m.dtype == torch.float32 and m.sum() == 2 and m[2, 3] == 1 and m[0, 1] == 1
    assert HeadSet.from_mask(m) == hs  # index order, the same heads: equal
    assert HeadSet.from_mask(m).flat == (1, 11)
    assert HeadSet.from_pairs(hs.pairs(), 3, 4).flat == hs.flat
    assert HeadSet.from_labels(hs.labels(), 3, 4) == hs and hash(HeadSet(3, 4, (1, 11))) == hash(hs)
    assert torch.equal(mask_of([11, 1], (3, 4)), m)
    assert head_label(11, 4) == "L2H3"
    assert repr(HeadSet(1, 2)) == "HeadSet(1×2: no heads)" and HeadSet(1, 2).mask().sum() == 0


def test_headset_top_k_and_jaccard():
    scores = torch.tensor([[0.1, 0.7], [0.7, 0.2]])
    top = HeadSet.top_k(scores, 2)
    assert top.flat == (1, 2)  # the tie kept in index order
    assert HeadSet.top_k(scores, 1, descending=False).flat == (0,)
    assert top.jaccard(HeadSet(2, 2, (2, 3))) == pytest.approx(1 / 3)
    assert HeadSet(2, 2).jaccard(HeadSet(2, 2)) == 1.0  # two empty sets: the same set (sitelens.stats)
    assert HeadSet(2, 2, (0,)) != HeadSet(1, 4, (0,))  # another shape


@pytest.mark.parametrize("bad", [
    lambda: HeadSet(2, 2, (4,)),
    lambda: HeadSet(2, 2, (1, 1)),
    lambda: HeadSet.from_pairs([(2, 0)], 2, 2),
    lambda: HeadSet.from_labels("L0X1", 2, 2),
])
def test_headset_refuses_what_is_not_a_head_of_the_model(bad):
    with pytest.raises(ValueError):
        bad()
