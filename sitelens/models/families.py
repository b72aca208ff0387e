"""Architecture families as data: one :class:`Family` per family TransformerLens 3.9 can build
(its Hugging Face architecture, the real model its settings come from, the features it exercises,
and the ``HookedTransformerConfig`` fields of a tiny random-weight model of it, which
:func:`sitelens.testing.family_model` builds). ``tests/test_families.py`` runs sitelens end to end
on each; ``scripts/families_table.py`` writes the support table of ``docs/models.md`` from its
results.

Each entry keeps what makes the family its own (norm type, positional scheme, rotary fraction and
pairing, parallel attention + MLP, biases, GQA/MQA, a head width other than ``d_model / n_heads``,
soft-capping, sliding windows, QK norm, post-norms), copied from what TransformerLens 3.9's
``loading_from_pretrained.convert_hf_model_config`` writes for the named model, and shrinks the
rest: 2 layers, 4 query heads of width 8 or 16 (16 where a partial rotary fraction must leave
an even number of rotated dimensions), ``d_mlp`` 64 or ``4·d_model``, the byte tokenizer's
259-token vocabulary, windows of 8 tokens (shorter than the test prompts, so they bite), and
soft-caps at the tiny models' score and logit scale (``_SCORE_CAP``, ``_LOGIT_CAP``).

TransformerLens initialises every bias to zero; the biases a family really has (``biases``) are
drawn at random (seeded) so their paths carry numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# the tiny sizes every family starts from
_BASE = dict(n_layers=2, d_model=32, n_heads=4, d_head=8, d_mlp=64)
_ROPE = dict(normalization_type="RMS", positional_embedding_type="rotary", final_rms=True,
             gated_mlp=True, rotary_adjacent_pairs=False)
_ALL_BIASES = ("b_Q", "b_K", "b_V", "b_O", "b_in", "b_out")
_WINDOW = 8  # tokens; the real windows (256 to 4096) would never bite on a test prompt
# Gemma 2's soft-caps (scores 50, logits 30) at the tiny models' scale: their attention scores
# reach ~3 and their logits ~3.5, where a cap of 50 or 30 is the identity to 1e-4; these bite
_SCORE_CAP, _LOGIT_CAP = 2.0, 3.0


@dataclass(frozen=True)
class Family:
    """One architecture family: ``fields`` are ``HookedTransformerConfig`` keyword arguments
    (``d_vocab``, ``n_ctx``, ``seed``, ``dtype`` are added by :func:`sitelens.testing.family_model`);
    ``unsupported`` is why TransformerLens 3.9 cannot build the family (then ``fields`` is
    empty)."""

    name: str
    architecture: str  # the Hugging Face class; TransformerLens's ``original_architecture``
    source: str  # the real model whose settings ``fields`` copies
    features: tuple[str, ...] = ()
    fields: dict = field(default_factory=dict)
    biases: tuple[str, ...] = ()  # bias parameters given random values
    unsupported: str | None = None

    @property
    def supported(self) -> bool:
        return self.unsupported is None

    def config(self) -> dict:
        """The tiny model's ``HookedTransformerConfig`` fields (a copy)."""
        return {**_BASE, **self.fields, "original_architecture": self.architecture}


def _fam(name, architecture, source, features, biases=(), **fields) -> Family:
    return Family(name, architecture, source, tuple(features), fields, tuple(biases))


FAMILIES: dict[str, Family] = {f.name: f for f in (
    _fam("gpt2", "GPT2LMHeadModel", "gpt2", ["LayerNorm", "learned positions", "biases"],
         _ALL_BIASES, normalization_type="LN", positional_embedding_type="standard",
         act_fn="gelu_new", d_mlp=128),
    _fam("gpt-neo", "GPTNeoForCausalLM", "EleutherAI/gpt-neo-125M",
         ["LayerNorm", "learned positions", "no attention scaling", "local/global layers"],
         ("b_O", "b_in", "b_out"), normalization_type="LN", positional_embedding_type="standard",
         act_fn="gelu_new", d_mlp=128, use_attn_scale=False, use_local_attn=True,
         attn_types=["global", "local"], window_size=_WINDOW),
    _fam("gpt-j", "GPTJForCausalLM", "EleutherAI/gpt-j-6B",
         ["LayerNorm", "parallel attention + MLP", "partial rotary (1/4)", "adjacent-pair rotary"],
         ("b_in", "b_out"), normalization_type="LN", positional_embedding_type="rotary",
         act_fn="gelu_new", d_head=16, d_model=64, d_mlp=256, rotary_dim=4,
         rotary_adjacent_pairs=True, parallel_attn_mlp=True),
    _fam("pythia", "GPTNeoXForCausalLM", "EleutherAI/pythia-70m",
         ["LayerNorm", "parallel attention + MLP", "partial rotary (1/4)", "biases", "no BOS"],
         _ALL_BIASES, normalization_type="LN", positional_embedding_type="rotary", act_fn="gelu",
         d_head=16, d_model=64, d_mlp=256, rotary_dim=4, rotary_adjacent_pairs=False,
         parallel_attn_mlp=True, default_prepend_bos=False),
    _fam("opt", "OPTForCausalLM", "facebook/opt-125m",
         ["LayerNorm", "learned positions", "ReLU", "biases"], _ALL_BIASES,
         normalization_type="LN", positional_embedding_type="standard", act_fn="relu", d_mlp=128),
    _fam("bloom", "BloomForCausalLM", "bigscience/bloom-560m",
         ["LayerNorm", "ALiBi", "embedding LayerNorm", "biases", "no BOS"], _ALL_BIASES,
         normalization_type="LN", positional_embedding_type="alibi", post_embedding_ln=True,
         act_fn="gelu_fast", d_mlp=128, default_prepend_bos=False),
    _fam("llama", "LlamaForCausalLM", "meta-llama/Llama-3.2-1B",
         ["RMSNorm", "rotary", "GQA", "llama3 rope scaling"], (), **_ROPE, act_fn="silu",
         n_key_value_heads=2, rotary_dim=8, rotary_base=500000.0, use_NTK_by_parts_rope=True,
         NTK_by_parts_low_freq_factor=1.0, NTK_by_parts_high_freq_factor=4.0,
         NTK_by_parts_factor=32.0, NTK_original_ctx_len=8192),
    _fam("mistral", "MistralForCausalLM", "mistralai/Mistral-7B-v0.1",
         ["RMSNorm", "rotary", "GQA", "sliding window (every layer)"], (), **_ROPE, act_fn="silu",
         n_key_value_heads=2, rotary_dim=8, use_local_attn=True, attn_types=["local", "local"],
         window_size=_WINDOW),
    _fam("qwen2", "Qwen2ForCausalLM", "Qwen/Qwen2.5-0.5B",
         ["RMSNorm", "rotary", "GQA", "QKV bias", "no BOS"], ("b_Q", "b_K", "b_V"), **_ROPE,
         act_fn="silu", n_key_value_heads=2, rotary_dim=8, rotary_base=1000000,
         default_prepend_bos=False),
    _fam("qwen3", "Qwen3ForCausalLM", "Qwen/Qwen3-0.6B",
         ["RMSNorm", "rotary", "GQA", "per-head QK norm", "n_heads·d_head ≠ d_model", "no BOS"],
         (), **_ROPE, act_fn="silu", n_key_value_heads=2, d_head=16, rotary_dim=16,
         rotary_base=1000000, use_qk_norm=True, default_prepend_bos=False),
    _fam("gemma", "GemmaForCausalLM", "google/gemma-7b",
         ["RMSNorm", "rotary", "GeGLU", "n_heads·d_head ≠ d_model"], (), **_ROPE, act_fn="gelu",
         d_model=48, d_head=16, rotary_dim=16),
    _fam("gemma2", "Gemma2ForCausalLM", "google/gemma-2-2b",
         ["RMSNorm", "post-norms", "GQA", "attention soft-cap", "logit soft-cap",
          "local/global layers", "n_heads·d_head ≠ d_model"], (), **_ROPE,
         act_fn="gelu_pytorch_tanh", d_model=48, d_head=16, rotary_dim=16, n_key_value_heads=2,
         use_normalization_before_and_after=True, attn_scores_soft_cap=_SCORE_CAP,
         output_logits_soft_cap=_LOGIT_CAP, use_local_attn=True, attn_types=["local", "global"],
         window_size=_WINDOW),
    _fam("gemma3", "Gemma3ForCausalLM", "google/gemma-3-270m",
         ["RMSNorm", "post-norms", "MQA", "per-head QK norm", "local/global layers",
          "local rotary base", "n_heads·d_head ≠ d_model"], (), **_ROPE,
         act_fn="gelu_pytorch_tanh", d_model=48, d_head=16, rotary_dim=16, n_key_value_heads=1,
         rotary_base=1000000, rotary_base_local=10000, use_normalization_before_and_after=True,
         use_qk_norm=True, use_local_attn=True, attn_types=["local", "global"],
         window_size=_WINDOW),
    _fam("phi", "PhiForCausalLM", "microsoft/phi-2",
         ["LayerNorm", "parallel attention + MLP", "partial rotary (2/5)", "biases", "no BOS"],
         _ALL_BIASES, normalization_type="LN", positional_embedding_type="rotary",
         act_fn="gelu_new", d_head=16, d_model=64, d_mlp=256, rotary_dim=6,
         parallel_attn_mlp=True, default_prepend_bos=False),
    _fam("phi3", "Phi3ForCausalLM", "microsoft/Phi-3-mini-4k-instruct",
         ["RMSNorm", "rotary", "sliding window (every layer)"], (), **{**_ROPE, "final_rms": False},
         act_fn="silu", rotary_dim=8, use_local_attn=True, attn_types=["local", "local"],
         window_size=_WINDOW),
    _fam("olmo2", "Olmo2ForCausalLM", "allenai/OLMo-2-0425-1B",
         ["RMSNorm after attention and MLP", "full-width QK norm", "rotary"], (),
         normalization_type="RMS", positional_embedding_type="rotary", gated_mlp=True,
         act_fn="silu", rotary_dim=8, rotary_base=500000.0, rotary_adjacent_pairs=False),
    Family("falcon", "FalconForCausalLM", "tiiuae/falcon-7b",
           unsupported="TransformerLens 3.9 has no HookedTransformer conversion for "
                       "FalconForCausalLM (use the TransformerBridge)"),
    Family("starcoder2", "Starcoder2ForCausalLM", "bigcode/starcoder2-3b",
           unsupported="TransformerLens 3.9 has no HookedTransformer conversion for "
                       "Starcoder2ForCausalLM (use the TransformerBridge)"),
)}

SUPPORTED_FAMILIES: tuple[str, ...] = tuple(n for n, f in FAMILIES.items() if f.supported)


__all__ = ["FAMILIES", "SUPPORTED_FAMILIES", "Family"]
