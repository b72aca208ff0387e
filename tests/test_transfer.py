"""Cross-model transfer (sitelens.pipelines.transfer): the ridge map recovers a known linear relation
and fails
on shuffled pairs; layer writes equal hook_attn_out; solved per-head z reproduce a write; TV, LTV
and SITE vectors land where the maps say, between two tiny random models of different widths."""

from __future__ import annotations

import pytest
import torch

from sitelens.errors import UsageError
from sitelens.models import has_hooked_transformer
from sitelens.pipelines.transfer import (
    HiddenMap,
    corresponding_index,
    corresponding_layer,
    fit_hidden_map,
    fit_ridge_map,
    layer_write,
    map_grid,
    r2_score,
    resid_hook,
    resid_states,
    solve_z,
    task_states,
    transfer_embedding,
    transfer_linear,
    transfer_state,
    tv_fitted,
)
from sitelens.site.injection import HeadMix
from sitelens.testing import tiny_model

hooked_only = pytest.mark.skipif(not has_hooked_transformer(),
                                 reason="W_O / ln1_post identities need a HookedTransformer")


def _linear_data(n=240, d_src=12, d_dst=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d_src, generator=g, dtype=torch.float64) * 3 + 1
    A = torch.randn(d_dst, d_src, generator=g, dtype=torch.float64)
    b = torch.randn(d_dst, generator=g, dtype=torch.float64)
    return X, X @ A.T + b, A, b


def test_ridge_map_recovers_a_known_linear_relation_exactly():
    X, Y, A, b = _linear_data()
    m = fit_ridge_map(X[:200], Y[:200], X_heldout=X[200:], Y_heldout=Y[200:])
    assert m.rho == 0.0  # noiseless: least squares validates best
    # float64 least squares on well-conditioned 200 x 12 data: errors ~1e-13; 1e-9 leaves room
    assert torch.allclose(m.A, A, atol=1e-9) and torch.allclose(m.b, b, atol=1e-9)
    assert m.r2_heldout > 1 - 1e-12 and m.r2_valid > 1 - 1e-12


def test_ridge_map_on_shuffled_pairs_fails():
    X, Y, _, _ = _linear_data()
    perm = torch.randperm(200, generator=torch.Generator().manual_seed(1))
    m = fit_ridge_map(X[:200], Y[:200][perm], X_heldout=X[200:], Y_heldout=Y[200:])
    # no pairing left: nothing to explain on held-out pairs (the true relation gives R² = 1)
    assert m.r2_heldout < 0.1 and m.r2_valid < 0.1


def test_ridge_map_checks_its_input():
    with pytest.raises(UsageError, match="paired"):
        fit_ridge_map(torch.zeros(5, 3), torch.zeros(4, 2))
    with pytest.raises(UsageError, match="validation"):
        fit_ridge_map(torch.zeros(2, 3), torch.zeros(2, 2))


def test_r2_score():
    Y = torch.randn(50, 4, generator=torch.Generator().manual_seed(0))
    assert r2_score(Y, Y) == 1.0
    assert abs(r2_score(Y, Y.mean(0).expand_as(Y))) < 1e-12  # the mean predicts nothing
    assert r2_score(Y, -Y) < 0


def test_depth_correspondence():
    # Gemma-3-270M (18 layers) -> SmolLM2-135M (30): the ends and the middle meet
    assert [corresponding_index(i, 18, 30) for i in (0, 9, 18)] == [0, 15, 30]
    assert corresponding_layer(0, 18, 30) == 0 and corresponding_layer(17, 18, 30) == 29
    assert corresponding_layer(9, 18, 30) == 15
    assert all(corresponding_layer(a, 18, 30) <= corresponding_layer(a + 1, 18, 30) for a in range(17))


def test_transfer_linear_carries_the_shift_exactly():
    """With an exact forward map (A, b_A) and its exact inverse as the backward map, the shift
    W' h_dst + c equals A (W h_src) for h_dst = A h_src + b_A."""
    g = torch.Generator().manual_seed(0)
    A = torch.randn(7, 5, generator=g, dtype=torch.float64)  # full column rank
    bA = torch.randn(7, generator=g, dtype=torch.float64)
    B = torch.linalg.pinv(A)
    fwd, back = HiddenMap(A=A, b=bA, rho=0.0), HiddenMap(A=B, b=-B @ bA, rho=0.0)
    W = torch.randn(5, 5, generator=g, dtype=torch.float64)
    h_src = torch.randn(10, 5, generator=g, dtype=torch.float64)
    h_dst = fwd.state(h_src)
    Wd, c = transfer_linear(W, fwd, back)
    # float32 outputs of float64 products of O(1) entries: 1e-4 absolute is a few float32 ulps
    assert torch.allclose(h_dst.float() @ Wd.T + c, (h_src @ W.T @ A.T).float(), atol=1e-4)
    with pytest.raises(UsageError, match="does not fit"):
        transfer_linear(torch.zeros(4, 4, dtype=torch.float64), fwd, back)


def test_affine_intervention_is_ltv_plus_centring_and_bias():
    """``affine_intervention`` sets the last position to h + W (h − x̄) + b at block ``layer``'s
    resid_post, only there; without x̄ and b it is ``ltv_intervention``."""
    from types import SimpleNamespace

    from sitelens.baselines.ltv import affine_intervention, ltv_intervention

    g = torch.Generator().manual_seed(0)
    W, xm, b = (torch.randn(*s, generator=g) for s in ((6, 6), (6,), (6,)))
    x = torch.randn(2, 4, 6, generator=g)  # [batch, pos, d_model]
    model = SimpleNamespace(cfg=SimpleNamespace(device="cpu"))
    [(name, hook)] = affine_intervention(W, 3, x_mean=xm, bias=b)(model, 4)
    out = hook(x)
    assert name == "blocks.3.hook_resid_post"
    assert torch.equal(out[:, :-1], x[:, :-1])
    assert torch.allclose(out[:, -1], x[:, -1] + (x[:, -1] - xm) @ W.T + b, atol=1e-6)
    [(_, plain)] = affine_intervention(W, 3)(model, 4)
    [(_, ltv)] = ltv_intervention(W, 3)(model, 4)
    assert torch.equal(plain(x), ltv(x))


# ----------------------------------------------------------------------------------------------
# tiny models of different widths


@pytest.fixture(scope="module")
def pair():
    if not has_hooked_transformer():
        pytest.skip("W_O / ln1_post identities need a HookedTransformer")
    # 40 wide with a post-attention norm (Gemma-like) -> 24 wide without (Llama-like)
    src = tiny_model(n_layers=3, n_heads=4, d_head=10, post_norm=True, seed=0, backend="hooked")
    dst = tiny_model(n_layers=2, n_heads=3, d_head=8, seed=1, backend="hooked")
    return src, dst


def _texts(n, seed):
    import random

    rng = random.Random(seed)
    words = ["cat", "dog", "red", "blue", "sun", "moon", "tree", "sea", "one", "two", "up", "down"]
    return [f"Q: {' '.join(rng.choice(words) for _ in range(rng.randint(1, 6)))}\nA:" for _ in range(n)]


def test_same_model_map_reproduces_the_states(pair):
    src, _ = pair
    m = fit_hidden_map(src, src, _texts(120, 0), 2, 2, heldout=_texts(40, 1))
    # states of a model mapped onto themselves: exact up to float32 capture noise
    assert m.r2_heldout > 1 - 1e-6 and m.src_index == 2 and m.dst_index == 2


def test_map_between_widths_and_shuffled_texts(pair):
    src, dst = pair
    fit, held = _texts(160, 0), _texts(60, 1)
    X, Y = resid_states(src, fit), resid_states(dst, fit)  # [n, 4, 40], [n, 3, 24]
    Xh, Yh = resid_states(src, held), resid_states(dst, held)
    assert X.shape == (160, 4, 40) and Y.shape == (160, 3, 24)
    grid = map_grid(X, Y, Xh, Yh)
    assert len(grid) == 4 * 3
    # point 0 is the last token's embedding, the same ":" for every text: R² of a constant target
    # is undefined (NaN), and a constant source explains nothing (R² <= 0 up to rounding)
    assert grid[grid.dst_index == 0]["r2_heldout"].isna().all()
    assert grid[grid.dst_index > 0]["r2_heldout"].notna().all()
    assert (grid[(grid.src_index == 0) & (grid.dst_index > 0)]["r2_heldout"] < 1e-6).all()
    m = fit_ridge_map(X[:, 2], Y[:, 1], X_heldout=Xh[:, 2], Y_heldout=Yh[:, 1])
    row = grid[(grid.src_index == 2) & (grid.dst_index == 1)].iloc[0]
    # map_grid is fit_ridge_map with a shared SVD: the same penalty and R² up to float64 rounding
    assert row.rho == m.rho and abs(row.r2_heldout - m.r2_heldout) < 1e-9
    shuffled = fit_ridge_map(X[:, 2], Y[torch.randperm(160, generator=torch.Generator().manual_seed(0)), 1],
                             X_heldout=Xh[:, 2], Y_heldout=Yh[:, 1])
    assert shuffled.r2_heldout < m.r2_heldout - 0.2  # pairing carries the information
    tv = transfer_state(X[:, 2].mean(0), m)
    assert tv.shape == (24,) and torch.allclose(tv, X[:, 2].mean(0) @ m.A.float().T + m.b.float())


def _attn_out_with_mix(model, layer, z, prompt="Q: cat\nA:"):
    """hook_attn_out at the last token with every head of ``layer`` set to ``z`` there."""
    w = torch.zeros(model.cfg.n_layers, model.cfg.n_heads)
    w[layer] = 1.0
    t = torch.zeros(model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_head)
    t[layer] = z
    got = {}
    hooks = HeadMix(w, t).hooks(model) + [
        (f"blocks.{layer}.hook_attn_out", lambda x, hook: got.setdefault("out", x[0, -1].detach()))]
    with torch.no_grad():
        model.run_with_hooks(model.to_tokens(prompt), fwd_hooks=hooks)
    return got["out"]


@hooked_only
@pytest.mark.parametrize("post_norm", [False, True])
def test_layer_write_is_hook_attn_out(post_norm):
    model = tiny_model(n_layers=2, n_heads=4, d_head=8, post_norm=post_norm, seed=3, backend="hooked")
    z = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    # the same float32 ops in another order: 1e-5 relative
    assert torch.allclose(layer_write(model, 1, z), _attn_out_with_mix(model, 1, z), rtol=1e-5, atol=1e-5)


@hooked_only
@pytest.mark.parametrize("post_norm", [False, True])
def test_solve_z_reproduces_a_write(post_norm):
    model = tiny_model(n_layers=2, n_heads=4, d_head=8, post_norm=post_norm, seed=3, backend="hooked")
    z0 = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    write = layer_write(model, 0, z0)
    z, rel = solve_z(model, 0, write)
    # square invertible W_O: float64 solve, float32 round trip; the norm's eps moves it ~1e-6
    assert rel < 1e-4
    if not post_norm:  # unique: the very z (with a post-norm, any positive rescaling of it)
        assert torch.allclose(z, z0, atol=1e-4)


def test_transfer_embedding_lands_the_mapped_write(pair):
    src, dst = pair
    g = torch.Generator().manual_seed(0)
    t_src = torch.randn(3, 4, 10, generator=g)  # [n_layers, n_heads, d_head] of src
    maps = {0: (0, HiddenMap(A=torch.randn(24, 40, generator=g, dtype=torch.float64) / 6,
                             b=torch.randn(24, generator=g, dtype=torch.float64), rho=0.0)),
            1: (2, HiddenMap(A=torch.randn(24, 40, generator=g, dtype=torch.float64) / 6,
                             b=torch.randn(24, generator=g, dtype=torch.float64), rho=0.0))}
    t_dst, table = transfer_embedding(src, dst, t_src, maps)
    assert t_dst.shape == (2, 3, 8) and list(table.dst_layer) == [0, 1]
    for dst_layer, (src_layer, m) in maps.items():
        want = m.write(layer_write(src, src_layer, t_src[src_layer]).double()).float()  # A w, no b
        # injected with α = 1 on that layer, the destination writes the mapped source write
        got = _attn_out_with_mix(dst, dst_layer, t_dst[dst_layer])
        assert torch.allclose(got, want, rtol=1e-4, atol=1e-4)  # float32 forward vs float64 solve
    assert (table.rel_residual < 1e-4).all()


def test_resid_hook_names(pair):
    src, _ = pair
    assert resid_hook(src, 0) == "blocks.0.hook_resid_pre"
    assert resid_hook(src, 3) == "blocks.2.hook_resid_post"
    with pytest.raises(UsageError, match="residual index"):
        resid_hook(src, 4)


def test_task_states_and_tv_fitted_equal_tv_and_stage_1(tiny_mha):
    """One shared capture gives exactly TV's states and layer and SITE's stage-1 embedding."""
    from sitelens.baselines import TV
    from sitelens.baselines.tv import task_vectors
    from sitelens.site import task_embedding
    from sitelens.tasks import load_task

    task = load_task("antonym")
    st = task_states(tiny_mha, task, n_prompts=6, n_shots=2, seed=1)
    assert st["resid"].shape == (6, 3, 32)
    assert torch.equal(st["tv"], task_vectors(tiny_mha, task, n_prompts=6, n_shots=2, seed=1))
    assert torch.equal(st["embedding"], task_embedding(tiny_mha, task, n_prompts=6, n_shots=2, seed=1))
    own = TV(n_prompts=6, n_shots=2, n_valid=8).fit(tiny_mha, task, seed=1)
    mine = tv_fitted(tiny_mha, task, st["tv"], n_valid=8)
    assert mine.state["layer"] == own.state["layer"]
    assert torch.equal(mine.state["vector"].cpu(), own.state["vector"].cpu())
    assert mine.meta["layer_table"] == own.meta["layer_table"]
