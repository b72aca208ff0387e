"""The report of ``benchmarks/heads.py``: reads ``results/heads/{model}/{task}/`` and writes

- ``results/heads_exact_vs_fast.{csv,md}``: every fast lens against exact activation patching
  (``effect``) per model × task: Spearman, top-10 recall, forward/backward passes, seconds; and
  **certified top-k** with AtP / AtP* as the candidate lens;
- ``results/heads_schedule.{csv,md}``: the intra-task experiment at λ = 0 (top-10 / bottom-10 /
  random-10 α heads, default vs official schedule, over fit seeds), α's seed stability, and the
  top-10 heads of every lens injected with α = 1;
- ``results/heads_agreement.{csv,md}`` and ``results/heads_lens_agreement.{png,html,csv}``: Spearman and
  top-10 Jaccard of every pair of lenses, averaged over tasks (with the spread over tasks);
- ``figures/{model}/alpha_uncertainty_antonym`` (α over seeds: mean, heads whose interval holds
  0.5 masked, interval width) and ``figures/{model}/lens_maps_antonym`` (every lens, percentile
  ranks on one colour scale).

Certified top-k (:func:`sitelens.lenses.compare.certify_top_k`): rank heads by the fast lens;
verify exactly (one row per head and prompt, as ``effect`` does) the best-ranked heads, k at a
time, up to 15% of the full exact run's rows; the residual bound ``r`` is the largest |exact − fast| among
verified heads; the exact top-k is *certified* when the k-th best verified exact effect exceeds
``fast + r`` of every unverified head. The exact values of the verified heads are read from the
full exact run (each row of that run is one head on one prompt, independent of the other rows, so
verifying a subset gives the same numbers); the cost is counted as the rows that subset needs.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from sitelens.eval.metrics import bootstrap_ci, correlation
from sitelens.lenses import HeadScores
from sitelens.lenses.compare import certify_top_k, lens_agreement, top_k_indices
from sitelens.lenses.plots import agreement_matrix, alpha_uncertainty, lens_maps
from sitelens.pipelines.experiment import md_table

FAST = ("alpha", "alpha-official", "alpha-grad", "atp", "atp-star", "ablation-mean",
        "ablation-zero", "dla")
ORDER = ("effect", "atp", "atp-star", "alpha-grad", "alpha", "alpha-official", "ablation-mean",
         "ablation-zero", "dla")


def load_units(out: Path) -> dict[tuple[str, str], dict]:
    units = {}
    for meta in sorted((out / "heads").glob("*/*/meta.json")):
        d = meta.parent
        if ".stale-" in d.name or ".tmp" in d.name:
            continue
        units[(d.parent.name, d.name)] = {
            "scores": pd.read_csv(d / "scores.csv"),
            "intra": pd.read_csv(d / "intra.csv"),
            "stability": pd.read_csv(d / "stability.csv"),
            "meta": json.loads(meta.read_text()),
        }
    return units


def _map(scores: pd.DataFrame, lens: str) -> np.ndarray:
    d = scores[scores.lens == lens].sort_values(["layer", "head"])
    return d["score"].to_numpy(dtype=float)


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    return correlation(a, b, "spearman")


def certified(fast: np.ndarray, exact: np.ndarray, n_prompts: int, k: int = 10,
              budget: float = 0.15, rule: str = "absolute") -> dict:
    """:func:`sitelens.lenses.compare.certify_top_k` with the exact values read from the full
    exact run; rows counted as :func:`~sitelens.lenses.compare.certified_top_k` runs them (one
    unpatched row per prompt, then one per verified head and prompt). ``budget`` is a share of
    the full exact run's rows ``(n_heads + 1) × n_prompts``."""
    n = len(fast)
    max_heads = int(np.floor(budget * (n + 1))) - 1
    c = certify_top_k(fast, lambda idx: exact[np.asarray(idx)], k=k, budget=max_heads / n, rule=rule)
    found = set(c["top"]) & top_k_indices(exact, k)
    return {"verified": len(c["verified"]), "verified_share": len(c["verified"]) / n,
            "recall": len(found) / k, "certified": c["certified"], "rounds": c["rounds"],
            "rows": (len(c["verified"]) + 1) * n_prompts}


def exact_vs_fast(units, k: int = 10) -> tuple[pd.DataFrame, pd.DataFrame]:
    rows, cert = [], []
    for (model, task), u in units.items():
        s = u["scores"]
        ex = _map(s, "effect")
        e_row = s[s.lens == "effect"].iloc[0]
        n_heads = len(ex)
        meta = json.loads(e_row["meta"])
        for lens in FAST:
            if lens not in set(s.lens):
                continue
            f = _map(s, lens)
            r = s[s.lens == lens].iloc[0]
            rows.append({"model": model, "task": task, "lens": lens,
                         "spearman": _spearman(f, ex),
                         f"top{k}_recall": len(top_k_indices(f, k) & top_k_indices(ex, k)) / k,
                         "forward_passes": int(r.forward_passes),
                         "backward_passes": int(r.backward_passes), "seconds": float(r.seconds),
                         "exact_forward_passes": int(e_row.forward_passes),
                         "exact_rows": int(meta["rows"]), "exact_seconds": float(e_row.seconds)})
        for lens in ("atp", "atp-star"):
            for rule in ("absolute", "relative"):
                if lens in set(s.lens):
                    c = certified(_map(s, lens), ex, meta["n_prompts"], k, rule=rule)
                    cert.append({"model": model, "task": task, "lens": lens, "rule": rule, **c,
                                 "exact_rows_share": c["rows"] / meta["rows"], "n_heads": n_heads})
    return pd.DataFrame(rows), pd.DataFrame(cert)


def agreement(units, k: int = 10) -> pd.DataFrame:
    table = HeadScores.concat([HeadScores(u["scores"]) for u in units.values()])
    return lens_agreement(table, k, lenses=list(ORDER))


def _boot_mean(x) -> tuple[float, float, float]:
    """Mean over tasks and its 95% percentile bootstrap CI (2,000 seeded resamples)."""
    x = np.asarray(x, dtype=float)
    x = x[np.isfinite(x)]
    lo, hi = bootstrap_ci(x, n_boot=2000, seed=0)
    return (float(x.mean()) if len(x) else float("nan")), lo, hi


def schedule(units, k: int = 10) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(per model × schedule × selection: mean first-token accuracy over tasks, 95% bootstrap CI
    over tasks of the seed-averaged accuracy; per model × lens: the lens's top-k / bottom-k;
    per model × schedule: seed stability)."""
    intra = pd.concat([u["intra"].assign(model_key=m) for (m, _), u in units.items()],
                      ignore_index=True)
    a = intra[intra.kind == "alpha_fit"]
    a = a[(a.k == k) | a.selection.isin(["site", "zero_shot"])]
    per_task = a.groupby(["model_key", "schedule", "selection", "task"])["accuracy"].mean()
    rows = []
    for model in sorted(set(a.model_key)):
        am = a[a.model_key == model]
        paired = sorted(set(am[am.schedule == "official"].task) & set(am[am.schedule == "default"].task))
        groups = [("default", "default", paired), ("official", "official", paired),
                  ("default", "default (all tasks)", sorted(set(am.task)))]
        for sched, label, tasks in groups:
            if not tasks:
                continue
            for sel in sorted(set(am.selection)):
                try:
                    g = per_task.loc[(model, sched, sel)]
                except KeyError:
                    continue
                g = g[g.index.isin(tasks)]
                m, lo, hi = _boot_mean(g.to_numpy())
                n_fits = am[am.schedule == sched].fit_seed.nunique()
                rows.append({"model": model, "schedule": label, "selection": sel, "accuracy": m,
                             "ci_low": lo, "ci_high": hi, "n_tasks": len(g), "n_seeds": n_fits,
                             "tasks": " ".join(tasks)})
    sched_df = pd.DataFrame(rows)
    lt = intra[(intra.kind == "lens_topk") & (intra.k == k)]
    per = lt.groupby(["model_key", "lens", "selection", "task"])["accuracy"].mean()
    rows = []
    for (model, lens, sel), g in per.groupby(level=[0, 1, 2]):
        m, lo, hi = _boot_mean(g.to_numpy())
        rows.append({"model": model, "lens": lens, "selection": sel, "accuracy": m,
                     "ci_low": lo, "ci_high": hi, "n_tasks": len(g)})
    lens_df = pd.DataFrame(rows)
    st = pd.concat([u["stability"].assign(model=m, task=t) for (m, t), u in units.items()],
                   ignore_index=True)
    stab = st.groupby(["model", "schedule"]).agg(
        spearman=("spearman", "mean"), spearman_min=("spearman", "min"),
        **{f"top{k}_jaccard": (f"top{k}_jaccard", "mean")}, pairs=("spearman", "size")).reset_index()
    return sched_df, lens_df, stab


def write_report(out: Path, figures: Path, k: int = 10, heatmap_task: str = "antonym") -> None:
    from sitelens.io import atomic_write_csv, atomic_write_text
    from sitelens.viz.export import FigureWriter

    units = load_units(out)
    if not units:
        print("no units yet")
        return
    evf, cert = exact_vs_fast(units, k)
    agree = agreement(units, k)
    sched, lens_top, stab = schedule(units, k)
    atomic_write_csv(out / "heads_exact_vs_fast.csv", evf)
    atomic_write_csv(out / "heads_certified_topk.csv", cert)
    atomic_write_csv(out / "heads_agreement.csv", agree)
    atomic_write_csv(out / "heads_schedule.csv", sched)
    atomic_write_csv(out / "heads_lens_topk.csv", lens_top)
    atomic_write_csv(out / "heads_stability.csv", stab)

    summ = evf.groupby(["model", "lens"]).agg(
        tasks=("task", "size"), spearman_median=("spearman", "median"),
        spearman_min=("spearman", "min"), tasks_rho_ge_0_8=("spearman", lambda x: int((x >= 0.8).sum())),
        **{f"top{k}_recall": (f"top{k}_recall", "mean")},
        forward=("forward_passes", "median"), backward=("backward_passes", "median"),
        seconds=("seconds", "median"), exact_forward=("exact_forward_passes", "median"),
        exact_rows=("exact_rows", "median"), exact_seconds=("exact_seconds", "median"),
    ).reset_index().round(3)
    csum = cert.groupby(["model", "lens", "rule"]).agg(
        tasks=("task", "size"), recall=("recall", "mean"), certified=("certified", "sum"),
        verified_share=("verified_share", "mean"), exact_rows_share=("exact_rows_share", "mean"),
    ).reset_index().round(3)
    tasks = sorted({t for _, t in units})
    models = sorted({m for m, _ in units})
    atomic_write_text(out / "heads_exact_vs_fast.md", "\n".join([
        "# Exact vs fast head-importance lenses", "",
        f"Models: {', '.join(models)}; tasks ({len(tasks)}): {', '.join(tasks)}. Written by "
        "`python benchmarks/heads.py` (see its docstring for every setting); per-task rows in "
        "`heads_exact_vs_fast.csv`.", "",
        "Each fast lens against exact activation patching (`effect`, one forward row per head and "
        "corrupted prompt): Spearman over all heads (median and minimum over tasks, tasks with "
        f"ρ ≥ 0.8), mean top-{k} recall; passes and seconds are medians per task (forward passes "
        "are calls of the model: prefix-cache passes plus last-token passes; `exact_rows` are the "
        "single-token rows those passes ran).", "", md_table(summ), "",
        f"## Certified top-{k}", "",
        "Candidates ranked by AtP / AtP*; the best-ranked heads are verified exactly until the "
        f"exact top-{k} is certified (the k-th verified exact effect above every unverified head's "
        "bound: rule `absolute`, fast score + the largest residual seen; rule `relative`, fast "
        "score × (1 + the largest relative residual seen)) or the verification has used 15% of "
        "the full exact run's rows. "
        f"`recall`: share of the exact top-{k} found; `certified`: tasks where the certificate "
        "held within the budget; `exact_rows_share`: exact rows needed / rows of the full exact "
        "run.", "", md_table(csum), ""]))

    def fmt(r):
        return f"{r.accuracy:.3f} [{r.ci_low:.3f}, {r.ci_high:.3f}]"

    sp = sched.assign(v=sched.apply(fmt, axis=1)).pivot_table(
        index=["model", "schedule"], columns="selection", values="v", aggfunc="first").reset_index()
    lp = lens_top.assign(v=lens_top.apply(fmt, axis=1)).pivot_table(
        index=["model", "lens"], columns="selection", values="v", aggfunc="first").reset_index()
    atomic_write_text(out / "heads_schedule.md", "\n".join([
        "# Does α pick the heads that carry the task? (λ = 0)", "",
        f"Intra-task patching ({len(tasks)} tasks, first-token accuracy on the first 40 test "
        f"items): inject the task embedding with α = 1 into only the top-{k}, bottom-{k} or "
        f"{k} random heads (3 draws) by the fitted α, or the full α (`site`). `default`: "
        "`FitConfig()` (50 steps of batch 8, the best-validation α); `official`: the paper code's "
        "schedule (400 steps of batch 1, the final α), fitted on the first tasks only; both rows "
        "`default` and `official` are over the same tasks (those with official fits), "
        "`default (all tasks)` over all. Mean over tasks of the seed-averaged accuracy, 95% "
        "bootstrap CI over tasks. Written by `python benchmarks/heads.py`.", "",
        md_table(sp), "", "## α's stability over seeds", "",
        f"Mean (and minimum) Spearman of every pair of fit seeds, mean top-{k} Jaccard.", "",
        md_table(stab.round(3)), "", f"## The top-{k} heads of every lens", "",
        f"The same injection (α = 1, the first default fit's embedding) into the top-{k} / "
        f"bottom-{k} heads of each lens's map.", "", md_table(lp), ""]))

    fig, frame = agreement_matrix(agree, list(ORDER))
    figures.mkdir(parents=True, exist_ok=True)
    w = FigureWriter()
    try:
        w.write(fig, frame, out / "heads_lens_agreement")  # beside the tables (and their plotly.js)
        for (model, task), u in units.items():
            if task != heatmap_task:
                continue
            hs = HeadScores(u["scores"])
            w.write(alpha_uncertainty(hs, "alpha"), hs.lens("alpha").df,
                    figures / model / f"alpha_uncertainty_{task}")
            w.write(lens_maps(hs, [x for x in ORDER if x in hs.lenses]), hs.df,
                    figures / model / f"lens_maps_{task}")
    finally:
        w.close()
    mean = frame[frame.lens_a < frame.lens_b]
    atomic_write_text(out / "heads_agreement.md", "\n".join([
        "# Agreement across lenses", "",
        f"Spearman ρ between the head maps of every pair of lenses, mean ± sd over {len(tasks)} "
        f"tasks (per-task rows with top-{k} Jaccard: `heads_agreement.csv`; figure: "
        "`heads_lens_agreement.png`).", "",
        md_table(mean.round(3)[["model", "lens_a", "lens_b", "spearman_mean", "spearman_sd"]]), ""]))
    print(f"report: {len(units)} units -> {out}")
