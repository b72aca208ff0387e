"""Published architecture shapes as data: one :class:`ModelShape` per model family member (its
Hugging Face name, whether its embeddings are tied, its family and the ``HookedTransformerConfig``
fields TransformerLens converts its config to), and :func:`random_model`, a randomly initialised
``HookedTransformer`` of a shape (nothing is downloaded). ``benchmarks/scaling.py`` times every
sitelens stage on these: random weights cost what trained ones do.

Sources: SmolLM2 (HuggingFaceTB/SmolLM2-* config.json, converted as TransformerLens 3.9's
``convert_hf_model_config`` does: ``d_head = hidden / heads``, ``n_key_value_heads`` None when equal
to ``n_heads``; 135M is the bundled model's shape); Qwen2.5-0.5B (config.json; TransformerLens always
has QKV biases); Llama 3.2 1B / 3.1 8B and Gemma 3 1B: TransformerLens 3.9
``loading_from_pretrained.py`` (llama3 rope factor 32 / 8; Gemma: QK norm, pre- and post-norms,
512-token window on 5 of every 6 layers, rope 1e6 global / 1e4 local).
"""

from __future__ import annotations

from dataclasses import dataclass

_ROPE = dict(normalization_type="RMS", positional_embedding_type="rotary", final_rms=True, gated_mlp=True)
# Llama 3.1 / 3.2 "llama3" rope scaling, as TransformerLens writes it
_LLAMA3 = dict(use_NTK_by_parts_rope=True, NTK_by_parts_low_freq_factor=1.0,
               NTK_by_parts_high_freq_factor=4.0, NTK_original_ctx_len=8192)


def _silu(d_model, d_head, n_heads, kv, d_mlp, n_layers, d_vocab, base, eps=1e-5, **kw) -> dict:
    return dict(_ROPE, act_fn="silu", rotary_adjacent_pairs=False, d_model=d_model, d_head=d_head,
                n_heads=n_heads, n_key_value_heads=kv, d_mlp=d_mlp, n_layers=n_layers, eps=eps,
                d_vocab=d_vocab, rotary_dim=d_head, rotary_base=base, **kw)


@dataclass(frozen=True)
class ModelShape:
    """One published architecture: ``fields`` are ``HookedTransformerConfig`` keyword arguments
    (``n_ctx``, dtype, device and seed excluded); ``family`` names what the parameter count must
    add (``qwen2``: QKV biases; ``gemma3``: post-norms and QK norms)."""

    name: str
    hf: str
    tied: bool
    family: str
    fields: dict

    def config(self, *, tiny: bool = False) -> dict:
        """A copy of :attr:`fields`, :func:`shrunk` when ``tiny``."""
        return shrunk(self.fields) if tiny else dict(self.fields)


SHAPES: dict[str, ModelShape] = {s.name: s for s in (
    ModelShape("smollm2-135m", "HuggingFaceTB/SmolLM2-135M", True, "llama",
               _silu(576, 64, 9, 3, 1536, 30, 49152, 100000)),
    ModelShape("smollm2-360m", "HuggingFaceTB/SmolLM2-360M", True, "llama",
               _silu(960, 64, 15, 5, 2560, 32, 49152, 100000)),
    ModelShape("smollm2-1.7b", "HuggingFaceTB/SmolLM2-1.7B", True, "llama",
               _silu(2048, 64, 32, None, 8192, 24, 49152, 130000)),
    ModelShape("qwen2.5-0.5b", "Qwen/Qwen2.5-0.5B", True, "qwen2", _silu(
        896, 64, 14, 2, 4864, 24, 151936, 1000000, eps=1e-6, use_attn_scale=True, initializer_range=0.02)),
    ModelShape("llama-3.2-1b", "meta-llama/Llama-3.2-1B", True, "llama", _silu(
        2048, 64, 32, 8, 8192, 16, 128256, 500000.0, NTK_by_parts_factor=32.0, **_LLAMA3)),
    ModelShape("llama-3.1-8b", "meta-llama/Llama-3.1-8B", False, "llama", _silu(
        4096, 128, 32, 8, 14336, 32, 128256, 500000.0, NTK_by_parts_factor=8.0, **_LLAMA3)),
    ModelShape("gemma-3-1b", "google/gemma-3-1b-pt", True, "gemma3", dict(
        _ROPE, d_model=1152, d_head=256, n_heads=4, n_key_value_heads=1, d_mlp=6912, n_layers=26, eps=1e-6,
        d_vocab=262144, act_fn="gelu_pytorch_tanh", initializer_range=0.02, rotary_base=1000000,
        rotary_base_local=10000, rotary_dim=256, use_attn_scale=True, use_normalization_before_and_after=True,
        use_qk_norm=True, window_size=512, use_local_attn=True,
        attn_types=(["local"] * 5 + ["global"]) * 4 + ["local"] * 2)),
)}


def hf_param_count(fields: dict, tied: bool, family: str) -> int:
    """Parameters as the Hugging Face checkpoint counts them (tied embeddings once, no zero
    biases): the size a model card quotes."""
    d, dh, H, L, V, m = (fields["d_model"], fields["d_head"], fields["n_heads"], fields["n_layers"],
                         fields["d_vocab"], fields["d_mlp"])
    kv = fields.get("n_key_value_heads") or H
    attn = 2 * d * H * dh + 2 * d * kv * dh
    if family == "qwen2":
        attn += H * dh + 2 * kv * dh  # q, k, v biases
    norms = 2 * d + (2 * d + 2 * dh if family == "gemma3" else 0)  # + post-norms, q/k norms
    return L * (attn + 3 * d * m + norms) + d + V * d * (1 if tied else 2)


def compute_params(fields: dict, family: str) -> int:
    """Parameters a token's forward pass multiplies through: every block plus the unembedding
    (the embedding is a gather)."""
    return hf_param_count(fields, True, family)


def shrunk(fields: dict) -> dict:
    """The shape's features at toy sizes: 2 layers, d_model / 16, d_head / 8, d_mlp / 16, a
    512-token vocabulary (local attention: a 16-token window on one of the two layers)."""
    f = fields
    c = dict(f, n_layers=2, d_model=max(32, f["d_model"] // 16), d_head=max(8, f["d_head"] // 8),
             d_mlp=max(32, f["d_mlp"] // 16), d_vocab=512)
    c["rotary_dim"] = c["d_head"]
    if "attn_types" in c:
        c.update(attn_types=["local", "global"], window_size=16)
    return c


def random_model(name: str, fields: dict, *, n_ctx: int, device: str = "cpu", dtype: str = "float32",
                 seed: int = 0):
    """``HookedTransformer(cfg)`` of ``fields`` with TransformerLens's random init and the byte
    tokenizer, readied for sitelens as :func:`sitelens.testing.tiny_model` is (frozen, fast
    layout and attention, self-checked); its parameters are created on ``device``."""
    import torch
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    from sitelens.models.attention import enable_fast_attention
    from sitelens.models.devices import resolve_dtype
    from sitelens.models.hooks import self_check
    from sitelens.models.prepare import fast_layout
    from sitelens.testing import tiny_tokenizer

    cfg = HookedTransformerConfig(
        **fields, n_ctx=n_ctx, seed=seed, init_weights=True, dtype=resolve_dtype(dtype), device=device,
        default_prepend_bos=True, tokenizer_prepends_bos=False, model_name=f"random-{name}",
    )
    with torch.device(device):  # parameters are created where they live (no CPU copy of an 8B)
        model = HookedTransformer(cfg, tokenizer=None)
    model.tokenizer = tiny_tokenizer()  # set_tokenizer would look the name up on a hub
    model.tokenizer.padding_side = "left"
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    fast_layout(model)
    enable_fast_attention(model)
    self_check(model)
    return model
