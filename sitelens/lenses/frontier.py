"""The accuracy-vs-heads frontier: how few heads carry a task, found several ways.

:func:`frontier` fits full SITE once per seed (its embedding is the one every selector injects),
asks each selector (:mod:`sitelens.lenses.selectors`) for a set S_k per budget k, on train and
valid only, and injects each set two ways on the test split's zero-shot prompts:

- ``alpha1``: the task embedding with α = 1 on S_k only (the patching convention; the same rows as
  :func:`sitelens.patching.intra_task`'s ``top`` condition for S = the top-k of α);
- ``refit``: α re-fitted on S_k only (a k-head SITE adapter: the other heads' α held at 0) with
  :attr:`~sitelens.lenses.selectors.FrontierConfig.refit` (default: the full fit's config).

Accuracy: first-token accuracy with a 95% Wilson interval over items (``ci_low``, ``ci_high``), and
exact match of greedy generation, beside full SITE's and zero-shot first-token accuracy on the same
items. Cost columns: the selector's counted forward and backward passes and seconds
(``alpha`` is the full SITE fit: its cost; the other selectors share that fit's embedding and do not
pay for it); ``refit`` rows add their share of the refit: every distinct set of every selector is
re-fitted in one joint fit (:func:`~sitelens.lenses.joint_fit.fit_many`, the same fits as one by
one up to float rounding), whose counted passes and seconds are split evenly over the sets.

The answer (:attr:`FrontierResult.summary`): per selector and injection, k* = the smallest k whose
mean test accuracy (over seeds) reaches 90% of full SITE's (:func:`k_star`), else ``"not
reached"``; the stability of S_k (mean pairwise Jaccard over fit seeds, and against the sets chosen
on bootstrap resamples of the selection items), flagged ``unstable`` below
:data:`UNSTABLE_BELOW`; and the overlap between selectors (Jaccard of S_k, first seed).
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from itertools import combinations
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch import Tensor
from tqdm.auto import tqdm

from sitelens.eval.evaluation import evaluate
from sitelens.heads import head_label, mask_of
from sitelens.lenses.joint_fit import fit_many
from sitelens.lenses.registry import DEFAULT_BUDGETS
from sitelens.lenses.selectors import (
    SELECTORS,
    FrontierConfig,
    Selection,
    SelectionContext,
    check_budgets,
    check_task_splits,
    fit_site_counted,
    parse_selectors,
    select,
)
from sitelens.models import model_name
from sitelens.patching.engine import BackwardPassCounter, ForwardPassCounter, row_grid, run_rows
from sitelens.site.injection import HeadMix
from sitelens.site.training import LastTokenSet
from sitelens.stats import jaccard, wilson_interval
from sitelens.tasks import Task

COLUMNS = [
    "model", "task", "selector", "k", "injection", "heads", "first_token_acc", "exact_match",
    "ci_low", "ci_high", "full_site", "zero_shot", "forward_passes", "backward_passes", "seconds",
    "seed",
]
INJECTIONS = ("alpha1", "refit")
COST = ("forward_passes", "backward_passes", "seconds")
THRESHOLD = 0.9  # k*: the fraction of full SITE's accuracy to reach
UNSTABLE_BELOW = 0.5  # mean Jaccard under which a selector's sets are called unstable
NOT_REACHED = "not reached"


def _json_safe(x):
    """NaN and infinities as ``null`` (strict JSON), recursively."""
    if isinstance(x, dict):
        return {str(k): _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    if isinstance(x, (float, np.floating)):
        return float(x) if np.isfinite(x) else None
    if isinstance(x, np.integer):
        return int(x)
    return x


def k_star(ks: Sequence[int], accuracy: Sequence[float], full: float, threshold: float = THRESHOLD):
    """The smallest k whose accuracy reaches ``threshold`` × ``full`` (NaN accuracies never do),
    else :data:`NOT_REACHED`."""
    for k, a in sorted(zip(ks, accuracy)):
        if np.isfinite(a) and a >= threshold * full:
            return int(k)
    return NOT_REACHED


def mean_jaccard(sets: Sequence[Sequence[int] | None]) -> float:
    """Mean Jaccard over every pair of sets; NaN with fewer than two sets or a missing one."""
    if len(sets) < 2 or any(s is None for s in sets):
        return float("nan")
    return float(np.mean([jaccard(a, b) for a, b in combinations(sets, 2)]))


def inject_scores(model, items: LastTokenSet, weights: Tensor, embedding: Tensor, *,
                  batch_size: int = 128) -> np.ndarray:
    """Per condition and item: is the first answer token the argmax under the mix ``weights[c]``
    toward ``embedding`` (``[n_cond, n_items]`` bool), all conditions on one prefix cache."""
    n = len(items)
    item, cond = row_grid(weights.shape[0], n)
    correct, _ = run_rows(model, items.cache, items.last, items.answers, item, cond, weights,
                          embedding, batch_size=batch_size)
    return correct.reshape(weights.shape[0], n).numpy()


@dataclass
class FrontierResult:
    """The frontier of one model and task: ``table`` (:data:`COLUMNS`, one row per selector × k ×
    injection × seed), ``summary`` (k*, stability, overlap) and the selections themselves."""

    table: pd.DataFrame
    summary: dict
    selections: list[Selection] = field(default_factory=list)

    def figure(self, injection: str | None = None):
        """Test accuracy vs k, one line per selector (solid ``alpha1``, dashed ``refit``), 95%
        Wilson bands, full SITE and zero-shot as reference lines. Returns a plotly Figure."""
        import plotly.express as px
        import plotly.graph_objects as go

        t = self.table
        if injection is not None:
            t = t[t.injection == injection]
        g = (t.groupby(["selector", "injection", "k"], sort=False)
             [["first_token_acc", "ci_low", "ci_high"]].mean().reset_index())
        colors = px.colors.qualitative.Plotly
        fig = go.Figure()
        for i, sel in enumerate(dict.fromkeys(g.selector)):
            c = colors[i % len(colors)]
            for inj in dict.fromkeys(g.injection):
                d = g[(g.selector == sel) & (g.injection == inj)].sort_values("k")
                if d.empty:
                    continue
                ok = d.dropna(subset=["ci_low"])
                fig.add_trace(go.Scatter(
                    x=[*ok.k, *ok.k[::-1]], y=[*ok.ci_high, *ok.ci_low[::-1]], fill="toself",
                    fillcolor=c, opacity=0.15, line={"width": 0}, hoverinfo="skip",
                    showlegend=False, legendgroup=f"{sel}/{inj}"))
                fig.add_trace(go.Scatter(
                    x=d.k, y=d.first_token_acc, mode="lines+markers", name=f"{sel} ({inj})",
                    legendgroup=f"{sel}/{inj}",
                    line={"color": c, "dash": "solid" if inj == "alpha1" else "dash"}))
        for col, name, dash in (("full_site", "full SITE", "dot"), ("zero_shot", "zero-shot", "dashdot")):
            y = float(t[col].mean()) if len(t) else float("nan")
            fig.add_hline(y=y, line_dash=dash, line_color="black",
                          annotation_text=f"{name} {y:.2f}", annotation_position="top left")
        row = t.iloc[0] if len(t) else {"model": "", "task": ""}
        fig.update_layout(title=f"How few heads carry {row['task']} ({row['model']})",
                          xaxis={"title": "heads k", "type": "log"},
                          yaxis={"title": "test first-token accuracy", "range": [0, 1.02]})
        return fig

    def to_dir(self, out: str | Path) -> tuple[Path, Path]:
        """``out/frontier.csv`` and ``out/summary.json``, each written atomically."""
        from sitelens.io import atomic_write_text, ensure_dir

        out = ensure_dir(out)
        csv = atomic_write_text(out / "frontier.csv", self.table.to_csv(index=False))
        text = json.dumps(_json_safe(self.summary), indent=1, allow_nan=False)
        js = atomic_write_text(out / "summary.json", text)
        return csv, js


def resample_selection_items(task: Task, b: int) -> Task:
    """Bootstrap resample ``b`` of ``task``: its train and valid items drawn with replacement
    (seeded by ``b``, so resample b is the same everywhere); test untouched."""
    rng = random.Random(20_000 + b)
    return replace(task, train=[rng.choice(task.train) for _ in task.train],
                   valid=[rng.choice(task.valid) for _ in task.valid])


def frontier_sets(
    model, task: Task, *, budgets: Sequence[int] = DEFAULT_BUDGETS,
    selectors: Sequence[str] = SELECTORS, seed: int = 0, bootstrap: int | None = None,
    config: FrontierConfig | None = None, progress: bool = False,
) -> list[Selection]:
    """Only the selection half of :func:`frontier`: full SITE fitted at ``seed``, then every
    selector's S_k, nothing injected on test. ``bootstrap``: b, fit and select on
    :func:`resample_selection_items` ``(task, b)`` instead. The replicates whose Jaccard with the
    first seed's sets is the stability; ``alpha``'s cost includes the fit. Bad input raises before
    any work, as :func:`frontier` does."""
    cfg = config or FrontierConfig()
    selectors = parse_selectors(selectors)
    budgets = check_budgets(budgets, model.cfg.n_layers * model.cfg.n_heads)
    check_task_splits(task)
    t = task if bootstrap is None else resample_selection_items(task, bootstrap)
    adapter, fit_cost = fit_site_counted(model, t, cfg, seed, progress=progress)
    ctx = SelectionContext(model, t, adapter, cfg, seed, progress)
    out = [select(ctx, name, budgets) for name in selectors]
    for s in out:
        if s.selector == "alpha":
            for key in COST:
                setattr(s, key, getattr(s, key) + fit_cost.get(key, 0))
    return out


def _refit_all(ctx: SelectionContext, sets: list[tuple[int, ...]], cfg: FrontierConfig) -> dict:
    """α re-fitted on each head set (the others held at 0), every set at once
    (:func:`~sitelens.lenses.joint_fit.fit_many`: the same fits as one ``fit_many`` per set, up
    to float rounding). Returns
    ``{set: (weights [L, H], cost)}``; each set's cost is its share of the joint fit's counted
    passes and seconds (the total over the sets)."""
    if not sets:
        return {}
    shape = ctx.shape
    masks = torch.stack([mask_of(list(h), shape).flatten() for h in sets])  # [n_sets, L * H]
    fit = replace(cfg.refit or cfg.fit, seed=ctx.seed)
    with ForwardPassCounter(ctx.model) as fwd, BackwardPassCounter(ctx.model) as bwd:
        kept = fit_many(ctx.model, ctx.task, ctx.adapter.embedding, fit,
                        lambda x: torch.sigmoid(x) * masks.to(x.device), len(sets),
                        template=ctx.adapter.template, what="α on each head set",
                        max_rows=cfg.batch_size)
    n = len(sets)
    cost = {"forward_passes": fwd.count / n, "backward_passes": bwd.count / n, "seconds": fwd.seconds / n}
    w = torch.sigmoid(kept.reshape(n, -1)) * masks
    return {h: (w[i].reshape(shape), cost) for i, h in enumerate(sets)}


def _exact_match(model, task, cfg: FrontierConfig, weights: Tensor, embedding, template) -> np.ndarray:
    """Exact match per condition and item, greedy generation under each mix."""
    inter = {f"c{i}": HeadMix(w, embedding) for i, w in enumerate(weights)}
    res = evaluate(model, task, methods=list(inter), split="test", limit=cfg.test_limit,
                   template=template, interventions=inter, labels=None)
    return np.stack([res.loc[res.method == m, "correct"].to_numpy(float) for m in inter])


def _score_seed(ctx: SelectionContext, selections: list[Selection], budgets, injections, cfg,
                fit_cost: dict) -> list[dict]:
    """The rows of one seed: every (selector, k, injection) set injected on the test items, all in
    one batched first-token pass (and one generation per distinct mix for exact match)."""
    model, task = ctx.model, ctx.task
    L, H = ctx.shape
    items = task.test[: cfg.test_limit] if cfg.test_limit else task.test
    test = LastTokenSet.build(model, items, ctx.adapter.template)
    conds: list[dict] = []
    weights = [torch.zeros(L, H), ctx.adapter.alpha.float().cpu()]
    seen: dict[bytes, int] = {}  # identical mixes (the same set from two selectors) run once
    todo = {tuple(sorted(h)): None for s in selections for h in s.sets.values()
            if h is not None and "refit" in injections}
    refits = _refit_all(ctx, list(todo), cfg)
    for s in selections:
        base = dict(fit_cost) if s.selector == "alpha" else {}
        cost = {key: getattr(s, key) + base.get(key, 0) for key in COST}
        for k in budgets:
            heads = s.sets.get(k)
            for inj in injections:
                row = {"selector": s.selector, "k": k, "injection": inj, **cost,
                       "heads": "" if heads is None else ";".join(head_label(j, H) for j in heads)}
                if heads is not None:
                    if inj == "alpha1":
                        w = mask_of(heads, (L, H))
                    else:
                        w, rc = refits[tuple(sorted(heads))]
                        row.update({c: row[c] + rc[c] for c in rc})
                    key = w.float().numpy().tobytes()
                    if key not in seen:
                        seen[key] = len(weights)
                        weights.append(w)
                    row["_cond"] = seen[key]
                conds.append(row)
    W = torch.stack(weights)  # [n_cond, L, H]
    correct = inject_scores(model, test, W, ctx.adapter.embedding, batch_size=cfg.batch_size)
    n = correct.shape[1]
    acc = correct.mean(1)
    lo, hi = wilson_interval(correct.sum(1), n)
    em = (_exact_match(model, task, cfg, W, ctx.adapter.embedding, ctx.adapter.template).mean(1)
          if cfg.exact_match else np.full(len(W), np.nan))
    rows = []
    for row in conds:
        c = row.pop("_cond", None)

        def get(x, c=c):
            return float(x[c]) if c is not None else float("nan")

        rows.append({"model": model_name(model), "task": task.name, **row,
                     "first_token_acc": get(acc), "exact_match": get(em), "ci_low": get(lo),
                     "ci_high": get(hi), "full_site": float(acc[1]), "zero_shot": float(acc[0]),
                     "zero_shot_exact_match": float(em[0]), "full_site_exact_match": float(em[1]),
                     "seed": ctx.seed, "n_test": n})
    return rows


def _summary(table: pd.DataFrame, selections: list[Selection], boot: dict, budgets) -> dict:
    out: dict = {"threshold": THRESHOLD, "full_site": float(table.full_site.mean()),
                 "zero_shot": float(table.zero_shot.mean()), "n_test": int(table.n_test.iloc[0]),
                 "full_site_exact_match": float(table.full_site_exact_match.mean()),
                 "zero_shot_exact_match": float(table.zero_shot_exact_match.mean()),
                 "selectors": {}, "overlap": {}}
    by = {(s.selector, s.seed): s for s in selections}
    seeds = sorted({s.seed for s in selections})
    for sel in dict.fromkeys(table.selector):
        d = table[table.selector == sel]
        ks = {}
        for inj in dict.fromkeys(d.injection):
            m = d[d.injection == inj].groupby("k").first_token_acc.mean()
            ks[inj] = k_star(m.index.tolist(), m.tolist(), out["full_site"])
        j_seed = {k: mean_jaccard([by[(sel, s)].sets.get(k) for s in seeds]) for k in budgets}
        j_boot = {k: (float(np.nanmean([jaccard(by[(sel, seeds[0])].sets[k], b[k])
                                        for b in boot[sel] if b.get(k) is not None]))
                      if by[(sel, seeds[0])].sets.get(k) is not None
                      and any(b.get(k) is not None for b in boot.get(sel, [])) else float("nan"))
                  for k in budgets}
        stab = [v for v in (*j_seed.values(), *j_boot.values()) if np.isfinite(v)]
        unstable = bool(stab) and float(np.mean(stab)) < UNSTABLE_BELOW
        first = d.iloc[0]
        out["selectors"][sel] = {
            "k_star": ks, "jaccard_seeds": j_seed, "jaccard_bootstrap": j_boot,
            "stability": float(np.mean(stab)) if stab else None, "unstable": unstable,
            "note": "unstable sets (mean Jaccard < 0.5)" if unstable else "",
            "forward_passes": int(first.forward_passes), "backward_passes": int(first.backward_passes),
            "seconds": float(d[d.injection == d.injection.iloc[0]].groupby("seed").seconds.first().mean()),
            "meta": by[(sel, seeds[0])].meta,
        }
    first = [s for s in selections if s.seed == seeds[0]]
    for k in budgets:
        out["overlap"][str(k)] = {f"{a.selector}|{b.selector}": mean_jaccard([a.sets[k], b.sets[k]])
                                  for a, b in combinations(first, 2)}
    return out


def frontier(
    model,
    task: Task,
    *,
    budgets: Sequence[int] = DEFAULT_BUDGETS,
    selectors: Sequence[str] = SELECTORS,
    injections: Sequence[str] = INJECTIONS,
    seeds: int | Sequence[int] = 1,
    config: FrontierConfig | None = None,
    progress: bool = False,
) -> FrontierResult:
    """The accuracy-vs-heads frontier of ``model`` on ``task`` (see the module docstring).
    ``seeds``: a number n (seeds 0..n-1) or the seeds themselves; each seed refits full SITE and
    reruns every selector. Bad input raises before any work: :class:`~sitelens.errors.LensError`
    for an unknown selector or injection or a budget outside [1, the model's head count],
    :class:`~sitelens.errors.TaskError` for a task too small to split."""
    cfg = config or FrontierConfig()
    selectors = parse_selectors(selectors)
    budgets = check_budgets(budgets, model.cfg.n_layers * model.cfg.n_heads)
    bad = [i for i in injections if i not in INJECTIONS]
    if bad or not injections:
        from sitelens.errors import LensError

        raise LensError(f"Unknown injection {bad[0] if bad else None!r}; use {', '.join(INJECTIONS)}.")
    check_task_splits(task)
    seed_list = list(range(int(seeds))) if isinstance(seeds, int) else [int(s) for s in seeds]
    rows, selections = [], []
    boot: dict[str, list[dict]] = {s: [] for s in selectors}
    for seed in tqdm(seed_list, desc=f"frontier [{task.name}]", disable=not progress):
        adapter, fit_cost = fit_site_counted(model, task, cfg, seed, progress=progress)
        ctx = SelectionContext(model, task, adapter, cfg, seed, progress)
        sel = [select(ctx, name, budgets) for name in selectors]
        selections += sel
        rows += _score_seed(ctx, sel, budgets, list(injections), cfg, fit_cost)
    for b in range(cfg.n_bootstrap):  # the same selectors on resampled selection items
        for s in frontier_sets(model, task, budgets=budgets, selectors=selectors, seed=seed_list[0],
                               bootstrap=b, config=cfg):
            boot[s.selector].append(s.sets)
    full = pd.DataFrame(rows)
    summary = _summary(full, selections, boot, budgets)
    return FrontierResult(full[COLUMNS].copy(), summary, selections)


__all__ = ["COLUMNS", "INJECTIONS", "NOT_REACHED",
           "FrontierResult", "frontier", "frontier_sets", "inject_scores", "k_star", "mean_jaccard",
           "resample_selection_items"]
