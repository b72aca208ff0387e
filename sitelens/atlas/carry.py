"""Bring atlas tables made at an older numerics version up to date by measuring only what changed.

A full refit costs hours per model on a CPU (:data:`sitelens.atlas.tables.REFIT_COST`). A numerics
bump names the tasks it can move (:func:`sitelens.tasks.numerics.numerics_touches`: version 3 moved only
tasks with an answer whose first token is whitespace only), so :func:`carry_atlas_data`:

1. checks that ``previous`` was made with this model's weights and the same :class:`AtlasConfig`;
2. refits the touched tasks (every seed, the fit cache of :func:`build_atlas_data`);
3. refits ``n_check`` untouched tasks too (chosen by a seeded draw) and checks that their α equals
   the carried one within :data:`ALPHA_TOLERANCE` — the rule is tested on the data before any row
   is carried (:class:`~sitelens.errors.OutputError` otherwise: then refit everything);
4. measures transfer again on every ordered pair that has a touched source or target (untouched
   targets need their stage-1 embedding, computed again: it is not in the tables, and stage 1 is
   seconds), the fast lenses and promoted tokens of the touched tasks, and ``minimal.csv``'s rows
   of the touched tasks (when the previous tables had a current one);
5. carries every other row, and computes the similarity and the statistics again on the whole.

``summary["carried"]`` records the version carried from, the refitted and carried tasks and the
check; ``numerics_version`` is the current one.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pandas as pd

from sitelens.atlas.data import (
    AtlasConfig,
    AtlasData,
    _alpha_table,
    _cell_store,
    _fit_all,
    _lens_table,
    _round_lens,
    _statistics,
    _tokens_table,
    depth_profile,
    task_family,
)

# The largest |Δα| a carried task may show against its refit: the tables round α to 5 decimals, and
# a refit on another thread count sums in another order, which 50 Adam steps carry to about 3e-5
# (SmolLM2's antonym, measured); a task the bump really moved differs by far more (α of a refit task
# moves by 0.1 and up).
ALPHA_TOLERANCE = 1e-4


def _jsonable(config) -> dict:
    """A config as its summary.json holds it (tuples as lists)."""
    return json.loads(json.dumps(asdict(config) if isinstance(config, AtlasConfig) else config))


def _in_task_order(df: pd.DataFrame, names: Sequence[str], cols: Sequence[str] = ("task",),
                   then: Sequence[str] = ()) -> pd.DataFrame:
    """``df``'s rows in the order of the tasks ``names`` (by each of ``cols`` in turn), then by
    ``then``; stable, so rows that tie keep their order: the layout of a full build."""
    pos = {n: i for i, n in enumerate(names)}
    keys = [f"_order{i}" for i in range(len(cols))]
    out = df.assign(**{k: df[c].map(pos) for k, c in zip(keys, cols)})
    return out.sort_values([*keys, *then], kind="stable").drop(columns=keys).reset_index(drop=True)


def _check_previous(model, previous: AtlasData, cfg: AtlasConfig, tasks) -> int:
    from sitelens.errors import OutputError
    from sitelens.models import fingerprint, model_name

    name, fp = model_name(model), fingerprint(model)
    if previous.model != name or previous.summary.get("fingerprint") != fp:
        raise OutputError(f"The tables to carry are of {previous.model} (fingerprint "
                          f"{previous.summary.get('fingerprint')}), the model is {name} ({fp}): carry "
                          "only tables of the same weights, or refit without carrying.")
    if _jsonable(previous.summary.get("config")) != _jsonable(cfg):
        raise OutputError(f"The tables to carry were made with {previous.summary.get('config')}, this "
                          f"refit asks for {_jsonable(cfg)}: refit without carrying.")
    version = previous.summary.get("numerics_version")
    if version is None:
        raise OutputError("The tables to carry record no numerics_version: refit without carrying.")
    missing = sorted({t.name for t in tasks} - set(previous.tasks))
    if missing:
        raise OutputError(f"The tables to carry lack task(s) {', '.join(missing)}: refit without "
                          "carrying (or leave those tasks out).")
    return int(version)


def _stand_in_adapters(model, tasks, previous: AtlasData, cfg: AtlasConfig) -> dict:
    """Adapters of carried tasks for transfer: their stage-1 embedding computed again (first seed,
    pooled across tasks) and their α from the tables (the mean over seeds, as the table holds)."""
    import torch

    from sitelens.models import model_name, weights_fingerprint
    from sitelens.site import SiteAdapter
    from sitelens.site.joint import task_embeddings
    from sitelens.tasks import DEFAULT_TEMPLATE

    if not tasks:
        return {}
    embs = task_embeddings(model, list(tasks), n_prompts=cfg.n_prompts, n_shots=cfg.n_shots,
                           seed=cfg.seeds[0])
    L, H = previous.n_layers, previous.n_heads
    out = {}
    for task, emb in zip(tasks, embs):
        alpha = torch.tensor(previous.alpha_map(task.name), dtype=torch.float32)  # [n_layers, n_heads]
        out[task.name] = SiteAdapter(alpha.reshape(L, H), emb, {
            "model": model_name(model), "fingerprint": weights_fingerprint(model),
            "fingerprint_of": "weights", "task": task.name, "template": DEFAULT_TEMPLATE.to_dict(),
            "carried": True})
    return out


def carry_atlas_data(
    model,
    tasks: Sequence,
    previous: AtlasData,
    config: AtlasConfig | None = None,
    *,
    cache_dir: str | Path = "runs/atlas",
    lenses: pd.DataFrame | None = None,
    log: Callable[[str], None] | None = None,
    n_check: int = 2,
    joint: bool = False,
) -> AtlasData:
    """``previous`` brought to :data:`~sitelens.provenance.NUMERICS_VERSION` (see the module
    docstring). ``tasks``: the loaded tasks of ``previous`` (the same names; a task of
    ``previous`` not among them is dropped). ``lenses``: other lenses' rows to carry in, as
    :func:`build_atlas_data`. ``n_check``: untouched tasks refitted to test the rule (at least 1)."""
    import torch

    from sitelens.errors import OutputError
    from sitelens.patching import inter_task
    from sitelens.patching.analysis import alpha_similarity
    from sitelens.pipelines.store import slug
    from sitelens.provenance import NUMERICS_VERSION, task_hash
    from sitelens.tasks.numerics import numerics_touches

    cfg = config or AtlasConfig()
    log = log or (lambda msg: None)
    if n_check < 1:
        raise ValueError(f"n_check must be at least 1 (the rule is checked on the data), got {n_check}.")
    since = _check_previous(model, previous, cfg, tasks)
    L, H = previous.n_layers, previous.n_heads
    touched = [t for t in tasks if numerics_touches(model, t, since)]
    kept = [t for t in tasks if t.name not in {x.name for x in touched}]
    log(f"{previous.model}: numerics {since} -> {NUMERICS_VERSION}: {len(touched)} task(s) touched "
        f"({', '.join(t.name for t in touched) or 'none'}), {len(kept)} carried")
    rng = np.random.default_rng(cfg.seed)
    checked = [kept[i] for i in sorted(rng.choice(len(kept), min(n_check, len(kept)), replace=False))]
    cells = _cell_store(model, cache_dir, log)

    t0 = time.perf_counter()
    adapters, skipped, _ = _fit_all(model, touched + checked, cfg, cells, log, joint=joint)
    fit_seconds = time.perf_counter() - t0
    worst = 0.0
    for task in checked:
        if task.name not in adapters:
            raise OutputError(f"{task.name} could not be refitted to check the carry rule "
                              f"({skipped.get(task.name)}): refit without carrying.")
        refit = np.stack([a.alpha.detach().float().cpu().numpy() for a in adapters[task.name]]).mean(0)
        diff = float(np.abs(refit - previous.alpha_map(task.name)).max())
        log(f"  check {task.name}: max |Δα| {diff:.2g} against the carried α")
        worst = max(worst, diff)
        if diff > ALPHA_TOLERANCE:
            raise OutputError(
                f"{task.name} is untouched by the numerics changes since version {since}, yet its refit α "
                f"differs from the carried one by {diff:.3g} (> {ALPHA_TOLERANCE:g}): the rule of "
                "sitelens.tasks.numerics.NUMERICS_TOUCHES misses a change. Refit without carrying.")
    touched = [t for t in touched if t.name in adapters]
    fresh = {t.name: adapters[t.name] for t in touched}
    kept_names = [t.name for t in kept]
    names = [t.name for t in tasks if t.name in fresh or t.name in kept_names]
    alpha_new = _alpha_table(fresh, L, H).round(5) if fresh else previous.alpha.iloc[:0]
    alpha = _in_task_order(pd.concat([previous.alpha[previous.alpha.task.isin(kept_names)], alpha_new]),
                           names, then=("layer", "head"))
    mean_alpha = {t: torch.tensor(alpha[alpha.task == t].alpha.to_numpy(np.float32)).reshape(L, H)
                  for t in names}  # [n_layers, n_heads] each
    sim = alpha_similarity(mean_alpha)["spearman"]

    t1 = time.perf_counter()
    tasks = [t for t in tasks if t.name in names]
    first = {t.name: fresh[t.name][0] for t in touched}
    new_names = [t.name for t in touched]
    params = {"tasks": [[t.name, task_hash(t)] for t in tasks], "touched": new_names,
              "seeds": list(cfg.seeds), "config": asdict(cfg), "carried_from": since}

    def measure() -> pd.DataFrame:
        amap = {**_stand_in_adapters(model, kept, previous, cfg), **first}
        k = min(cfg.k, L * H)
        parts = [inter_task(model, tasks, amap, k=k, limit=cfg.transfer_limit, seed=cfg.seed,
                            n_boot=0, targets=new_names)]
        if kept:
            parts.append(inter_task(model, tasks, amap, k=k, limit=cfg.transfer_limit,
                                    seed=cfg.seed, n_boot=0, sources=new_names,
                                    targets=kept_names))
        return pd.concat(parts, ignore_index=True)

    measured = cells.csv("transfer_carried", params, measure) if touched else previous.transfer.iloc[:0]
    old = previous.transfer
    carried = old[~old.source_task.isin(new_names) & ~old.target_task.isin(new_names)
                  & old.source_task.isin(names) & old.target_task.isin(names)]
    if len(measured):  # the zero-shot column is a property of the target: carried rows keep theirs
        measured = measured.astype({c: old[c].dtype for c in old.columns if c in measured})
    transfer = _in_task_order(pd.concat([carried, measured], ignore_index=True), names,
                              cols=("target_task", "source_task"), then=("mode",))
    transfer["k"] = pd.array(transfer["k"], dtype="Int64")  # as inter_task writes it ("10", not "10.0")
    transfer_seconds = time.perf_counter() - t1

    t2 = time.perf_counter()
    fast = list(cfg.fast_lenses)
    lens_old = previous.lenses[previous.lenses.task.isin(kept_names)
                               & previous.lenses.lens.isin(fast)]
    lens_new = _lens_table(model, touched, first, cfg, cells, None)
    # as build_atlas_data lays it out: the fast lenses task by task, then the other lenses' rows
    lens_rows = pd.concat([p for p in (lens_old, lens_new) if len(p)], ignore_index=True)
    lens_rows = _in_task_order(lens_rows, names)
    if lenses is not None and len(lenses):
        extra = lenses[lenses.task.isin(names) & ~lenses.lens.isin(fast)][list(lens_old.columns)]
        lens_rows = pd.concat([lens_rows, _round_lens(extra.copy())], ignore_index=True)
    lens_rows = lens_rows.reset_index(drop=True)
    lens_seconds = time.perf_counter() - t2
    tokens = pd.concat([previous.tokens[previous.tokens.task.isin(kept_names)],
                        _tokens_table(model, first, cfg) if first else previous.tokens.iloc[:0]],
                       ignore_index=True)
    tokens = _in_task_order(tokens, names, then=("layer", "head", "rank"))

    data = AtlasData(previous.model, L, H, alpha, sim.round(5), transfer, tokens, lens_rows)
    skipped = {**previous.summary.get("skipped", {}), **skipped}
    data.summary = {
        "config": asdict(cfg), "n_tasks": len(names), "skipped": skipped,
        "fingerprint": previous.summary["fingerprint"], "numerics_version": NUMERICS_VERSION,
        **_statistics(sim, transfer, names, cfg),
        "families": {t: task_family(t) for t in names},
        "depth_profile": depth_profile(data).round(5).to_dict(orient="list"),
        # what the cells this table used cost when they were computed (the cell store's ledger, so a
        # rebuild from the cache still reports them); this process's own wall times beside
        "seconds": _ledger(cells, {
            "fits": [f"fit/{t.name}/s{s}" for t in touched + checked for s in cfg.seeds],
            "transfer": ["transfer_carried"] if touched else [],
            "fast_lenses": [f"lenses/{t.name}" for t in touched]}),
        "seconds_this_process": {"fits": round(fit_seconds, 1), "transfer": round(transfer_seconds, 1),
                                 "fast_lenses": round(lens_seconds, 1)},
        "threads": torch.get_num_threads(),
        "carried": {
            "from_numerics_version": since, "refitted": new_names, "carried": kept_names,
            "check": {"tasks": [t.name for t in checked], "max_abs_alpha_difference": worst,
                      "tolerance": ALPHA_TOLERANCE},
            "previous_seconds": previous.summary.get("seconds"),
        },
    }
    if previous.minimal is not None:
        data.minimal = _carry_minimal(model, data, previous.minimal, touched, cache_dir, log)
        ledger = _cell_store(model, cache_dir, lambda m: None)  # read again: build_minimal wrote it
        data.summary["seconds"]["minimal"] = _ledger(
            ledger, {"m": [f"minimal/{slug(t.name)}" for t in touched]})["m"]
    return data


def _ledger(cells, parts: dict[str, list[str]]) -> dict[str, float | None]:
    """Per part, the summed seconds the cell store's ledger records for its cells (``None`` when
    one of them has no record, e.g. fitted on a worker)."""
    out = {}
    for part, names in parts.items():
        got = [cells.timings.get(n) for n in names]
        out[part] = None if any(g is None for g in got) else round(float(sum(got)), 1)
    return out


def _carry_minimal(model, data: AtlasData, minimal: pd.DataFrame, touched, cache_dir, log
                   ) -> pd.DataFrame:
    """``minimal.csv`` at the new version: the touched tasks' rows measured again
    (:func:`sitelens.atlas.minimal.build_minimal`), the others carried. The table records its
    budgets (``k``) and its test items (``n_test``) but not its config: the budgets are the ones it
    holds, and the test limit its largest ``n_test`` (a limit no task reaches changes nothing, so
    this reproduces a table made without one too)."""
    from sitelens.atlas.minimal import MinimalConfig, build_minimal
    from sitelens.provenance import NUMERICS_VERSION

    names = [t.name for t in touched]
    budgets = tuple(sorted(int(k) for k in minimal.k.dropna().unique()))
    cfg = MinimalConfig(budgets=budgets, test_limit=int(minimal.n_test.max()))
    fresh = (build_minimal(model, data, touched, cfg, cache_dir=cache_dir, log=log, progress=False)
             if touched else minimal.iloc[:0])
    kept = minimal[~minimal.task.isin(names) & minimal.task.isin(data.tasks)].assign(
        numerics_version=NUMERICS_VERSION)
    return _in_task_order(pd.concat([kept, fresh[list(minimal.columns)]], ignore_index=True), data.tasks)


__all__ = ["ALPHA_TOLERANCE", "carry_atlas_data"]
