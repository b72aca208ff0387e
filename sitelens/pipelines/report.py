"""What a figures run measured and shows: the summary numbers and the figures of one model's run
(a :class:`~sitelens.pipelines.figure_config.ModelRun`), rebuilt from its cells in seconds.

- :func:`summarize_model`: high- vs low-α gaps (per λ, at ``gap_ks``), transfer within vs between
  families, α similarity within vs between, α-similarity / transfer Spearman (Mantel p), and
  effect–α Spearman per task; :func:`summary_rows` flattens a summary into a long table and
  :func:`headline` picks its headline numbers.
- :func:`model_figures`: ``{name: (plotly Figure, CSV frame)}`` from :mod:`sitelens.viz.plotting`.
- the summary files of a figures directory: ``summary.json`` (one entry per model, each with the
  config that made it; other models' entries are kept) and ``summary.csv`` (:func:`summary_rows`).

The statistics themselves are in :mod:`sitelens.patching.analysis`.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from sitelens.errors import OutputError
from sitelens.format import round_or_none, round_values
from sitelens.io import atomic_write_csv, atomic_write_text
from sitelens.patching import default_ks
from sitelens.patching.analysis import (
    TASK_FAMILIES,
    by_target_family,
    effect_alpha_correlation,
    intra_gaps,
    intra_mean,
    paired_gaps,
    target_centred,
    transfer_matrix,
    transfer_similarity_correlation,
    within_between,
)
from sitelens.pipelines.figure_config import FigureConfig, ModelRun
from sitelens.site import SiteAdapter
from sitelens.viz.plotting import (
    alpha_facets,
    alpha_heatmap,
    cluster_order,
    effect_vs_alpha,
    matrix_heatmap,
    patching_curves,
)


def gap_k(spec: str | int, n_total: int) -> int:
    """``10`` → 10 heads; ``"5%"`` → 5% of all heads (rounded, at least 1)."""
    if isinstance(spec, str) and spec.endswith("%"):
        return max(1, min(n_total, round(float(spec[:-1]) / 100 * n_total)))
    return max(1, min(n_total, int(spec)))


def intra_ks(n_total: int, cfg: FigureConfig) -> list[int]:
    """1, 2, 4, …, all heads, plus the k of ``cfg.gap_ks``."""
    ks = set(default_ks(n_total)) | {gap_k(g, n_total) for g in cfg.gap_ks}
    return sorted(ks)


def lambda_tag(sparsity: float) -> str:
    """The λ part of cell and figure names: ``lam0``, ``lam5``, ``lam0.5``."""
    return f"lam{sparsity:g}"


# ----------------------------------------------------------------------------------------------
# summary


def summarize_model(run: ModelRun) -> dict:
    """The measured numbers of one model: high- vs low-α gaps (per λ, at ``gap_ks``), transfer
    within vs between families (raw, over zero-shot), α similarity within vs between, the
    α-similarity / transfer Spearman (Mantel p), and effect–α Spearman per task. Numbers are
    rounded to 4 digits; NaN becomes ``None``."""
    cfg = run.config
    families = {t: TASK_FAMILIES.get(t, t) for t in cfg.tasks}
    return {
        "model": run.model,
        "n_layers": run.n_layers,
        "n_heads": run.n_heads,
        "n_heads_total": run.n_total,
        "main_sparsity": cfg.main_sparsity,
        "intra_tasks": list(cfg.intra_tasks),
        "tasks": list(cfg.tasks),
        "intra": _intra_summary(run),
        "transfer": _transfer_summary(run.inter, families),
        "alpha_similarity": {
            name: round_values(within_between(mat, families)) for name, mat in run.similarity.items()
        },
        "similarity_transfer_spearman": _similarity_transfer_summary(run),
        "effects": _effects_summary(run),
        "compute_seconds": round_or_none(math.fsum(run.timings.values()), 1),  # order-independent
    }


def _norm_suffix(normalize: str) -> str:
    return "" if normalize == "none" else f"_minus_{normalize}"


def _intra_summary(run: ModelRun) -> dict:
    """Per λ: top / bottom / random accuracy and their gap at each ``gap_ks`` (mean over the intra
    tasks, the gap's paired 95% bootstrap interval over those tasks, and how many tasks have
    top > bottom), and the zero-shot / SITE references."""
    ks = {str(g): gap_k(g, run.n_total) for g in run.config.gap_ks}
    gaps = intra_gaps(run.intra, sorted(set(ks.values())))
    paired = paired_gaps(gaps, seed=run.config.seed)  # top − bottom over the tasks
    intra = {}
    for lam in run.config.sparsity:
        d = {}
        for spec, k in ks.items():
            m = gaps[(gaps.sparsity == lam) & (gaps.task == "mean") & (gaps.k == k)]
            if m.empty:
                continue
            r = m.iloc[0]
            per_task = gaps[(gaps.sparsity == lam) & (gaps.task != "mean") & (gaps.k == k)]
            gap = paired[(paired.sparsity == lam) & (paired.k == k)].iloc[0]
            d[f"k={spec}"] = {"k": k, **round_values({"top": r.top, "bottom": r.bottom,
                                                  "random": r.random, "gap": r.gap,
                                                  "gap_ci_low": gap.ci_low, "gap_ci_high": gap.ci_high}),
                              "tasks_top_gt_bottom": int((per_task.gap > 0).sum()),
                              "n_tasks": len(per_task)}
        sub = gaps[(gaps.sparsity == lam) & (gaps.task == "mean")]
        d["zero_shot"] = round_or_none(sub.zero_shot.iloc[0]) if len(sub) else None
        d["site"] = round_or_none(sub.site.iloc[0]) if len(sub) else None
        intra[f"{lam:g}"] = d
    return intra


def _transfer_summary(inter: pd.DataFrame, families: dict[str, str]) -> dict:
    """Inter-task transfer within vs between families: raw, over zero-shot, target-centred, per
    target family, and the mean of the diagonal (SITE itself)."""
    transfer = {}
    for mode, norm in (("alpha", "none"), ("alpha", "zero_shot"), ("topk", "none")):
        wb = within_between(transfer_matrix(inter, mode=mode, normalize=norm), families)
        transfer[mode + _norm_suffix(norm)] = round_values(wb)
    for mode in ("alpha", "topk"):
        wb = within_between(target_centred(transfer_matrix(inter, mode=mode)), families)
        transfer[f"{mode}_target_centred"] = round_values(wb)
    transfer["alpha_by_target_family"] = by_target_family(
        transfer_matrix(inter, mode="alpha"), families)
    diag = np.diag(transfer_matrix(inter, mode="alpha").to_numpy(dtype=float))
    transfer["diagonal_mean"] = round_or_none(np.nanmean(diag))
    return transfer


def _similarity_transfer_summary(run: ModelRun) -> dict:
    """Spearman ρ (Mantel p) of each α similarity vs α transfer, raw and over zero-shot."""
    corr = {}
    for name in ("spearman", "jaccard_topk", "cosine"):
        for norm in ("none", "zero_shot"):
            c = transfer_similarity_correlation(run.similarity[name], run.inter, mode="alpha",
                                                normalize=norm, seed=run.config.seed)
            corr[name + _norm_suffix(norm)] = {
                **round_values({"rho": c["rho"], "p_value": c["p_value"]}), "n_pairs": c["n_pairs"]}
    return corr


def _effects_summary(run: ModelRun) -> dict:
    """Per effect task: the run's stats and the Spearman ρ of the effects with α at every λ."""
    effects = {}
    for task, df in run.effects.items():
        eff = torch.tensor(df["effect"].to_numpy()).reshape(run.n_layers, run.n_heads)
        d = dict(run.effect_stats.get(task, {}))
        for lam, ads in run.adapters.items():
            if task in ads:
                d[f"rho_alpha_{lambda_tag(lam)}"] = effect_alpha_correlation(eff, ads[task].alpha)
        effects[task] = round_values(d)
    return effects


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
    """``{name: (figure, csv_frame)}`` for one model (figures from :mod:`sitelens.viz.plotting`).

    Long (about 70 lines) on purpose: one short block per figure of ``figures/{model}/``, in the
    order the docs list them, so that a figure and the frame behind it are read side by side."""
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
                frame[f"alpha_{lambda_tag(lam)}"] = run.adapters[lam][task].alpha.flatten().numpy()
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
        out[f"patching_curves_tasks_{lambda_tag(lam)}"] = (
            patching_curves(sub, f"{m}: intra-task patching per task (λ = {lam:g})"),
            sub,
        )
    gaps = intra_gaps(intra, intra_ks(run.n_total, cfg))
    out["patching_gaps"] = (None, gaps)
    out["patching_gaps_paired"] = (None, paired_gaps(gaps, seed=cfg.seed))

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


# ----------------------------------------------------------------------------------------------
# the summary files of a figures directory (summary.json, summary.csv)


def _config_dict(cfg: FigureConfig) -> dict:
    d = asdict(cfg)
    return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}


def _previous_summary(out: Path) -> dict:
    """``out/summary.json`` of earlier runs, each model entry carrying its own ``config`` (a file
    with one top-level config gets it copied into each entry)."""
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


__all__ = ["gap_k", "intra_ks", "lambda_tag", "summarize_model", "summary_rows", "headline",
           "model_figures"]
