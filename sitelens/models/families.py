"""Architecture families as data: one :class:`Family` record per family holds every fact sitelens
keeps about it, so a family is added here, in one place:

- what names it: its Hugging Face class (``architecture``, TransformerLens's
  ``original_architecture``) and the ``model_type`` of its ``config.json``
  (:mod:`sitelens.models.hf_arch` reads a local directory's family from them);
- how a local Hugging Face directory of it becomes a ``HookedTransformer``
  (``hooked_config``, used by :mod:`sitelens.models.hf_convert`), or why it cannot
  (``unsupported``);
- the real model its settings come from (``source``), the features it exercises (``features``,
  the columns of the support table in ``docs/models.md``), and the ``HookedTransformerConfig``
  fields and biases of a tiny random-weight model of it (``fields``, ``biases``), which
  :func:`sitelens.testing.family_model` builds. ``tests/test_families.py`` runs sitelens end to
  end on each; ``scripts/families_table.py`` writes the support table from its results.

Each tiny model keeps what makes the family its own (norm type, positional scheme, rotary fraction
and pairing, parallel attention + MLP, biases, GQA/MQA, a head width other than
``d_model / n_heads``, soft-capping, sliding windows, QK norm, post-norms), copied from what
TransformerLens 3.9's ``loading_from_pretrained.convert_hf_model_config`` writes for the named
model, and shrinks the rest: 2 layers, 4 query heads of width 8 or 16 (16 where a partial rotary
fraction must leave an even number of rotated dimensions), ``d_mlp`` 64 or ``4·d_model``, the byte
tokenizer's 259-token vocabulary, windows of 8 tokens (shorter than the test prompts, so they
bite), and soft-caps at the tiny models' score and logit scale (``_SCORE_CAP``, ``_LOGIT_CAP``).
TransformerLens initialises every bias to zero; the biases a family really has (``biases``) are
drawn at random (seeded) so their paths carry numbers.

Imports neither torch nor TransformerLens: the command line checks a directory's family before any
model code loads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from sitelens.errors import ModelError
from sitelens.models.compat import partial_rotary_factor, rope_scaling, rope_theta

# the tiny sizes every family starts from
_BASE = dict(n_layers=2, d_model=32, n_heads=4, d_head=8, d_mlp=64)
_ROPE = dict(normalization_type="RMS", positional_embedding_type="rotary", final_rms=True,
             gated_mlp=True, rotary_adjacent_pairs=False)
_ALL_BIASES = ("b_Q", "b_K", "b_V", "b_O", "b_in", "b_out")
_WINDOW = 8  # tokens; the real windows (256 to 4096) would never bite on a test prompt
# Gemma 2's soft-caps (scores 50, logits 30) at the tiny models' scale: their attention scores
# reach ~3 and their logits ~3.5, where a cap of 50 or 30 is the identity to 1e-4; these bite
_SCORE_CAP, _LOGIT_CAP = 2.0, 3.0

# ``Family.hooked_config`` for the families whose config TransformerLens 3.9 converts itself
# (``convert_hf_model_config`` on the local config.json, keyed by the architecture), and for Llama
# (:func:`sitelens.models.gguf.llama_config_from_hf`, which honours ``head_dim``, and
# ``convert_llama_weights``)
TRANSFORMER_LENS = "transformer_lens"
LLAMA = "llama"


# ----------------------------------------------------------------------------------------------
# HookedTransformerConfig fields from a Hugging Face config, for the families TransformerLens 3.9
# maps by official model name only (Gemma, Gemma 2, Gemma 3, OLMo 2) or reads a key transformers
# 5 no longer keeps (Phi): the keys of TransformerLens's own entries (e.g. ``google/gemma-2-2b``),
# valued from the model's config


def _check_plain_rope(c, arch: str, *kinds) -> None:
    """Refuse a rope scaling sitelens does not map (it would be silently dropped)."""
    params = rope_scaling(c)
    groups = [params[k] for k in kinds if isinstance(params.get(k), dict)] or [params]
    for p in groups:
        kind = (p.get("rope_type") or p.get("type") or "default") if isinstance(p, dict) else "default"
        if kind != "default":
            raise ModelError(f"{arch} with rope scaling {kind!r}: sitelens maps only unscaled "
                             "rotary for this family; use backend='bridge'.")


def _attn_types(c) -> list[str]:
    """``["local" | "global"]`` per layer from ``layer_types`` (HF's ``sliding_attention`` /
    ``full_attention``), else Gemma 2's default (even layers sliding)."""
    types = getattr(c, "layer_types", None)
    if types:
        return ["local" if t == "sliding_attention" else "global" for t in types]
    return ["local" if i % 2 == 0 else "global" for i in range(c.num_hidden_layers)]


def _gemma_base(c) -> dict:
    d_head = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return {
        "d_model": c.hidden_size, "d_head": d_head, "n_heads": c.num_attention_heads,
        "d_mlp": c.intermediate_size, "n_layers": c.num_hidden_layers,
        "n_ctx": c.max_position_embeddings, "eps": c.rms_norm_eps, "d_vocab": c.vocab_size,
        "act_fn": getattr(c, "hidden_activation", None) or c.hidden_act,
        "initializer_range": c.initializer_range, "normalization_type": "RMS",
        "positional_embedding_type": "rotary", "rotary_dim": d_head, "use_attn_scale": True,
        "n_key_value_heads": c.num_key_value_heads, "gated_mlp": True, "final_rms": True,
    }


def _gemma_local_global(c) -> dict:
    """Gemma 2 and 3: post-norms, ``query_pre_attn_scalar``, local/global layers."""
    out = _gemma_base(c)
    scalar = getattr(c, "query_pre_attn_scalar", None)
    out.update({
        "attn_scale": float(scalar) ** 0.5 if scalar else float(out["d_head"]) ** 0.5,
        "use_normalization_before_and_after": True, "use_local_attn": True,
        "window_size": c.sliding_window, "attn_types": _attn_types(c),
    })
    return out


def _gemma_config(c) -> dict:
    _check_plain_rope(c, "GemmaForCausalLM")
    return {**_gemma_base(c), "rotary_base": rope_theta(c)}


def _gemma2_config(c) -> dict:
    _check_plain_rope(c, "Gemma2ForCausalLM")
    return {**_gemma_local_global(c), "rotary_base": rope_theta(c),
            "attn_scores_soft_cap": float(c.attn_logit_softcapping or -1.0),
            "output_logits_soft_cap": float(c.final_logit_softcapping or -1.0)}


def _gemma3_config(c) -> dict:
    _check_plain_rope(c, "Gemma3ForCausalLM", "full_attention", "sliding_attention")
    return {**_gemma_local_global(c), "use_qk_norm": True,
            "rotary_base": rope_theta(c, "full_attention", 1e6),
            "rotary_base_local": rope_theta(c, "sliding_attention", 1e4)}


def _olmo2_config(c) -> dict:
    _check_plain_rope(c, "Olmo2ForCausalLM")
    d_head = c.hidden_size // c.num_attention_heads
    kv = c.num_key_value_heads
    return {
        "d_model": c.hidden_size, "d_head": d_head, "n_heads": c.num_attention_heads,
        "n_key_value_heads": kv if kv != c.num_attention_heads else None,
        "d_mlp": c.intermediate_size, "n_layers": c.num_hidden_layers,
        "n_ctx": c.max_position_embeddings, "eps": c.rms_norm_eps, "d_vocab": c.vocab_size,
        "act_fn": c.hidden_act, "initializer_range": c.initializer_range,
        "normalization_type": "RMS", "rotary_base": rope_theta(c), "rotary_dim": d_head,
        "attn_types": ["global"] * c.num_hidden_layers, "positional_embedding_type": "rotary",
        "gated_mlp": True,
    }


def _phi_config(c) -> dict:
    """TransformerLens's PhiForCausalLM entry, with ``partial_rotary_factor`` read where
    transformers 5 keeps it (:func:`~sitelens.models.compat.partial_rotary_factor`)."""
    _check_plain_rope(c, "PhiForCausalLM")
    d_head = c.hidden_size // c.num_attention_heads
    return {
        "d_model": c.hidden_size, "d_head": d_head, "n_heads": c.num_attention_heads,
        "d_mlp": c.intermediate_size, "n_layers": c.num_hidden_layers,
        "n_ctx": c.max_position_embeddings, "eps": c.layer_norm_eps, "d_vocab": c.vocab_size,
        "act_fn": c.hidden_act, "initializer_range": c.initializer_range,
        "normalization_type": "LN", "positional_embedding_type": "rotary", "rotary_base": rope_theta(c),
        "use_attn_scale": True, "parallel_attn_mlp": True, "default_prepend_bos": False,
        "rotary_dim": round(float(partial_rotary_factor(c)) * d_head),
    }


# ----------------------------------------------------------------------------------------------
# the records


@dataclass(frozen=True)
class Family:
    """One architecture family, all of its facts (see the module docstring).

    ``hooked_config``: how a Hugging Face config of the family becomes ``HookedTransformerConfig``
    fields: :data:`TRANSFORMER_LENS` (TransformerLens's own conversion), :data:`LLAMA`, or a
    function of the config; None where TransformerLens 3.9 cannot build the family, and then
    ``unsupported`` says why (and ``fields`` is empty). ``fields``: the tiny model's
    ``HookedTransformerConfig`` keyword arguments (``d_vocab``, ``n_ctx``, ``seed``, ``dtype`` are
    added by :func:`sitelens.testing.family_model`); ``biases``: its bias parameters given random
    values."""

    name: str
    architecture: str  # the Hugging Face class; TransformerLens's ``original_architecture``
    source: str  # the real model whose settings ``fields`` copies
    model_types: tuple[str, ...] = ()  # config.json ``model_type`` values that name the family
    features: tuple[str, ...] = ()
    fields: dict = field(default_factory=dict)
    biases: tuple[str, ...] = ()
    hooked_config: str | Callable[..., dict] | None = TRANSFORMER_LENS
    unsupported: str | None = None

    @property
    def supported(self) -> bool:
        return self.unsupported is None

    def config(self) -> dict:
        """The tiny model's ``HookedTransformerConfig`` fields (a copy)."""
        return {**_BASE, **self.fields, "original_architecture": self.architecture}


def _fam(name, architecture, source, model_type, features, biases=(), *,
         hooked_config=TRANSFORMER_LENS, **fields) -> Family:
    return Family(name, architecture, source, (model_type,), tuple(features), fields, tuple(biases),
                  hooked_config)


FAMILIES: dict[str, Family] = {f.name: f for f in (
    _fam("gpt2", "GPT2LMHeadModel", "gpt2", "gpt2", ["LayerNorm", "learned positions", "biases"],
         _ALL_BIASES, normalization_type="LN", positional_embedding_type="standard",
         act_fn="gelu_new", d_mlp=128),
    _fam("gpt-neo", "GPTNeoForCausalLM", "EleutherAI/gpt-neo-125M", "gpt_neo",
         ["LayerNorm", "learned positions", "no attention scaling", "local/global layers"],
         ("b_O", "b_in", "b_out"), normalization_type="LN", positional_embedding_type="standard",
         act_fn="gelu_new", d_mlp=128, use_attn_scale=False, use_local_attn=True,
         attn_types=["global", "local"], window_size=_WINDOW),
    _fam("gpt-j", "GPTJForCausalLM", "EleutherAI/gpt-j-6B", "gptj",
         ["LayerNorm", "parallel attention + MLP", "partial rotary (1/4)", "adjacent-pair rotary"],
         ("b_in", "b_out"), normalization_type="LN", positional_embedding_type="rotary",
         act_fn="gelu_new", d_head=16, d_model=64, d_mlp=256, rotary_dim=4,
         rotary_adjacent_pairs=True, parallel_attn_mlp=True),
    _fam("pythia", "GPTNeoXForCausalLM", "EleutherAI/pythia-70m", "gpt_neox",
         ["LayerNorm", "parallel attention + MLP", "partial rotary (1/4)", "biases", "no BOS"],
         _ALL_BIASES, normalization_type="LN", positional_embedding_type="rotary", act_fn="gelu",
         d_head=16, d_model=64, d_mlp=256, rotary_dim=4, rotary_adjacent_pairs=False,
         parallel_attn_mlp=True, default_prepend_bos=False),
    _fam("opt", "OPTForCausalLM", "facebook/opt-125m", "opt",
         ["LayerNorm", "learned positions", "ReLU", "biases"], _ALL_BIASES,
         normalization_type="LN", positional_embedding_type="standard", act_fn="relu", d_mlp=128),
    _fam("bloom", "BloomForCausalLM", "bigscience/bloom-560m", "bloom",
         ["LayerNorm", "ALiBi", "embedding LayerNorm", "biases", "no BOS"], _ALL_BIASES,
         normalization_type="LN", positional_embedding_type="alibi", post_embedding_ln=True,
         act_fn="gelu_fast", d_mlp=128, default_prepend_bos=False),
    _fam("llama", "LlamaForCausalLM", "meta-llama/Llama-3.2-1B", "llama",
         ["RMSNorm", "rotary", "GQA", "llama3 rope scaling"], (), **_ROPE, act_fn="silu",
         n_key_value_heads=2, rotary_dim=8, rotary_base=500000.0, use_NTK_by_parts_rope=True,
         NTK_by_parts_low_freq_factor=1.0, NTK_by_parts_high_freq_factor=4.0,
         NTK_by_parts_factor=32.0, NTK_original_ctx_len=8192,
         hooked_config=LLAMA),
    _fam("mistral", "MistralForCausalLM", "mistralai/Mistral-7B-v0.1", "mistral",
         ["RMSNorm", "rotary", "GQA", "sliding window (every layer)"], (), **_ROPE, act_fn="silu",
         n_key_value_heads=2, rotary_dim=8, use_local_attn=True, attn_types=["local", "local"],
         window_size=_WINDOW),
    _fam("qwen2", "Qwen2ForCausalLM", "Qwen/Qwen2.5-0.5B", "qwen2",
         ["RMSNorm", "rotary", "GQA", "QKV bias", "no BOS"], ("b_Q", "b_K", "b_V"), **_ROPE,
         act_fn="silu", n_key_value_heads=2, rotary_dim=8, rotary_base=1000000,
         default_prepend_bos=False),
    _fam("qwen3", "Qwen3ForCausalLM", "Qwen/Qwen3-0.6B", "qwen3",
         ["RMSNorm", "rotary", "GQA", "per-head QK norm", "n_heads·d_head ≠ d_model", "no BOS"],
         (), **_ROPE, act_fn="silu", n_key_value_heads=2, d_head=16, rotary_dim=16,
         rotary_base=1000000, use_qk_norm=True, default_prepend_bos=False),
    _fam("gemma", "GemmaForCausalLM", "google/gemma-7b", "gemma",
         ["RMSNorm", "rotary", "GeGLU", "n_heads·d_head ≠ d_model"], (), **_ROPE, act_fn="gelu",
         d_model=48, d_head=16, rotary_dim=16,
         hooked_config=_gemma_config),
    _fam("gemma2", "Gemma2ForCausalLM", "google/gemma-2-2b", "gemma2",
         ["RMSNorm", "post-norms", "GQA", "attention soft-cap", "logit soft-cap",
          "local/global layers", "n_heads·d_head ≠ d_model"], (), **_ROPE,
         act_fn="gelu_pytorch_tanh", d_model=48, d_head=16, rotary_dim=16, n_key_value_heads=2,
         use_normalization_before_and_after=True, attn_scores_soft_cap=_SCORE_CAP,
         output_logits_soft_cap=_LOGIT_CAP, use_local_attn=True, attn_types=["local", "global"],
         window_size=_WINDOW,
         hooked_config=_gemma2_config),
    _fam("gemma3", "Gemma3ForCausalLM", "google/gemma-3-270m", "gemma3_text",
         ["RMSNorm", "post-norms", "MQA", "per-head QK norm", "local/global layers",
          "local rotary base", "n_heads·d_head ≠ d_model"], (), **_ROPE,
         act_fn="gelu_pytorch_tanh", d_model=48, d_head=16, rotary_dim=16, n_key_value_heads=1,
         rotary_base=1000000, rotary_base_local=10000, use_normalization_before_and_after=True,
         use_qk_norm=True, use_local_attn=True, attn_types=["local", "global"],
         window_size=_WINDOW,
         hooked_config=_gemma3_config),
    _fam("phi", "PhiForCausalLM", "microsoft/phi-2", "phi",
         ["LayerNorm", "parallel attention + MLP", "partial rotary (2/5)", "biases", "no BOS"],
         _ALL_BIASES, normalization_type="LN", positional_embedding_type="rotary",
         act_fn="gelu_new", d_head=16, d_model=64, d_mlp=256, rotary_dim=6,
         parallel_attn_mlp=True, default_prepend_bos=False,
         hooked_config=_phi_config),
    _fam("phi3", "Phi3ForCausalLM", "microsoft/Phi-3-mini-4k-instruct", "phi3",
         ["RMSNorm", "rotary", "sliding window (every layer)"], (), **{**_ROPE, "final_rms": False},
         act_fn="silu", rotary_dim=8, use_local_attn=True, attn_types=["local", "local"],
         window_size=_WINDOW),
    _fam("olmo2", "Olmo2ForCausalLM", "allenai/OLMo-2-0425-1B", "olmo2",
         ["RMSNorm after attention and MLP", "full-width QK norm", "rotary"], (),
         normalization_type="RMS", positional_embedding_type="rotary", gated_mlp=True,
         act_fn="silu", rotary_dim=8, rotary_base=500000.0, rotary_adjacent_pairs=False,
         hooked_config=_olmo2_config),
    Family("falcon", "FalconForCausalLM", "tiiuae/falcon-7b", ("falcon",), hooked_config=None,
           unsupported="TransformerLens 3.9 has no HookedTransformer conversion for "
                       "FalconForCausalLM (use the TransformerBridge)"),
    Family("starcoder2", "Starcoder2ForCausalLM", "bigcode/starcoder2-3b", ("starcoder2",),
           hooked_config=None,
           unsupported="TransformerLens 3.9 has no HookedTransformer conversion for "
                       "Starcoder2ForCausalLM (use the TransformerBridge)"),
)}

SUPPORTED_FAMILIES: tuple[str, ...] = tuple(n for n, f in FAMILIES.items() if f.supported)
BY_ARCHITECTURE: dict[str, Family] = {f.architecture: f for f in FAMILIES.values()}
# ``model_type`` -> the Hugging Face causal-LM class, for a config.json without ``architectures``
MODEL_TYPES: dict[str, str] = {t: f.architecture for f in FAMILIES.values() for t in f.model_types}


__all__ = ["BY_ARCHITECTURE", "FAMILIES", "LLAMA", "MODEL_TYPES", "SUPPORTED_FAMILIES",
           "TRANSFORMER_LENS", "Family"]
