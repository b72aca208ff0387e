"""The roofline counter (benchmarks/roofline.py): FLOPs and bytes counted op by
op from the real shapes.

Exact integer counts, no tolerance: a product of known shapes, a linear layer with a bias
(``addmm``), an activation-by-activation product (attention-like), views (no bytes) and a broadcast
operand (read once); on the tiny random model a whole forward pass equals the count derived from its
config by hand (2·tokens·weights for every projection and the unembedding, 4·b·h·q·k·d per layer
for the fused attention). The machine measurements are smoke-tested only (no timed assertions).
A planted bug (``addmm`` not counted) is caught.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from bench_util import bench_module

rl = bench_module("roofline")  # benchmarks/roofline.py


def _counted(fn, weights=()):
    with rl.OpCounter(weights) as c:
        fn()
    return c


def test_a_product_with_a_weight():
    x, w = torch.rand(3, 5), torch.rand(5, 7)
    c = _counted(lambda: x @ w, [w])
    assert (c.flops, c.weight_flops, c.attention_flops) == (2 * 3 * 5 * 7, 2 * 3 * 5 * 7, 0)
    assert c.bytes == (15 + 35 + 21) * 4 and c.weight_bytes == 35 * 4
    assert dict(c.shapes) == {(1, 3, 5, 7): 210}


def test_a_linear_layer_with_bias_is_one_product():
    x, w, b = torch.rand(3, 5), torch.rand(7, 5), torch.rand(7)
    c = _counted(lambda: F.linear(x, w, b), [w, b])
    assert c.flops == c.weight_flops == 2 * 3 * 5 * 7  # the bias add is not a product
    assert dict(c.shapes) == {(1, 3, 5, 7): 210}


def test_linear_check_catches_addmm_left_uncounted(monkeypatch):
    """Mutation: a counter that forgets ``addmm`` (biased linear layers) counts no FLOPs there."""
    monkeypatch.setattr(rl, "MATMULS", {k: v for k, v in rl.MATMULS.items()
                                        if k is not torch.ops.aten.addmm.default})
    with pytest.raises(AssertionError):
        test_a_linear_layer_with_bias_is_one_product()


def test_a_product_of_activations_is_attention_and_reads_its_keys():
    q, k = torch.rand(2, 4, 6), torch.rand(2, 6, 9)
    c = _counted(lambda: torch.bmm(q, k))
    assert c.attention_flops == c.flops == 2 * 2 * 4 * 6 * 9 and c.weight_flops == 0
    assert c.kv_bytes == k.numel() * 4 and dict(c.shapes) == {(2, 4, 6, 9): c.flops}


def test_views_move_nothing_and_broadcasts_are_read_once():
    x = torch.rand(4, 6)
    c = _counted(lambda: (x.t(), x.view(24), x[:2]))
    assert c.bytes == 0 and c.ops == 3
    row = torch.rand(1, 6)
    c = _counted(lambda: x + row.expand(4, 6))
    assert c.bytes == (24 + 6 + 24) * 4  # the expanded row: 6 floats, not 24
    assert rl.distinct_bytes(row.expand(4, 6)) == 24


def test_a_forward_pass_is_counted_from_its_shapes(tiny_model_name="tiny-random"):
    from sitelens.models import load_model

    model = load_model(tiny_model_name)
    cfg = model.cfg
    b, p = 2, 7
    tokens = torch.randint(0, cfg.d_vocab, (b, p))
    with torch.no_grad(), rl.OpCounter(rl.model_weights(model)) as c:
        model(tokens)
    kv = cfg.n_key_value_heads or cfg.n_heads
    per_layer = (2 * cfg.n_heads + 2 * kv) * cfg.d_head * cfg.d_model \
        + (3 if cfg.gated_mlp else 2) * cfg.d_model * cfg.d_mlp
    weights = cfg.n_layers * per_layer + cfg.d_model * cfg.d_vocab
    assert c.weight_flops == 2 * b * p * weights
    assert c.attention_flops == cfg.n_layers * 4 * b * cfg.n_heads * p * p * cfg.d_head
    assert c.flops == c.weight_flops + c.attention_flops
    n_weights = sum(t.numel() * t.element_size() for t in model.parameters())  # buffers: sliced
    table = cfg.d_vocab * cfg.d_model * 4  # the embedding table: only the rows of the tokens are read
    assert c.weight_bytes >= n_weights - table  # every other parameter read at least once
    assert c.bytes > c.weight_bytes and c.ops > 0


def test_roofline_row_bounds():
    tot = dict(flops=10 * 10**9, bytes=10**9, ops=1000)
    mem = rl.roofline_row(tot, seconds=2.0, peak_gflops=100.0, bandwidth_gbs=5.0, op_s=1e-5)
    assert mem["bound"] == "memory" and mem["intensity"] == 10 and mem["attainable_gflops"] == 50
    assert mem["achieved_gflops"] == 5 and mem["pct_attainable"] == 10
    assert (mem["compute_floor_s"], mem["memory_floor_s"], mem["dispatch_floor_s"]) == (0.1, 0.2, 0.01)
    comp = rl.roofline_row(tot, seconds=0.5, peak_gflops=40.0, bandwidth_gbs=5.0)
    assert comp["bound"] == "compute" and comp["attainable_gflops"] == 40 and comp["pct_attainable"] == 50


def test_machine_measurements_run():
    """Smoke only: the measurements return positive finite rates (their values are the machine's)."""
    assert math.isfinite(rl.matmul_gflops((2, 8, 8, 8))) and rl.matmul_gflops((1, 8, 8, 8)) > 0
    bw = rl.stream_gbs(1 << 16)
    assert set(bw) == {"copy", "triad"} and all(v > 0 for v in bw.values())
    assert rl.op_seconds((2, 2)) > 0


def test_an_embedding_lookup_reads_only_its_rows():
    table, ids = torch.rand(1000, 8), torch.tensor([[3, 5, 3]])
    c = _counted(lambda: table[ids], [table])
    assert c.weight_bytes == 3 * 8 * 4  # three rows, not the 1,000-row table
    assert c.bytes == 2 * 3 * 8 * 4 + ids.numel() * 8  # rows read, rows written, the ids



def test_the_stages_include_stage_2_fitted_jointly(monkeypatch):
    """The joint stage-2 row fits the cell's task with the others, each with its own embedding
    (the cell's from stage 1); without others there is no such row. Small fits on the tiny model."""
    import sitelens.site as site
    from sitelens import FitConfig, load_task
    from sitelens.models import load_model
    from sitelens.site.embedding import task_embedding
    from sitelens.site.joint import fit_alpha_tasks

    model = load_model("tiny-random")
    task, other = load_task("antonym"), load_task("country_capital")
    small = FitConfig(n_examples=16, n_valid=8)
    emb_other = task_embedding(model, other, n_prompts=4, n_shots=2)
    seen = []
    real_fit = site.fit_site
    monkeypatch.setattr(site, "task_embedding", lambda m, t: task_embedding(m, t, n_prompts=4, n_shots=2))
    monkeypatch.setattr(site, "fit_site", lambda m, t, **k: real_fit(m, t, config=small, **k))
    monkeypatch.setattr(site, "fit_alpha_tasks", lambda m, ts, es: seen.append(
        ([t.name for t in ts], es)) or fit_alpha_tasks(m, ts, es, small))
    stages = rl.Roofline().stages(model, task, [(other, emb_other)])
    assert [n for n, _ in stages][:3] == ["stage 1", "stage 2", "stage 2, 2 tasks jointly"]
    for _, thunk in stages[:3]:
        thunk()
    ((names, embs),) = seen
    assert names == ["antonym", "country_capital"] and embs[1] is emb_other
    assert embs[0].shape == (model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_head)
    assert not any("jointly" in n for n, _ in rl.Roofline().stages(model, task, []))
