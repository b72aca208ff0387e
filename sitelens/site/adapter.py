"""The SITE adapter: α and the task embedding as one artifact, and :func:`fit_site`, both stages in
one call.

A :class:`SiteAdapter` holds α [n_layers, n_heads] (:mod:`sitelens.site.alpha`), the task
embedding t [n_layers, n_heads, d_head] (:mod:`sitelens.site.embedding`) and the metadata that
ties them to one model and template (name, weight fingerprint, backend, hyperparameters, versions).
The fingerprint is of the weights themselves (:func:`~sitelens.models.identity.weights_fingerprint`),
so an adapter fitted on one backend loads on the other for the same weights. Applied,
it is one :class:`~sitelens.site.injection.HeadMix` at the last prompt token during prefill,

    z[l, h, -1] ← (1 − α[l, h]) · z[l, h, -1] + α[l, h] · t[l, h]

(generation lives in :mod:`sitelens.eval.evaluation`). On disk it is ``adapter.safetensors`` (the
two tensors) beside ``adapter.json`` (the metadata and a SHA-256 of the tensors), each written
atomically; loading checks the checksum and the shapes, and :meth:`SiteAdapter.check_model`
refuses a model or template other than the one it was fitted on.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from jaxtyping import Float
from torch import Tensor

from sitelens.errors import AdapterError, FitError
from sitelens.heads import HeadSet, head_label
from sitelens.io import atomic_write, ensure_dir
from sitelens.models import backend_of, fingerprint, model_name, weights_fingerprint
from sitelens.models.identity import dtype_of
from sitelens.site.alpha import fit_alpha, site_mix
from sitelens.site.config import FitConfig
from sitelens.site.embedding import task_embedding
from sitelens.site.injection import HeadMix
from sitelens.site.saturation import AlphaSaturation, AlphaSaturationWarning, alpha_saturation
from sitelens.tasks import DEFAULT_TEMPLATE, Task, Template


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
    and metadata (model name and weight fingerprint, backend and dtype, task, template,
    hyperparameters, versions).

    ``meta["fingerprint"]`` is :func:`~sitelens.models.identity.weights_fingerprint` when
    ``meta["fingerprint_of"] == "weights"`` (every adapter fitted now): the same on both backends.
    An adapter without ``fingerprint_of`` holds the older :func:`~sitelens.models.fingerprint` of
    the backend it was fitted on, and loads on that backend only."""

    alpha: Float[Tensor, "n_layers n_heads"]
    embedding: Float[Tensor, "n_layers n_heads d_head"]
    meta: dict = field(default_factory=dict)

    @property
    def template(self) -> Template:
        return Template(**self.meta.get("template", DEFAULT_TEMPLATE.to_dict()))

    def __repr__(self) -> str:
        """One line: model, task, layers × heads, the top-3 heads by α (with how many heads sit
        above the saturation threshold when those three are a pick among near-ties) and the fit
        settings (never the tensors). A repr states, it never warns: printing an adapter in a
        notebook must not raise a warning meant for a ranking."""
        m, hp = self.meta, self.meta.get("hyperparameters") or {}
        L, H = self.alpha.shape
        top = " ".join(f"{head_label(layer * H + h, H)}={a:.2f}"
                       for layer, h, a in self.top_heads(3, warn=False))
        sat = self.saturation(3)
        if sat.saturated:
            top += f" (of {sat.n_saturated} heads at α > {sat.threshold:g})"
        keys = ("lr", "n_examples", "batch_size", "sparsity", "seed", "n_prompts", "n_shots")
        settings = " ".join(f"{k}={hp[k]}" for k in keys if k in hp)
        return (f"SiteAdapter(model={m.get('model')!r}, task={m.get('task')!r}, {L}×{H} heads, "
                f"top α {top}, protocol={m.get('protocol', 'default')}"
                + (f", {settings}" if settings else "") + ")")

    def mix(self, seq_len: int | None = None) -> HeadMix:
        return site_mix(self.alpha, self.embedding, seq_len)

    def saturation(self, k: int = 10) -> AlphaSaturation:
        """How many heads have α above 0.95, judged for a top-``k``
        (:func:`sitelens.site.saturation.alpha_saturation`)."""
        return alpha_saturation(self.alpha, k)

    def top_heads(self, k: int = 10, *, warn: bool = True) -> list[tuple[int, int, float]]:
        """The ``k`` heads with the largest α as ``(layer, head, alpha)``. When more than ``k``
        heads have α above 0.95 (:meth:`saturation`) these are a pick among near-ties, and an
        :class:`~sitelens.site.saturation.AlphaSaturationWarning` says so (``warn=False``: not)."""
        sat = self.saturation(k)
        if warn and sat.saturated:
            warnings.warn(sat.message(), AlphaSaturationWarning, stacklevel=2)
        return [(layer, h, float(self.alpha[layer, h])) for layer, h in HeadSet.top_k(self.alpha, k).pairs()]

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
        self._check_weights(model)
        if template is not None and template.to_dict() != self.meta.get("template"):
            raise AdapterError(
                f"Adapter was fitted with template {self.meta.get('template')!r} but "
                f"{template.to_dict()!r} was given. Use the adapter's template or refit."
            )

    def _check_weights(self, model) -> None:
        """Raise :class:`AdapterError` unless the adapter's weight fingerprint is ``model``'s,
        saying what differs: the dtype, or the weights themselves."""
        m = self.meta
        fp = m.get("fingerprint")
        if not fp:
            return
        if m.get("fingerprint_of") != "weights":  # an adapter of the backend-layout fingerprint
            if fp != fingerprint(model):
                raise AdapterError(
                    f"Adapter was fitted on {m.get('model')!r} (weights {fp}, a fingerprint of the "
                    f"backend it was fitted on, which adapters of this sitelens version no longer "
                    f"record) but the model is {model_name(model)!r} on the {backend_of(model)} "
                    "backend. Load it on the backend it was fitted on, or refit the adapter "
                    "(adapters fitted now load on either backend)."
                )
            return
        got = weights_fingerprint(model)
        if fp == got:
            return
        want_dtype, got_dtype = m.get("dtype"), dtype_of(model)
        if want_dtype is not None and want_dtype != got_dtype:
            what = f"the dtype differs: the adapter's model was {want_dtype}, this one is {got_dtype}"
        else:
            what = ("the weights themselves differ (the fingerprint hashes d_model, d_vocab and "
                    "every layer's attention output W_O; the backend does not enter it)")
        raise AdapterError(
            f"Adapter was fitted on {m.get('model')!r} (weights {fp}) but the model is "
            f"{model_name(model)!r} (weights {got}): {what}. Load the matching model or refit "
            "the adapter."
        )

    # -- persistence ---------------------------------------------------------------------------

    @classmethod
    def load_matching(cls, path: str | Path, model, on_error: Callable[[AdapterError], None] | None = None
                      ) -> SiteAdapter | None:
        """The adapter saved in ``path`` if there is one and it was fitted on ``model``
        (:meth:`check_model`), else ``None``: the cache check of every runner that refits what
        it cannot reuse. A corrupted or mismatched adapter is passed to ``on_error`` (to say why
        it is refitted) before ``None`` is returned."""
        if not (Path(path) / "adapter.json").exists():
            return None
        try:
            adapter = cls.load(path)
            adapter.check_model(model)
        except AdapterError as e:
            if on_error is not None:
                on_error(e)
            return None
        return adapter

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
    answer token, and ``meta`` records ``"protocol": "official"`` and the validation history.

    ``progress``: a bar for each stage, ``task embedding [task]`` and ``fit α [task]``
    (:func:`sitelens.format.progress_bar`: plain lines when stderr is not a terminal)."""
    cfg = config or FitConfig()
    if cfg.protocol == "official":
        template = replace(template, bare_digits=True)
    t0 = time.perf_counter()
    if embedding is None:
        emb = task_embedding(
            model, task, n_prompts=n_prompts, n_shots=n_shots, batch_size=batch_size,
            seed=cfg.seed, template=template, progress=progress,
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
    return adapter_of(model, task, emb, res, cfg, template=template, n_prompts=n_prompts,
                      n_shots=n_shots, stage1_seconds=t1 - t0)


def adapter_of(model, task: Task, embedding: Tensor, res, cfg: FitConfig, *, template: Template,
               n_prompts: int, n_shots: int, stage1_seconds: float) -> SiteAdapter:
    """The :class:`SiteAdapter` of a fitted task: its embedding, stage 2's :class:`FitResult`
    ``res`` under ``cfg`` and ``template`` (the fit's own), and ``meta`` (settings, versions,
    timings, the kept step and validation loss; ``"joint_tasks"`` when ``res`` came from a joint
    fit of several tasks, :func:`sitelens.site.joint.fit_site_tasks`)."""
    meta = {
        "model": model_name(model),
        "fingerprint": weights_fingerprint(model),
        "fingerprint_of": "weights",  # the same on both backends (weights_fingerprint)
        "backend": backend_of(model),
        "dtype": dtype_of(model),
        "task": task.name,
        "template": template.to_dict(),
        "hyperparameters": dict(cfg.settings(), n_prompts=n_prompts, n_shots=n_shots),
        "versions": _versions(),
        "stage1_seconds": stage1_seconds,
        "stage2_seconds": res.seconds,
        "best_step": res.best_step,
        "data": res.data,  # the split sizes and the items stage 2 used (absent in older adapters)
    }
    checks = [h for h in res.history if h["valid_loss"] == h["valid_loss"]]  # not NaN
    if cfg.protocol == "official":
        meta["protocol"] = "official"
        kept = [h["valid_loss"] for h in checks if h["step"] == res.best_step]
        meta["final_valid_loss"] = kept[0] if kept else float("nan")  # the kept α's
        meta["valid_history"] = [{"step": h["step"], "valid_loss": h["valid_loss"]} for h in checks]
    else:
        meta["final_valid_loss"] = min(h["valid_loss"] for h in checks)
    if res.joint_tasks > 1:
        meta["joint_tasks"] = res.joint_tasks
    return SiteAdapter(alpha=res.alpha, embedding=embedding, meta=meta)
