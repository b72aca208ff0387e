"""Reproduce ``figures/`` from real runs: one resumable pipeline (``sitelens figures``).

For each model, :func:`make_figures` (or :func:`run_model` + :func:`model_figures` +
:func:`summarize_model` on an already loaded model):

1. fits a SITE adapter per (task, sparsity λ) (stage-1 embeddings shared across λ);
2. runs intra-task patching (:func:`sitelens.patching.intra_task`) for every λ on ``intra_tasks``;
3. runs inter-task patching (:func:`sitelens.patching.inter_task`) and α-map similarity over
   ``tasks`` (with the adapters of ``main_sparsity``);
4. measures per-head causal effects (:func:`sitelens.patching.effects.head_causal_effects`) on
   ``effect_tasks``;
5. writes each figure as PNG + HTML + the CSV behind it (:class:`sitelens.viz.export.FigureWriter`),
   and a summary (JSON + CSV) of the measured high-α vs low-α gap, the within- vs between-family
   transfer gap and the α-similarity / transfer correlation (:func:`summarize_model`, from the
   statistics of :mod:`sitelens.patching.analysis`).

Resumable: every finished cell (:mod:`sitelens.pipelines.store`) is kept under ``out_dir/.runs/{model}/`` —
fitted adapters (:meth:`SiteAdapter.save`), stage-1 embeddings, and each experiment's CSV
(written atomically) — with a short hash of the parameters that produced it in its name, and
reused on restart (a cell computed with other parameters is recomputed, never reused). Figures and
the summary are rebuilt from those cells on every run (seconds).

The cells run in this process by default; ``executor=`` (``processes:N``, ``ray[:ADDRESS]``,
:mod:`sitelens.pipelines.executors`) runs them on workers first, in three waves — stage-1 embeddings, SITE
fits, then the intra / effects / inter cells — each cell written atomically by its worker into
``out_dir/.runs`` (which the workers must therefore see: one machine, or a shared file system),
and the driver then builds the figures from the finished cells as above.

The sizes and seeds of a run are a :class:`FigureConfig`; :func:`make_figures` takes one, or its
fields as keyword arguments. Its cells are listed once (:func:`figure_cells`, in
:mod:`sitelens.pipelines.figure_config`), for this process and for the workers alike. The
statistics (:func:`intra_mean`, :func:`intra_gaps`, …) and the writer (:class:`FigureWriter`,
:func:`notebook_renderer`) are re-exported here from :mod:`sitelens.patching.analysis` and
:mod:`sitelens.viz.export`.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from sitelens.errors import OutputError, SitelensError
from sitelens.io import atomic_write
from sitelens.models import LoadSpec
from sitelens.patching import inter_task, intra_task
from sitelens.patching.analysis import (
    alpha_similarity,
    by_target_family,
    intra_gaps,
    intra_mean,
    target_centred,
)
from sitelens.patching.effects import head_causal_effects
from sitelens.pipelines.executors import Cell, Executor, cached_model, check_fingerprint, make_executor
from sitelens.pipelines.figure_config import (
    DEFAULT_MODELS,
    DEFAULT_SPARSITY,
    EFFECT_TASKS,
    FIGURE_TASKS,
    HEATMAP_TASK,
    INTRA_TASKS,
    FigureCell,
    FigureConfig,
    ModelRun,
    figure_cells,
)
from sitelens.pipelines.report import (
    _config_dict,
    _merge_model,
    _previous_summary,
    _write_summary,
    gap_k,
    headline,
    intra_ks,
    lambda_tag,
    model_figures,
    summarize_model,
    summary_rows,
)
from sitelens.pipelines.store import CellStore, slug
from sitelens.provenance import NUMERICS_VERSION, config_with_overrides, task_hash
from sitelens.site import SiteAdapter, fit_site, task_embedding
from sitelens.site.adapter import adapter_of
from sitelens.site.joint import fit_alpha_tasks
from sitelens.tasks import DEFAULT_TEMPLATE, Task, load_task
from sitelens.viz.export import FigureWriter, notebook_renderer, png_export_error


def _fit_params(cfg: FigureConfig, sparsity: float) -> dict:
    """The settings of one (task, λ) fit, part of the key of every cell built on it: stage 1's
    prompts and the stage-2 fields that a figures run sets (:meth:`FigureConfig.fit_config`)."""
    fc = cfg.fit_config(sparsity)
    return {"n_examples": fc.n_examples, "n_prompts": cfg.n_prompts, "n_shots": cfg.n_shots,
            "lr": fc.lr, "batch_size": fc.batch_size, "seed": fc.seed, "sparsity": fc.sparsity}


def _embedding_path(task: Task, cfg: FigureConfig, cells: CellStore) -> Path:
    params = {"task": task.name, "task_hash": task_hash(task), "n_prompts": cfg.n_prompts,
              "n_shots": cfg.n_shots, "seed": cfg.seed}
    return cells.path(f"embeddings/{slug(task.name)}", params, ".safetensors")


def _adapter_path(task: Task, sparsity: float, cfg: FigureConfig, cells: CellStore) -> Path:
    params = dict(_fit_params(cfg, sparsity), task_hash=task_hash(task))
    return cells.path(f"adapters/{slug(task.name)}_{lambda_tag(sparsity)}", params)


def _embedding(model, task: Task, cfg: FigureConfig, cells: CellStore) -> torch.Tensor:
    """The stage-1 embedding cell of ``task`` (shared across λ): loaded, or computed and saved."""
    from safetensors.torch import load_file, save

    path = _embedding_path(task, cfg, cells)
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
    path = _adapter_path(task, sparsity, cfg, cells)
    ad = SiteAdapter.load_matching(
        path, model, on_error=lambda e: cells.log(f"  {path.name}: {e} — refitting"))
    if ad is not None:
        return ad
    t0 = time.perf_counter()
    emb = _embedding(model, task, cfg, cells)  # [n_layers, n_heads, d_head]
    t1 = time.perf_counter()
    ad = fit_site(model, task, n_prompts=cfg.n_prompts, n_shots=cfg.n_shots,
                  config=cfg.fit_config(sparsity),
                  progress=progress, embedding=emb, stage1_seconds=t1 - t0)
    ad.save(path)
    cells.record(f"fit/{task.name}/{lambda_tag(sparsity)}", time.perf_counter() - t1)  # stage 2
    cells.log(f"  fitted {task.name} λ={sparsity:g} in {time.perf_counter() - t0:.1f}s "
              f"(best step {ad.meta['best_step']}, valid loss {ad.meta['final_valid_loss']:.3f})")
    return ad


def fit_jointly(model, runs_dir: str | Path, config: FigureConfig | None = None, *,
                log: Callable[[str], None] | None = None) -> int:
    """The fit cells of one model's run (under ``runs_dir``) not saved yet, each λ's tasks in one
    joint stage 2 (:func:`sitelens.site.joint.fit_alpha_tasks`) on their stage-1 embedding cells,
    saved where :func:`fit_cell` finds them; returns how many were fitted. Each adapter equals its
    one-task fit up to float rounding; its recorded stage-2 seconds are an even share of the joint
    run. A λ with one missing fit, or whose joint fit fails, is left to :func:`fit_cell`."""
    cfg = (config or FigureConfig()).resolved()
    log = log or (lambda msg: None)
    cells = _cell_store(model, runs_dir, log)
    tasks = {name: load_task(name, seed=cfg.seed) for name in cfg.tasks}
    missing: dict[float, list[Task]] = {}
    for c in _of_kind(figure_cells(cfg), "fit"):
        path = _adapter_path(tasks[c.task], c.sparsity, cfg, cells)
        if SiteAdapter.load_matching(path, model, on_error=lambda e: None) is None:
            missing.setdefault(c.sparsity, []).append(tasks[c.task])
    n = 0
    for lam, todo in missing.items():
        if len(todo) < 2:
            continue
        t0 = time.perf_counter()
        embs = [_embedding(model, t, cfg, cells) for t in todo]  # [n_layers, n_heads, d_head] each
        t1 = time.perf_counter()
        fc = cfg.fit_config(lam)
        try:
            results = fit_alpha_tasks(model, todo, embs, fc)
        except SitelensError as e:
            log(f"  joint fit at λ={lam:g} failed ({e}); fitting one task at a time")
            continue
        share = (time.perf_counter() - t1) / len(todo)
        for task, emb, res in zip(todo, embs, results):
            ad = adapter_of(model, task, emb, res, fc, template=DEFAULT_TEMPLATE, n_prompts=cfg.n_prompts,
                            n_shots=cfg.n_shots, stage1_seconds=(t1 - t0) / len(todo))
            ad.save(_adapter_path(task, lam, cfg, cells))
            cells.record(f"fit/{task.name}/{lambda_tag(lam)}", share)  # stage 2
        log(f"  fitted {len(todo)} tasks jointly at λ={lam:g} in {time.perf_counter() - t1:.1f}s")
        n += len(todo)
    return n


def _cell_store(model, runs_dir: str | Path, log: Callable[[str], None]) -> CellStore:
    """The cells of one model's run: keyed on its weight fingerprint, the template and the
    numerics version (plus each cell's own parameters)."""
    from sitelens.models import fingerprint

    base = {"fingerprint": fingerprint(model), "template": DEFAULT_TEMPLATE.to_dict(),
            "numerics_version": NUMERICS_VERSION}
    return CellStore(Path(runs_dir), log, base)


def _empty_run(model, cfg: FigureConfig) -> ModelRun:
    from sitelens.models import model_name

    return ModelRun(model=model_name(model), n_layers=model.cfg.n_layers,
                    n_heads=model.cfg.n_heads, config=cfg)


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
    cfg = (config or FigureConfig()).resolved()
    log = log or (lambda msg: None)
    cells = _cell_store(model, runs_dir, log)
    run = _empty_run(model, cfg)
    tasks = {name: load_task(name, seed=cfg.seed) for name in cfg.tasks}
    plan = figure_cells(cfg)

    # 1. adapters: main λ on every task, the other λ on the intra tasks
    run.adapters = {lam: {} for lam in cfg.sparsity}
    for c in _of_kind(plan, "fit"):
        run.adapters[c.sparsity][c.task] = fit_cell(model, tasks[c.task], c.sparsity, cfg, cells,
                                                    progress=progress)
    # 2. intra-task patching, every λ, concatenated with a ``sparsity`` column
    frames = [_intra_cell(model, run, tasks[c.task], c.sparsity, cells).assign(sparsity=c.sparsity)
              for c in _of_kind(plan, "intra")]
    run.intra = pd.concat(frames, ignore_index=True)
    # 3. inter-task patching (the plan's one inter cell) and α similarity, main λ
    inter_k = min(cfg.inter_k, run.n_total)
    run.inter = _inter_cell(model, run, tasks, cells, inter_k)
    run.similarity = alpha_similarity(run.adapters[cfg.main_sparsity], k=inter_k)
    # 4. per-head causal effects (embedding = the task-mean activation of stage 1)
    for c in _of_kind(plan, "effects"):
        df = _effects_cell(model, run, tasks[c.task], cells)
        run.effects[c.task] = df
        run.effect_stats[c.task] = {"baseline_prob": float(df["baseline_prob"].iloc[0]),
                                    "seconds": float(df["seconds"].iloc[0])}
    run.timings = dict(cells.timings)
    return run


def _of_kind(plan: list[FigureCell], kind: str) -> list[FigureCell]:
    return [c for c in plan if c.kind == kind]


def _intra_spec(cfg: FigureConfig, n_total: int, task: Task, lam: float) -> tuple[str, dict]:
    """The name and parameters of the intra-task cell of (``task``, λ)."""
    params = dict(_fit_params(cfg, lam), task=task.name, task_hash=task_hash(task),
                  ks=intra_ks(n_total, cfg), limit=cfg.limit, n_random_seeds=cfg.n_random_seeds,
                  n_boot=cfg.n_boot)
    return f"intra/{slug(task.name)}_{lambda_tag(lam)}", params


def _intra_cell(model, run: ModelRun, task: Task, lam: float, cells: CellStore) -> pd.DataFrame:
    """The intra-task cell of (``task``, λ) with the adapter ``run.adapters[λ][task]``."""
    cfg = run.config
    name, params = _intra_spec(cfg, run.n_total, task, lam)
    ad = run.adapters[lam][task.name]
    return cells.csv(name, params, lambda: intra_task(
        model, task, ad, ks=params["ks"], n_random_seeds=cfg.n_random_seeds, limit=cfg.limit,
        seed=cfg.seed, n_boot=cfg.n_boot))


def _inter_spec(cfg: FigureConfig, tasks: dict[str, Task], inter_k: int) -> tuple[str, dict]:
    params = dict(_fit_params(cfg, cfg.main_sparsity), tasks=list(cfg.tasks),
                  task_hashes=[task_hash(tasks[n]) for n in cfg.tasks], k=inter_k,
                  limit=cfg.limit, n_boot=cfg.n_boot)
    return f"inter_{lambda_tag(cfg.main_sparsity)}", params


def _inter_cell(model, run: ModelRun, tasks: dict[str, Task], cells: CellStore,
                inter_k: int) -> pd.DataFrame:
    """The inter-task cell over all tasks, with the adapters of the main λ."""
    cfg, main = run.config, run.config.main_sparsity
    name, params = _inter_spec(cfg, tasks, inter_k)
    return cells.csv(
        name, params,
        lambda: inter_task(model, [tasks[n] for n in cfg.tasks], run.adapters[main], k=inter_k,
                           limit=cfg.limit, seed=cfg.seed, n_boot=cfg.n_boot),
    )


def _effects_spec(cfg: FigureConfig, task: Task) -> tuple[str, dict]:
    params = dict(_fit_params(cfg, cfg.main_sparsity), task=task.name, task_hash=task_hash(task),
                  n_prompts_effects=cfg.effect_prompts)
    return f"effects/{slug(task.name)}", params


def _effects_cell(model, run: ModelRun, task: Task, cells: CellStore) -> pd.DataFrame:
    """The per-head causal-effect cell of ``task`` (one row per head, with the run's stats)."""
    cfg, main = run.config, run.config.main_sparsity
    L, H = run.n_layers, run.n_heads
    name, params = _effects_spec(cfg, task)

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

    return cells.csv(name, params, compute)


# ----------------------------------------------------------------------------------------------
# the cells on workers (executor=): three waves, each cell written by its worker into the store


@dataclass(frozen=True)
class FigureJob:
    """One figures cell for a worker (picklable): which model (by name, and the fingerprint of its
    weights), the run directory, the resolved config, the kind (``embedding``, ``fit``,
    ``intra``, ``effects``, ``inter``), the task and λ."""

    model: str
    fingerprint: str  # the driver's: the worker's model must have the same weights
    runs_dir: str
    config: FigureConfig
    kind: str
    task: str | None = None
    sparsity: float | None = None
    verbose: bool = False
    load: LoadSpec | None = None  # how the worker loads the model (None: load_model's defaults)


def run_figure_cell(job: FigureJob) -> str:
    """Compute one figures cell in this process (a worker) and write it into the run's store
    (atomically; a cell already there is read back, not recomputed); returns the job's label."""
    cfg = job.config
    log = (lambda m: print(m, file=sys.stderr, flush=True)) if job.verbose else (lambda m: None)
    model = cached_model(job.model, load=job.load)
    check_fingerprint(model, job.model, job.fingerprint)
    cells = _cell_store(model, job.runs_dir, log)
    run = _empty_run(model, cfg)
    main = cfg.main_sparsity
    needs = cfg.tasks if job.kind == "inter" else [job.task]
    tasks = {n: load_task(n, seed=cfg.seed) for n in needs}
    if job.kind == "embedding":
        _embedding(model, tasks[job.task], cfg, cells)
    elif job.kind == "fit":
        fit_cell(model, tasks[job.task], job.sparsity, cfg, cells)
    elif job.kind == "intra":
        run.adapters[job.sparsity] = {job.task: fit_cell(model, tasks[job.task], job.sparsity, cfg,
                                                         cells)}
        _intra_cell(model, run, tasks[job.task], job.sparsity, cells)
    elif job.kind == "effects":
        run.adapters[main] = {job.task: fit_cell(model, tasks[job.task], main, cfg, cells)}
        _effects_cell(model, run, tasks[job.task], cells)
    elif job.kind == "inter":
        run.adapters[main] = {n: fit_cell(model, t, main, cfg, cells) for n, t in tasks.items()}
        _inter_cell(model, run, tasks, cells, min(cfg.inter_k, run.n_total))
    else:
        raise ValueError(f"unknown figures cell kind {job.kind!r}")
    return _job_label(job)


def _job_label(job: FigureJob) -> str:
    lam = "" if job.sparsity is None else f" λ={job.sparsity:g}"
    return f"{job.kind} {job.task or 'all tasks'}{lam}"


def _waves(model, name: str, runs_dir: Path, cfg: FigureConfig, verbose: bool,
           load: LoadSpec | None = None) -> list[list[Cell]]:
    """The missing cells of one model's run, in the order their inputs need: embeddings, then
    fits, then the intra / effects / inter cells (the ones already in the store are left out)."""
    cells = _cell_store(model, runs_dir, lambda m: None)
    tasks = {n: load_task(n, seed=cfg.seed) for n in cfg.tasks}
    n_total = model.cfg.n_layers * model.cfg.n_heads
    plan = figure_cells(cfg)
    todo_fits = [c for c in _of_kind(plan, "fit")
                 if not (_adapter_path(tasks[c.task], c.sparsity, cfg, cells) / "adapter.json").exists()]
    embed = [n for n in dict.fromkeys(c.task for c in todo_fits)
             if not _embedding_path(tasks[n], cfg, cells).exists()]
    last = [(c, _result_path(c, cfg, cells, tasks, n_total)) for c in plan if c.kind != "fit"]

    def cell(kind, task=None, lam=None, key=None) -> Cell:
        job = FigureJob(name, cells.base["fingerprint"], str(Path(runs_dir).resolve()), cfg, kind,
                        task, lam, verbose, load)
        return Cell(key or _job_label(job), run_figure_cell, (job,), label=_job_label(job))

    return [
        [cell("embedding", n) for n in embed],
        [cell("fit", c.task, c.sparsity) for c in todo_fits],
        [cell(c.kind, c.task, c.sparsity, key=str(path)) for c, path in last if not path.exists()],
    ]


def _result_path(c: FigureCell, cfg: FigureConfig, cells: CellStore, tasks: dict[str, Task],
                 n_total: int) -> Path:
    """The CSV file of an ``intra``, ``effects`` or ``inter`` cell."""
    if c.kind == "intra":
        return cells.path(*_intra_spec(cfg, n_total, tasks[c.task], c.sparsity), ".csv")
    if c.kind == "effects":
        return cells.path(*_effects_spec(cfg, tasks[c.task]), ".csv")
    return cells.path(*_inter_spec(cfg, tasks, min(cfg.inter_k, n_total)), ".csv")


def run_cells(model, name: str, runs_dir: str | Path, config: FigureConfig | None,
              executor: Executor, *, log: Callable[[str], None] | None = None,
              verbose: bool = False, load: LoadSpec | None = None) -> int:
    """Compute the missing cells of one model's run on ``executor`` (wave by wave) so that
    :func:`run_model` then finds them all; returns how many cells ran. ``name``: the model's name
    for :func:`sitelens.models.load_model` in the workers, with ``load`` (``model``, loaded here,
    gives the keys)."""
    cfg = (config or FigureConfig()).resolved()
    log = log or (lambda msg: None)
    n = 0
    for wave in _waves(model, name, Path(runs_dir), cfg, verbose, load):
        if wave:
            log(f"{name}: {len(wave)} cell(s) on {executor.name}: "
                + ", ".join(c.label for c in wave[:6]) + (" ..." if len(wave) > 6 else ""))
            executor.run(wave, lambda c, _r: log(f"  done: {c.label}"))
            n += len(wave)
    return n


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
    executor: str | Executor | None = None,
    load: LoadSpec | None = None,
    **overrides,
) -> FiguresResult:
    """Reproduce ``out_dir`` from real runs on ``models`` (see the module docstring).

    ``config`` (default :class:`FigureConfig`) sets the sizes and seeds; keyword ``overrides`` are
    :class:`FigureConfig` field names (``limit=10``, ``sparsity=(0, 5)``, ``tasks=[...]``, …; an
    unknown name raises ``TypeError``). ``sparsity``: the λ values of the intra-task experiment;
    ``main_sparsity`` (default ``max(sparsity)``) is the λ of the adapters used for the α maps,
    inter-task patching, α similarity and causal effects. ``limit``: test items per task.
    ``threads``: ``torch.set_num_threads`` (and the torch threads of each worker).
    ``progress``: one line per step on stderr. ``executor``: where the cells run
    (:func:`sitelens.pipelines.executors.make_executor`; default in this process): with ``processes:N`` or
    ``ray[:ADDRESS]`` the missing cells are computed on workers first (:func:`run_cells`), with
    the same results. ``load``: how every model loads, here and in the workers
    (:class:`~sitelens.models.LoadSpec`: device, dtype, devices, device map, backend).

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
    ex = make_executor(executor, threads=threads)
    try:
        for name in models:
            log(f"{name}: loading")
            t0 = time.perf_counter()
            model = load_model(name, spec=load)
            log(f"{name}: loaded in {time.perf_counter() - t0:.1f}s")
            if cfg.joint:  # in this process, before any other cell needs the adapters
                fit_jointly(model, out / ".runs" / slug(name), cfg, log=log)
            if not ex.in_process:
                run_cells(model, name, out / ".runs" / slug(name), cfg, ex, log=log, load=load)
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
        if ex is not executor:  # made here from a name: closed here
            ex.close()
    summary["wall_seconds_this_run"] = round(time.perf_counter() - t_start, 1)
    _write_summary(summary, out)
    return FiguresResult(out_dir=out, summary=summary, figures=figures, runs=runs)


__all__ = [
    "DEFAULT_MODELS", "FIGURE_TASKS", "INTRA_TASKS", "HEATMAP_TASK", "EFFECT_TASKS",
    "DEFAULT_SPARSITY", "FigureConfig", "ModelRun", "FigureCell", "figure_cells",
    "FiguresResult", "FigureWriter", "fit_cell", "fit_jointly", "run_model", "intra_mean", "intra_gaps",
    "summarize_model", "summary_rows", "model_figures", "make_figures", "run_cells",
    "run_figure_cell", "FigureJob", "gap_k", "intra_ks",
    "png_export_error", "notebook_renderer", "headline", "target_centred", "by_target_family",
    "lambda_tag",
]
