"""SITE — soft head selection for injecting ICL-derived task embeddings — in one file.

1. :func:`task_embedding`: t[l, h] = mean over few-shot prompts of ``blocks.{l}.attn.hook_z`` at the
   last prompt token.                                              -> [n_layers, n_heads, d_head]
2. :func:`fit_alpha`: α = sigmoid(a), the model frozen; at the last token of zero-shot prompts
   z ← (1 − α)·z + α·t; Adam on the cross-entropy of the first answer token; the α with the best
   validation loss is kept (:meth:`FitConfig.official`: the final α, as the paper's code does).
                                                                   -> [n_layers, n_heads]
3. :func:`site_mix` / :class:`SiteAdapter`: inject once at the last prompt token during prefill
   (generation lives in :mod:`sitelens.eval.evaluate`).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import ClassVar

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor

from sitelens.errors import AdapterError, FitError
from sitelens.io import atomic_write, ensure_dir
from sitelens.models import (
    check_z_shape,
    encode,
    fingerprint,
    forward_until,
    last_token_forward,
    layer_devices,
    length_batches,
    model_name,
    place_layer_rows,
    z_hook_name,
)
from sitelens.site.injection import HeadMix, apply_hooks
from sitelens.site.training import (
    BatchRows,
    LastTokenSet,
    RunConfig,
    iid_batches,
    run_training,
    training_batches,
    valid_items,
)
from sitelens.tasks import DEFAULT_TEMPLATE, Task, Template, embedding_prompts

# ----------------------------------------------------------------------------------------------
# stage 1: task embedding


def capture_last(
    model, prompts: Sequence[str], hook_names: Sequence[str], *, batch_size: int = 8
) -> dict[str, Tensor]:
    """The value of each hook at the last prompt token: ``{name: [n_prompts, ...]}`` (float32,
    CPU, in the order of ``prompts``). Prompts of similar length share a batch; each pass ends as
    soon as every hook has fired (:func:`~sitelens.models.forward_until`), and only the last
    position of each hooked tensor is kept, converted to float32 where the hook fired (on its
    layer's device; a bfloat16 model's activations are never summed in bfloat16) and copied to
    the CPU once per hook, after the last batch."""
    prompts = list(prompts)
    batches = length_batches(model, prompts, batch_size)  # similar lengths, bounded memory
    order = [i for idx in batches for i in idx]
    parts: dict[str, list[Tensor]] = {n: [] for n in hook_names}
    for idx in batches:
        enc = encode(model, [prompts[i] for i in idx])
        buf: dict[str, Tensor] = {}

        def grabber(name: str, buf=buf) -> Callable:
            # keyed by the requested name: on a TransformerBridge ``hook.name`` is the canonical
            # name behind an alias such as ``blocks.{l}.hook_resid_post``
            def grab(x, hook=None):
                buf[name] = x[:, -1].detach().float()  # [batch, ...], on the hook's device

            return grab

        with torch.no_grad():
            forward_until(model, [(n, grabber(n)) for n in hook_names], enc.tokens,
                          attention_mask=enc.attention_mask)
        for n in hook_names:
            parts[n].append(buf[n])
    inverse = torch.empty(len(order), dtype=torch.long)
    inverse[torch.tensor(order)] = torch.arange(len(order))
    return {n: torch.cat(parts[n]).cpu()[inverse] for n in hook_names}


def last_token_z(
    model, prompts: list[str], *, batch_size: int = 8, reduce: str = "mean"
) -> Float[Tensor, "... n_layers n_heads d_head"]:
    """``hook_z`` of every layer at the last prompt token (:func:`capture_last`; each pass stops
    right after the last layer's ``hook_z``). ``reduce="mean"`` averages over prompts;
    ``"none"`` returns ``[n_prompts, n_layers, n_heads, d_head]``."""
    cfg = model.cfg
    names = [z_hook_name(model, layer) for layer in range(cfg.n_layers)]
    acts = capture_last(model, prompts, names, batch_size=batch_size)  # {name: [n, H, d_head]}
    for name in names:
        check_z_shape(acts[name][:, None], cfg.n_heads, cfg.d_head, name)
    z = torch.stack([acts[n] for n in names], dim=1)  # [n_prompts, n_layers, n_heads, d_head]
    return z.mean(0) if reduce == "mean" else z


def task_embedding(
    model,
    task: Task,
    *,
    n_prompts: int = 50,
    n_shots: int = 10,
    batch_size: int = 8,
    seed: int = 0,
    template: Template = DEFAULT_TEMPLATE,
) -> Float[Tensor, "n_layers n_heads d_head"]:
    """Stage 1: the mean last-token ``hook_z`` over ``n_prompts`` ``n_shots``-shot prompts built
    from the train split."""
    prompts = embedding_prompts(task, n_prompts, n_shots, seed=seed, template=template)
    return last_token_z(model, prompts, batch_size=batch_size)  # [n_layers, n_heads, d_head]


# ----------------------------------------------------------------------------------------------
# stage 2: soft head selection


def site_mix(alpha, embedding, seq_len: int | None = None) -> HeadMix:
    """The SITE intervention: α-weighted mix toward the task embedding at the last prompt token."""
    return HeadMix(weights=alpha, targets=embedding, positions=(-1,), seq_len=seq_len)


def first_token_loss(
    model,
    cache,
    last_tokens: Int[Tensor, "batch 1"],
    answer_ids: Int[Tensor, " batch"],
    mix: HeadMix | None,
) -> Tensor:
    """Mean cross-entropy of the first answer token, running only the last prompt token on top of a
    frozen prefix KV cache (the mix acts at that token, so the prefix is unaffected). Computed in
    float32 (float64 for a float64 model) on the device the logits come out on."""
    hooks = mix.hooks(model) if mix is not None else []
    with apply_hooks(model, hooks):
        logits = last_token_forward(model, cache, last_tokens)  # [batch, 1, d_vocab]
    logits = logits[:, -1].to(torch.promote_types(logits.dtype, torch.float32))  # [batch, d_vocab]
    return F.cross_entropy(logits, answer_ids.to(logits.device))


@dataclass
class FitConfig:
    """Stage-2 hyperparameters. The reference: a = 0, lr 0.2, 400 steps of batch 1. The default
    here spends the same 400 training examples in batches (``n_examples / batch_size`` steps):
    shuffled passes over the train split, the α with the best validation loss kept.
    :meth:`official` is the reference's own protocol."""

    protocol: ClassVar[str] = "default"  # a class attribute: not in asdict() or settings hashes

    lr: float = 0.2
    init: float = 0.0
    n_examples: int = 400
    batch_size: int = 8
    sparsity: float = 0.0  # λ in loss + λ·mean(α); 0 = the paper's method
    eval_every: int = 10  # steps between validation-loss checks (and at the end)
    n_valid: int = 64  # validation items used for model selection
    seed: int = 0

    def __post_init__(self):
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise FitError(f"FitConfig.lr must be a positive finite number, got {self.lr!r}.")
        if not math.isfinite(self.init) or not math.isfinite(self.sparsity):
            raise FitError(
                f"FitConfig.init and .sparsity must be finite, got {self.init!r}, {self.sparsity!r}."
            )
        if self.n_examples < 1 or self.batch_size < 1 or self.eval_every < 1:
            raise FitError("FitConfig.n_examples, .batch_size and .eval_every must be at least 1.")

    @property
    def steps(self) -> int:
        return max(1, math.ceil(self.n_examples / self.batch_size))

    @classmethod
    def official(cls, **overrides) -> OfficialFitConfig:
        """The public SITE code's stage 2 (:class:`OfficialFitConfig`); ``overrides`` set fields."""
        return OfficialFitConfig(**overrides)


@dataclass
class OfficialFitConfig(FitConfig):
    """Stage 2 as the paper's public code runs it (github.com/SNU-DRL/Soft_Injection, commit
    01bd5d6: ``optimize_head_selection`` and ``validate_head_selection`` in ``utils.py``,
    ``format_icl`` in ``preprocess.py``, run by ``eval_scripts/eval_site.sh`` with ``--epoch 400
    --lr 0.2 --batch_size 1 --test_batch_size 1``):

    - 400 steps of batch 1; each step draws its item i.i.d. (with replacement) from the train
      split (there ``random.sample(range(n), 1)``, unseeded; here seeded with ``seed``);
    - after every 50th step the validation loss on the first 100 valid items is computed (the
      mean first-token cross-entropy, there one item at a time) and recorded;
    - the α of the last check is kept: there the check ``val_loss < best_val_loss`` never updates
      ``best_val_loss`` (it stays ``inf``), so every check saves the current α. With 400 steps and
      checks every 50 that is the final α; with no check at all, the final α too;
    - no space before an all-digit answer (:attr:`sitelens.tasks.Template.bare_digits`), set by
      :func:`fit_site`, which records ``meta["protocol"] = "official"``.
    """

    batch_size: int = 1
    eval_every: int = 50
    n_valid: int = 100

    protocol: ClassVar[str] = "official"


def alpha_logit_rows(model, init: float = 0.0) -> list[Tensor]:
    """SITE's trainable logits ``a`` (α = sigmoid(a)) as one float32 row ``[n_heads]`` per layer,
    each on that layer's device (:func:`sitelens.models.layer_devices`), filled with ``init``: the
    parameters of stage 2, whatever the model's dtype and however it is split over devices."""
    H = model.cfg.n_heads
    return [torch.full((H,), float(init), dtype=torch.float32, device=d, requires_grad=True)
            for d in layer_devices(model)]  # L × [n_heads]


def stack_rows(rows: Sequence[Tensor]) -> Float[Tensor, "n_layers n_heads"]:
    """Per-layer rows stacked on the first row's device (a detached copy)."""
    dev = rows[0].device
    return torch.stack([r.detach().to(dev) for r in rows])  # [n_layers, n_heads]


def mean_alpha(alpha: Sequence[Tensor], device) -> Tensor:
    """The mean of α over all heads (rows on any devices), on ``device``, differentiable."""
    return torch.cat([r.to(device) for r in alpha]).mean()  # []


@dataclass
class FitResult:
    alpha: Float[Tensor, "n_layers n_heads"]
    logits: Float[Tensor, "n_layers n_heads"]
    history: list[dict] = field(default_factory=list)
    best_step: int = 0
    seconds: float = 0.0


def fit_alpha(
    model,
    task: Task,
    embedding: Float[Tensor, "n_layers n_heads d_head"],
    config: FitConfig | None = None,
    *,
    template: Template = DEFAULT_TEMPLATE,
    progress: bool = False,
) -> FitResult:
    """Stage 2: learn α = sigmoid(a) with the model frozen (only ``a`` gets gradients).

    What is SITE's own is here: the parameters ``a``, the α-mix toward the embedding at the last
    token and the first-token loss (+ λ·mean(α)). The loop — Adam, batches, validation, which α
    is kept — is :func:`sitelens.site.training.run_training`. Default: shuffled passes, validation every
    ``eval_every`` steps and at the end, the best α kept. :class:`OfficialFitConfig`: i.i.d.
    draws, validation every ``eval_every`` steps only, the α of the last validation kept (the
    final α for 400 steps checked every 50), and no space before all-digit answers in the answer
    token."""
    cfg = config or FitConfig()
    official = cfg.protocol == "official"
    if official:
        template = replace(template, bare_digits=True)
    t0 = time.perf_counter()
    a = alpha_logit_rows(model, cfg.init)  # L × [n_heads], float32, each on its layer's device
    if not torch.isfinite(embedding).all():
        bad = int((~torch.isfinite(embedding)).sum())
        raise FitError(
            f"The task embedding of {task.name!r} has {bad} non-finite value(s) (inf/nan), so the "
            "loss would be non-finite. Recompute it in float32 (task_embedding) or refit."
        )
    target = place_layer_rows(embedding, model, dtype=torch.float32)  # L × [n_heads, d_head]
    valid = LastTokenSet.build(model, valid_items(task, cfg.n_valid), template)
    if official:
        batches = list(iid_batches(len(task.train), cfg))  # [steps][batch_size] indices
    else:
        batches = list(training_batches(list(range(len(task.train))), cfg))  # [steps][batch_size]
    rows = BatchRows(batches)  # each training item's prefix is encoded once
    train = LastTokenSet.build(model, [task.train[i] for i in rows.used], template)

    def objective(batch: list[int]) -> tuple[Tensor, Tensor]:
        alpha = [torch.sigmoid(r) for r in a]  # L × [n_heads], each on its layer's device
        b = train.select(rows(batch))
        loss = first_token_loss(model, b.cache, b.last, b.answers, site_mix(alpha, target))
        return loss + cfg.sparsity * mean_alpha(alpha, loss.device), loss.detach()

    def valid_loss() -> float:
        with torch.no_grad():
            mix = site_mix([torch.sigmoid(r.detach()) for r in a], target)
            return first_token_loss(model, valid.cache, valid.last, valid.answers, mix).item()

    run = run_training(
        a, batches, objective, valid_loss, snapshot=lambda: stack_rows(a),
        config=RunConfig(
            lr=cfg.lr, seed=cfg.seed, eval_every=cfg.eval_every,
            keep="last_check" if official else "best",  # official: the α of the last check
            what="α", task=task.name, progress=progress, check_params=True,
            hint="Lower the learning rate (lr), check the model dtype (float32 is safest), or "
                 "the embedding.",
        ),
    )
    kept = run.kept.cpu()  # [n_layers, n_heads], float32
    return FitResult(
        alpha=torch.sigmoid(kept),
        logits=kept,
        history=run.history,
        best_step=run.best_step,
        seconds=time.perf_counter() - t0,
    )


# ----------------------------------------------------------------------------------------------
# the adapter artifact


def _versions() -> dict:
    out = {}
    for pkg in ("sitelens", "transformer-lens", "torch", "transformers"):
        try:
            out[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            out[pkg] = None
    return out


@dataclass
class SiteAdapter:
    """A fitted SITE adapter: α [n_layers, n_heads], task embedding [n_layers, n_heads, d_head],
    and metadata (model name and weight fingerprint, task, template, hyperparameters, versions)."""

    alpha: Float[Tensor, "n_layers n_heads"]
    embedding: Float[Tensor, "n_layers n_heads d_head"]
    meta: dict = field(default_factory=dict)

    @property
    def template(self) -> Template:
        return Template(**self.meta.get("template", DEFAULT_TEMPLATE.to_dict()))

    def mix(self, seq_len: int | None = None) -> HeadMix:
        return site_mix(self.alpha, self.embedding, seq_len)

    def top_heads(self, k: int = 10) -> list[tuple[int, int, float]]:
        """The ``k`` heads with the largest α as ``(layer, head, alpha)``."""
        flat = self.alpha.flatten()
        idx = torch.argsort(flat, descending=True, stable=True)[:k]
        H = self.alpha.shape[1]
        return [(int(i) // H, int(i) % H, float(flat[i])) for i in idx]

    def check_model(self, model, template: Template | None = None) -> None:
        """Raise :class:`AdapterError` unless this adapter was fitted on ``model`` (and template)."""
        L, H, d = self.embedding.shape
        c = model.cfg
        if (L, H, d) != (c.n_layers, c.n_heads, c.d_head):
            raise AdapterError(
                f"Adapter shape [n_layers={L}, n_heads={H}, d_head={d}] does not match the model "
                f"{model_name(model)!r} [{c.n_layers}, {c.n_heads}, {c.d_head}]: the adapter was "
                f"fitted on {self.meta.get('model')!r}. Load that model or refit the adapter."
            )
        fp = self.meta.get("fingerprint")
        if fp and fp != fingerprint(model):
            raise AdapterError(
                f"Adapter was fitted on {self.meta.get('model')!r} (weights {fp}) but the model is "
                f"{model_name(model)!r} (weights {fingerprint(model)}). Load the matching model or "
                "refit the adapter."
            )
        if template is not None and template.to_dict() != self.meta.get("template"):
            raise AdapterError(
                f"Adapter was fitted with template {self.meta.get('template')!r} but "
                f"{template.to_dict()!r} was given. Use the adapter's template or refit."
            )

    # -- persistence ---------------------------------------------------------------------------

    def save(self, path: str | Path) -> Path:
        """Write ``adapter.safetensors`` + ``adapter.json`` (with a SHA-256 of the tensors),
        each atomically (:func:`sitelens.io.atomic_write`). An unwritable ``path`` raises
        :class:`OutputError`."""
        from safetensors.torch import save as st_save

        path = ensure_dir(path)
        blob = st_save({"alpha": self.alpha.contiguous().cpu(),
                        "embedding": self.embedding.contiguous().cpu()})
        meta = dict(self.meta, sha256=hashlib.sha256(blob).hexdigest())
        atomic_write(path / "adapter.safetensors", blob)
        atomic_write(path / "adapter.json", json.dumps(meta, indent=1).encode())
        return path

    @classmethod
    def load(cls, path: str | Path) -> SiteAdapter:
        """Read an adapter directory; a missing, truncated or corrupted file raises
        :class:`AdapterError` (the tensors are checked against the SHA-256 in adapter.json)."""
        from safetensors.torch import load as st_load

        path = Path(path)
        fj, fs = path / "adapter.json", path / "adapter.safetensors"
        if not fj.is_file() or not fs.is_file():
            raise AdapterError(
                f"{path} is not an adapter directory: it needs adapter.json and "
                "adapter.safetensors (written by `sitelens fit --out DIR` or SiteAdapter.save)."
            )
        try:
            meta = json.loads(fj.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            why = e.msg if isinstance(e, json.JSONDecodeError) else "not UTF-8 text"
            raise AdapterError(f"{fj} is corrupted ({why}); refit the adapter.") from e
        if not isinstance(meta, dict) or not isinstance(meta.get("sha256"), str):
            raise AdapterError(
                f"{fj} is corrupted (no adapter metadata with a sha256 checksum); refit the adapter."
            )
        blob = fs.read_bytes()
        if hashlib.sha256(blob).hexdigest() != meta["sha256"]:
            raise AdapterError(
                f"{fs} does not match the checksum in adapter.json (truncated or corrupted); "
                "refit the adapter."
            )
        try:
            tensors = st_load(blob)
            alpha, embedding = tensors["alpha"], tensors["embedding"]
        except Exception as e:  # safetensors raises its own error types
            raise AdapterError(f"{fs} cannot be read ({e}); refit the adapter.") from e
        if alpha.dim() != 2 or embedding.dim() != 3 or tuple(alpha.shape) != tuple(embedding.shape[:2]):
            raise AdapterError(
                f"{fs} holds alpha {list(alpha.shape)} and embedding {list(embedding.shape)}, not "
                "[n_layers, n_heads] and [n_layers, n_heads, d_head]; refit the adapter."
            )
        return cls(alpha=alpha, embedding=embedding, meta=meta)


ensure_writable_dir = ensure_dir  # the name ``sitelens fit`` imports: create ``--out`` or fail early


# ----------------------------------------------------------------------------------------------
# one call: both stages


def fit_site(
    model,
    task: Task,
    *,
    n_prompts: int = 50,
    n_shots: int = 10,
    config: FitConfig | None = None,
    template: Template = DEFAULT_TEMPLATE,
    batch_size: int = 8,
    progress: bool = False,
    embedding: Float[Tensor, "n_layers n_heads d_head"] | None = None,
    stage1_seconds: float | None = None,
) -> SiteAdapter:
    """Stage 1 + stage 2 → a :class:`SiteAdapter` (timings in ``meta``).

    ``embedding``: a task embedding already computed by :func:`task_embedding` (e.g. shared by
    fits that differ only in stage 2, such as a sweep over the sparsity λ); stage 1 is then
    skipped and ``stage1_seconds`` (its cost, if known) is recorded instead.

    ``config=FitConfig.official()``: the paper code's protocol (:class:`OfficialFitConfig`); the
    template then puts no space before all-digit answers, in stage 1's demonstrations and in the
    answer token, and ``meta`` records ``"protocol": "official"`` and the validation history."""
    cfg = config or FitConfig()
    if cfg.protocol == "official":
        template = replace(template, bare_digits=True)
    t0 = time.perf_counter()
    if embedding is None:
        emb = task_embedding(
            model, task, n_prompts=n_prompts, n_shots=n_shots, batch_size=batch_size,
            seed=cfg.seed, template=template,
        )  # [n_layers, n_heads, d_head]
    else:
        c = model.cfg
        if tuple(embedding.shape) != (c.n_layers, c.n_heads, c.d_head):
            raise FitError(
                f"The task embedding has shape {list(embedding.shape)}, but this model needs "
                f"[n_layers={c.n_layers}, n_heads={c.n_heads}, d_head={c.d_head}]; compute it "
                "with sitelens.task_embedding(model, task)."
            )
        emb = embedding
    t1 = time.perf_counter()
    if embedding is not None:
        t0 = t1 - (stage1_seconds or 0.0)
    res = fit_alpha(model, task, emb, cfg, template=template, progress=progress)
    meta = {
        "model": model_name(model),
        "fingerprint": fingerprint(model),
        "task": task.name,
        "template": template.to_dict(),
        "hyperparameters": dict(asdict(cfg), n_prompts=n_prompts, n_shots=n_shots),
        "versions": _versions(),
        "stage1_seconds": t1 - t0,
        "stage2_seconds": res.seconds,
        "best_step": res.best_step,
    }
    checks = [h for h in res.history if h["valid_loss"] == h["valid_loss"]]  # not NaN
    if cfg.protocol == "official":
        meta["protocol"] = "official"
        kept = [h["valid_loss"] for h in checks if h["step"] == res.best_step]
        meta["final_valid_loss"] = kept[0] if kept else float("nan")  # the kept α's
        meta["valid_history"] = [{"step": h["step"], "valid_loss": h["valid_loss"]} for h in checks]
    else:
        meta["final_valid_loss"] = min(h["valid_loss"] for h in checks)
    return SiteAdapter(alpha=res.alpha, embedding=emb, meta=meta)
