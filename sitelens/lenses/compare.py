"""Comparing lenses: rank agreement, and a verified top-k (heuristic stopping rule) that verifies
exactly only the heads the fast lens ranks best.

- :func:`lens_agreement`: for every model × task in a :class:`HeadScores` table and every pair of
  its lenses, the Spearman correlation over heads and the top-k Jaccard overlap.
- :func:`fast_vs_exact`: every fast lens of a :class:`HeadScores` table against its exact
  ``effect`` lens (Spearman, top-k recall, passes and seconds of both), and the certified top-k of
  AtP / AtP* replayed on the full exact run.
- :func:`certify_top_k` (pure, on arrays) and :func:`certified_top_k` (runs the exact patching):
  rank heads by a fast lens (AtP), verify the best-ranked heads exactly, ``step`` at a time; the
  residual ``r`` is the largest ``|exact − fast|`` seen among verified heads; verification stops
  (the result's ``certified`` flag) once the k-th best verified exact effect exceeds ``fast + r`` of
  every head not yet verified, or at ``budget`` (a share of all heads) with the flag unset. This
  is a heuristic stopping rule, not a bound: it assumes the residuals of unverified heads are no
  larger than the largest seen among the verified ones (the heads with the largest effects), and a
  head with a larger error can be missed. The names ``certify_top_k`` / ``certified_top_k`` and the
  ``certified`` key are kept as the results' keys; read them as "verified, the rule stopped".
"""

from __future__ import annotations

import json
import time
from itertools import combinations

import numpy as np
import pandas as pd
import torch

from sitelens.eval.metrics import correlation
from sitelens.heads import ranking
from sitelens.lenses.scores import HeadScores
from sitelens.patching.effects import EffectsConfig, corrupted_prompts
from sitelens.patching.engine import ForwardPassCounter, RowCounter, prefix_rows, run_rows
from sitelens.stats import jaccard


def lens_agreement(scores: HeadScores, k: int = 10, lenses: list[str] | None = None) -> pd.DataFrame:
    """One row per (model, task, lens_a, lens_b): ``spearman`` and ``top{k}_jaccard``."""
    rows = []
    for (model, task), d in scores.df.groupby(["model", "task"], sort=False):
        have = [x for x in (lenses or list(dict.fromkeys(d.lens))) if x in set(d.lens)]
        maps = {x: d[d.lens == x].sort_values(["layer", "head"])["score"].to_numpy(float)
                for x in have}
        for a, b in combinations(have, 2):
            rows.append({"model": model, "task": task, "lens_a": a, "lens_b": b,
                         "spearman": correlation(maps[a], maps[b], "spearman"),
                         f"top{k}_jaccard": jaccard(ranking(maps[a])[:k], ranking(maps[b])[:k])})
    return pd.DataFrame(rows)


FAST_LENSES = ("alpha", "alpha-official", "alpha-grad", "atp", "atp-star", "ablation-mean", "ablation-zero",
               "dla")


def _head_map(df: pd.DataFrame, lens: str) -> np.ndarray:
    return df[df.lens == lens].sort_values(["layer", "head"])["score"].to_numpy(float)


def fast_vs_exact(scores: HeadScores, k: int = 10, lenses=FAST_LENSES, certify=("atp", "atp-star"),
                  budget: float = 0.15) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per (model, task) of ``scores`` that has the exact ``effect`` lens: one row per fast lens
    (``spearman`` and ``top{k}_recall`` against ``effect``, its passes and seconds, and the exact
    run's ``exact_forward_passes``, ``exact_rows``, ``exact_seconds``); and one row per lens of
    ``certify`` and rule (``absolute``, ``relative``): :func:`certify_top_k` with the exact values
    read from the full exact run (each of its rows is one head on one prompt, so a subset gives the
    same numbers), rows counted as :func:`certified_top_k` runs them (one unpatched row per prompt,
    then one per verified head and prompt), ``budget`` a share of the full run's rows
    ``(n_heads + 1) × n_prompts``."""
    rows, cert = [], []
    for (model, task), s in scores.df.groupby(["model", "task"], sort=False):
        if "effect" not in set(s.lens):
            continue
        ex, e_row = _head_map(s, "effect"), s[s.lens == "effect"].iloc[0]
        meta, n = json.loads(e_row["meta"]), len(ex)
        for lens in [x for x in lenses if x in set(s.lens)]:
            f, r = _head_map(s, lens), s[s.lens == lens].iloc[0]
            rows.append({"model": model, "task": task, "lens": lens,
                         "spearman": correlation(f, ex, "spearman"),
                         f"top{k}_recall": len(set(ranking(f)[:k]) & set(ranking(ex)[:k])) / k,
                         "forward_passes": int(r.forward_passes), "backward_passes": int(r.backward_passes),
                         "seconds": float(r.seconds), "exact_forward_passes": int(e_row.forward_passes),
                         "exact_rows": int(meta["rows"]), "exact_seconds": float(e_row.seconds)})
        for lens in [x for x in certify if x in set(s.lens)]:
            for rule in ("absolute", "relative"):
                max_heads = int(np.floor(budget * (n + 1))) - 1
                c = certify_top_k(_head_map(s, lens), lambda idx, ex=ex: ex[np.asarray(idx)], k=k,
                                  budget=max_heads / n, rule=rule)
                n_rows = (len(c["verified"]) + 1) * meta["n_prompts"]
                cert.append({"model": model, "task": task, "lens": lens, "rule": rule,
                             "verified": len(c["verified"]), "verified_share": len(c["verified"]) / n,
                             "recall": len(set(c["top"]) & set(ranking(ex)[:k])) / k,
                             "certified": c["certified"], "rounds": c["rounds"], "rows": n_rows,
                             "exact_rows_share": n_rows / meta["rows"], "n_heads": n})
    return pd.DataFrame(rows), pd.DataFrame(cert)


def certify_top_k(fast: np.ndarray, exact_of, k: int = 10, budget: float = 0.15,
                  step: int | None = None, rule: str = "absolute") -> dict:
    """The verification loop (heuristic stopping rule) on flat arrays. ``exact_of(idx) -> values``
    returns the exact scores of the heads ``idx`` (called once per round with the new heads only).
    Returns ``verified`` (flat indices, in verification order), ``exact`` (their values), ``top``
    (the k best verified), ``certified`` (the stopping rule held; not a guarantee), ``residual``,
    ``rounds`` (calls of ``exact_of``).

    ``rule``: how an unverified head's exact score is bounded from its fast score ``f``:
    ``"absolute"`` ``f + r`` with ``r`` the largest ``|exact − fast|`` seen; ``"relative"``
    ``f + ρ·|f|`` with ``ρ`` the largest ``|exact − fast| / |fast|`` seen (errors proportional
    to the effect, as a first-order estimate's are when it is not saturated)."""
    if rule not in ("absolute", "relative"):
        raise ValueError(f"rule must be 'absolute' or 'relative', got {rule!r}.")
    fast = np.asarray(fast, dtype=float)
    n = len(fast)
    order = np.argsort(-fast, kind="stable")
    limit = min(n, max(k, int(np.floor(budget * n + 1e-9))))
    step = step or k
    verified: list[int] = []
    exact: list[float] = []
    certified, r, rounds = False, float("nan"), 0
    while len(verified) < limit:
        rounds += 1
        new = order[len(verified): min(limit, len(verified) + (k if not verified else step))]
        exact += [float(v) for v in exact_of(new)]
        verified += [int(i) for i in new]
        ev, fv = np.array(exact), fast[verified]
        if rule == "absolute":
            r = float(np.max(np.abs(ev - fv)))
        else:
            r = float(np.max(np.abs(ev - fv) / np.maximum(np.abs(fv), 1e-12)))
        kth = np.sort(ev)[::-1][min(k, len(ev)) - 1]
        rest = order[len(verified):]
        bound = fast[rest] + (r if rule == "absolute" else r * np.abs(fast[rest]))
        if len(verified) >= k and (len(rest) == 0 or kth > float(np.max(bound))):
            certified = True
            break
    ev = np.array(exact)
    top = [verified[i] for i in np.argsort(-ev, kind="stable")[:k]]
    return {"verified": verified, "exact": ev, "top": top, "certified": certified, "residual": r,
            "rounds": rounds}


def certified_top_k(
    model, task, fast: HeadScores, embedding, config: EffectsConfig | None = None, *,
    k: int = 10, budget: float = 0.15, step: int | None = None, rule: str = "absolute",
) -> dict:
    """Verified top-k heads (heuristic stopping rule, see the module docstring) of exact activation
    patching (the ``effect`` lens, same corrupted prompts and embedding as ``config``) using
    ``fast`` (one lens, e.g. ``atp``) to choose which heads to verify. The prefix KV cache and the
    unpatched row of each prompt are computed once; each round runs one last-token row per (prompt,
    new head). Returns :func:`certify_top_k`'s
    dict with ``top`` as ``(layer, head)`` pairs, plus ``forward_passes``, ``rows``
    (single-token rows run, ``(verified + 1) × n_prompts``; counted by
    :class:`~sitelens.patching.engine.RowCounter`), ``seconds``."""
    cfg = config or EffectsConfig()
    L, H = model.cfg.n_layers, model.cfg.n_heads
    f = fast.map().flatten().numpy()  # [n_layers * n_heads]
    emb = embedding.to(model.cfg.device)  # [n_layers, n_heads, d_head]
    t0 = time.perf_counter()
    with ForwardPassCounter(model) as passes, RowCounter(model) as rows:
        prompts, answers = corrupted_prompts(
            model, task, n_prompts=cfg.n_prompts, n_shots=cfg.n_shots, split=cfg.split,
            seed=cfg.seed, template=cfg.template)
        cache, last, ans = prefix_rows(model, prompts, answers)
        n = len(prompts)

        def run(weights: torch.Tensor) -> torch.Tensor:  # weights [c, L, H] -> probs [n, c]
            c = weights.shape[0]
            item = torch.arange(n).repeat_interleave(c)  # [n * c], prompt-major
            cond = torch.arange(c).repeat(n)  # [n * c]
            _, prob = run_rows(model, cache, last, ans, item, cond, weights, emb,
                                batch_size=cfg.batch_size)
            return prob.reshape(n, c)

        base = run(torch.zeros(1, L, H))[:, 0]  # [n_prompts]

        def exact_of(idx):
            onehots = torch.zeros(len(idx), L * H)  # [c, L * H]
            onehots[torch.arange(len(idx)), torch.as_tensor(idx)] = 1
            return (run(onehots.reshape(-1, L, H)) - base[:, None]).mean(0).numpy()  # [c]

        out = certify_top_k(f, exact_of, k=k, budget=budget, step=step, rule=rule)
    out["top"] = [(i // H, i % H) for i in out["top"]]
    out.update(forward_passes=passes.count, rows=rows.count, seconds=time.perf_counter() - t0)
    return out
