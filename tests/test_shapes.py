"""benchmarks/lib/shapes.py: the shapes are the published models' (their parameter counts match the
model cards), a shrunk shape keeps its features, and a random model of one runs."""

import bench_util  # noqa: F401  (benchmarks/ on the path: its package lib)
import pytest
from lib.shapes import SHAPES, ModelShape, compute_params, hf_param_count, random_model, shrunk

from sitelens.models import has_hooked_transformer

# Parameter counts the model cards / Hugging Face checkpoints report (tied embeddings counted
# once): a shape with a wrong width, depth, head count, vocabulary or MLP size misses them.
PUBLISHED = {
    "smollm2-135m": 134_515_008,
    "smollm2-360m": 361_821_120,
    "smollm2-1.7b": 1_711_376_384,
    "qwen2.5-0.5b": 494_032_768,
    "llama-3.2-1b": 1_235_814_400,
    "gemma-3-1b": 999_885_952,
    "llama-3.1-8b": 8_030_261_248,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_shapes_have_the_published_parameter_counts(name):
    s = SHAPES[name]
    assert hf_param_count(s.fields, s.tied, s.family) == PUBLISHED[name]
    assert compute_params(s.fields, s.family) == hf_param_count(s.fields, True, s.family)


def test_every_shape_has_a_source_and_is_rotary():
    assert sorted(SHAPES) == sorted(PUBLISHED)
    for name, s in SHAPES.items():
        assert isinstance(s, ModelShape) and s.name == name and s.hf
        assert s.fields["positional_embedding_type"] == "rotary"


def test_config_is_a_copy_and_tiny_is_shrunk():
    s = SHAPES["gemma-3-1b"]
    c = s.config()
    c["n_layers"] = 1
    assert s.fields["n_layers"] == 26
    t = s.config(tiny=True)
    assert t == shrunk(s.fields)
    assert (t["n_layers"], t["d_vocab"], t["rotary_dim"]) == (2, 512, t["d_head"])
    assert t["attn_types"] == ["local", "global"] and t["use_qk_norm"]


@pytest.mark.skipif(not has_hooked_transformer(),
                    reason="HookedTransformer only: random_model builds a HookedTransformer shape")
def test_random_model_of_a_shrunk_shape_runs():
    import torch

    model = random_model("smollm2-135m", SHAPES["smollm2-135m"].config(tiny=True), n_ctx=64)
    assert model.cfg.n_layers == 2 and model.cfg.n_key_value_heads == 3
    assert not any(p.requires_grad for p in model.parameters())
    logits = model(torch.tensor([[1, 5, 7, 9]]))  # [batch, pos, d_vocab]
    assert logits.shape == (1, 4, 512) and torch.isfinite(logits).all()
