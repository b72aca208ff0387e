"""Reproduce ``figures/`` from real runs: one resumable pipeline (``sitelens figures``).

For each model, :func:`make_figures` (or :func:`run_model` + :func:`model_figures` +
:func:`summarize_model` on an already loaded model):

1. fits a SITE adapter per (task, sparsity λ) (stage-1 embeddings shared across λ);
2. runs intra-task patching (:func:`sitelens.patching.intra_task`) for every λ on ``intra_tasks``;
3. runs inter-task patching (:func:`sitelens.patching.inter_task`) and α-map similarity over
   ``tasks`` (with the adapters of ``main_sparsity``);
4. measures per-head causal effects (:func:`sitelens.effects.head_causal_effects`) on
   ``effect_tasks``;
5. writes each figure as PNG + HTML + the CSV behind it (:class:`sitelens.export.FigureWriter`),
   and a summary (JSON + CSV) of the measured high-α vs low-α gap, the within- vs between-family
   transfer gap and the α-similarity / transfer correlation (:func:`summarize_model`, from the
   statistics of :mod:`sitelens.analysis`).

Resumable: every finished cell (:mod:`sitelens.runs`) is kept under ``out_dir/.runs/{model}/`` —
fitted adapters (:meth:`SiteAdapter.save`), stage-1 embeddings, and each experiment's CSV
(written atomically) — with a short hash of the parameters that produced it in its name, and
reused on restart (a cell computed with other parameters is recomputed, never reused). Figures and
the summary are rebuilt from those cells on every run (seconds).

The sizes and seeds of a run are a :class:`FigureConfig`; :func:`make_figures` takes one, or its
fields as keyword arguments. The statistics (:func:`intra_mean`, :func:`intra_gaps`, …) and the
writer (:class:`FigureWriter`, :func:`notebook_renderer`) are re-exported here from
:mod:`sitelens.analysis` and :mod:`sitelens.export`.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from sitelens.analysis import (
    alpha_similarity,
    by_target_family,
    intra_gaps,
    intra_mean,
    target_centred,
)
from sitelens.effects import head_causal_effects
from sitelens.errors import AdapterError, OutputError
from sitelens.export import FigureWriter, notebook_renderer, png_export_error
from sitelens.io import atomic_write, atomic_write_csv, atomic_write_text
from sitelens.patching import inter_task, intra_task
from sitelens.provenance import NUMERICS_VERSION, task_hash
from sitelens.report import (
    gap_k,
    headline,
    intra_ks,
    lambda_tag,
    model_figures,
    summarize_model,
    summary_rows,
)
from sitelens.runs import CellStore, config_with_overrides, slug
from sitelens.site import FitConfig, SiteAdapter, fit_site, task_embedding
from sitelens.tasks import DEFAULT_TEMPLATE, Task, load_task

DEFAULT_MODELS = ("smollm2-135m-instruct", "gemma-3-270m")

# the inter-task set: three families plus dissimilar singletons
FIGURE_TASKS = (
    "english_french", "english_german", "english_spanish", "english_italian",
    "first_letter", "last_letter", "capitalize_first_letter", "lowercase_first_letter",
    "choose_first_of_3", "choose_middle_of_3", "choose_last_of_3",
    "antonym", "country_capital", "present_past",
)
# intra-task patching (with and without sparsity): 8 tasks spanning all families
INTRA_TASKS = (
    "antonym", "country_capital", "present_past", "english_french", "english_spanish",
    "first_letter", "capitalize_first_letter", "choose_first_of_3",
)
HEATMAP_TASK = "antonym"
EFFECT_TASKS = ("antonym", "english_french")
DEFAULT_SPARSITY = (0.0, 5.0)
_TUPLE_FIELDS = ("tasks", "intra_tasks", "effect_tasks", "sparsity", "gap_ks", "formats")


@dataclass
class FigureConfig:
    """Sizes and seeds of one figures run (see :func:`make_figures`, which also takes each field
    as a keyword argument). Sequences given as lists are stored as tuples."""

    tasks: tuple[str, ...] = FIGURE_TASKS
    intra_tasks: tuple[str, ...] | None = INTRA_TASKS  # None: the first 8 of tasks
    effect_tasks: tuple[str, ...] = EFFECT_TASKS
    heatmap_task: str = HEATMAP_TASK
    sparsity: tuple[float, ...] = DEFAULT_SPARSITY
    main_sparsity: float | None = None  # λ of the α maps, inter-task, effects; None: max(sparsity)
    limit: int | None = 40  # test items per task
    seed: int = 0
    n_examples: int = 200  # stage-2 training examples (FitConfig.n_examples)
    n_prompts: int = 20  # stage-1 few-shot prompts
    n_shots: int = 10
    lr: float = 0.2
    batch_size: int = 8
    effect_prompts: int = 8  # corrupted prompts for the causal effects
    n_random_seeds: int = 3
    n_boot: int = 1000
    inter_k: int = 10  # top-k heads of the inter-task "topk" mode (and the Jaccard similarity)
    gap_ks: tuple[str | int, ...] = (10, "5%")  # k at which the high- vs low-α gap is reported
    formats: tuple[str, ...] = ("png", "html")

    def __post_init__(self) -> None:
        for name in _TUPLE_FIELDS:
            value = getattr(self, name)
            if value is not None and not isinstance(value, tuple):
                setattr(self, name, tuple(value))

    def resolved(self) -> FigureConfig:
        """This config made consistent: duplicates dropped, ``intra_tasks`` / ``effect_tasks`` /
        ``heatmap_task`` restricted to ``tasks`` (with fallbacks), λ as floats, and
        ``main_sparsity`` set and included in ``sparsity``."""
        tasks = tuple(dict.fromkeys(self.tasks))
        intra = self.intra_tasks
        intra = tuple(t for t in intra if t in tasks) if intra is not None else tasks[:8]
        intra = intra or tasks[:8]
        effects = tuple(t for t in self.effect_tasks if t in tasks) or tasks[:1]
        heat = self.heatmap_task if self.heatmap_task in tasks else tasks[0]
        sparsity = tuple(float(s) for s in dict.fromkeys(self.sparsity))
        main = float(max(sparsity) if self.main_sparsity is None else self.main_sparsity)
        if main not in sparsity:
            sparsity = sparsity + (main,)
        return replace(self, tasks=tasks, intra_tasks=intra, effect_tasks=effects,
                       heatmap_task=heat, sparsity=sparsity, main_sparsity=main)


# ----------------------------------------------------------------------------------------------
# the cells of one model's run


@dataclass
class ModelRun:
    """What :func:`run_model` computed (or reused) for one model."""

    model: str
    n_layers: int
    n_heads: int
    config: FigureConfig
    adapters: dict[float, dict[str, SiteAdapter]] = field(default_factory=dict)  # λ -> task -> ad
    intra: pd.DataFrame | None = None  # intra_task rows of every task and λ, column "sparsity"
    inter: pd.DataFrame | None = None  # inter_task rows (main λ)
    similarity: dict[str, pd.DataFrame] = field(default_factory=dict)
    effects: dict[str, pd.DataFrame] = field(default_factory=dict)  # task -> layer, head, effect
    effect_stats: dict[str, dict] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def n_total(self) -> int:
        return self.n_layers * self.n_heads


def _fit_params(cfg: FigureConfig, sparsity: float) -> dict:
    """The settings of one (task, λ) fit, part of the key of every cell built on it."""
    return {"n_examples": cfg.n_examples, "n_prompts": cfg.n_prompts, "n_shots": cfg.n_shots,
            "lr": cfg.lr, "batch_size": cfg.batch_size, "seed": cfg.seed, "sparsity": sparsity}


def _embedding(model, task: Task, cfg: FigureConfig, cells: CellStore) -> torch.Tensor:
    """The stage-1 embedding cell of ``task`` (shared across λ): loaded, or computed and saved."""
    from safetensors.torch import load_file, save

    params = {"task": task.name, "task_hash": task_hash(task), "n_prompts": cfg.n_prompts,
              "n_shots": cfg.n_shots, "seed": cfg.seed}
    path = cells.path(f"embeddings/{slug(task.name)}", params, ".safetensors")
    if path.exists():
        try:
            return load_file(path)["embedding"]
        except Exception:  # a truncated file from an interrupted run: recompute
            cells.log(f"  {path.name} is unreadable; recomputing")
    t0 = time.perf_counter()
    emb = task_embedding(model, task, n_prompts=cfg.n_prompts, n_shots=cfg.n_shots, seed=cfg.seed)
    atomic_write(path, save({"embedding": emb.contiguous().cpu()}))
    cells.record(f"embedding/{task.name}", time.perf_counter() - t0)
    return emb  # [n_layers, n_heads, d_head]


def fit_cell(model, task: Task, sparsity: float, cfg: FigureConfig, cells: CellStore,
             *, progress: bool = False) -> SiteAdapter:
    """The SITE adapter cell of (task, λ = ``sparsity``): loaded from ``adapters/`` if a valid one
    was saved with the same parameters, else fitted (stage 1 shared across λ) and saved."""
    params = dict(_fit_params(cfg, sparsity), task_hash=task_hash(task))
    path = cells.path(f"adapters/{slug(task.name)}_{lambda_tag(sparsity)}", params)
    if (path / "adapter.json").exists():
        try:
            ad = SiteAdapter.load(path)
            ad.check_model(model)
            return ad
        except AdapterError as e:
            cells.log(f"  {path.name}: {e} — refitting")
    t0 = time.perf_counter()
    emb = _embedding(model, task, cfg, cells)  # [n_layers, n_heads, d_head]
    t1 = time.perf_counter()
    fc = FitConfig(lr=cfg.lr, n_examples=cfg.n_examples, batch_size=cfg.batch_size,
                   sparsity=sparsity, seed=cfg.seed)
    ad = fit_site(model, task, n_prompts=cfg.n_prompts, n_shots=cfg.n_shots, config=fc,
                  progress=progress, embedding=emb, stage1_seconds=t1 - t0)
    ad.save(path)
    cells.record(f"fit/{task.name}/{lambda_tag(sparsity)}", time.perf_counter() - t1)  # stage 2
    cells.log(f"  fitted {task.name} λ={sparsity:g} in {time.perf_counter() - t0:.1f}s "
              f"(best step {ad.meta['best_step']}, valid loss {ad.meta['final_valid_loss']:.3f})")
    return ad


def run_model(
    model,
    runs_dir: str | Path,
    config: FigureConfig | None = None,
    *,
    progress: bool = False,
    log: Callable[[str], None] | None = None,
) -> ModelRun:
    """All cells of one model (fits, intra, inter, similarity, effects), reusing finished ones
    under ``runs_dir``. ``log`` receives one-line progress messages (default: none)."""
    from sitelens.models import fingerprint, model_name

    cfg = (config or FigureConfig()).resolved()
    log = log or (lambda msg: None)
    base = {"fingerprint": fingerprint(model), "template": DEFAULT_TEMPLATE.to_dict(),
            "numerics_version": NUMERICS_VERSION}
    cells = CellStore(Path(runs_dir), log, base)
    run = ModelRun(model=model_name(model), n_layers=model.cfg.n_layers,
                   n_heads=model.cfg.n_heads, config=cfg)
    tasks = {name: load_task(name, seed=cfg.seed) for name in cfg.tasks}
    main = cfg.main_sparsity

    # 1. adapters: main λ on every task, the other λ on the intra tasks
    for lam in cfg.sparsity:
        names = cfg.tasks if lam == main else cfg.intra_tasks
        run.adapters[lam] = {
            name: fit_cell(model, tasks[name], lam, cfg, cells, progress=progress)
            for name in names
        }
    run.intra = _intra_cells(model, run, tasks, cells)  # 2. intra-task patching, every λ
    # 3. inter-task patching and α similarity (main λ)
    inter_k = min(cfg.inter_k, run.n_total)
    run.inter = _inter_cell(model, run, tasks, cells, inter_k)
    run.similarity = alpha_similarity(run.adapters[main], k=inter_k)
    # 4. per-head causal effects (embedding = the task-mean activation of stage 1)
    for name in cfg.effect_tasks:
        df = _effects_cell(model, run, tasks[name], cells)
        run.effects[name] = df
        run.effect_stats[name] = {"baseline_prob": float(df["baseline_prob"].iloc[0]),
                                  "seconds": float(df["seconds"].iloc[0])}
    run.timings = dict(cells.timings)
    return run


def _intra_cells(model, run: ModelRun, tasks: dict[str, Task], cells: CellStore) -> pd.DataFrame:
    """The intra-task cell of every (intra task, λ), concatenated with a ``sparsity`` column."""
    cfg = run.config
    ks = intra_ks(run.n_total, cfg)
    frames = []
    for lam in cfg.sparsity:
        for name in cfg.intra_tasks:
            ad = run.adapters[lam][name]
            params = dict(_fit_params(cfg, lam), task=name, task_hash=task_hash(tasks[name]),
                          ks=ks, limit=cfg.limit, n_random_seeds=cfg.n_random_seeds,
                          n_boot=cfg.n_boot)
            df = cells.csv(
                f"intra/{slug(name)}_{lambda_tag(lam)}", params,
                lambda ad=ad, name=name: intra_task(
                    model, tasks[name], ad, ks=ks, n_random_seeds=cfg.n_random_seeds,
                    limit=cfg.limit, seed=cfg.seed, n_boot=cfg.n_boot,
                ),
            )
            frames.append(df.assign(sparsity=lam))
    return pd.concat(frames, ignore_index=True)


def _inter_cell(model, run: ModelRun, tasks: dict[str, Task], cells: CellStore,
                inter_k: int) -> pd.DataFrame:
    """The inter-task cell over all tasks, with the adapters of the main λ."""
    cfg, main = run.config, run.config.main_sparsity
    params = dict(_fit_params(cfg, main), tasks=list(cfg.tasks),
                  task_hashes=[task_hash(tasks[n]) for n in cfg.tasks], k=inter_k,
                  limit=cfg.limit, n_boot=cfg.n_boot)
    return cells.csv(
        f"inter_{lambda_tag(main)}", params,
        lambda: inter_task(model, [tasks[n] for n in cfg.tasks], run.adapters[main], k=inter_k,
                           limit=cfg.limit, seed=cfg.seed, n_boot=cfg.n_boot),
    )


def _effects_cell(model, run: ModelRun, task: Task, cells: CellStore) -> pd.DataFrame:
    """The per-head causal-effect cell of ``task`` (one row per head, with the run's stats)."""
    cfg, main = run.config, run.config.main_sparsity
    L, H = run.n_layers, run.n_heads
    params = dict(_fit_params(cfg, main), task=task.name, task_hash=task_hash(task),
                  n_prompts_effects=cfg.effect_prompts)

    def compute() -> pd.DataFrame:
        effects, stats = head_causal_effects(
            model, task, n_prompts=cfg.effect_prompts, n_shots=cfg.n_shots, seed=cfg.seed,
            embedding=run.adapters[main][task.name].embedding, return_stats=True,
        )  # [n_layers, n_heads]
        layer, head = np.divmod(np.arange(L * H), H)
        return pd.DataFrame({
            "model": run.model, "task": task.name, "layer": layer, "head": head,
            "effect": effects.flatten().numpy(), "baseline_prob": stats["baseline_prob"],
            "seconds": stats["seconds"], "n_prompts": stats["n_prompts"],
        })

    return cells.csv(f"effects/{slug(task.name)}", params, compute)


@dataclass
class FiguresResult:
    """What :func:`make_figures` produced: the summary, the figures per model, where they are."""

    out_dir: Path
    summary: dict
    figures: dict[str, dict[str, object]]  # model -> name -> plotly Figure
    runs: dict[str, ModelRun]


def make_figures(
    out_dir: str | Path = "figures",
    config: FigureConfig | None = None,
    *,
    models: Sequence[str] = DEFAULT_MODELS,
    threads: int | None = None,
    progress: bool = True,
    **overrides,
) -> FiguresResult:
    """Reproduce ``out_dir`` from real runs on ``models`` (see the module docstring).

    ``config`` (default :class:`FigureConfig`) sets the sizes and seeds; keyword ``overrides`` are
    :class:`FigureConfig` field names (``limit=10``, ``sparsity=(0, 5)``, ``tasks=[...]``, …; an
    unknown name raises ``TypeError``). ``sparsity``: the λ values of the intra-task experiment;
    ``main_sparsity`` (default ``max(sparsity)``) is the λ of the adapters used for the α maps,
    inter-task patching, α similarity and causal effects. ``limit``: test items per task.
    ``threads``: ``torch.set_num_threads``. ``progress``: one line per step on stderr.

    Per model, under ``out_dir/{model}/``: ``alpha_heatmap_{task}``, ``alpha_facets``,
    ``effect_vs_alpha_{task}``, ``patching_curves`` (mean over the intra tasks, one row per λ),
    ``patching_curves_tasks_lam{λ}``, ``patching_gaps.csv``, ``inter_accuracy``,
    ``inter_accuracy_topk``, ``alpha_similarity`` — each ``.png`` + ``.html`` + ``.csv``. In
    ``out_dir``: ``summary.json`` and ``summary.csv``. Cells are cached in ``out_dir/.runs/``;
    rerunning after an interruption (or to regenerate figures) reuses them."""
    from sitelens.models import load_model

    cfg = config_with_overrides(FigureConfig, config, overrides, "make_figures").resolved()
    if threads:
        torch.set_num_threads(threads)
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except PermissionError as e:
        raise OutputError(f"Cannot create {out}: {e.strerror}. Choose a writable out_dir.") from e
    t_start = time.perf_counter()

    def log(msg: str) -> None:
        if progress:
            print(f"[{time.perf_counter() - t_start:7.1f}s] {msg}", file=sys.stderr, flush=True)

    writer = FigureWriter(cfg.formats)
    if writer.png_error:
        log(f"PNG export unavailable: {writer.png_error}; writing HTML + CSV only")
    summary = _previous_summary(out)  # other models' numbers are kept, never dropped
    figures: dict[str, dict[str, object]] = {}
    runs: dict[str, ModelRun] = {}
    try:
        for name in models:
            log(f"{name}: loading")
            t0 = time.perf_counter()
            model = load_model(name)
            log(f"{name}: loaded in {time.perf_counter() - t0:.1f}s")
            run = run_model(model, out / ".runs" / slug(name), cfg, log=log)
            del model
            runs[name] = run
            entry = dict(summarize_model(run), config=_config_dict(cfg),
                         numerics_version=NUMERICS_VERSION)
            _merge_model(summary, entry)
            figs = model_figures(run)
            figures[name] = {k: f for k, (f, _) in figs.items() if f is not None}
            for fname, (fig, frame) in figs.items():
                writer.write(fig, frame, out / slug(name) / fname)
            log(f"{name}: figures written to {out / slug(name)}")
            summary["png"] = writer.png_error is None and "png" in cfg.formats
            summary["png_error"] = writer.png_error
            _write_summary(summary, out)  # after every model, so a partial run has one too
    finally:
        writer.close()
    summary["wall_seconds_this_run"] = round(time.perf_counter() - t_start, 1)
    _write_summary(summary, out)
    return FiguresResult(out_dir=out, summary=summary, figures=figures, runs=runs)


def _config_dict(cfg: FigureConfig) -> dict:
    d = asdict(cfg)
    return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}


def _previous_summary(out: Path) -> dict:
    """``out/summary.json`` of earlier runs, each model entry carrying its own ``config`` (a file
    from before per-model configs gets its top-level config copied into each entry)."""
    path = out / "summary.json"
    try:
        old = json.loads(path.read_text())
    except FileNotFoundError:
        return {"models": []}
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise OutputError(
            f"{path} exists but is not a figures summary ({e}); move it away or choose another "
            "--out, so that its numbers are not lost."
        ) from e
    if not isinstance(old, dict) or not isinstance(old.get("models"), list):
        raise OutputError(f"{path} is not a figures summary (no 'models' list); move it away or "
                          "choose another --out.")
    top = old.pop("config", None)
    for m in old["models"]:
        if top is not None:
            m.setdefault("config", top)
        m.setdefault("numerics_version", 1)
    return {"models": old["models"]}


def _merge_model(summary: dict, entry: dict) -> None:
    """Replace ``entry['model']``'s entry in ``summary['models']`` (in place) or append it."""
    models = summary["models"]
    for i, m in enumerate(models):
        if m.get("model") == entry["model"]:
            models[i] = entry
            return
    models.append(entry)


def _write_summary(summary: dict, out: Path) -> None:
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=1, default=str) + "\n")
    atomic_write_csv(out / "summary.csv", summary_rows(summary))


__all__ = [
    "DEFAULT_MODELS", "FIGURE_TASKS", "INTRA_TASKS", "EFFECT_TASKS", "FigureConfig", "ModelRun",
    "FiguresResult", "FigureWriter", "fit_cell", "run_model", "intra_mean", "intra_gaps",
    "summarize_model", "summary_rows", "model_figures", "make_figures", "gap_k", "intra_ks",
    "png_export_error", "notebook_renderer", "headline", "target_centred", "by_target_family",
    "lambda_tag",
]
