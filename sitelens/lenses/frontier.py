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
one up to float rounding), whose counted passes and seconds are split evenly over the sets (so a
``refit`` row's passes are fractional; ``summary["refit"]`` holds each seed's whole joint refit:
the sets it served, its passes and seconds).

Every set is also scored on the valid items the selectors use
(:attr:`~sitelens.lenses.selectors.SelectionContext.valid`: the first
:attr:`~sitelens.lenses.selectors.FrontierConfig.n_valid`), in the same batched pass
(``valid_acc``, ``full_site_valid``, ``zero_shot_valid``).

The answer (:attr:`FrontierResult.summary`), per selector and injection:

- k* is chosen on **valid** and reported on **test**: the smallest k whose valid accuracy (per item,
  mean over seeds) reaches 90% of full SITE's valid accuracy, with its percentile bootstrap
  interval over valid items (:func:`sitelens.stats.k_star_interval`), else ``"not reached"``; the
  test accuracy of S_{k*} with its Wilson interval is what is reported. Choosing k* on test would
  make the reported accuracy at k* the maximum of a noisy search over budgets.
- No k* (``None``, ``summary["status"] = "site_not_above_zero_shot"``) where full SITE does not
  clearly beat zero-shot: the paired difference full SITE − zero-shot over the test items
  (:func:`sitelens.stats.paired_difference`) has a 95% interval that reaches 0. "90% of full SITE"
  is then reached by any set, or by none, and says nothing about heads.
- Stability at k* (``at_k_star``): the chance-adjusted Jaccard of S_{k*}
  (:func:`sitelens.stats.adjusted_jaccard` against N = n_layers · n_heads) over every pair of fit
  seeds and between the first seed and each bootstrap resample of the selection items; its mean,
  standard deviation and number of pairs. ``unstable``: mean below :data:`UNSTABLE_BELOW`.
  ``None`` where nothing was compared (one seed, no resample, or no k*), never ``False``. Every
  figure beside k* is the one at k*; ``stability_by_k`` has the same per budget.

The overlap between selectors is the raw Jaccard of S_k (first seed).
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from itertools import combinations
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from sitelens.eval.evaluation import evaluate
from sitelens.format import StageLog
from sitelens.heads import head_label, mask_of
from sitelens.lenses.joint_fit import fit_many
from sitelens.lenses.registry import DEFAULT_BUDGETS, SELECTORS, get_selector, parse_selectors
from sitelens.lenses.selectors import (
    FrontierConfig,
    Selection,
    SelectionContext,
    check_budgets,
    check_task_splits,
    fit_site_counted,
    fit_site_counted_tasks,
    select,
)
from sitelens.models import model_name
from sitelens.patching.engine import BackwardPassCounter, ForwardPassCounter, row_grid, run_rows
from sitelens.site import SiteAdapter
from sitelens.site.injection import HeadMix
from sitelens.site.training import LastTokenSet
from sitelens.stats import (
    adjusted_jaccard,
    expected_jaccard,
    jaccard,
    k_star_interval,
    paired_difference,
    smallest_reaching,
    wilson_interval,
)
from sitelens.tasks import Task

COLUMNS = [
    "model", "task", "selector", "k", "injection", "heads", "first_token_acc", "exact_match",
    "ci_low", "ci_high", "full_site", "zero_shot", "valid_acc", "full_site_valid", "zero_shot_valid",
    "forward_passes", "backward_passes", "seconds", "seed",
]
INJECTIONS = ("alpha1", "refit")
COST = ("forward_passes", "backward_passes", "seconds")
THRESHOLD = 0.9  # k*: the fraction of full SITE's valid accuracy to reach
# The unstable mark, on the chance-adjusted Jaccard (0: the overlap two random k-sets of N heads
# share, 1: identical sets). Below 0.5 the sets of two replicates share less than half of the
# overlap that separates a random draw from a reproducible choice. Being chance-adjusted, the
# mark means the same at k = 1 of 72 heads and k = 50 of 72, where a raw 0.5 is below chance.
UNSTABLE_BELOW = 0.5
NOT_REACHED = "not reached"
SITE_NOT_ABOVE_ZERO_SHOT = "site_not_above_zero_shot"  # summary status: no k* is given
N_BOOT = 2000  # bootstrap resamples of k*'s interval and of full SITE − zero-shot


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
    pairs = sorted(zip(ks, accuracy))
    k = smallest_reaching([k for k, _ in pairs], [a for _, a in pairs], full, threshold)
    return int(k) if math.isfinite(k) else NOT_REACHED


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

    def __repr__(self) -> str:
        """One short line: model, task, the table's size, the status, and per selector its k*
        (``alpha1``; ``refit`` after a slash) with S_{k*} as ``L{l}H{h}`` labels (first seed;
        long sets shortened)."""
        from sitelens.heads import labels_line

        t, s = self.table, self.summary
        row = t.iloc[0] if len(t) else {"model": "?", "task": "?"}
        parts = []
        if s.get("status") != "ok":  # no k*: the selectors only
            parts.append("no k*; selectors " + ", ".join(s.get("selectors", {})))
        for sel, d in s.get("selectors", {}).items() if s.get("status") == "ok" else ():
            ks = d.get("k_star", {})
            k = ks.get("alpha1", ks.get("refit"))
            text = f"{sel} k*={k}" + (f"/{ks['refit']}" if "alpha1" in ks and "refit" in ks else "")
            if isinstance(k, int):
                hit = t[(t.selector == sel) & (t.k == k)]
                if len(hit) and hit.heads.iloc[0]:
                    text += f" {{{labels_line(hit.heads.iloc[0].split(';'), 3)}}}"
            parts.append(text)
        return (f"FrontierResult(model={row['model']!r}, task={row['task']!r}, {len(t)} rows, "
                f"budgets {','.join(map(str, sorted(set(t.k)))) if len(t) else '-'}, "
                f"status {s.get('status')}; " + "; ".join(parts) + ")")

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


class CellStore:
    """The finished parts of a frontier, kept on disk so that a rerun skips them: per seed (and
    bootstrap resample) the full SITE fit (its adapter and counted cost) and each selector's sets
    for every budget, and per seed the scored rows. Each part is one file (or folder) named by what
    it is and a hash of everything that made it (:meth:`key`: the model's name, weight
    fingerprint, device and dtype; the task's items; the whole :class:`FrontierConfig`; the
    seed, resample, selector, budgets and injections; the numerics version), written atomically
    when the part finishes, so an interrupted run leaves only whole parts and a part made with
    other settings is never read."""

    def __init__(self, root: str | Path, model, task: Task, config: FrontierConfig, *, read: bool = True):
        from sitelens.models import fingerprint
        from sitelens.provenance import NUMERICS_VERSION, canonical, task_hash

        self.root, self.read = Path(root), read  # read=False: every part redone (and stored again)
        self.base = {"model": model_name(model), "fingerprint": fingerprint(model),
                     "device": str(model.cfg.device), "dtype": str(model.cfg.dtype),
                     "task": task_hash(task), "config": canonical(config),
                     "numerics_version": NUMERICS_VERSION}

    def key(self, **parts) -> str:
        from sitelens.provenance import settings_hash

        return settings_hash({**self.base, **parts}, n=16)

    def _json(self, name: str):
        if not self.read:
            return None
        try:
            return json.loads((self.root / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None

    def _put(self, name: str, obj) -> None:
        from sitelens.io import atomic_write_text, ensure_dir

        ensure_dir(self.root)
        atomic_write_text(self.root / name, json.dumps(_json_safe(obj)))

    def fit(self, key: str):
        """``(adapter, cost)`` of a finished fit, else None."""
        from sitelens.errors import AdapterError
        from sitelens.site import SiteAdapter

        cost = self._json(f"fit-{key}/cost.json")
        if cost is None:
            return None
        try:
            return SiteAdapter.load(self.root / f"fit-{key}"), cost
        except AdapterError:
            return None

    def fit_cost(self, key: str) -> dict | None:
        return self._json(f"fit-{key}/cost.json")

    def put_fit(self, key: str, adapter, cost: dict) -> None:
        adapter.save(self.root / f"fit-{key}")
        self._put(f"fit-{key}/cost.json", cost)  # last: its presence marks a whole fit

    def selection(self, key: str) -> Selection | None:
        d = self._json(f"select-{key}.json")
        if d is None:
            return None
        d["sets"] = {int(k): v for k, v in d["sets"].items()}
        return Selection(**d)

    def budget_set(self, key: str) -> dict | None:
        """One budget's stored set of a budgetwise selector (:meth:`put_budget_sets`), else None."""
        return self._json(f"select-{key}.json")

    def put_budget_sets(self, keys: dict[int, str], s: Selection) -> dict[int, dict]:
        """Each budget of ``s`` as its own part, with the cost and ``meta`` of the run that made
        them all (``run``: the same record in each, so a cost is counted once however many of
        its budgets a later run reads); returns the parts."""
        run = _json_safe({"budgets": sorted(keys), "forward_passes": s.forward_passes,
                          "backward_passes": s.backward_passes, "seconds": s.seconds, "meta": s.meta})
        parts = {k: {"selector": s.selector, "seed": s.seed, "budget": k, "set": s.sets.get(k),
                     "n_heads": s.n_heads, "run": run} for k in keys}
        for k, key in keys.items():
            self._put(f"select-{key}.json", parts[k])
        return parts

    def put_selection(self, key: str, s: Selection) -> None:
        self._put(f"select-{key}.json", {"selector": s.selector, "seed": s.seed, "sets": s.sets,
                                         "forward_passes": s.forward_passes,
                                         "backward_passes": s.backward_passes, "seconds": s.seconds,
                                         "meta": s.meta, "n_heads": s.n_heads})

    def scores(self, key: str):
        """``(rows, scores, refit)`` of a finished scoring, else None."""
        d = self._json(f"score-{key}.json")
        if d is None:
            return None
        nan = float("nan")
        rows = [{k: (nan if v is None and k != "cond" else v) for k, v in r.items()} for r in d["rows"]]
        scores = {k: np.asarray(v, dtype=bool) for k, v in d["scores"].items()}
        return rows, scores, d["refit"]

    def put_scores(self, key: str, rows, scores, refit) -> None:
        self._put(f"score-{key}.json", {"rows": rows, "scores": {k: v.astype(int).tolist()
                                                                 for k, v in scores.items()},
                                        "refit": refit})


def _table_cost(s: Selection, fit_cost: dict | None) -> dict:
    """A selector's cost as the table reports it: its own, and for ``alpha`` the full fit's too."""
    base = (fit_cost or {}) if s.selector == "alpha" else {}
    return {key: getattr(s, key) + base.get(key, 0) for key in COST}


class _Replicate:
    """One seed (or bootstrap resample) of the frontier: the full SITE fit, made or read from the
    store only when a part that needs it is not already stored, and the selectors' sets."""

    def __init__(self, model, task: Task, cfg: FrontierConfig, seed: int, *, bootstrap: int | None,
                 store: CellStore | None, log: StageLog | None, progress: bool, name: str,
                 fit: tuple[SiteAdapter, dict] | None = None):
        self.model, self.cfg, self.seed, self.bootstrap = model, cfg, seed, bootstrap
        self.task = task if bootstrap is None else resample_selection_items(task, bootstrap)
        self.store, self.log, self.progress, self.name = store, log, progress, name
        self.fit_key = store.key(part="fit", seed=seed, bootstrap=bootstrap) if store else None
        self._ctx: SelectionContext | None = None
        self._fit_cost: dict | None = None
        self._given = fit  # a full fit made elsewhere (a joint fit of many tasks): used as is
        if fit is not None:
            self._fit_cost = fit[1]

    def say(self, text: str) -> None:
        if self.log is not None:
            self.log.write(f"{self.name}: {text}")

    @property
    def fit_cost(self) -> dict:
        if self._fit_cost is None and self.store is not None:
            self._fit_cost = self.store.fit_cost(self.fit_key)
        if self._fit_cost is None:
            self.context()
        return self._fit_cost

    def context(self) -> SelectionContext:
        if self._ctx is None:
            got = self._given
            if got is not None:
                adapter, self._fit_cost = got
                self.say(f"full SITE fit given (fitted jointly with {got[1].get('joint_tasks', 1)} task(s))")
                if self.store is not None:
                    self.store.put_fit(self.fit_key, adapter, self._fit_cost)
            elif self.store is not None and (got := self.store.fit(self.fit_key)) is not None:
                adapter, self._fit_cost = got
                self.say("full SITE fit read from an earlier run")
            else:
                if self.log is not None:
                    self.log.begin(f"{self.name}: full SITE fit")
                adapter, self._fit_cost = fit_site_counted(self.model, self.task, self.cfg, self.seed,
                                                           progress=self.progress)
                c = self._fit_cost
                self.say(f"full SITE fitted in {c['seconds']:.1f}s (forward {c['forward_passes']}, "
                         f"backward {c['backward_passes']})")
                if self.store is not None:
                    self.store.put_fit(self.fit_key, adapter, self._fit_cost)
            # the selectors' own bars only where they redraw in place (a terminal, a notebook); in
            # a log the selector lines and the heartbeat say it, with no second "done in" figure
            # that times only a part of the selector
            live = self.progress and not (self.log is not None and self.log.heartbeat)
            self._ctx = SelectionContext(self.model, self.task, adapter, self.cfg, self.seed, live,
                                         self.log)
        return self._ctx

    def _budget_keys(self, name: str, budgets: list[int]) -> dict[int, str]:
        return {k: self.store.key(part="select-budget", seed=self.seed, bootstrap=self.bootstrap,
                                  selector=name, budget=k) for k in budgets}

    def _stored_budgets(self, name: str, keys: dict[int, str]) -> dict[int, dict]:
        """The budgets of a budgetwise selector stored by earlier runs (any budget lists)."""
        got = {k: self.store.budget_set(key) for k, key in keys.items()}
        return {k: d for k, d in got.items() if d is not None}

    @staticmethod
    def _joined(name: str, seed: int, budgets: list[int], parts: dict[int, dict]) -> Selection:
        """One Selection from per-budget parts: each distinct run's cost counted once, the meta
        of the run that made the largest budget."""
        runs = {json.dumps(d["run"], sort_keys=True): d["run"] for d in parts.values()}.values()
        last = parts[max(parts)]["run"]
        return Selection(name, seed, {k: parts[k]["set"] for k in budgets},
                         sum(r["forward_passes"] for r in runs), sum(r["backward_passes"] for r in runs),
                         sum(r["seconds"] for r in runs), last["meta"], parts[max(parts)]["n_heads"])

    def select(self, selectors: list[str], budgets: list[int]) -> tuple[list[Selection], list[str]]:
        """Each selector's sets (stored ones read, the others run and stored as each finishes),
        and the keys of the stored parts (None without a store). A budgetwise selector
        (:class:`~sitelens.lenses.registry.Selector`) is stored and read budget by budget: only
        the budgets no earlier run made are run."""
        out, keys = [], []
        ks = ",".join(map(str, budgets))
        for i, name in enumerate(selectors, start=1):
            key = (self.store.key(part="select", seed=self.seed, bootstrap=self.bootstrap, selector=name,
                                  budgets=list(budgets)) if self.store else None)
            s = self.store.selection(key) if self.store is not None else None
            where = f"selector {name} ({i} of {len(selectors)}), budgets {ks}"
            bkeys = (self._budget_keys(name, list(budgets))
                     if self.store is not None and get_selector(name).budgetwise else None)
            parts = self._stored_budgets(name, bkeys) if s is None and bkeys else {}
            todo = [k for k in budgets if k not in parts]
            if s is None and parts and not todo:
                s = self._joined(name, self.seed, list(budgets), parts)
            if s is not None:
                self.say(f"{where}: done in an earlier run, skipped")
            else:
                ctx = self.context()
                if self.log is not None:
                    self.log.begin(f"{self.name}: selector {name}", f"{self.name}: {where}")
                if parts:
                    self.say(f"selector {name}: budgets {','.join(map(str, sorted(parts)))} done in "
                             f"an earlier run; running {','.join(map(str, todo))}")
                s = select(ctx, name, todo)
                if bkeys:
                    made = self.store.put_budget_sets({k: bkeys[k] for k in todo}, s)
                    s = self._joined(name, self.seed, list(budgets), {**parts, **made})
                elif self.store is not None:
                    self.store.put_selection(key, s)
                c = _table_cost(s, self.fit_cost)
                reached = [k for k in budgets if s.sets.get(k) is not None]
                self.say(f"selector {name} done in {c['seconds']:.1f}s (forward {c['forward_passes']}, "
                         f"backward {c['backward_passes']}"
                         + (", with the full SITE fit" if name == "alpha" else "") + "); budgets "
                         + (",".join(map(str, reached)) or "none") + " reached")
            out.append(s)
            keys.append(key)
        return out, keys


def frontier_sets(
    model, task: Task, *, budgets: Sequence[int] = DEFAULT_BUDGETS,
    selectors: Sequence[str] = SELECTORS, seed: int = 0, bootstrap: int | None = None,
    config: FrontierConfig | None = None, progress: bool = False,
    fit: tuple[SiteAdapter, dict] | None = None,
) -> list[Selection]:
    """Only the selection half of :func:`frontier`: full SITE fitted at ``seed``, then every
    selector's S_k, nothing injected on test. ``bootstrap``: b, fit and select on
    :func:`resample_selection_items` ``(task, b)`` instead. The replicates whose Jaccard with the
    first seed's sets is the stability; ``alpha``'s cost includes the fit. ``fit``: that full fit
    made already, ``(adapter, cost)`` (:func:`frontier_sets_tasks` gives each task its share of
    one joint fit); it must be the fit of this task, seed and resample. Bad input raises before
    any work, as :func:`frontier` does."""
    cfg = config or FrontierConfig()
    selectors = parse_selectors(selectors)
    budgets = check_budgets(budgets, model.cfg.n_layers * model.cfg.n_heads)
    check_task_splits(task)
    name = f"seed {seed}" if bootstrap is None else f"resample {bootstrap} (seed {seed})"
    log = StageLog(f"frontier sets [{task.name}]", enabled=progress)
    rep = _Replicate(model, task, cfg, seed, bootstrap=bootstrap, store=None, log=log, progress=progress,
                     name=name, fit=fit)
    with log.watch(model):
        out, _ = rep.select(selectors, budgets)
    for s in out:
        if s.selector == "alpha":
            for key in COST:
                setattr(s, key, getattr(s, key) + rep.fit_cost.get(key, 0))
        if "joint_tasks" in rep.fit_cost:
            s.meta["fit_joint_tasks"] = rep.fit_cost["joint_tasks"]
    return out


def joint_full_fits(model, tasks: Sequence[Task], config: FrontierConfig, seed: int, *,
                    bootstrap: int | None = None, progress: bool = False) -> list[tuple[SiteAdapter, dict]]:
    """The full SITE fits ``(adapter, cost)`` of ``tasks`` at ``seed`` (on resample ``bootstrap``
    of each task's selection items, as :func:`frontier_sets` fits them) in one joint fit
    (:func:`~sitelens.lenses.selectors.fit_site_counted_tasks`), each to pass as its ``fit``."""
    fitted = tasks if bootstrap is None else [resample_selection_items(t, bootstrap) for t in tasks]
    return fit_site_counted_tasks(model, fitted, config, seed, progress=progress)


def frontier_sets_tasks(
    model, tasks: Sequence[Task], *, budgets: Sequence[int] = DEFAULT_BUDGETS,
    selectors: Sequence[str] = SELECTORS, seed: int = 0, bootstrap: int | None = None,
    config: FrontierConfig | None = None, progress: bool = False,
) -> list[list[Selection]]:
    """:func:`frontier_sets` for each of ``tasks`` (same seed and resample), their full SITE fits
    made in one joint fit (:func:`~sitelens.lenses.selectors.fit_site_counted_tasks`: the same
    fits up to float rounding, every task's rows in each stage-2 pass); then each task's
    selectors, one task at a time. Each ``alpha`` selection's cost counts its even share of the
    joint fit, and every selection's ``meta["fit_joint_tasks"]`` says how many tasks shared it.
    Bad input (any task) raises before any work."""
    cfg = config or FrontierConfig()
    tasks = list(tasks)
    parse_selectors(selectors)
    check_budgets(budgets, model.cfg.n_layers * model.cfg.n_heads)
    for t in tasks:
        check_task_splits(t)
    fits = joint_full_fits(model, tasks, cfg, seed, bootstrap=bootstrap, progress=progress)
    return [frontier_sets(model, t, budgets=budgets, selectors=selectors, seed=seed, bootstrap=bootstrap,
                          config=cfg, progress=progress, fit=f) for t, f in zip(tasks, fits)]


def _refit_all(ctx: SelectionContext, sets: list[tuple[int, ...]], cfg: FrontierConfig) -> dict:
    """α re-fitted on each head set (the others held at 0), every set at once
    (:func:`~sitelens.lenses.joint_fit.fit_many`: the same fits as one ``fit_many`` per set, up
    to float rounding). Returns
    ``{set: (weights [L, H], cost)}``; each set's cost is its share of the joint fit's counted
    passes and seconds (the total over the sets), and ``"total"``: the joint fit's whole counts and
    the number of sets it served (``{"sets", "forward_passes", "backward_passes", "seconds"}``)."""
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
    total = {"sets": n, "forward_passes": fwd.count, "backward_passes": bwd.count, "seconds": fwd.seconds}
    ctx.say(f"{n} set(s) fitted in {fwd.seconds:.1f}s (forward {fwd.count}, "
            f"backward {bwd.count}; each refit row carries 1/{n} of it)")
    cost = {"forward_passes": fwd.count / n, "backward_passes": bwd.count / n, "seconds": fwd.seconds / n}
    w = torch.sigmoid(kept.reshape(n, -1)) * masks
    return {h: (w[i].reshape(shape), cost) for i, h in enumerate(sets)} | {"total": total}


def _exact_match(model, task, cfg: FrontierConfig, weights: Tensor, embedding, template) -> np.ndarray:
    """Exact match per condition and item, greedy generation under each mix."""
    inter = {f"c{i}": HeadMix(w, embedding) for i, w in enumerate(weights)}
    res = evaluate(model, task, methods=list(inter), split="test", limit=cfg.test_limit,
                   template=template, interventions=inter, labels=None)
    return np.stack([res.loc[res.method == m, "correct"].to_numpy(float) for m in inter])


def _score_seed(ctx: SelectionContext, selections: list[Selection], budgets, injections, cfg,
                fit_cost: dict) -> tuple[list[dict], dict[str, np.ndarray], dict]:
    """The rows of one seed: every (selector, k, injection) set injected on the test items and on
    the selectors' valid items, each split in one batched first-token pass (and one generation per
    distinct mix for exact match). Also returns the per-item correctness ``{"test": [n_cond,
    n_test], "valid": [n_cond, n_valid]}``; each row's ``cond`` indexes it (condition 0 is
    zero-shot, 1 full SITE), and the joint refit's whole cost (:func:`_refit_all`'s ``"total"``)."""
    model, task = ctx.model, ctx.task
    L, H = ctx.shape
    items = task.test[: cfg.test_limit] if cfg.test_limit else task.test
    test = LastTokenSet.build(model, items, ctx.adapter.template)
    conds: list[dict] = []
    weights = [torch.zeros(L, H), ctx.adapter.alpha.float().cpu()]
    seen: dict[bytes, int] = {}  # identical mixes (the same set from two selectors) run once
    todo = {tuple(sorted(h)): None for s in selections for h in s.sets.values()
            if h is not None and "refit" in injections}
    if todo and ctx.log is not None:
        ctx.log.begin(f"seed {ctx.seed}: refit", f"seed {ctx.seed}: refit of {len(todo)} distinct set(s) "
                      f"(every selector and budget, one joint fit)")
    refits = _refit_all(ctx, list(todo), cfg)
    refit_total = refits.pop("total", {"sets": 0, "forward_passes": 0, "backward_passes": 0, "seconds": 0.0})
    for s in selections:
        cost = _table_cost(s, fit_cost)
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
    if ctx.log is not None:
        ctx.log.begin(f"seed {ctx.seed}: scoring", f"seed {ctx.seed}: scoring {len(W)} distinct mixes on "
                      f"{len(test)} test and {len(ctx.valid)} valid items"
                      + (" (then exact match: one generation per mix)" if cfg.exact_match else ""))
    correct = inject_scores(model, test, W, ctx.adapter.embedding, batch_size=cfg.batch_size)
    valid = inject_scores(model, ctx.valid, W, ctx.adapter.embedding, batch_size=cfg.batch_size)
    n = correct.shape[1]
    acc, vacc = correct.mean(1), valid.mean(1)
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
                     "valid_acc": get(vacc), "full_site_valid": float(vacc[1]),
                     "zero_shot_valid": float(vacc[0]),
                     "zero_shot_exact_match": float(em[0]), "full_site_exact_match": float(em[1]),
                     "seed": ctx.seed, "n_test": n, "n_valid": valid.shape[1], "cond": c})
    return rows, {"test": correct, "valid": valid}, refit_total


def _k_text(k: float):
    """A budget from :mod:`sitelens.stats` (a float, ``inf``: not reached) as the summary writes it."""
    return int(k) if np.isfinite(k) else NOT_REACHED


def _pair_values(sets_by_seed: list, boot_sets: list, n: int) -> tuple[list[float], list[float]]:
    """The chance-adjusted and raw Jaccards of one budget's sets: every pair of fit seeds, and the
    first seed's set against each bootstrap resample's (pairs with a missing set are skipped)."""
    pairs = [(a, b) for a, b in combinations(sets_by_seed, 2)]
    if sets_by_seed and sets_by_seed[0] is not None:
        pairs += [(sets_by_seed[0], b) for b in boot_sets]
    pairs = [(a, b) for a, b in pairs if a is not None and b is not None]
    adj = [adjusted_jaccard(a, b, n) for a, b in pairs]
    return [v for v in adj if np.isfinite(v)], [jaccard(a, b) for a, b in pairs]


def set_stability(sets_by_seed: list, boot_sets: list, n: int, k: int) -> dict:
    """The stability of one budget's sets: mean, standard deviation and count of the
    chance-adjusted Jaccards (:func:`_pair_values`), the raw mean and its chance level; ``None``
    where no pair was compared."""
    adj, raw = _pair_values(sets_by_seed, boot_sets, n)
    return {"stability": float(np.mean(adj)) if adj else None,
            "stability_sd": float(np.std(adj, ddof=1)) if len(adj) > 1 else None,
            "n_pairs": len(adj), "raw_jaccard": float(np.mean(raw)) if raw else None,
            "chance_jaccard": expected_jaccard(k, k, n)}


def _raw_bootstrap(first: list[int] | None, boot_sets: list[dict], k: int) -> float:
    """The raw Jaccard of the first seed's S_k with each resample's, mean (NaN: nothing compared)."""
    js = [jaccard(first, b[k]) for b in boot_sets if first is not None and b.get(k) is not None]
    return float(np.mean(js)) if js else float("nan")


def _summary(table: pd.DataFrame, selections: list[Selection], boot: dict, budgets,
             scores: dict[int, dict[str, np.ndarray]], n_heads_total: int) -> dict:
    seeds = sorted({s.seed for s in selections})
    # zero-shot and full SITE per item (conditions 0 and 1 of every seed), mean over seeds
    test, valid = ({c: np.mean([scores[s][split][c] for s in seeds], axis=0) for c in (0, 1)}
                   for split in ("test", "valid"))
    gap = paired_difference(test[1], test[0], over="items", n_boot=N_BOOT, seed=0)
    status = "ok" if gap.ci_low > 0 else SITE_NOT_ABOVE_ZERO_SHOT
    out: dict = {"threshold": THRESHOLD, "k_star_split": "valid", "reported_split": "test",
                 "status": status,
                 "full_site": float(table.full_site.mean()), "zero_shot": float(table.zero_shot.mean()),
                 "full_site_minus_zero_shot": {"diff": gap.diff, "ci_low": gap.ci_low,
                                               "ci_high": gap.ci_high, "n": gap.n, "over": gap.over},
                 "n_test": int(table.n_test.iloc[0]), "n_valid": int(table.n_valid.iloc[0]),
                 "full_site_valid": float(table.full_site_valid.mean()),
                 "zero_shot_valid": float(table.zero_shot_valid.mean()),
                 "full_site_exact_match": float(table.full_site_exact_match.mean()),
                 "zero_shot_exact_match": float(table.zero_shot_exact_match.mean()),
                 "unstable_below": UNSTABLE_BELOW, "n_heads_total": n_heads_total,
                 "selectors": {}, "overlap": {}}
    by = {(s.selector, s.seed): s for s in selections}
    for sel in dict.fromkeys(table.selector):
        d = table[table.selector == sel]
        stab_k = {k: set_stability([by[(sel, s)].sets.get(k) for s in seeds],
                                [b[k] for b in boot.get(sel, []) if b.get(k) is not None],
                                n_heads_total, k) for k in budgets}
        ks, at = {}, {}
        for inj in dict.fromkeys(d.injection):
            di = d[d.injection == inj]
            conds = {(r.k, r.seed): r.cond for r in di.itertuples()}

            def rows(split, conds=conds):  # [n_budgets, n_items]: mean over seeds, NaN if any seed has no set
                n = scores[seeds[0]][split].shape[1]
                return np.stack([np.mean([scores[s][split][int(conds[k, s])] if pd.notna(conds[k, s])
                                          else np.full(n, np.nan) for s in seeds], axis=0)
                                 for k in budgets])
            k, lo, hi = k_star_interval(budgets, rows("valid"), valid[1], share=THRESHOLD,
                                        n_boot=N_BOOT, seed=0)
            if status != "ok":
                ks[inj] = None
                at[inj] = {"k_star": None, "note": "no k*: full SITE not above zero-shot",
                           "stability": None, "unstable": None}
                continue
            ks[inj] = _k_text(k)
            entry = {"k_star": ks[inj],
                     "k_star_interval": None if np.isnan(lo) else [_k_text(lo), _k_text(hi)]}
            if not np.isfinite(k):
                at[inj] = {**entry, "note": "not reached on valid", "stability": None, "unstable": None}
                continue
            i = list(budgets).index(int(k))
            t = rows("test")[i]
            tlo, thi = wilson_interval(float(t.sum()), len(t))
            st = stab_k[int(k)]
            unstable = None if st["stability"] is None else bool(st["stability"] < UNSTABLE_BELOW)
            note = ("stability not measured (one seed, no resample)" if unstable is None
                    else f"unstable sets (adjusted Jaccard < {UNSTABLE_BELOW})" if unstable else "")
            at[inj] = {**entry, "valid_acc": float(np.mean(rows("valid")[i])),
                       "test_acc": float(t.mean()), "test_ci": [tlo, thi], **st,
                       "unstable": unstable, "note": note}
        first = d.iloc[0]
        out["selectors"][sel] = {
            "k_star": ks, "at_k_star": at, "stability_by_k": stab_k,
            "jaccard_seeds": {k: mean_jaccard([by[(sel, s)].sets.get(k) for s in seeds]) for k in budgets},
            "jaccard_bootstrap": {k: _raw_bootstrap(by[(sel, seeds[0])].sets.get(k), boot.get(sel, []), k)
                                  for k in budgets},
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
    resume_dir: str | Path | None = None,
    force: bool = False,
) -> FrontierResult:
    """The accuracy-vs-heads frontier of ``model`` on ``task`` (see the module docstring).
    ``seeds``: a number n (seeds 0..n-1) or the seeds themselves; each seed refits full SITE and
    reruns every selector. Bad input raises before any work: :class:`~sitelens.errors.LensError`
    for an unknown selector or injection or a budget outside [1, the model's head count],
    :class:`~sitelens.errors.TaskError` for a task too small to split.

    ``progress``: plain lines on stderr naming each seed, selector (with its budgets), refit,
    scoring and bootstrap resample as it starts and ends, with the cost each adds to the table,
    and a heartbeat at least every 30 s of a step that writes nothing else
    (:class:`~sitelens.format.StageLog`). ``resume_dir``: a folder keeping each finished part
    (:class:`CellStore`: each seed's and resample's fit and selectors' sets, each seed's scored
    rows); a rerun with the same folder reads the parts made with the same settings instead of
    redoing them (the counted passes and seconds in the table are those of the run that made
    them); ``force=True``: nothing is read, every part is redone and stored again."""
    cfg = config or FrontierConfig()
    selectors = parse_selectors(selectors)
    budgets = check_budgets(budgets, model.cfg.n_layers * model.cfg.n_heads)
    bad = [i for i in injections if i not in INJECTIONS]
    if bad or not injections:
        from sitelens.errors import LensError

        raise LensError(f"Unknown injection {bad[0] if bad else None!r}; use {', '.join(INJECTIONS)}.")
    check_task_splits(task)
    seed_list = list(range(int(seeds))) if isinstance(seeds, int) else [int(s) for s in seeds]
    store = CellStore(resume_dir, model, task, cfg, read=not force) if resume_dir is not None else None
    log = StageLog(f"frontier [{task.name}]", enabled=progress)
    rows, selections, scores, refits = [], [], {}, {}
    boot: dict[str, list[dict]] = {s: [] for s in selectors}
    with log.watch(model):
        for i, seed in enumerate(seed_list, start=1):
            name = f"seed {seed} ({i} of {len(seed_list)})" if len(seed_list) > 1 else f"seed {seed}"
            rep = _Replicate(model, task, cfg, seed, bootstrap=None, store=store, log=log,
                             progress=progress, name=name)
            sel, keys = rep.select(selectors, budgets)
            selections += sel
            key = (store.key(part="score", seed=seed, selectors=selectors, budgets=budgets,
                             injections=list(injections), selections=keys) if store else None)
            got = store.scores(key) if store is not None else None
            if got is not None:
                rep.say("scored in an earlier run, skipped")
                seed_rows, scores[seed], refits[seed] = got
            else:
                seed_rows, scores[seed], refits[seed] = _score_seed(
                    rep.context(), sel, budgets, list(injections), cfg, rep.fit_cost)
                if store is not None:
                    store.put_scores(key, seed_rows, scores[seed], refits[seed])
                rep.say(f"scored ({len(seed_rows)} rows)")
            rows += seed_rows
        for b in range(cfg.n_bootstrap):  # the same selectors on resampled selection items
            rep = _Replicate(model, task, cfg, seed_list[0], bootstrap=b, store=store, log=log,
                             progress=progress, name=f"resample {b + 1} of {cfg.n_bootstrap}")
            for s in rep.select(selectors, budgets)[0]:
                boot[s.selector].append(s.sets)
    full = pd.DataFrame(rows)
    summary = _summary(full, selections, boot, budgets, scores, model.cfg.n_layers * model.cfg.n_heads)
    summary["refit"] = {str(s): r for s, r in refits.items()}
    log.write(f"done in {log.seconds():.1f}s")
    return FrontierResult(full[COLUMNS].copy(), summary, selections)


__all__ = ["COLUMNS", "INJECTIONS", "NOT_REACHED", "SITE_NOT_ABOVE_ZERO_SHOT", "THRESHOLD", "UNSTABLE_BELOW",
           "FrontierResult", "frontier", "frontier_sets", "frontier_sets_tasks", "inject_scores",
           "joint_full_fits", "k_star", "mean_jaccard", "resample_selection_items"]
