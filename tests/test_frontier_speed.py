"""The frontier's speed-ups against the slow computations they replace, on tiny random models.

Tolerance of the joint fits (:func:`sitelens.lenses.joint_fit.fit_many`): one pass of R × n rows
instead of R passes of n rows sums the same float32 terms in another order (about 1e-7 relative
per pass); over the fit's steps Adam's normalized updates carry that forward, so the kept logits
(of order 1) agree to 1e-4, far below the gaps that decide a top-k or an argmax in these tests.
Where two validation checks give the same loss to within that rounding (a straight-through mask
that did not change between them), either may be kept: the fits here validate only before the
first and after the last step, so the kept step is decided by a real difference."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from test_frontier_pin import planted

import sitelens.lenses.joint_fit as J
import sitelens.lenses.selectors as S
from sitelens import FitConfig, fit_site, load_task
from sitelens.tasks import Template

BARE = Template(answer_prefix="")
FIT = FitConfig(n_examples=40, n_valid=8, eval_every=5)  # checks at steps 0 and 5 only (see above)
ATOL = 1e-4  # see the module docstring


@pytest.fixture(scope="module")
def task(tiny_mha):
    return planted(tiny_mha, load_task("antonym"))  # answers the model can learn: the fits move


def _embedding(model, task):
    return fit_site(model, task, n_prompts=4, n_shots=2, config=FIT, template=BARE).embedding


def check_joint_refits_equal_one_by_one(model, task) -> None:
    emb = _embedding(model, task)
    L, H = model.cfg.n_layers, model.cfg.n_heads
    sets = [[0], [1, 5], [2, 3, 7]]
    masks = torch.stack([S.mask_of(h, (L, H)).flatten() for h in sets])  # [3, L * H]
    joint = J.fit_many(model, task, emb, FIT, lambda a: torch.sigmoid(a) * masks, len(sets),
                       template=BARE, what="test", max_rows=16)  # 16 rows: the sets run in groups
    for i, m in enumerate(masks):
        one = S.fit_head_weights(model, task, emb, FIT, lambda a, m=m: torch.sigmoid(a) * m,
                                 template=BARE, what="test")  # [L, H]
        got, want = joint[i].flatten()[m > 0], one.flatten()[m > 0]
        assert torch.allclose(got, want, atol=ATOL), (i, got, want)
    assert (joint != FIT.init).any()  # the fits moved: the comparison is not of two starts


def test_joint_refits_equal_one_by_one(tiny_mha, task):
    check_joint_refits_equal_one_by_one(tiny_mha, task)


def test_mutation_joint_fit_with_the_wrong_mix_is_caught(tiny_mha, task, monkeypatch):
    real = J._condition_losses

    def wrong(model, items, conds, w, t):  # each condition's weights halved in the mix
        return real(model, items, conds, w * 0.5, t)

    monkeypatch.setattr(J, "_condition_losses", wrong)
    with pytest.raises(AssertionError):
        check_joint_refits_equal_one_by_one(tiny_mha, task)


def test_joint_sparse_fits_equal_one_by_one(tiny_mha, task):
    emb = _embedding(tiny_mha, task)
    L, H = tiny_mha.cfg.n_layers, tiny_mha.cfg.n_heads
    init = 1e-3 * torch.randn(L * H, generator=torch.Generator().manual_seed(0))
    ks = [1, 3]
    joint = J.fit_many(tiny_mha, task, emb, FIT, S.straight_through_topk_rows(ks), len(ks),
                       template=BARE, what="test", init=init.repeat(len(ks), 1))
    for k, got in zip(ks, joint):
        one = S.fit_head_weights(tiny_mha, task, emb, FIT, S.straight_through_topk(k), template=BARE,
                                 what="test", init=init)
        assert torch.allclose(got, one, atol=ATOL)
        assert S.ranking(got)[:k] == S.ranking(one)[:k]


def test_joint_alpha_sparse_fits_equal_fit_site(tiny_mha, task):
    emb = _embedding(tiny_mha, task)
    lams = torch.tensor([0.5, 5.0])
    joint = J.fit_many(tiny_mha, task, emb, FIT, torch.sigmoid, 2, template=BARE, what="test",
                       penalty=lambda a: lams * torch.sigmoid(a).mean(1))
    for lam, got in zip(lams.tolist(), joint):
        ad = fit_site(tiny_mha, task, config=replace(FIT, sparsity=lam), template=BARE, embedding=emb)
        assert torch.allclose(torch.sigmoid(got), ad.alpha, atol=ATOL)
