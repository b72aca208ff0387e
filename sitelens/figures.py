"""Reproduce ``figures/`` from real runs: one resumable pipeline (``sitelens figures``).

For each model, :func:`make_figures` (or :func:`run_model` + :func:`model_figures` +
:func:`summarize_model` on an already loaded model):

1. fits a SITE adapter per (task, sparsity λ) (stage-1 embeddings shared across λ);
2. runs intra-task patching (:func:`sitelens.patching.intra_task`) for every λ on ``intra_tasks``;
3. runs inter-task patching (:func:`sitelens.patching.inter_task`) and α-map similarity over
   ``tasks`` (with the adapters of ``main_sparsity``);
4. measures per-head causal effects (:func:`sitelens.patching.head_causal_effects`) on
   ``effect_tasks``;
5. writes each figure as PNG + HTML + the CSV behind it, and a summary (JSON + CSV) of the
   measured high-α vs low-α gap, the within- vs between-family transfer gap and the α-similarity /
   transfer correlation.

Resumable: every finished cell is kept under ``out_dir/.runs/{model}/`` — fitted adapters
(:meth:`SiteAdapter.save`), stage-1 embeddings, and each experiment's CSV (written atomically) —
with a short hash of the parameters that produced it in its name, and reused on restart (a cell
computed with other parameters is recomputed, never reused). Figures and the summary are rebuilt
from those cells on every run (seconds).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from sitelens.errors import AdapterError, OutputError
from sitelens.io import atomic_write, atomic_write_csv, atomic_write_text
from sitelens.patching import (
    TASK_FAMILIES,
    alpha_similarity,
    default_ks,
    effect_alpha_correlation,
    head_causal_effects,
    inter_task,
    intra_task,
    transfer_matrix,
    transfer_similarity_correlation,
    within_between,
)
from sitelens.plotting import (
    alpha_facets,
    alpha_heatmap,
    cluster_order,
    effect_vs_alpha,
    matrix_heatmap,
    patching_curves,
)
from sitelens.provenance import NUMERICS_VERSION, settings_hash, task_hash
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


@dataclass
class FigureConfig:
    """Sizes and seeds of one figures run (see :func:`make_figures`)."""

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

    def resolved(self) -> FigureConfig:
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


def gap_k(spec: str | int, n_total: int) -> int:
    """``10`` → 10 heads; ``"5%"`` → 5% of all heads (rounded, at least 1)."""
    if isinstance(spec, str) and spec.endswith("%"):
        return max(1, min(n_total, round(float(spec[:-1]) / 100 * n_total)))
    return max(1, min(n_total, int(spec)))


def _key(d: dict) -> str:
    return settings_hash(d, n=8)


def _lam(x: float) -> str:
    return f"lam{x:g}"


def _atomic_csv(df: pd.DataFrame, path: Path) -> None:
    atomic_write_csv(path, df)


def _atomic_text(text: str, path: Path) -> None:
    atomic_write_text(path, text)


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


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


class _Cells:
    """Cached cells under ``runs_dir`` with a timings ledger (survives restarts).

    Every cell's file name carries a hash of its parameters *and* of ``base``: the model's weight
    fingerprint, the prompt template and :data:`sitelens.provenance.NUMERICS_VERSION` (the
    callers add each task's split hash). A cell made by other code or weights is recomputed."""

    def __init__(self, runs_dir: Path, log: Callable[[str], None], base: dict | None = None):
        self.dir = runs_dir
        self.base = dict(base or {})
        self.dir.mkdir(parents=True, exist_ok=True)
        self.log = log
        self.ledger_path = self.dir / "timings.json"
        try:
            self.timings = json.loads(self.ledger_path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            self.timings = {}

    def key(self, params: dict) -> str:
        return _key({**params, "base": self.base})

    def record(self, name: str, seconds: float) -> None:
        self.timings[name] = round(seconds, 2)
        _atomic_text(json.dumps(self.timings, indent=1, sort_keys=True), self.ledger_path)

    def csv(self, name: str, params: dict, compute: Callable[[], pd.DataFrame]) -> pd.DataFrame:
        path = self.dir / f"{name}_{self.key(params)}.csv"
        if path.exists():
            try:
                return pd.read_csv(path)
            except (pd.errors.ParserError, pd.errors.EmptyDataError):
                self.log(f"  {path.name} is unreadable; recomputing")
        self.log(f"  computing {name} ...")
        t0 = time.perf_counter()
        df = compute()
        dt = time.perf_counter() - t0
        _atomic_csv(df, path)
        self.record(name, dt)
        self.log(f"  {name} done in {dt:.1f}s")
        return df


def _fit_params(cfg: FigureConfig, lam: float) -> dict:
    return {"n_examples": cfg.n_examples, "n_prompts": cfg.n_prompts, "n_shots": cfg.n_shots,
            "lr": cfg.lr, "batch_size": cfg.batch_size, "seed": cfg.seed, "sparsity": lam}


def _embedding(model, task: Task, cfg: FigureConfig, cells: _Cells) -> torch.Tensor:
    from safetensors.torch import load_file, save

    params = {"task": task.name, "task_hash": task_hash(task), "n_prompts": cfg.n_prompts,
              "n_shots": cfg.n_shots, "seed": cfg.seed}
    path = cells.dir / "embeddings" / f"{_slug(task.name)}_{cells.key(params)}.safetensors"
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


def fit_cell(model, task: Task, lam: float, cfg: FigureConfig, cells: _Cells,
             *, progress: bool = False) -> SiteAdapter:
    """The SITE adapter of (task, λ): loaded from ``runs/adapters/`` if a valid one was saved with
    the same parameters, else fitted (stage 1 shared across λ) and saved."""

    params = dict(_fit_params(cfg, lam), task_hash=task_hash(task))
    path = cells.dir / "adapters" / f"{_slug(task.name)}_{_lam(lam)}_{cells.key(params)}"
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
                   sparsity=lam, seed=cfg.seed)
    ad = fit_site(model, task, n_prompts=cfg.n_prompts, n_shots=cfg.n_shots, config=fc,
                  progress=progress, embedding=emb, stage1_seconds=t1 - t0)
    ad.save(path)
    cells.record(f"fit/{task.name}/{_lam(lam)}", time.perf_counter() - t1)  # stage 2 only
    cells.log(f"  fitted {task.name} λ={lam:g} in {time.perf_counter() - t0:.1f}s "
              f"(best step {ad.meta['best_step']}, valid loss {ad.meta['final_valid_loss']:.3f})")
    return ad


def intra_ks(n_total: int, cfg: FigureConfig) -> list[int]:
    """1, 2, 4, …, all heads, plus the k of ``cfg.gap_ks``."""
    ks = set(default_ks(n_total)) | {gap_k(g, n_total) for g in cfg.gap_ks}
    return sorted(ks)


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
    cells = _Cells(Path(runs_dir), log, base)
    L, H = model.cfg.n_layers, model.cfg.n_heads
    run = ModelRun(model=model_name(model), n_layers=L, n_heads=H, config=cfg)
    tasks = {name: load_task(name, seed=cfg.seed) for name in cfg.tasks}
    hashes = {name: task_hash(t) for name, t in tasks.items()}
    main = cfg.main_sparsity

    # 1. adapters: main λ on every task, the other λ on the intra tasks
    for lam in cfg.sparsity:
        names = cfg.tasks if lam == main else cfg.intra_tasks
        run.adapters[lam] = {}
        for name in names:
            run.adapters[lam][name] = fit_cell(model, tasks[name], lam, cfg, cells,
                                               progress=progress)

    # 2. intra-task patching, every λ
    ks = intra_ks(L * H, cfg)
    frames = []
    for lam in cfg.sparsity:
        for name in cfg.intra_tasks:
            ad = run.adapters[lam][name]
            params = dict(_fit_params(cfg, lam), task=name, task_hash=hashes[name], ks=ks,
                          limit=cfg.limit, n_random_seeds=cfg.n_random_seeds, n_boot=cfg.n_boot)
            df = cells.csv(
                f"intra/{_slug(name)}_{_lam(lam)}", params,
                lambda ad=ad, name=name: intra_task(
                    model, tasks[name], ad, ks=ks, n_random_seeds=cfg.n_random_seeds,
                    limit=cfg.limit, seed=cfg.seed, n_boot=cfg.n_boot,
                ),
            )
            frames.append(df.assign(sparsity=lam))
    run.intra = pd.concat(frames, ignore_index=True)

    # 3. inter-task patching and α similarity (main λ)
    ads = run.adapters[main]
    inter_k = min(cfg.inter_k, L * H)
    params = dict(_fit_params(cfg, main), tasks=list(cfg.tasks),
                  task_hashes=[hashes[n] for n in cfg.tasks], k=inter_k, limit=cfg.limit,
                  n_boot=cfg.n_boot)
    run.inter = cells.csv(
        f"inter_{_lam(main)}", params,
        lambda: inter_task(model, [tasks[n] for n in cfg.tasks], ads, k=inter_k,
                           limit=cfg.limit, seed=cfg.seed, n_boot=cfg.n_boot),
    )
    run.similarity = alpha_similarity(ads, k=inter_k)

    # 4. per-head causal effects (embedding = the task-mean activation of stage 1)
    for name in cfg.effect_tasks:
        params = dict(_fit_params(cfg, main), task=name, task_hash=hashes[name],
                      n_prompts_effects=cfg.effect_prompts)
        stats_box: dict = {}

        def compute(name=name, stats_box=stats_box) -> pd.DataFrame:
            eff, st = head_causal_effects(
                model, tasks[name], n_prompts=cfg.effect_prompts, n_shots=cfg.n_shots,
                seed=cfg.seed, embedding=ads[name].embedding, return_stats=True,
            )  # [n_layers, n_heads]
            stats_box.update({k: v for k, v in st.items() if k != "per_prompt"})
            layer, head = np.divmod(np.arange(L * H), H)
            return pd.DataFrame({
                "model": run.model, "task": name, "layer": layer, "head": head,
                "effect": eff.flatten().numpy(), "baseline_prob": st["baseline_prob"],
                "seconds": st["seconds"], "n_prompts": st["n_prompts"],
            })

        df = cells.csv(f"effects/{_slug(name)}", params, compute)
        run.effects[name] = df
        run.effect_stats[name] = {"baseline_prob": float(df["baseline_prob"].iloc[0]),
                                  "seconds": float(df["seconds"].iloc[0])}
    run.timings = dict(cells.timings)
    return run


# ----------------------------------------------------------------------------------------------
# aggregation and summary


def intra_mean(intra: pd.DataFrame, label: Callable[[float], str] | None = None) -> pd.DataFrame:
    """Intra-task rows averaged over tasks, per (sparsity, selection, k, seed). The CI of the mean
    combines the per-task bootstrap CIs by a normal approximation (independent tasks):
    half-width = sqrt(Σ halfwidth²) / n_tasks. ``task`` becomes ``label(λ)`` (one panel row per λ
    in :func:`sitelens.plotting.patching_curves`)."""
    label = label or (lambda lam: f"mean over tasks, λ = {lam:g}")
    df = intra.copy()
    df["seed"] = df["seed"].astype("Int64")
    df["half"] = (df["ci_high"] - df["ci_low"]) / 2
    keys = ["sparsity", "selection", "k", "seed"]
    g = df.groupby(keys, dropna=False, sort=False)
    out = g.agg(accuracy=("accuracy", "mean"), answer_prob=("answer_prob", "mean"),
                n=("n", "sum"), n_tasks=("task", "nunique"),
                half=("half", lambda h: float(np.sqrt((h**2).sum()) / len(h)))).reset_index()
    out["ci_low"] = (out["accuracy"] - out["half"]).clip(lower=0.0)
    out["ci_high"] = (out["accuracy"] + out["half"]).clip(upper=1.0)
    out["task"] = [label(lam) for lam in out["sparsity"]]
    out["model"] = df["model"].iloc[0] if "model" in df else ""
    cols = ["model", "task", "sparsity", "k", "selection", "seed", "accuracy", "ci_low",
            "ci_high", "answer_prob", "n", "n_tasks"]
    return out[cols]


def intra_gaps(intra: pd.DataFrame, ks: Sequence[int]) -> pd.DataFrame:
    """Per (sparsity, task, k): accuracy of top-k, bottom-k, random-k (mean over seeds), the gap
    top − bottom, and the zero-shot / SITE references. Includes a ``task = "mean"`` row per k."""
    rows = []
    for (lam, task), sub in intra.groupby(["sparsity", "task"], sort=False):
        zs = float(sub.loc[sub.selection == "zero_shot", "accuracy"].mean())
        site = float(sub.loc[sub.selection == "site", "accuracy"].mean())
        for k in ks:
            at = sub[sub["k"] == k]
            acc = {s: float(at.loc[at.selection == s, "accuracy"].mean())
                   for s in ("top", "bottom", "random")}
            rows.append({"sparsity": lam, "task": task, "k": k, **acc,
                         "gap": acc["top"] - acc["bottom"], "zero_shot": zs, "site": site,
                         "n": int(sub["n"].iloc[0])})
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    mean = (df.groupby(["sparsity", "k"], sort=False)
            [["top", "bottom", "random", "gap", "zero_shot", "site"]].mean().reset_index())
    mean["task"] = "mean"
    mean["n"] = df.groupby(["sparsity", "k"], sort=False)["n"].sum().to_numpy()
    return pd.concat([df, mean[df.columns]], ignore_index=True)


def target_centred(matrix: pd.DataFrame) -> pd.DataFrame:
    """A transfer matrix (rows = source A, columns = target B) minus, per target B, the mean over
    the other sources A ≠ B (the diagonal becomes NaN). Removes how easy B is for any α, so that
    what is left is how much better A's heads carry B than other tasks' heads do."""
    A = matrix.to_numpy(dtype=float).copy()  # [T, T]
    np.fill_diagonal(A, np.nan)
    with np.errstate(invalid="ignore"):
        A = A - np.nanmean(A, axis=0, keepdims=True)
    return pd.DataFrame(A, index=matrix.index, columns=matrix.columns)


def by_target_family(matrix: pd.DataFrame, groups: dict[str, str]) -> dict:
    """Per family with ≥ 2 tasks: mean transfer to its tasks from sources of the same family
    (A ≠ B) vs from sources of other families."""
    names = [n for n in matrix.index if n in groups and n in matrix.columns]
    out = {}
    for fam in dict.fromkeys(groups[n] for n in names):
        members = [n for n in names if groups[n] == fam]
        if len(members) < 2:
            continue
        same = [matrix.loc[a, b] for b in members for a in members if a != b]
        other = [matrix.loc[a, b] for b in members for a in names if groups[a] != fam]
        out[fam] = {"from_same_family": _r(np.nanmean(same)),
                    "from_other_families": _r(np.nanmean(other) if other else float("nan"))}
    return out


def _r(x, nd: int = 4):
    try:
        x = float(x)
    except (TypeError, ValueError):
        return x
    return None if not math.isfinite(x) else round(x, nd)


def summarize_model(run: ModelRun) -> dict:
    """The measured numbers of one model: high- vs low-α gaps (per λ, at ``gap_ks``), transfer
    within vs between families (raw, over zero-shot), α similarity within vs between, the
    α-similarity / transfer Spearman (Mantel p), and effect–α Spearman per task."""
    cfg = run.config
    ks = {str(g): gap_k(g, run.n_total) for g in cfg.gap_ks}
    gaps = intra_gaps(run.intra, sorted(set(ks.values())))
    intra = {}
    for lam in cfg.sparsity:
        d = {}
        for spec, k in ks.items():
            m = gaps[(gaps.sparsity == lam) & (gaps.task == "mean") & (gaps.k == k)]
            if m.empty:
                continue
            r = m.iloc[0]
            per_task = gaps[(gaps.sparsity == lam) & (gaps.task != "mean") & (gaps.k == k)]
            d[f"k={spec}"] = {"k": k, "top": _r(r.top), "bottom": _r(r.bottom),
                              "random": _r(r.random), "gap": _r(r.gap),
                              "tasks_top_gt_bottom": int((per_task.gap > 0).sum()),
                              "n_tasks": len(per_task)}
        sub = gaps[(gaps.sparsity == lam) & (gaps.task == "mean")]
        d["zero_shot"] = _r(sub.zero_shot.iloc[0]) if len(sub) else None
        d["site"] = _r(sub.site.iloc[0]) if len(sub) else None
        intra[f"{lam:g}"] = d

    fam = {t: TASK_FAMILIES.get(t, t) for t in cfg.tasks}
    transfer = {}
    for mode, norm in (("alpha", "none"), ("alpha", "zero_shot"), ("topk", "none")):
        wb = within_between(transfer_matrix(run.inter, mode=mode, normalize=norm), fam)
        transfer[f"{mode}" + ("" if norm == "none" else f"_minus_{norm}")] = {
            k: _r(v) for k, v in wb.items()}
    for mode in ("alpha", "topk"):
        wb = within_between(target_centred(transfer_matrix(run.inter, mode=mode)), fam)
        transfer[f"{mode}_target_centred"] = {k: _r(v) for k, v in wb.items()}
    transfer["alpha_by_target_family"] = by_target_family(
        transfer_matrix(run.inter, mode="alpha"), fam)
    diag = np.diag(transfer_matrix(run.inter, mode="alpha").to_numpy(dtype=float))
    transfer["diagonal_mean"] = _r(np.nanmean(diag))
    sim = {}
    for name, mat in run.similarity.items():
        sim[name] = {k: _r(v) for k, v in within_between(mat, fam).items()}
    corr = {}
    for name in ("spearman", "jaccard_topk", "cosine"):
        for norm in ("none", "zero_shot"):
            c = transfer_similarity_correlation(run.similarity[name], run.inter, mode="alpha",
                                                normalize=norm, seed=cfg.seed)
            corr[f"{name}" + ("" if norm == "none" else f"_minus_{norm}")] = {
                "rho": _r(c["rho"]), "p_value": _r(c["p_value"]), "n_pairs": c["n_pairs"]}
    effects = {}
    for task, df in run.effects.items():
        eff = torch.tensor(df["effect"].to_numpy()).reshape(run.n_layers, run.n_heads)
        d = dict(run.effect_stats.get(task, {}))
        for lam, ads in run.adapters.items():
            if task in ads:
                d[f"rho_alpha_{_lam(lam)}"] = effect_alpha_correlation(eff, ads[task].alpha)
        effects[task] = {k: _r(v) for k, v in d.items()}
    return {
        "model": run.model,
        "n_layers": run.n_layers,
        "n_heads": run.n_heads,
        "n_heads_total": run.n_total,
        "main_sparsity": cfg.main_sparsity,
        "intra_tasks": list(cfg.intra_tasks),
        "tasks": list(cfg.tasks),
        "intra": intra,
        "transfer": transfer,
        "alpha_similarity": sim,
        "similarity_transfer_spearman": corr,
        "effects": effects,
        "compute_seconds": _r(math.fsum(run.timings.values()), 1),  # order-independent
    }


def summary_rows(summary: dict) -> pd.DataFrame:
    """The nested per-model summary as a long table ``model, metric, value``."""
    rows = []

    def walk(prefix: str, obj, model: str):
        if isinstance(obj, dict):
            for k, v in obj.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v, model)
        elif not isinstance(obj, list):
            rows.append({"model": model, "metric": prefix, "value": obj})

    for m in summary.get("models", []):
        walk("", {k: v for k, v in m.items() if k not in ("model", "config")}, m["model"])
    return pd.DataFrame(rows, columns=["model", "metric", "value"])


def headline(summary: dict) -> pd.DataFrame:
    """The headline numbers of a :func:`make_figures` summary, one row per (model, λ): mean
    first-token accuracy with the task embedding injected into the top-k vs bottom-k vs random k
    heads by α (at each ``gap_ks``), SITE and zero-shot, and (main λ) transfer within vs between
    families and the α-similarity / transfer Spearman ρ."""
    rows = []
    for m in summary.get("models", []):
        for lam, d in m["intra"].items():
            row = {"model": m["model"], "sparsity": float(lam)}
            for key, v in d.items():
                if key.startswith("k="):
                    tag = key[2:]
                    row.update({f"top@{tag}": v["top"], f"bottom@{tag}": v["bottom"],
                                f"random@{tag}": v["random"], f"k@{tag}": v["k"]})
            row.update({"site": d.get("site"), "zero_shot": d.get("zero_shot")})
            if float(lam) == float(m["main_sparsity"]):
                tr = m["transfer"]["alpha"]
                tc = m["transfer"].get("alpha_target_centred", {})
                row.update({"transfer_within": tr["within"], "transfer_between": tr["between"],
                            "transfer_within_centred": tc.get("within"),
                            "transfer_between_centred": tc.get("between"),
                            "rho_similarity_transfer":
                                m["similarity_transfer_spearman"]["spearman"]["rho"]})
            rows.append(row)
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------------------------
# figures


def _alpha_long(adapters: dict[str, SiteAdapter], lam: float) -> pd.DataFrame:
    frames = []
    for task, ad in adapters.items():
        a = ad.alpha.detach().float().cpu()  # [n_layers, n_heads]
        layer, head = np.divmod(np.arange(a.numel()), a.shape[1])
        frames.append(pd.DataFrame({"task": task, "sparsity": lam, "layer": layer, "head": head,
                                    "alpha": a.flatten().numpy()}))
    return pd.concat(frames, ignore_index=True)


def model_figures(run: ModelRun) -> dict[str, tuple]:
    """``{name: (figure, csv_frame)}`` for one model (figures from :mod:`sitelens.plotting`)."""
    cfg = run.config
    main = cfg.main_sparsity
    m = run.model
    ads = run.adapters[main]
    out: dict[str, tuple] = {}

    heat = cfg.heatmap_task
    lam_all = [lam for lam in cfg.sparsity if heat in run.adapters[lam]]
    out[f"alpha_heatmap_{heat}"] = (
        alpha_heatmap(ads[heat].alpha, f"{m}: SITE α on {heat} (λ = {main:g})"),
        pd.concat([_alpha_long({heat: run.adapters[lam][heat]}, lam) for lam in lam_all],
                  ignore_index=True),
    )

    order = cluster_order(run.similarity["spearman"])
    out["alpha_facets"] = (
        alpha_facets({t: ads[t].alpha for t in order}, cols=5,
                     title=f"{m}: α per head across tasks (λ = {main:g}; one colour scale; "
                           "clustered by α similarity)"),
        _alpha_long({t: ads[t] for t in order}, main),
    )

    for task, df in run.effects.items():
        eff = torch.tensor(df["effect"].to_numpy()).reshape(run.n_layers, run.n_heads)
        frame = df[["model", "task", "layer", "head", "effect"]].copy()
        for lam in cfg.sparsity:
            if task in run.adapters[lam]:
                frame[f"alpha_{_lam(lam)}"] = run.adapters[lam][task].alpha.flatten().numpy()
        out[f"effect_vs_alpha_{task}"] = (
            effect_vs_alpha(eff, ads[task].alpha,
                            title=f"{m}, {task}: causal effect (corrupted {cfg.n_shots}-shot, "
                                  f"{cfg.effect_prompts} prompts) vs α (λ = {main:g})"),
            frame,
        )

    intra = run.intra
    mean = intra_mean(intra)
    n_t = len(cfg.intra_tasks)
    out["patching_curves"] = (
        patching_curves(mean, f"{m}: intra-task patching, mean over {n_t} tasks (rows: λ)"),
        mean,
    )
    for lam in cfg.sparsity:
        sub = intra[intra.sparsity == lam]
        out[f"patching_curves_tasks_{_lam(lam)}"] = (
            patching_curves(sub, f"{m}: intra-task patching per task (λ = {lam:g})"),
            sub,
        )
    gaps = intra_gaps(intra, intra_ks(run.n_total, cfg))
    out["patching_gaps"] = (None, gaps)

    out["inter_accuracy"] = (
        matrix_heatmap(run.inter, f"{m}: inject B's embedding through A's α (accuracy on B)",
                       order=order, mode="alpha", zmin=0, zmax=1),
        run.inter,
    )
    out["inter_accuracy_topk"] = (
        matrix_heatmap(run.inter, f"{m}: inject B's embedding into A's top-{cfg.inter_k} heads "
                                  "(α = 1; accuracy on B)",
                       order=order, mode="topk", zmin=0, zmax=1),
        run.inter,
    )
    sim = run.similarity
    long = pd.concat(
        [sim[name].stack().rename(name) for name in sim], axis=1
    ).rename_axis(["task_a", "task_b"]).reset_index()
    out["alpha_similarity"] = (
        matrix_heatmap(sim["spearman"], f"{m}: α-map similarity (Spearman ρ over heads)",
                       order=order, value_name="Spearman ρ", zmin=-1, zmax=1,
                       colorscale="RdBu_r"),
        long,
    )
    return out


def png_export_error() -> str | None:
    """``None`` if plotly can export PNGs here (kaleido + a Chrome/Chromium), else why not. Points
    kaleido at the system Chromium (``BROWSER_PATH``) when that variable is unset."""
    if not os.environ.get("BROWSER_PATH"):
        for cand in ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome"):
            if Path(cand).exists():
                os.environ["BROWSER_PATH"] = cand
                break
    try:
        import kaleido  # noqa: F401
    except ImportError:
        return "kaleido is not installed (pip install 'sitelens[figures]')"
    if not (os.environ.get("BROWSER_PATH") or shutil.which("chromium")
            or shutil.which("google-chrome")):
        return "no Chrome/Chromium found (apt-get install chromium, or set BROWSER_PATH)"
    return None


def _start_kaleido_server() -> bool:
    """One browser for all exports (kaleido >= 1.0); older kaleido starts one per export."""
    try:
        import kaleido

        kaleido.start_sync_server(silence_warnings=True)
        return True
    except Exception:  # older kaleido, or a server already running
        return False


def notebook_renderer(preferred: str = "png") -> str:
    """Set plotly's default renderer for a notebook and return it: ``preferred`` (``"png"``:
    static images, which render on code hosts and keep notebooks small) when PNG export works
    here, else ``"notebook_connected"`` (interactive; plotly.js from a CDN)."""
    import plotly.io as pio

    renderer = preferred
    if "png" in preferred.split("+") and png_export_error() is not None:
        renderer = "notebook_connected"
    if "png" in renderer.split("+"):
        _start_kaleido_server()
    pio.renderers.default = renderer
    return renderer


class FigureWriter:
    """Writes figures as PNG (plotly + kaleido + Chromium) / HTML and their CSVs, atomically.
    If PNG export is unavailable, HTML + CSV are still written and :attr:`png_error` says why."""

    def __init__(self, formats: Sequence[str] = ("png", "html")):
        self.formats = tuple(formats)
        self.png_error: str | None = None
        self._server = False
        if "png" in self.formats:
            self.png_error = self._start_png()

    def _start_png(self) -> str | None:
        err = png_export_error()
        if err is None:
            self._server = _start_kaleido_server()
        return err

    def close(self) -> None:
        if self._server:
            import kaleido

            try:
                kaleido.stop_sync_server(silence_warnings=True)
            except Exception:
                pass
            self._server = False

    def write(self, fig, frame: pd.DataFrame | None, base: Path) -> list[str]:
        base.parent.mkdir(parents=True, exist_ok=True)
        written = []
        if frame is not None:
            _atomic_csv(frame, base.with_suffix(".csv"))
            written.append(base.with_suffix(".csv").name)
        if fig is None:
            return written
        if "html" in self.formats:
            target = base.with_suffix(".html")
            atomic_write_text(target, fig.to_html(include_plotlyjs="cdn", full_html=True))
            written.append(target.name)
        if "png" in self.formats and self.png_error is None:
            target = base.with_suffix(".png")
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # "kopts ignored if using a server"
                    png = fig.to_image(format="png", scale=1)
            except Exception as e:  # kaleido/Chromium failures vary
                self.png_error = f"PNG export failed: {type(e).__name__}: {e}"
            else:
                atomic_write(target, png)
                written.append(target.name)
        return written


@dataclass
class FiguresResult:
    """What :func:`make_figures` produced: the summary, the figures per model, where they are."""

    out_dir: Path
    summary: dict
    figures: dict[str, dict[str, object]]  # model -> name -> plotly Figure
    runs: dict[str, ModelRun]


def make_figures(
    out_dir: str | Path = "figures",
    models: Sequence[str] = DEFAULT_MODELS,
    tasks: Sequence[str] = FIGURE_TASKS,
    *,
    intra_tasks: Sequence[str] | None = INTRA_TASKS,
    effect_tasks: Sequence[str] = EFFECT_TASKS,
    heatmap_task: str = HEATMAP_TASK,
    limit: int | None = 40,
    sparsity: Sequence[float] = DEFAULT_SPARSITY,
    main_sparsity: float | None = None,
    seed: int = 0,
    n_examples: int = 200,
    n_prompts: int = 20,
    n_shots: int = 10,
    effect_prompts: int = 8,
    n_random_seeds: int = 3,
    n_boot: int = 1000,
    formats: Sequence[str] = ("png", "html"),
    threads: int | None = None,
    progress: bool = True,
) -> FiguresResult:
    """Reproduce ``out_dir`` from real runs on ``models`` (see the module docstring).

    Per model, under ``out_dir/{model}/``: ``alpha_heatmap_{task}``, ``alpha_facets``,
    ``effect_vs_alpha_{task}``, ``patching_curves`` (mean over the intra tasks, one row per λ),
    ``patching_curves_tasks_lam{λ}``, ``patching_gaps.csv``, ``inter_accuracy``,
    ``inter_accuracy_topk``, ``alpha_similarity`` — each ``.png`` + ``.html`` + ``.csv``. In
    ``out_dir``: ``summary.json`` and ``summary.csv``. Cells are cached in ``out_dir/.runs/``;
    rerunning after an interruption (or to regenerate figures) reuses them.

    ``sparsity``: the λ values of the intra-task experiment; ``main_sparsity`` (default
    ``max(sparsity)``) is the λ of the adapters used for the α maps, inter-task patching, α
    similarity and causal effects. ``limit``: test items per task. ``progress``: one line per step
    on stderr."""
    from sitelens.models import load_model

    if threads:
        torch.set_num_threads(threads)
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except PermissionError as e:
        raise OutputError(f"Cannot create {out}: {e.strerror}. Choose a writable out_dir.") from e
    cfg = FigureConfig(
        tasks=tuple(tasks), intra_tasks=None if intra_tasks is None else tuple(intra_tasks),
        effect_tasks=tuple(effect_tasks), heatmap_task=heatmap_task,
        sparsity=tuple(sparsity), main_sparsity=main_sparsity, limit=limit, seed=seed,
        n_examples=n_examples, n_prompts=n_prompts, n_shots=n_shots,
        effect_prompts=effect_prompts, n_random_seeds=n_random_seeds, n_boot=n_boot,
        formats=tuple(formats),
    ).resolved()
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
            run = run_model(model, out / ".runs" / _slug(name), cfg, log=log)
            del model
            runs[name] = run
            entry = dict(summarize_model(run), config=_config_dict(cfg),
                         numerics_version=NUMERICS_VERSION)
            _merge_model(summary, entry)
            figs = model_figures(run)
            figures[name] = {k: f for k, (f, _) in figs.items() if f is not None}
            for fname, (fig, frame) in figs.items():
                writer.write(fig, frame, out / _slug(name) / fname)
            log(f"{name}: figures written to {out / _slug(name)}")
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
    _atomic_text(json.dumps(summary, indent=1, default=str) + "\n", out / "summary.json")
    _atomic_csv(summary_rows(summary), out / "summary.csv")


__all__ = [
    "DEFAULT_MODELS", "FIGURE_TASKS", "INTRA_TASKS", "EFFECT_TASKS", "FigureConfig", "ModelRun",
    "FiguresResult", "FigureWriter", "fit_cell", "run_model", "intra_mean", "intra_gaps",
    "summarize_model", "summary_rows", "model_figures", "make_figures", "gap_k", "intra_ks",
    "png_export_error", "notebook_renderer", "headline", "target_centred", "by_target_family",
]
