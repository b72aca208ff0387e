"""sitelens.baselines.ltv_variants: the ridge variants fit what they claim, and the first-token
scorer agrees with a plain forward pass."""

import pytest
import torch

from sitelens.baselines.ltv import ridge_closed_form
from sitelens.baselines.ltv_variants import VARIANTS, FirstTokens, fit_variant, predict, r2


def _data(n=64, d=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d, generator=g)  # [n, d_model]
    A = torch.randn(d, d, generator=g)
    return X, X @ A.T + 3.0  # [n, d_model]: linear plus an offset


def test_variants():
    X, Y = _data()
    W, xm, ym = fit_variant(X, Y, 0.5, "ltv")
    assert torch.equal(W, ridge_closed_form(X, Y, 0.5)) and not xm.any() and not ym.any()
    W, xm, ym = fit_variant(X, Y, 1e-9, "ltv+b")
    assert r2(Y, predict(W, xm, ym, X)) == pytest.approx(1.0, abs=1e-6)  # exact with an intercept
    W, xm, ym = fit_variant(X, Y, 0.5, "shift")
    assert not W.any() and torch.allclose(predict(W, xm, ym, X), Y.mean(0).expand_as(Y))
    assert r2(Y, predict(W, xm, ym, X)) == pytest.approx(0.0, abs=1e-6)
    assert set(VARIANTS) == {"ltv", "ltv+b", "shift"}


def test_first_tokens_matches_a_forward_pass():
    from sitelens.tasks import Example, zero_shot_prompts
    from sitelens.testing import tiny_model

    model = tiny_model(n_layers=2, n_heads=2, d_head=8, seed=0)
    items = [Example(x, y) for x, y in (("ab", "c"), ("de", "f"), ("gh", "i"))]
    ft = FirstTokens(model, items, None)
    with torch.no_grad():
        ref = torch.stack([model(p)[0, -1] for p in zero_shot_prompts(model, items)])  # [n, d_vocab]
    out = ft.score([], ref)
    assert out["n"] == 3 and 0.0 <= out["first_token_acc"] <= 1.0
    assert out["dntp"] == pytest.approx(0.0, abs=1e-4)  # unsteered vs its own logits
    assert "label_acc_first" not in out
