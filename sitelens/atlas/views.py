"""The atlas's views as data: one payload (plain JSON types) built from :class:`AtlasData`, and the
lookups every view shows. The HTML page (:mod:`sitelens.atlas.html`) embeds the payload and its
JavaScript performs the same lookups; the Jupyter explorer (:mod:`sitelens.atlas.widget`) calls
these functions; the browser test checks the page against them, so the two never disagree.

Head arrays are flat, index ``layer * n_heads + head`` (``L{l}H{h}``).
"""

from __future__ import annotations

import math

import numpy as np

from sitelens.atlas.data import AtlasData, depth_profile
from sitelens.format import round_or_none
from sitelens.heads import head_label


def _flat(values, digits: int = 4) -> list:
    return [round_or_none(v, digits) for v in np.asarray(values, dtype=float).ravel()]


def cluster_order(similarity) -> list[str]:
    """Tasks ordered by average-linkage clustering of ``1 − similarity``."""
    from sitelens.viz.matrices import cluster_order as order  # no plotly: the page draws

    return order(similarity)


def _parse_heads(text, n_heads: int) -> list[int]:
    """``"L1H2;L0H3"`` → flat indices ``[1 * n_heads + 2, 3]``."""
    out = []
    for h in str(text or "").split(";"):
        if h:
            layer, head = h[1:].split("H")
            out.append(int(layer) * n_heads + int(head))
    return out


def minimal_payload(data: AtlasData) -> dict:
    """The minimal sets of ``minimal.csv`` (:mod:`sitelens.atlas.minimal`): per task, k* of each
    selector (an int, or ``"not reached"``) and its set S_{k*} (flat head indices; empty when not
    reached), full SITE, zero-shot and the test items; the skipped tasks with their reason;
    ``note``: why there are none (no or a stale ``minimal.csv``), else ``""``."""
    df = data.minimal
    note = data.minimal_note or ("" if df is not None else "No minimal sets for this model (no "
                                 "minimal.csv): run scripts/atlas_minimal.py to compute them.")
    out = {"note": note, "selectors": [], "budgets": [], "tasks": {}, "skipped": {}}
    if df is None:
        return out
    skip = df.skipped.fillna("").astype(str) != ""
    out["skipped"] = {r.task: r.skipped for r in df[skip].itertuples()}
    done = df[~skip]
    out["selectors"] = list(dict.fromkeys(done.selector))
    out["budgets"] = sorted({int(k) for k in done.k})
    for t, g in done.groupby("task", sort=False):
        ks, sets = {}, {}
        for sel, gs in g.groupby("selector", sort=False):
            k = str(gs.k_star.iloc[0])
            ks[sel] = int(float(k)) if k.replace(".", "").isdigit() else k
            hit = gs[gs.k.astype(int) == ks[sel]] if isinstance(ks[sel], int) else gs.iloc[:0]
            sets[sel] = _parse_heads(hit.heads.iloc[0], data.n_heads) if len(hit) else []
        r = g.iloc[0]
        out["tasks"][t] = {"k_star": ks, "sets": sets, "full_site": round_or_none(r.full_site),
                           "zero_shot": round_or_none(r.zero_shot), "n_test": int(r.n_test)}
    return out


def model_payload(data: AtlasData) -> dict:
    """Everything the views need for one model."""
    tasks = data.tasks
    order = cluster_order(data.similarity.loc[tasks, tasks]) if len(tasks) > 2 else tasks
    lenses: dict[str, dict[str, list]] = {
        "alpha": {t: _flat(data.alpha_map(t)) for t in tasks}}
    for lens, g in data.lenses.groupby("lens", sort=False):
        # α from `benchmarks/heads.py` (over its seeds, on the tasks it ran) is its own lens: the
        # atlas's "alpha" is the atlas fit of every task
        lens = "alpha-seeds" if lens == "alpha" else lens
        lenses[lens] = {}
        for t, gt in g.groupby("task", sort=False):
            m = np.full(data.n_layers * data.n_heads, np.nan)
            m[gt["layer"].to_numpy() * data.n_heads + gt["head"].to_numpy()] = gt["score"].to_numpy(float)
            lenses[lens][t] = _flat(m)
    tokens: dict[str, list] = {}
    for t, g in data.tokens.groupby("task", sort=False):
        g = g.sort_values(["layer", "head", "rank"])
        per = [[] for _ in range(data.n_layers * data.n_heads)]
        for r in g.itertuples():
            per[int(r.layer) * data.n_heads + int(r.head)].append(str(r.token))
        tokens[t] = per
    tr = data.transfer[data.transfer["mode"] == "alpha"]
    acc = tr.pivot_table(index="source_task", columns="target_task", values="accuracy")
    acc = acc.reindex(index=tasks, columns=tasks)
    zs = tr.groupby("target_task")["zero_shot"].first().reindex(tasks)
    sim = data.similarity.loc[tasks, tasks]
    prof = depth_profile(data)
    return {
        "model": data.model, "n_layers": data.n_layers, "n_heads": data.n_heads,
        "tasks": tasks, "order": order,
        "families": {t: data.summary.get("families", {}).get(t) for t in tasks},
        "lenses": lenses,
        "alpha_ci": {t: [_flat(data.alpha_map(t, "ci_low")), _flat(data.alpha_map(t, "ci_high"))]
                     for t in tasks},
        "n_seeds": {t: int(data.alpha[data.alpha.task == t].n_seeds.iloc[0]) for t in tasks},
        "tokens": tokens,
        "similarity": [[round_or_none(v) for v in row] for row in sim.to_numpy(float)],
        "transfer": [[round_or_none(v) for v in row] for row in acc.to_numpy(float)],
        "zero_shot": _flat(zs.to_numpy(float)),
        "depth_mass": _flat(prof["mass"].to_numpy()),
        "minimal": minimal_payload(data),
        "summary": {k: data.summary.get(k) for k in (
            "similarity_vs_transfer", "similarity_vs_transfer_zero_shot_normalized",
            "family_test", "n_tasks", "config")},
    }


def _clean(x):
    """JSON-safe: NaN / inf → None, numpy scalars → Python, tuples → lists."""
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, (float, np.floating)):
        return None if not math.isfinite(float(x)) else float(x)
    if isinstance(x, np.integer):
        return int(x)
    return x


def payload(datas: list[AtlasData]) -> dict:
    """The atlas payload: ``{"models": {name: model_payload}, "lens_order": [...],
    "default_model": name}``. The page and the explorer open on ``default_model``: the project's
    default model (:data:`sitelens.models.DEFAULT_MODEL`, SmolLM2) when it is among ``datas``, else
    the first; it also comes first in ``models``."""
    from sitelens.models import DEFAULT_MODEL

    datas = sorted(datas, key=lambda d: d.model != DEFAULT_MODEL)  # stable: the rest keep their order
    models = {d.model: model_payload(d) for d in datas}
    seen = []
    for m in models.values():
        seen += [x for x in m["lenses"] if x not in seen]
    return _clean({"models": models, "lens_order": seen,
                   "default_model": next(iter(models), None)})


# ----------------------------------------------------------------------------------------------
# lookups (mirrored by the page's JavaScript: keep the two in step)


def head_card(p: dict, model: str, task: str, layer: int, head: int) -> dict:
    """What the head card shows: the head's score in every lens for ``task`` (None where not
    computed), its α interval, the α of this head in every task (cluster order), its top tokens."""
    m = p["models"][model]
    i = layer * m["n_heads"] + head
    scores = {lens: (vals[task][i] if task in vals else None) for lens, vals in m["lenses"].items()}
    ci = m["alpha_ci"].get(task, [[None], [None]])
    alpha_across = [[t, m["lenses"]["alpha"][t][i]] for t in m["order"]]
    return {
        "head": head_label(i, m["n_heads"]), "model": model, "task": task, "scores": scores,
        "alpha_ci": [ci[0][i], ci[1][i]], "n_seeds": m["n_seeds"].get(task),
        "alpha_across_tasks": alpha_across,
        "tokens": m["tokens"].get(task, [[]] * (i + 1))[i],
        "minimal": head_minimal(p, model, layer, head),
    }


def head_minimal(p: dict, model: str, layer: int, head: int) -> dict:
    """Per selector, the tasks (cluster order) whose minimal set S_{k*} contains the head (``{}``
    without minimal sets)."""
    m = p["models"][model]
    mm = m.get("minimal") or {}
    i = layer * m["n_heads"] + head
    per = mm.get("tasks", {})
    return {sel: [t for t in m["order"] if i in per.get(t, {}).get("sets", {}).get(sel, [])]
            for sel in mm.get("selectors", [])}


def minimal_selector(p: dict, model: str, lens: str) -> str | None:
    """The selector whose minimal set the task map marks under ``lens``: the lens itself when it
    is one of the selectors, else ``alpha`` (``None`` without minimal sets)."""
    sels = (p["models"][model].get("minimal") or {}).get("selectors", [])
    return lens if lens in sels else ("alpha" if "alpha" in sels else (sels[0] if sels else None))


def minimal_set(p: dict, model: str, task: str, selector: str | None) -> list[list[int]]:
    """``[[layer, head], ...]`` of ``task``'s minimal set under ``selector`` (empty when none)."""
    m = p["models"][model]
    t = (m.get("minimal") or {}).get("tasks", {}).get(task, {})
    return [[j // m["n_heads"], j % m["n_heads"]] for j in t.get("sets", {}).get(selector, [])]


def minimal_view(p: dict, model: str) -> dict:
    """The k* panel: tasks (cluster order, those with minimal sets) × selectors, ``z`` = k*
    (``None``: not reached), ``text`` its label; ``note`` why there is nothing to show."""
    mm = p["models"][model].get("minimal") or {}
    per, sels = mm.get("tasks", {}), mm.get("selectors", [])
    rows = [t for t in p["models"][model]["order"] if t in per]
    z = [[per[t]["k_star"].get(s) if isinstance(per[t]["k_star"].get(s), int) else None for s in sels]
         for t in rows]
    text = [[str(per[t]["k_star"].get(s, "—")) for s in sels] for t in rows]
    note = mm.get("note") or ("" if rows else "No task has a minimal set.")
    return {"tasks": rows, "selectors": sels, "z": z, "text": text, "note": note,
            "skipped": mm.get("skipped", {})}


def task_map(p: dict, model: str, task: str, lens: str = "alpha") -> list[list]:
    """``[n_layers][n_heads]`` of ``lens`` for ``task`` (None where not computed)."""
    m = p["models"][model]
    flat = m["lenses"].get(lens, {}).get(task, [None] * (m["n_layers"] * m["n_heads"]))
    H = m["n_heads"]
    return [flat[r * H:(r + 1) * H] for r in range(m["n_layers"])]


def pair_view(p: dict, model: str, a: str, b: str) -> dict:
    """Task A's and B's α maps, their difference (A − B), α similarity and the measured transfer
    (B's embedding through A's α; first-token accuracy) with B's zero-shot accuracy."""
    m = p["models"][model]
    ia, ib = m["tasks"].index(a), m["tasks"].index(b)
    ma, mb = task_map(p, model, a), task_map(p, model, b)
    diff = [[round_or_none(x - y) for x, y in zip(ra, rb, strict=True)]
            for ra, rb in zip(ma, mb, strict=True)]
    return {"a": a, "b": b, "alpha_a": ma, "alpha_b": mb, "diff": diff,
            "similarity": m["similarity"][ia][ib], "transfer": m["transfer"][ia][ib],
            "zero_shot_b": m["zero_shot"][ib]}


# The overview names every head on its x-axis up to this many heads; past it (SmolLM2: 270, Gemma: 72)
# the labels would overlap at the page's width, so it names each layer's first head (L{l}H0).
MAX_HEAD_TICKS = 64


def overview(p: dict, model: str, lens: str = "alpha") -> dict:
    """Task × head matrix of ``lens`` (rows in cluster order; tasks without the lens left out);
    ``ticks``: the heads the x-axis names (all, or each layer's first past :data:`MAX_HEAD_TICKS`)."""
    m = p["models"][model]
    rows = [t for t in m["order"] if t in m["lenses"].get(lens, {})]
    heads = [head_label(i, m["n_heads"]) for i in range(m["n_layers"] * m["n_heads"])]
    ticks = heads if len(heads) <= MAX_HEAD_TICKS else heads[::m["n_heads"]]
    return {"tasks": rows, "z": [m["lenses"][lens][t] for t in rows], "heads": heads, "ticks": ticks}
