"""The fast selectors' k* for every task of the atlas: ``minimal.csv`` beside the other tables.

For each atlas task, the frontier (:mod:`sitelens.lenses.frontier`) of the *fast* selectors only:
``alpha`` (the atlas's α), ``alpha-grad`` and ``atp`` (the scores ``lenses.csv`` already holds), so
no lens is recomputed and nothing is fitted. S_k is the top-k of a selector's scores (ties by head
index, :func:`sitelens.heads.ranking`); it is injected the ``alpha1`` way (the task
embedding with α = 1 on S_k only) into the zero-shot prompts of the task's test split, beside full
SITE (the atlas's α, mean over its seeds) and zero-shot on the same items, all conditions in
batched rows on one prefix cache (:func:`sitelens.lenses.frontier.inject_scores`). The embedding is
stage 1 (:func:`sitelens.site.task_embedding`) with the atlas config's ``n_prompts``, ``n_shots``
and first fit seed: the embedding of the atlas's first fit, which its lenses used.

Accuracy: first-token, with a 95% Wilson interval over items; k* per (task, selector): the smallest
budget whose accuracy reaches 90% of full SITE's (:func:`sitelens.lenses.frontier.k_star`), else
``"not reached"``. A task too small to split (:func:`sitelens.lenses.selectors.check_task_splits`)
gets one row with its reason in ``skipped``.

Every task is a cell (:class:`sitelens.pipelines.store.CellStore` under ``cache_dir/{model}``,
keyed on the weights' fingerprint, :data:`sitelens.provenance.NUMERICS_VERSION`, the task's split
hash, the atlas config and the task's scores), so an interrupted run resumes at the next task.
Every row carries the atlas's ``fingerprint`` and ``numerics_version``; :class:`AtlasData` loads
``minimal.csv`` only when they match its ``summary.json`` (:func:`sitelens.atlas.tables.read_minimal`).

    python scripts/atlas_minimal.py --models smollm2-135m-instruct --tasks-dir ../shared/datasets/fv
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from sitelens.atlas.data import AtlasData, _cell_store
from sitelens.heads import HeadSet, ranking
from sitelens.lenses.registry import DEFAULT_BUDGETS
from sitelens.tasks import Template

SELECTORS: tuple[str, ...] = ("alpha", "alpha-grad", "atp")  # the fast ones: top-k of stored scores
COLUMNS = ["task", "selector", "k", "heads", "first_token_acc", "ci_low", "ci_high", "full_site",
           "zero_shot", "n_test", "k_star", "skipped", "fingerprint", "numerics_version"]


@dataclass(frozen=True)
class MinimalConfig:
    """Settings of :func:`build_minimal` (all of them key the cells)."""

    budgets: tuple[int, ...] = DEFAULT_BUDGETS
    selectors: tuple[str, ...] = SELECTORS
    test_limit: int | None = None  # the first test items only (None: the whole test split)
    batch_size: int = 256  # rows per forward pass
    template: Template | None = None  # of stage 1 and the test prompts (None: the atlas fits' default)


def selector_scores(data: AtlasData, task: str, selector: str) -> np.ndarray | None:
    """The flat ``[n_layers * n_heads]`` scores ``selector`` ranks for ``task`` (index
    ``layer * n_heads + head``): the atlas α, or the lens's scores in ``lenses.csv``; ``None`` when
    the task has no such scores."""
    n = data.n_layers * data.n_heads
    if selector == "alpha":
        a = data.alpha[data.alpha.task == task]
        return data.alpha_map(task).ravel() if len(a) == n else None
    g = data.lenses[(data.lenses.task == task) & (data.lenses.lens == selector)]
    if g.empty:
        return None
    s = np.full(n, np.nan)
    s[g["layer"].to_numpy(int) * data.n_heads + g["head"].to_numpy(int)] = g["score"].to_numpy(float)
    return s


def task_rows(model, task, data: AtlasData, cfg: MinimalConfig) -> pd.DataFrame:
    """The rows of one task (see the module docstring), without the provenance columns."""
    import torch

    from sitelens.errors import TaskError
    from sitelens.lenses.frontier import inject_scores, k_star
    from sitelens.lenses.selectors import check_budgets, check_task_splits
    from sitelens.site import task_embedding
    from sitelens.site.training import LastTokenSet
    from sitelens.stats import wilson_interval
    from sitelens.tasks import DEFAULT_TEMPLATE

    L, H = data.n_layers, data.n_heads
    budgets = check_budgets(cfg.budgets, L * H)
    try:
        check_task_splits(task)
    except TaskError as e:
        return pd.DataFrame([{"task": task.name, "skipped": str(e)}])
    conf = data.summary.get("config", {})
    seeds = conf.get("seeds") or [0]
    template = cfg.template or DEFAULT_TEMPLATE  # the atlas fits'
    emb = task_embedding(model, task, n_prompts=int(conf.get("n_prompts", 50)),
                         n_shots=int(conf.get("n_shots", 10)), seed=int(seeds[0]), template=template)
    weights = [torch.zeros(L, H), torch.tensor(data.alpha_map(task.name), dtype=torch.float32)]
    conds = []
    for sel in cfg.selectors:
        scores = selector_scores(data, task.name, sel)
        if scores is None:
            continue
        ranked = ranking(torch.as_tensor(scores, dtype=torch.float32))  # as the frontier ranks lens maps
        for k in budgets:
            heads = HeadSet(L, H, ranked[:k])
            conds.append({"selector": sel, "k": k, "heads": ";".join(heads.labels()), "_cond": len(weights)})
            weights.append(heads.mask())
    items = task.test[: cfg.test_limit] if cfg.test_limit else task.test
    test = LastTokenSet.build(model, items, template)
    correct = inject_scores(model, test, torch.stack(weights), emb, batch_size=cfg.batch_size)
    n = correct.shape[1]
    acc = correct.mean(1)
    lo, hi = wilson_interval(correct.sum(1), n)
    rows = []
    for c in conds:
        i = c.pop("_cond")
        rows.append({"task": task.name, **c, "first_token_acc": float(acc[i]), "ci_low": float(lo[i]),
                     "ci_high": float(hi[i]), "full_site": float(acc[1]), "zero_shot": float(acc[0]),
                     "n_test": n, "skipped": ""})
    if not rows:
        return pd.DataFrame([{"task": task.name, "skipped": "no scores of " + ", ".join(cfg.selectors)}])
    out = pd.DataFrame(rows)
    for _, g in out.groupby("selector", sort=False):
        out.loc[g.index, "k_star"] = str(k_star(g.k.tolist(), g.first_token_acc.tolist(), float(acc[1])))
    return out


def _scores_hash(data: AtlasData, task: str, selectors: Sequence[str]) -> str:
    """A short hash of the scores the selectors rank (a cell made from other tables is redone)."""
    h = hashlib.sha256()
    for sel in selectors:
        s = selector_scores(data, task, sel)
        h.update(sel.encode() + (b"-" if s is None else np.round(s, 6).tobytes()))
    return h.hexdigest()[:12]


def build_minimal(model, data: AtlasData, tasks: Sequence, config: MinimalConfig | None = None, *,
                  cache_dir: str | Path = "runs/atlas", log: Callable[[str], None] | None = None,
                  progress: bool = True) -> pd.DataFrame:
    """``minimal.csv``'s rows for ``tasks`` (loaded :class:`~sitelens.tasks.Task` objects; those not
    in the atlas are left out) on ``model``, whose weights must be the atlas's
    (:class:`~sitelens.errors.OutputError` otherwise). One cell per task (resumable; the seconds
    of each go to the cell store's ``timings.json`` as ``minimal/{task}``); ``progress``: a bar
    over the tasks."""
    from sitelens.errors import OutputError
    from sitelens.format import progress_bar
    from sitelens.models import fingerprint, model_name
    from sitelens.pipelines.store import slug
    from sitelens.provenance import NUMERICS_VERSION, task_hash

    cfg = config or MinimalConfig()
    log = log or (lambda msg: None)
    fp = fingerprint(model)
    if model_name(model) != data.model or fp != data.summary.get("fingerprint"):
        raise OutputError(f"The atlas tables are of {data.model} (fingerprint "
                          f"{data.summary.get('fingerprint')}), the model is {model_name(model)} "
                          f"({fp}): load the atlas's model, or rebuild the atlas with --refit.")
    cells = _cell_store(model, cache_dir, log)
    have = set(data.tasks)
    todo = [t for t in tasks if t.name in have]
    parts = []
    for task in progress_bar(todo, desc=f"minimal sets [{data.model}]", enabled=progress):
        params = {"minimal": asdict(cfg), "task_hash": task_hash(task),
                  "atlas_config": data.summary.get("config"),
                  "scores": _scores_hash(data, task.name, cfg.selectors)}
        t0 = time.perf_counter()
        parts.append(cells.csv(f"minimal/{slug(task.name)}", params,
                               lambda task=task: task_rows(model, task, data, cfg)))
        log(f"  {task.name}: {time.perf_counter() - t0:.1f}s")
    out = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=COLUMNS)
    out = out.reindex(columns=COLUMNS)
    for col in ("selector", "heads", "skipped"):
        out[col] = out[col].fillna("").astype(str)
    out["k_star"] = out["k_star"].map(_k_text)  # one type whether computed or read back from a cell
    for col in ("k", "n_test"):
        out[col] = pd.to_numeric(out[col]).astype("Int64")
    out["fingerprint"], out["numerics_version"] = fp, NUMERICS_VERSION
    num = ["first_token_acc", "ci_low", "ci_high", "full_site", "zero_shot"]
    out[num] = out[num].astype(float).round(4)
    return out


def _k_text(x) -> str:
    """k* as text: ``"5"``, ``"not reached"``, or ``""`` (a skipped task)."""
    if x is None or (isinstance(x, float) and np.isnan(x)):
        return ""
    try:
        return str(int(float(x)))
    except ValueError:
        return str(x)


def k_star_table(minimal: pd.DataFrame) -> pd.DataFrame:
    """One row per task: k* of each selector (columns), full SITE, zero-shot and n_test; skipped
    tasks carry their reason."""
    done = minimal[minimal.skipped.fillna("") == ""]
    ks = done.groupby(["task", "selector"], sort=False).k_star.first().unstack("selector")
    ref = done.groupby("task", sort=False)[["full_site", "zero_shot", "n_test"]].first()
    out = ref.join(ks).reset_index()
    skipped = minimal[minimal.skipped.fillna("") != ""][["task", "skipped"]]
    return pd.concat([out, skipped], ignore_index=True)


__all__ = ["COLUMNS", "SELECTORS", "MinimalConfig", "build_minimal", "k_star_table",
           "selector_scores", "task_rows"]
