"""Tiny random-weight Hugging Face models of every family in sitelens.models.families, built from
each family's own transformers config class (no download), saved as a user's folder would be
(``save_pretrained`` of the model and of a tokenizer). The settings that make the family its own
(partial rotary, parallel residual, soft-caps, windows, QK norm, GQA/MQA, biases) are kept; windows
of 8 tokens and soft-caps at the tiny scale so that they act on short prompts."""

from __future__ import annotations

from pathlib import Path

import torch

WINDOW = 8


def _configs(vocab: int, bos: int, eos: int, pad: int) -> dict:
    import transformers as T

    ids = dict(vocab_size=vocab, bos_token_id=bos, eos_token_id=eos, pad_token_id=pad)
    rope = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                max_position_embeddings=128, tie_word_embeddings=False, **ids)
    return {
        "gpt2": lambda: T.GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=128, **ids),
        "gpt-neo": lambda: T.GPTNeoConfig(hidden_size=32, num_layers=2, num_heads=4,
                                          attention_types=[[["global", "local"], 1]],
                                          window_size=WINDOW, max_position_embeddings=128, **ids),
        "gpt-j": lambda: T.GPTJConfig(n_embd=64, n_layer=2, n_head=4, rotary_dim=4,
                                      n_positions=128, tie_word_embeddings=False, **ids),
        "pythia": lambda: T.GPTNeoXConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                          intermediate_size=256, rotary_pct=0.25,
                                          use_parallel_residual=True, max_position_embeddings=128,
                                          tie_word_embeddings=False, **ids),
        "opt": lambda: T.OPTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                   ffn_dim=64, word_embed_proj_dim=32, max_position_embeddings=128,
                                   **ids),
        "bloom": lambda: T.BloomConfig(hidden_size=32, n_layer=2, n_head=4, **ids),
        "llama": lambda: T.LlamaConfig(num_key_value_heads=2, **rope),
        "mistral": lambda: T.MistralConfig(num_key_value_heads=2, sliding_window=WINDOW, **rope),
        "qwen2": lambda: T.Qwen2Config(num_key_value_heads=2, **rope),
        "qwen3": lambda: T.Qwen3Config(num_key_value_heads=2, head_dim=16, **rope),
        "gemma": lambda: T.GemmaConfig(**{**rope, "hidden_size": 48}, head_dim=16,
                                       num_key_value_heads=4),
        "gemma2": lambda: T.Gemma2Config(**{**rope, "hidden_size": 48}, head_dim=16,
                                         num_key_value_heads=2, sliding_window=WINDOW,
                                         query_pre_attn_scalar=16, attn_logit_softcapping=2.0,
                                         final_logit_softcapping=3.0),
        "gemma3": lambda: T.Gemma3TextConfig(**{**rope, "hidden_size": 48}, head_dim=16,
                                             num_key_value_heads=1, sliding_window=WINDOW,
                                             query_pre_attn_scalar=16,
                                             layer_types=["sliding_attention", "full_attention"]),
        "phi": lambda: T.PhiConfig(**{**rope, "hidden_size": 64, "intermediate_size": 256},
                                   partial_rotary_factor=0.4),
        "phi3": lambda: T.Phi3Config(**rope, sliding_window=WINDOW),
        "olmo2": lambda: T.Olmo2Config(**rope),
        "falcon": lambda: T.FalconConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                         **ids),
        "starcoder2": lambda: T.Starcoder2Config(**rope, num_key_value_heads=2),
    }


def hf_family_model(family: str, seed: int = 0):
    """``(hf_model, tokenizer)``: a tiny random Hugging Face causal LM of ``family`` (eval mode,
    float32), weights at the tiny sitelens models' scale, biases and norm weights perturbed so that
    their paths carry numbers."""
    from transformers import AutoModelForCausalLM

    from sitelens.testing import tiny_tokenizer

    tok = tiny_tokenizer()
    cfg = _configs(len(tok), tok.bos_token_id, tok.eos_token_id, tok.pad_token_id)[family]()
    cfg._attn_implementation = "eager"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        hf = AutoModelForCausalLM.from_config(cfg).to(torch.float32).eval()
        d = cfg.hidden_size if hasattr(cfg, "hidden_size") else cfg.n_embd
        with torch.no_grad():
            for _, p in hf.named_parameters():
                if p.dim() >= 2:
                    p.normal_(0.0, 0.8 / d**0.5)
                else:
                    p.add_(0.1 * torch.randn_like(p))
    hf.config.architectures = [type(hf).__name__]
    return hf, tok


def save_family_dir(family: str, path: Path, seed: int = 0):
    """The tiny model of ``family`` saved to ``path`` as a user's folder (config.json,
    model.safetensors, tokenizer files); returns the Hugging Face model."""
    hf, tok = hf_family_model(family, seed)
    hf.save_pretrained(str(path))
    tok.save_pretrained(str(path))
    return hf
