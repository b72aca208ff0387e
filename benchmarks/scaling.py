"""How the cost of every sitelens stage grows with model size and prompt length, measured on
randomly initialised models with the exact shapes of real families.

    python benchmarks/scaling.py --threads 1            # the committed CPU run (resumable)
    python benchmarks/scaling.py --tiny                 # shrunken shapes, about a minute: checks the script
    python benchmarks/scaling.py --dry-run              # list the cells a run would measure
    python benchmarks/scaling.py --report               # rewrite the md / png / html from the CSV
    bash benchmarks/gpu.sh                              # the CUDA run (bfloat16, longer prompts, 8B)

Each model is a ``HookedTransformer(cfg)`` built from the configuration in :data:`CONFIGS`
(written here from the published ``config.json`` values; nothing is downloaded), randomly
initialised with TransformerLens's own initialiser, and made ready for sitelens the way
:func:`sitelens.models.tiny.tiny_model` does it: the fast weight layout, the fused attention, eval
mode, no gradients, and :func:`sitelens.models.tiny.tiny_tokenizer` (one token per byte plus
``<bos>``/``<eos>``/``<pad>``), so a prompt of n characters is exactly n + 1 tokens. The model
keeps its real ``d_vocab``: the tokenizer only ever emits the first 259 ids, which changes nothing
in the cost (an embedding row is a gather; the unembedding still produces every logit).

**Why random weights cost the same as trained ones.** Every stage is dense matrix products,
fused attention and elementwise ops whose work and memory traffic are fixed by the shapes (batch,
positions, d_model, heads, d_mlp, d_vocab): there is no data-dependent sparsity, routing or early
exit in these paths (``forward_until`` stops at a hook chosen by name, not by value; length
batching reads token counts). Two things could still depend on values, and neither does here:
(1) generation length — a random model's EOS or newline timing depends on its weights, so the
generation stage forces a fixed number of new tokens (``min_new_tokens = max_new_tokens``, no
newline stop), checked by counting the model calls; (2) subnormal floats, which are slow on x86
CPUs — weights drawn N(0, initializer_range²) and RMS-normalised activations are nowhere near the
subnormal range.

Stages (each timed around the library's own function; per-unit costs are what the fits use):

- ``stage1``: :func:`sitelens.site.task_embedding` over few-shot prompts of ~L tokens; per prompt.
- ``stage2``: :func:`sitelens.site.fit_alpha` (batch 8, zero-shot prompts of ~L tokens); per step,
  read from the model-call timestamps of the step passes only (the prefix caches are excluded).
- ``generate``: :func:`sitelens.eval.evaluate.run_method` with the SITE injection (``site_mix``),
  zero-shot prompts of ~L tokens, exactly ``new_tokens`` new tokens; per item.
- ``patching``: :func:`sitelens.patching.effects.head_causal_effects` (exact, batched), corrupted few-shot
  prompts of ~L tokens; per head and prompt.
- ``atp``: :func:`sitelens.lenses.attribution_patching`; per head and prompt.
- ``alpha_grad``: :func:`sitelens.lenses.alpha_gradient` (zero-shot prompts of ~L tokens); per
  head and item.

Time: wall seconds and the process's CPU seconds (``time.process_time``). On the CPU the fits use
CPU seconds (the machine is shared, wall-clock is inflated by other jobs); on CUDA wall seconds
(after ``torch.cuda.synchronize``). Memory: on the CPU the peak resident set sampled during the
stage (``psutil``, every 20 ms) and the worker's ``getrusage`` max RSS; on CUDA
``torch.cuda.max_memory_allocated`` per stage. One worker process per (model, length) on the
CPU (``--group cell``), one per model on CUDA (``--group model``), so a model is built once.

Results: ``benchmarks/results/{tag}.csv`` (one row per cell, keyed on the configuration, length,
stage, stage sizes, device, dtype, threads and torch version; rerunning skips finished cells),
``{tag}.md`` (tables, log-log fits cost ∝ params^a · tokens^b per stage with R², the sweep
projection) and ``{tag}.png`` / ``{tag}.html``. A model that does not fit in the free memory is
recorded as ``skipped`` with the reason.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import math
import os
import platform
import random
import resource
import string
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
BENCH_VERSION = 1  # bump when what a cell measures changes

# ----------------------------------------------------------------------------------------------
# the model configurations (HookedTransformerConfig fields; nothing is downloaded)

_LLAMA3_ROPE = dict(  # Llama 3.1 / 3.2 "llama3" rope scaling, as TransformerLens writes it
    use_NTK_by_parts_rope=True, NTK_by_parts_low_freq_factor=1.0,
    NTK_by_parts_high_freq_factor=4.0, NTK_original_ctx_len=8192,
)
_GEMMA3_1B_TYPES = (["local"] * 5 + ["global"]) * 4 + ["local"] * 2  # 26 layers, 5 local : 1 global

CONFIGS: dict[str, dict] = {
    # SmolLM2 (LlamaForCausalLM): HuggingFaceTB/SmolLM2-{135M,360M,1.7B} config.json (hidden_size,
    # num_hidden_layers, num_attention_heads, num_key_value_heads, intermediate_size, rope_theta,
    # vocab_size 49152, tied embeddings), the same numbers as torchtune's
    # torchtune/models/smol/_model_builders.py (smollm2(30, 9, 3, 576, 1536), smollm2(32, 15, 5,
    # 960, 2560), smollm2(24, 32, 32, 2048, 8192, rope_base=130000)); converted as TransformerLens
    # 3.9's convert_hf_model_config does for LlamaForCausalLM (d_head = hidden / heads,
    # n_key_value_heads None when equal to n_heads). 135M is also the bundled model's shape.
    "smollm2-135m": dict(
        hf="HuggingFaceTB/SmolLM2-135M", tied=True, family="llama",
        cfg=dict(d_model=576, d_head=64, n_heads=9, n_key_value_heads=3, d_mlp=1536, n_layers=30,
                 eps=1e-5, d_vocab=49152, act_fn="silu", normalization_type="RMS",
                 positional_embedding_type="rotary", rotary_dim=64, rotary_base=100000,
                 rotary_adjacent_pairs=False, final_rms=True, gated_mlp=True),
    ),
    "smollm2-360m": dict(
        hf="HuggingFaceTB/SmolLM2-360M", tied=True, family="llama",
        cfg=dict(d_model=960, d_head=64, n_heads=15, n_key_value_heads=5, d_mlp=2560, n_layers=32,
                 eps=1e-5, d_vocab=49152, act_fn="silu", normalization_type="RMS",
                 positional_embedding_type="rotary", rotary_dim=64, rotary_base=100000,
                 rotary_adjacent_pairs=False, final_rms=True, gated_mlp=True),
    ),
    "smollm2-1.7b": dict(
        hf="HuggingFaceTB/SmolLM2-1.7B", tied=True, family="llama",
        cfg=dict(d_model=2048, d_head=64, n_heads=32, n_key_value_heads=None, d_mlp=8192,
                 n_layers=24, eps=1e-5, d_vocab=49152, act_fn="silu", normalization_type="RMS",
                 positional_embedding_type="rotary", rotary_dim=64, rotary_base=130000,
                 rotary_adjacent_pairs=False, final_rms=True, gated_mlp=True),
    ),
    # Qwen2.5-0.5B (Qwen2ForCausalLM): Qwen/Qwen2.5-0.5B config.json (hidden_size 896, 24 layers,
    # 14 heads, 2 KV heads, intermediate_size 4864, rms_norm_eps 1e-6, rope_theta 1e6,
    # vocab_size 151936, tied embeddings, QKV biases); converted as TransformerLens 3.9's
    # convert_hf_model_config does for Qwen2ForCausalLM (TransformerLens always has QKV biases).
    "qwen2.5-0.5b": dict(
        hf="Qwen/Qwen2.5-0.5B", tied=True, family="qwen2",
        cfg=dict(d_model=896, d_head=64, n_heads=14, n_key_value_heads=2, d_mlp=4864, n_layers=24,
                 eps=1e-6, d_vocab=151936, act_fn="silu", normalization_type="RMS",
                 positional_embedding_type="rotary", rotary_dim=64, rotary_base=1000000,
                 rotary_adjacent_pairs=False, use_attn_scale=True, initializer_range=0.02,
                 final_rms=True, gated_mlp=True),
    ),
    # Llama 3.2 1B and Llama 3.1 8B: TransformerLens 3.9 loading_from_pretrained.py, the
    # "Llama-3.2-1B" and "Llama-3.1-8B" branches of convert_hf_model_config (the meta-llama
    # config.json values: hidden 2048 / 4096, 16 / 32 layers, 32 heads, 8 KV heads, intermediate
    # 8192 / 14336, vocab 128256, rope_theta 500000 with llama3 scaling factor 32 / 8).
    "llama-3.2-1b": dict(
        hf="meta-llama/Llama-3.2-1B", tied=True, family="llama",
        cfg=dict(d_model=2048, d_head=64, n_heads=32, n_key_value_heads=8, d_mlp=8192, n_layers=16,
                 eps=1e-5, d_vocab=128256, act_fn="silu", normalization_type="RMS",
                 positional_embedding_type="rotary", rotary_dim=64, rotary_base=500000.0,
                 rotary_adjacent_pairs=False, final_rms=True, gated_mlp=True,
                 NTK_by_parts_factor=32.0, **_LLAMA3_ROPE),
    ),
    "llama-3.1-8b": dict(
        hf="meta-llama/Llama-3.1-8B", tied=False, family="llama",
        cfg=dict(d_model=4096, d_head=128, n_heads=32, n_key_value_heads=8, d_mlp=14336,
                 n_layers=32, eps=1e-5, d_vocab=128256, act_fn="silu", normalization_type="RMS",
                 positional_embedding_type="rotary", rotary_dim=128, rotary_base=500000.0,
                 rotary_adjacent_pairs=False, final_rms=True, gated_mlp=True,
                 NTK_by_parts_factor=8.0, **_LLAMA3_ROPE),
    ),
    # Gemma 3 1B: TransformerLens 3.9 loading_from_pretrained.py, the "google/gemma-3-1b" branch
    # (google/gemma-3-1b-pt config.json: hidden 1152, 26 layers, 4 heads of 256, 1 KV head,
    # intermediate 6912, vocab 262144, QK norm, pre- and post-norms, 512-token sliding window on
    # 5 of every 6 layers, rope 1e6 global / 1e4 local, gelu_pytorch_tanh, tied embeddings).
    "gemma-3-1b": dict(
        hf="google/gemma-3-1b-pt", tied=True, family="gemma3",
        cfg=dict(d_model=1152, d_head=256, n_heads=4, n_key_value_heads=1, d_mlp=6912, n_layers=26,
                 eps=1e-6, d_vocab=262144, act_fn="gelu_pytorch_tanh", initializer_range=0.02,
                 normalization_type="RMS", rotary_base=1000000, rotary_base_local=10000,
                 positional_embedding_type="rotary", rotary_dim=256, use_attn_scale=True,
                 gated_mlp=True, final_rms=True, use_normalization_before_and_after=True,
                 use_qk_norm=True, window_size=512, use_local_attn=True,
                 attn_types=_GEMMA3_1B_TYPES),
    ),
}
ORDER = ["smollm2-135m", "smollm2-360m", "qwen2.5-0.5b", "llama-3.2-1b", "gemma-3-1b",
         "smollm2-1.7b", "llama-3.1-8b"]
STAGES = ["stage1", "stage2", "generate", "patching", "atp", "alpha_grad"]
UNITS = {"stage1": "prompt", "stage2": "step", "generate": "item", "patching": "head-prompt",
         "atp": "head-prompt", "alpha_grad": "head-item"}
N_SHOTS = 4  # demonstrations per few-shot prompt (their count does not matter, their tokens do)

# Per-stage sizes: a few prompts / steps / items per cell (per-unit costs are what matter).
SIZES = {
    "cpu": dict(stage1_prompts=2, stage2_steps=3, stage2_batch=8, gen_items=2, new_tokens=8,
                patch_prompts=1, atp_prompts=1, alpha_items=1),
    "cuda": dict(stage1_prompts=8, stage2_steps=10, stage2_batch=8, gen_items=8, new_tokens=16,
                 patch_prompts=2, atp_prompts=8, alpha_items=8),
}


def hf_param_count(cfg: dict, tied: bool, family: str) -> int:
    """Parameters as the Hugging Face checkpoint counts them (tied embeddings once, no zero
    biases): the size a model card quotes."""
    d, dh, H, L, V, m = (cfg["d_model"], cfg["d_head"], cfg["n_heads"], cfg["n_layers"],
                         cfg["d_vocab"], cfg["d_mlp"])
    kv = cfg.get("n_key_value_heads") or H
    attn = 2 * d * H * dh + 2 * d * kv * dh
    if family == "qwen2":
        attn += H * dh + 2 * kv * dh  # q, k, v biases
    norms = 2 * d + (2 * d + 2 * dh if family == "gemma3" else 0)  # + post-norms, q/k norms
    per_layer = attn + 3 * d * m + norms
    return L * per_layer + d + V * d * (1 if tied else 2)


def compute_params(cfg: dict, family: str) -> int:
    """Parameters a token's forward pass multiplies through: every block plus the unembedding
    (the embedding is a gather, so it is left out). The fits use this as the model size."""
    return hf_param_count(cfg, True, family)  # blocks + final norm + one d_vocab × d_model matrix


def shrunk(cfg: dict) -> dict:
    """The configuration's features (GQA, QK norm, sliding window, llama3 rope) at toy sizes, for
    ``--tiny``: 2 layers, d_model / 16, d_head / 8, d_mlp / 16, a 512-token vocabulary."""
    c = dict(cfg)
    c["n_layers"] = 2
    c["d_model"] = max(32, cfg["d_model"] // 16)
    c["d_head"] = max(8, cfg["d_head"] // 8)
    c["rotary_dim"] = c["d_head"]
    c["d_mlp"] = max(32, cfg["d_mlp"] // 16)
    c["d_vocab"] = 512
    if "attn_types" in c:
        c["attn_types"] = ["local", "global"]
        c["window_size"] = 16
    return c


# ----------------------------------------------------------------------------------------------
# the worker: build one model, run stages, append one row per stage


def rss_bytes() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def build_model(name: str, cfg_fields: dict, *, n_ctx: int, device: str, dtype: str, seed: int = 0):
    """``HookedTransformer(cfg)`` with TransformerLens's random init, readied for sitelens as
    :func:`sitelens.models.tiny.tiny_model` does (fast layout, fused attention, eval, no grads,
    the byte tokenizer with left padding)."""
    import torch
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    from sitelens.models import fast_layout, resolve_dtype, self_check, tiny_tokenizer
    from sitelens.models.attention import enable_fast_attention

    torch_dtype = resolve_dtype(dtype)
    cfg = HookedTransformerConfig(
        **cfg_fields, n_ctx=n_ctx, seed=seed, init_weights=True, dtype=torch_dtype, device=device,
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


def _letters(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(max(1, n)))


def make_task(kind: str, length: int, *, n_train: int, n_valid: int = 2, seed: int = 0):
    """A task whose prompts have ~``length`` tokens with the byte tokenizer (BOS included):
    ``kind="few"``: ``N_SHOTS``-shot prompts (demonstration ``"Q: x\\nA: y\\n\\n"`` = k + 10
    characters with a 1-letter answer, query ``"Q: x\\nA:"`` = k + 6); ``"zero"``: the query
    alone. Inputs are random letters; answers distinct letters."""
    from sitelens.tasks import Example, Task

    if kind == "few":
        k = max(1, round((length - 1 - N_SHOTS * 10 - 6) / (N_SHOTS + 1)))
    else:
        k = max(1, length - 7)
    rng = random.Random(seed)
    n = n_train + 2 * n_valid
    items = [Example(_letters(rng, k), string.ascii_lowercase[i % 26]) for i in range(n)]
    return Task(f"synthetic-{kind}-{length}", items[:n_train], items[n_train:n_train + n_valid],
                items[n_train + n_valid:])


class ModelClock:
    """Timestamps (wall, CPU) of every call of ``model`` (a forward pre-hook)."""

    def __init__(self, model, sync):
        self.model, self.sync, self.marks = model, sync, []

    def _pre(self, module, args):
        self.sync()
        self.marks.append((time.perf_counter(), time.process_time()))

    def __enter__(self):
        self._h = self.model.register_forward_pre_hook(self._pre)
        return self

    def __exit__(self, *exc):
        self._h.remove()


def run_stage(model, stage: str, length: int, sizes: dict, sync) -> dict:
    """Run one stage; return its unit count, prompt tokens and details, and optionally an own
    timing (``wall``/``cpu``) that replaces the timing around the whole call."""
    import torch

    from sitelens.eval.evaluate import Protocol, run_method
    from sitelens.lenses import alpha_gradient, attribution_patching
    from sitelens.models import encode
    from sitelens.patching.effects import head_causal_effects
    from sitelens.site import FitConfig, fit_alpha, site_mix, task_embedding
    from sitelens.tasks import embedding_prompts, zero_shot_prompt

    cfg = model.cfg
    L, H, dh = cfg.n_layers, cfg.n_heads, cfg.d_head
    g = torch.Generator().manual_seed(0)
    emb = 0.1 * torch.randn(L, H, dh, generator=g)  # [n_layers, n_heads, d_head]; values do not matter
    few = make_task("few", length, n_train=max(N_SHOTS + 2, 12))
    zero = make_task("zero", length, n_train=1, n_valid=1)  # stage 2: a batch of 8 repeats one item

    def tokens(prompts) -> float:
        enc = encode(model, list(prompts))
        return float(enc.attention_mask.sum(1).float().mean())

    if stage == "stage1":
        n = sizes["stage1_prompts"]
        task_embedding(model, few, n_prompts=n, n_shots=N_SHOTS, batch_size=n)
        return dict(units=n, tokens=tokens(embedding_prompts(few, n, N_SHOTS)))
    if stage == "stage2":
        steps, bs = sizes["stage2_steps"], sizes["stage2_batch"]
        fc = FitConfig(n_examples=steps * bs, batch_size=bs, eval_every=steps + 1, n_valid=1)
        with ModelClock(model, sync) as clock:
            res = fit_alpha(model, zero, emb, fc)
        # calls: prefix caches, the check before training, `steps` step passes, the final check
        (w0, c0), (w1, c1) = clock.marks[-1 - steps], clock.marks[-1]
        return dict(units=steps, tokens=tokens([zero_shot_prompt(ex.input) for ex in zero.train]),
                    wall=w1 - w0, cpu=c1 - c0,
                    detail=dict(model_calls=len(clock.marks), batch_size=bs,
                                setup_wall=w0 - clock.marks[0][0], fit_seconds=res.seconds))
    if stage == "generate":
        n, new = sizes["gen_items"], sizes["new_tokens"]
        items = [make_task("zero", length, n_train=n, n_valid=0, seed=1).train[i] for i in range(n)]
        prompts = [zero_shot_prompt(ex.input) for ex in items]
        fixed = Protocol(name="fixed-length", max_new_tokens=new, min_new_tokens=new,
                         stop_at_newline=False)
        alpha = torch.full((L, H), 0.5)  # [n_layers, n_heads]
        with ModelClock(model, sync) as clock:
            run_method(model, zero, items, "site", prompts=prompts, intervention=site_mix(alpha, emb),
                       batch_size=n, protocol=fixed)
        if len(clock.marks) != new:  # one prefill + new - 1 decode steps, every one of them
            raise RuntimeError(f"generation made {len(clock.marks)} model calls, not {new}: the "
                               "length was not fixed")
        return dict(units=n, tokens=tokens(prompts), detail=dict(new_tokens=new, batch_size=n))
    if stage == "patching":
        n = sizes["patch_prompts"]
        _, st = head_causal_effects(model, few, embedding=emb, n_prompts=n, n_shots=N_SHOTS,
                                    return_stats=True)
        from sitelens.patching.effects import corrupted_prompts

        prompts, _ = corrupted_prompts(model, few, n_prompts=n, n_shots=N_SHOTS)
        return dict(units=st["n_heads_total"] * n, tokens=tokens(prompts),
                    detail=dict(forward_passes=st["forward_passes"], rows=st["rows"]))
    if stage == "atp":
        n = sizes["atp_prompts"]
        hs = attribution_patching(model, few, embedding=emb, n_prompts=n, n_shots=N_SHOTS, n_boot=0)
        from sitelens.patching.effects import corrupted_prompts

        prompts, _ = corrupted_prompts(model, few, n_prompts=n, n_shots=N_SHOTS)
        return dict(units=L * H * n, tokens=tokens(prompts),
                                detail=dict(forward_passes=int(hs.df["forward_passes"].iloc[0]),
                                backward_passes=int(hs.df["backward_passes"].iloc[0])))
    if stage == "alpha_grad":
        n = sizes["alpha_items"]
        task = make_task("zero", length, n_train=n, n_valid=1, seed=2)
        alpha_gradient(model, task, embedding=emb, n_alpha_items=n, n_boot=0)
        return dict(units=L * H * n, tokens=tokens([zero_shot_prompt(ex.input) for ex in task.train]))
    raise ValueError(f"unknown stage {stage!r}")


def worker(args) -> int:
    import torch

    from sitelens.pipelines.experiment import PeakRSS

    jobs = json.loads(args.jobs)  # [{"length", "stage", "key"}]
    torch.set_num_threads(args.threads)
    spec = CONFIGS[args.model]
    fields = shrunk(spec["cfg"]) if args.tiny else spec["cfg"]
    cuda = args.device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    t0, c0 = time.perf_counter(), time.process_time()
    model = build_model(args.model, fields, n_ctx=args.n_ctx, device=args.device, dtype=args.dtype)
    sync()
    build = dict(wall=time.perf_counter() - t0, cpu=time.process_time() - c0)
    n_params_tl = sum(p.numel() for p in model.parameters())
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    sizes = SIZES["cuda" if cuda else "cpu"]
    base = common_fields(args, fields, spec)
    for job in jobs:
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        rss0, load0 = rss_bytes(), os.getloadavg()[0]
        row = dict(base, key=job["key"], stage=job["stage"], unit=UNITS[job["stage"]],
                   length=job["length"], n_params_tl=n_params_tl, weights_gib=weights / 2**30,
                   build_wall_s=build["wall"], build_cpu_s=build["cpu"], load_avg_before=load0)
        try:
            with PeakRSS() as mem:
                sync()
                w0, c0 = time.perf_counter(), time.process_time()
                out = run_stage(model, job["stage"], job["length"], sizes, sync)
                sync()
                wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        except Exception as e:  # recorded, not done: a rerun tries again
            row.update(status="failed", reason=f"{type(e).__name__}: {e}"[:300])
            store(Path(args.csv)).append([row])
            print(f"  {args.model} L={job['length']} {job['stage']}: FAILED {e}", flush=True)
            continue
        wall, cpu = out.get("wall", wall), out.get("cpu", cpu)
        n = out["units"]
        row.update(
            status="ok", n_units=n, prompt_tokens=round(out["tokens"], 1),
            wall_s=round(wall, 4), cpu_s=round(cpu, 4),
            wall_s_per_unit=wall / n, cpu_s_per_unit=cpu / n,
            rss_before_gib=rss0 / 2**30, peak_rss_gib=mem.peak / 2**30,
            cell_maxrss_gib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
            cuda_peak_gib=(torch.cuda.max_memory_allocated() / 2**30) if cuda else "",
            load_avg_after=os.getloadavg()[0],
            detail=json.dumps(out.get("detail", {}), sort_keys=True),
        )
        store(Path(args.csv)).append([row])
        print(f"  {args.model} L={job['length']} {job['stage']}: {cpu / n:.4g} CPU s / "
              f"{wall / n:.4g} wall s per {UNITS[job['stage']]} (n={n})", flush=True)
    return 0


# ----------------------------------------------------------------------------------------------
# the runner: which cells are missing, one worker per group, memory checks, resumable CSV

FIELDS = [
    "key", "model", "hf", "stage", "unit", "length", "prompt_tokens", "n_units", "cpu_s", "wall_s",
    "cpu_s_per_unit", "wall_s_per_unit", "peak_rss_gib", "rss_before_gib", "cell_maxrss_gib",
    "cuda_peak_gib", "weights_gib", "n_params_tl", "params_hf", "params_compute", "n_layers",
    "n_heads", "n_kv_heads", "d_model", "d_head", "d_mlp", "d_vocab", "device", "dtype", "torch",
    "threads", "n_ctx", "sizes", "build_wall_s", "build_cpu_s", "load_avg_before", "load_avg_after",
    "status", "reason", "detail", "host", "date",
]


def common_fields(args, fields: dict, spec: dict) -> dict:
    import torch

    device_type = "cuda" if args.device.startswith("cuda") else "cpu"
    return dict(
        model=args.model, hf=spec["hf"], params_hf=hf_param_count(fields, spec["tied"], spec["family"]),
        params_compute=compute_params(fields, spec["family"]), n_layers=fields["n_layers"],
        n_heads=fields["n_heads"], n_kv_heads=fields.get("n_key_value_heads") or fields["n_heads"],
        d_model=fields["d_model"], d_head=fields["d_head"], d_mlp=fields["d_mlp"],
        d_vocab=fields["d_vocab"], device=device_type, dtype=args.dtype, torch=torch.__version__,
        threads=args.threads, n_ctx=args.n_ctx, sizes=json.dumps(SIZES[device_type], sort_keys=True),
        host=host_name(device_type), date=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M"),
    )


def host_name(device_type: str) -> str:
    if device_type == "cuda":
        import torch

        return torch.cuda.get_device_name(0)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cell_key(args, name: str, fields: dict, length: int, stage: str) -> str:
    import torch

    device_type = "cuda" if args.device.startswith("cuda") else "cpu"
    spec = dict(v=BENCH_VERSION, model=name, cfg=fields, length=length, stage=stage,
                device=device_type, dtype=args.dtype, torch=torch.__version__, threads=args.threads,
                n_ctx=args.n_ctx, sizes=SIZES[device_type], n_shots=N_SHOTS)
    # the committed rows' key rule: sha256 of this JSON (default separators), not settings_hash
    return hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:16]


def store(path: Path):
    """The results CSV: a key is done by its ``ok`` row (failed and skipped cells are retried)."""
    from sitelens.pipelines.store import ResultsStore

    return ResultsStore(path, FIELDS, done=lambda r: r["status"] == "ok")


def needed_bytes(fields: dict, dtype: str, length: int) -> int:
    """What a worker needs, roughly: the weights (TransformerLens keeps W_E and W_U untied), the
    imports (~0.6 GiB) and activations: a few [batch, length, d_mlp] tensors and 8 prompts' KV."""
    width = 2 if dtype in ("bfloat16", "float16") else 4
    n = hf_param_count(fields, False, "llama")
    kv = fields.get("n_key_value_heads") or fields["n_heads"]
    acts = 8 * length * (4 * fields["d_mlp"] + 2 * fields["n_layers"] * kv * fields["d_head"])
    return int(n * width + 0.6 * 2**30 + acts * width + fields["d_vocab"] * 64 * 4)


def free_bytes(device: str) -> int:
    if device.startswith("cuda"):
        import torch

        return torch.cuda.mem_get_info()[0]
    import psutil

    return psutil.virtual_memory().available


def run(args) -> int:
    models = ORDER if args.models == ["all"] else args.models
    unknown = [m for m in models if m not in CONFIGS]
    if unknown:
        print(f"unknown model(s) {unknown}; choose from {', '.join(ORDER)}", file=sys.stderr)
        return 2
    lengths = [int(x) for x in args.lengths.split(",")]
    stages = STAGES if args.stages == "all" else [s.strip() for s in args.stages.split(",")]
    csv_path = Path(args.csv)
    csv_path.parent.mkdir(parents=True, exist_ok=True)

    deadline = time.time() + args.budget_s if args.budget_s else None
    # The work, in order: by length first on the CPU (--group cell: every model at the shortest
    # length, then the next, so a partial run already spans the model sizes), by model on CUDA
    # (--group model: one worker per model runs all its lengths).
    plan = []  # (name, fields, spec, [jobs]) per worker
    done = store(csv_path).keys()
    for name in models:
        spec = CONFIGS[name]
        fields = shrunk(spec["cfg"]) if args.tiny else spec["cfg"]
        per_len = []
        for length in lengths:
            jobs = [dict(length=length, stage=s, key=cell_key(args, name, fields, length, s))
                    for s in stages]
            per_len.append([j for j in jobs if j["key"] not in done])
        if args.group == "model":
            plan.append((name, fields, spec, [j for jobs in per_len for j in jobs]))
        else:
            plan += [(name, fields, spec, jobs) for jobs in per_len]
    if args.dry_run:
        todo = [f"{name} L={j['length']} {j['stage']}" for name, _, _, jobs in plan for j in jobs]
        n = len(models) * len(lengths) * len(stages)
        print(f"{args.tag}: {n} cell(s), {n - len(todo)} done, {len(todo)} to run")
        for t in todo:
            print(f"  would run {t}")
        return 0
    if args.group == "cell":
        plan.sort(key=lambda w: lengths.index(w[3][0]["length"]) if w[3] else 0)  # stable: models in order
    for name, fields, spec, jobs in plan:
        if not jobs:
            continue
        need = needed_bytes(fields, args.dtype, max(j["length"] for j in jobs))
        free = free_bytes(args.device)
        if need + args.margin_gib * 2**30 > free:
            reason = (f"needs ~{need / 2**30:.1f} GiB ({args.dtype}) + {args.margin_gib:g} GiB margin, "
                      f"{free / 2**30:.1f} GiB free on {args.device}")
            print(f"{name}: skipped, {reason}", flush=True)
            skipped = {r["key"] for r in store(csv_path).rows() if r["status"] == "skipped"}
            base = common_fields(argparse.Namespace(**{**vars(args), "model": name}), fields, spec)
            new = [dict(base, key=j["key"], stage=j["stage"], unit=UNITS[j["stage"]],
                        length=j["length"], status="skipped", reason=reason)
                   for j in jobs if j["key"] not in skipped]
            if new:
                store(csv_path).append(new)
            continue
        timeout = args.cell_timeout
        if deadline is not None:
            timeout = min(timeout, deadline - time.time())
            if timeout < 20:
                print(f"{name}: out of budget, {len(jobs)} cell(s) not run", flush=True)
                continue
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--model", name,
               "--jobs", json.dumps(jobs), "--csv", str(csv_path), "--device", args.device,
               "--dtype", args.dtype, "--threads", str(args.threads), "--n-ctx", str(args.n_ctx)]
        if args.tiny:
            cmd.append("--tiny")
        env = dict(os.environ, OMP_NUM_THREADS=str(args.threads),
                   MKL_NUM_THREADS=str(args.threads), PYTHONWARNINGS="ignore")
        print(f"{name}: lengths {sorted({j['length'] for j in jobs})}, {len(jobs)} cell(s) "
              f"[{datetime.now().strftime('%H:%M:%S')}]", flush=True)
        try:
            proc = subprocess.run(cmd, env=env, timeout=timeout, cwd=str(HERE))
            if proc.returncode:
                print(f"{name}: worker exited with {proc.returncode} (-9: killed, e.g. for memory)",
                      flush=True)
        except subprocess.TimeoutExpired:
            print(f"{name}: worker timed out after {timeout:.0f} s", flush=True)
    summarize(csv_path, tag=csv_path.stem, png=not args.no_png)
    return 0


# ----------------------------------------------------------------------------------------------
# summary: tables, log-log fits, the sweep projection, the plot


def fit_power_law(df, ycol: str):
    """OLS of log y = c + a·log(params_compute) + b·log(prompt_tokens); returns (a, b, c, R², n).
    ``b`` is NaN (and left out) when every row has the same length."""
    import numpy as np

    d = df[(df[ycol] > 0)]
    if len(d) < 3:
        return None
    y = np.log(d[ycol].to_numpy(float))
    P = np.log(d["params_compute"].to_numpy(float))
    T = np.log(d["prompt_tokens"].to_numpy(float))
    use_t = np.ptp(T) > 0.1
    X = np.column_stack([np.ones_like(y), P] + ([T] if use_t else []))
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    resid = y - X @ coef
    ss = ((y - y.mean()) ** 2).sum()
    r2 = 1 - (resid ** 2).sum() / ss if ss > 0 else float("nan")
    return dict(a=coef[1], b=coef[2] if use_t else float("nan"), c=coef[0], r2=r2, n=len(d))


def predict(fit: dict, params: float, tokens: float) -> float:
    b = 0.0 if math.isnan(fit["b"]) else fit["b"]
    return math.exp(fit["c"] + fit["a"] * math.log(params) + b * math.log(tokens))


def load_frame(csv_path: Path):
    import pandas as pd

    df = pd.read_csv(csv_path)
    ok = df[df.status == "ok"].copy()
    for c in ("cpu_s_per_unit", "wall_s_per_unit", "params_compute", "prompt_tokens",
              "peak_rss_gib", "cuda_peak_gib", "length"):
        ok[c] = pd.to_numeric(ok[c], errors="coerce")
    # a cell rerun keeps its last ok row
    ok = ok.drop_duplicates("key", keep="last")
    return df, ok


def human(n: int) -> str:
    """134.5M, 1.71B, 38.2k."""
    for div, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= div * 0.9995:  # 999.9M is 1B, not "1e+03M"
            return f"{n / div:.3g}{suffix}"
    return str(n)


def fmt(x, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    return f"{x:.{digits}g}"


SWEEP_NOTE = (
    "Projection method: the measured 57-task × 10-method sweep on SmolLM2-135M "
    "(`benchmarks/results/baselines_smollm2-135m-instruct.csv`: Σ fit_seconds and Σ "
    "seconds_per_item × n, wall seconds on this 2-core machine under load) is scaled to the target "
    "model by (P_target / P_135M)^a, with a from the fit of the stage that dominates each part: "
    "fits (embeddings, prefix caches, causal-effect passes, training) by stage 1 (full forward "
    "passes) and, as the other end of the range, by stage 2 (last-token training steps); evaluation "
    "by generation. Assumptions: the same tasks, prompt lengths, settings, threads and machine as "
    "that sweep; the power law holds beyond the largest measured model; memory is not binding "
    "(an 8B model needs ~16 GiB in bfloat16, ~32 GiB in float32)."
)


def sweep_projection(fits: dict, target: str = "llama-3.1-8b", ref: str = "smollm2-135m") -> list[str]:
    import pandas as pd

    path = RESULTS / "baselines_smollm2-135m-instruct.csv"
    if not path.exists() or not all(s in fits for s in ("stage1", "stage2", "generate")):
        return []
    b = pd.read_csv(path)
    fit_s = float(b.fit_seconds.sum())
    eval_s = float((b.seconds_per_item * b.n).sum())
    tasks, methods = b.task.nunique(), b.method.nunique()
    p_t = compute_params(CONFIGS[target]["cfg"], CONFIGS[target]["family"])
    p_r = compute_params(CONFIGS[ref]["cfg"], CONFIGS[ref]["family"])
    r = {s: (p_t / p_r) ** fits[s]["a"] for s in ("stage1", "stage2", "generate")}
    lo = fit_s * min(r["stage1"], r["stage2"]) + eval_s * r["generate"]
    hi = fit_s * max(r["stage1"], r["stage2"]) + eval_s * r["generate"]
    return [
        f"**A {tasks}-task × {methods}-method sweep on {target}** (P = {p_t / 1e9:.2f}B compute "
        f"parameters, {p_t / p_r:.1f}× SmolLM2-135M's): measured on SmolLM2-135M "
        f"{(fit_s + eval_s) / 3600:.1f} h ({fit_s / 3600:.1f} h fitting, {eval_s / 3600:.1f} h "
        f"evaluating); scaled by the fitted exponents (stage 1 a = {fits['stage1']['a']:.2f}, "
        f"stage 2 a = {fits['stage2']['a']:.2f}, generation a = {fits['generate']['a']:.2f}): "
        f"**{lo / 3600:,.0f}–{hi / 3600:,.0f} h** on the same CPU setup "
        f"({lo / 86400:,.1f}–{hi / 86400:,.1f} days).",
        "",
        SWEEP_NOTE,
    ]


def summarize(csv_path: Path, *, tag: str, png: bool = True) -> str | None:
    import pandas as pd

    if not csv_path.exists():
        return None
    df, ok = load_frame(csv_path)
    if ok.empty:
        print(f"{csv_path}: no finished cells yet")
        return None
    device = ok.device.iloc[0]
    ycol = "cpu_s_per_unit" if device == "cpu" else "wall_s_per_unit"
    basis = "CPU seconds" if device == "cpu" else "wall seconds"
    mcol = "peak_rss_gib" if device == "cpu" else "cuda_peak_gib"
    models = [m for m in ORDER if m in set(ok.model)]
    shown = csv_path.relative_to(HERE.parent) if csv_path.is_relative_to(HERE.parent) else csv_path
    lines = [
        f"# Scaling: sitelens stages vs model size and prompt length ({device}, "
        f"{', '.join(sorted(set(ok.dtype)))})",
        "",
        f"Written by `python benchmarks/scaling.py --report --csv {shown}` "
        f"from `{csv_path.name}` ({len(ok)} finished cells). Randomly initialised "
        "`HookedTransformer`s with the exact shapes of the named models (configurations and sources "
        "in `benchmarks/scaling.py`); random weights cost what trained ones do (the module "
        "docstring says why; generation length is forced). "
        + (f"Costs are **{basis}** of the benchmark process with {int(ok.threads.iloc[0])} "
           "thread(s) (the machine was shared with other jobs, which inflates wall-clock far more "
           "than CPU time; both are in the CSV)." if device == "cpu" else
           f"Costs are **{basis}** after `torch.cuda.synchronize()` on {ok.host.iloc[0]}."),
        f"Host: {ok.host.iloc[0]}; torch {ok.torch.iloc[0]}; sizes per cell: `{ok.sizes.iloc[0]}`.",
        "",
        "## Models",
        "",
    ]
    mt = []
    for m in models:
        r = ok[ok.model == m].iloc[0]
        mt.append({"model": m, "config of": r.hf, "params (HF)": human(int(r.params_hf)),
                   "compute params P": human(int(r.params_compute)),
                   "layers × heads (KV)": f"{int(r.n_layers)} × {int(r.n_heads)} ({int(r.n_kv_heads)})",
                   "d_model / d_mlp / vocab": f"{int(r.d_model)} / {int(r.d_mlp)} / {int(r.d_vocab)}",
                   "weights GiB": fmt(float(r.weights_gib))})
    from sitelens.pipelines.experiment import md_table

    lines += [md_table(pd.DataFrame(mt)), "",
              "P = every block's parameters plus the unembedding (what a token's forward pass "
              "multiplies through; the embedding is a gather). TransformerLens keeps W_E and W_U "
              "untied, so the weights in memory exceed the HF count for tied models.", ""]
    skipped = df[(df.status == "skipped") & ~df.key.isin(ok.key)]
    if not skipped.empty:
        for m, g in skipped.groupby("model"):
            lines.append(f"- **{m} skipped**: {g.reason.iloc[0]}.")
        lines.append("")
    fits = {}
    lines += ["## Cost per unit", "",
              f"{basis} per unit; columns are the requested prompt lengths (the measured mean "
              "token count of each cell is `prompt_tokens` in the CSV).", ""]
    lengths = sorted(ok.length.dropna().astype(int).unique())
    for stage in STAGES:
        s = ok[ok.stage == stage]
        if s.empty:
            continue
        tab = []
        for m in models:
            row = {"model": m}
            for L in lengths:
                v = s[(s.model == m) & (s.length == L)][ycol]
                row[f"L={L}"] = fmt(float(v.iloc[0])) if len(v) else "—"
            tab.append(row)
        f = fit_power_law(s, ycol)
        if f:
            fits[stage] = f
        lines += [f"### {stage} (per {UNITS[stage]})", "", md_table(pd.DataFrame(tab)), ""]
    lines += ["## Peak memory (GiB)", "",
              ("Peak resident set sampled during each stage (weights + activations + the "
               "interpreter, ~0.6 GiB); the largest over the stages of a cell." if device == "cpu"
               else "`torch.cuda.max_memory_allocated` during each stage; the largest over the "
               "stages of a cell."), ""]
    tab = []
    for m in models:
        row = {"model": m}
        for L in lengths:
            v = ok[(ok.model == m) & (ok.length == L)][mcol]
            row[f"L={L}"] = fmt(float(v.max())) if len(v) and v.notna().any() else "—"
        tab.append(row)
    lines += [md_table(pd.DataFrame(tab)), ""]
    per_cell = ok.groupby(["model", "length"]).agg(
        params_compute=("params_compute", "first"), y=(mcol, "max")).reset_index()
    mem = fit_power_law(per_cell.assign(prompt_tokens=per_cell.length.astype(float)), "y")
    lines += ["## Log-log fits", "",
              f"OLS per stage of log({basis} per unit) = c + a·log P + b·log T over the finished "
              "cells (T = measured prompt tokens). Exponents are effective over the measured range: "
              "a cost that is a sum of terms (weights ∝ P, attention ∝ T², fixed per-call overhead) "
              "shows as a, b between their pure values.", ""]
    ft = [{"stage": s, "unit": UNITS[s], "a (params)": f"{f['a']:.2f}",
           "b (tokens)": "—" if math.isnan(f["b"]) else f"{f['b']:.2f}", "R²": f"{f['r2']:.3f}",
           "cells": f["n"]} for s, f in fits.items()]
    if mem:
        ft.append({"stage": "peak memory", "unit": "GiB per cell (T = requested length)",
                   "a (params)": f"{mem['a']:.2f}",
                   "b (tokens)": "—" if math.isnan(mem["b"]) else f"{mem['b']:.2f}",
                   "R²": f"{mem['r2']:.3f}", "cells": mem["n"]})
    if ft:
        lines += [md_table(pd.DataFrame(ft)), ""]
    target = "llama-3.1-8b"
    if fits:
        p8 = compute_params(CONFIGS[target]["cfg"], CONFIGS[target]["family"])
        pred = []
        for s, f in fits.items():
            row = {"stage": s, "unit": UNITS[s]}
            for T in (128, 1024):
                row[f"{target}, T={T}"] = fmt(predict(f, p8, T))
            pred.append(row)
        lines += [f"Predicted {basis} per unit for {target} (P = {p8 / 1e9:.2f}B) from the fits "
                  + ("(measured where the table above has it):" if target in models else
                     "(not measured here: extrapolated):"), "", md_table(pd.DataFrame(pred)), ""]
    if device == "cpu":
        proj = sweep_projection(fits)
        if proj:
            lines += ["## What a sweep costs", "", *proj, ""]
    lines += ["![scaling](" + f"{tag}.png)" if png else "", ""]
    text = "\n".join(lines)
    from sitelens.io import atomic_write_text

    atomic_write_text(csv_path.with_suffix(".md"), text)
    write_plot(ok, fits, ycol, mcol, basis, csv_path.with_suffix(""), png=png)
    print(f"wrote {csv_path.with_suffix('.md')}")
    return text


def write_plot(ok, fits: dict, ycol: str, mcol: str, basis: str, stem: Path, *, png: bool) -> None:
    import numpy as np
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from sitelens.viz.export import write_figure_html

    panels = [s for s in STAGES if s in set(ok.stage)] + ["memory"]
    cols = 4
    rows = -(-len(panels) // cols)
    titles = [f"{s} ({basis} / {UNITS[s]})" if s != "memory" else "peak memory (GiB)" for s in panels]
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=titles, horizontal_spacing=0.06,
                        vertical_spacing=0.14)
    lengths = sorted(ok.length.dropna().astype(int).unique())
    palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"]
    for i, panel in enumerate(panels):
        r, c = i // cols + 1, i % cols + 1
        for j, L in enumerate(lengths):
            if panel == "memory":
                d = ok[ok.length == L].groupby("model").agg(x=("params_compute", "first"),
                                                            y=(mcol, "max")).reset_index()
            else:
                d = ok[(ok.stage == panel) & (ok.length == L)].rename(
                    columns={"params_compute": "x", ycol: "y"})
            d = d.sort_values("x")
            if d.empty:
                continue
            color = palette[j % len(palette)]
            fig.add_trace(go.Scatter(x=d.x, y=d.y, mode="markers", name=f"L={L}",
                                     legendgroup=f"L={L}", showlegend=i == 0,
                                     marker=dict(color=color, size=7),
                                     text=d.model, hovertemplate="%{text}<br>P=%{x:.3s}<br>%{y:.3g}"),
                          row=r, col=c)
            if panel in fits:
                f = fits[panel]
                T = float(ok[(ok.stage == panel) & (ok.length == L)].prompt_tokens.mean())
                xs = np.geomspace(d.x.min(), max(d.x.max(), 1), 20)
                fig.add_trace(go.Scatter(x=xs, y=[predict(f, x, T) for x in xs], mode="lines",
                                         line=dict(color=color, dash="dot", width=1),
                                         legendgroup=f"L={L}", showlegend=False, hoverinfo="skip"),
                              row=r, col=c)
        fig.update_xaxes(type="log", title_text="compute params P" if r == rows else None, row=r, col=c)
        fig.update_yaxes(type="log", row=r, col=c)
    fig.update_layout(width=1400, height=380 * rows, template="plotly_white",
                      title="sitelens cost per stage vs model size (dotted: the log-log fit)",
                      legend=dict(title="prompt tokens"))
    write_figure_html(fig, f"{stem}.html")
    if png:
        try:
            fig.write_image(f"{stem}.png", width=1400, height=380 * rows)
        except Exception as e:  # kaleido / Chromium missing: the html is still written
            print(f"no png: {e}")


# ----------------------------------------------------------------------------------------------


def parse_args(argv=None):
    from sitelens.pipelines.experiment import parser

    p = parser(__doc__, models=["all"], threads=1)  # --models: a comma list or 'all'
    p.add_argument("--lengths", default="64,256,1024", help="prompt lengths in tokens")
    p.add_argument("--stages", default="all", help=f"comma list or 'all' ({', '.join(STAGES)})")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--n-ctx", type=int, default=None,
                   help="context of the built models (default 1088 on the CPU, 4160 on CUDA)")
    p.add_argument("--group", choices=["cell", "model"], default=None,
                   help="one worker per (model, length) [cpu default] or per model [cuda default]")
    p.add_argument("--cell-timeout", type=float, default=6 * 3600, help="seconds per worker")
    p.add_argument("--budget-s", type=float, default=None,
                   help="stop starting workers after this many seconds (gpu.sh)")
    p.add_argument("--margin-gib", type=float, default=2.0, help="free memory to leave unused")
    p.add_argument("--tag", default=None, help="results name (default scaling / scaling_gpu)")
    p.add_argument("--csv", default=None, help="results CSV (default benchmarks/results/{tag}.csv)")
    p.add_argument("--tiny", action="store_true",
                   help="the same configurations shrunk to toy sizes, lengths 64,128: checks the "
                        "script end to end (writes runs/scaling_dry/ unless --csv)")
    p.add_argument("--no-png", action="store_true")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--jobs", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    cuda = args.device.startswith("cuda")
    if args.tiny and args.lengths == "64,256,1024":
        args.lengths = "64,128"
    if args.n_ctx is None:  # fixed per device (it is part of every cell's key), raised if needed
        base = 192 if args.tiny else (4160 if cuda else 1088)
        args.n_ctx = max(base, max(int(x) for x in args.lengths.split(",")) + 64)
    if args.group is None:
        args.group = "model" if cuda else "cell"
    if args.tag is None:
        args.tag = ("scaling_gpu" if cuda else "scaling") + ("_dry" if args.tiny else "")
    if args.csv is None:
        out = HERE.parent / "runs" / "scaling_dry" if args.tiny else args.out  # runs/ is ignored
        args.csv = str(out / f"{args.tag}.csv")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    sys.path.insert(0, str(HERE))
    if args.worker:
        return worker(args)
    if args.report:
        return 0 if summarize(Path(args.csv), tag=Path(args.csv).stem, png=not args.no_png) else 1
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
