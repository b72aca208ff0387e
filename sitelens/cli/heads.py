"""``sitelens heads``: which heads matter, by several lenses (:mod:`sitelens.lenses`).

Runs :func:`sitelens.lenses.head_scores` on one model and task and writes the
:class:`~sitelens.lenses.HeadScores` table (one row per lens, layer and head) to ``--out`` as CSV.
Prints a short table per lens (top-5 heads, forward and backward passes, seconds) or, with
``--json``, one JSON object whose NaNs are ``null``.
"""

from __future__ import annotations

import json
import sys

from sitelens.cli.common import fit_config_from_args, load_task_and_model, saturation_notice
from sitelens.cli.types import split_csv
from sitelens.format import round_or_none, round_sig_or_none


def _configs(args):
    """``(AttributionConfig, AblationConfig)`` of the options: the same prompts, shots, seed and
    bootstrap for every lens that takes them."""
    from sitelens.lenses import AblationConfig, AttributionConfig

    att = AttributionConfig(n_prompts=args.n_prompts, n_shots=args.n_shots, seed=args.seed,
                            n_mean_prompts=args.n_mean_prompts, n_alpha_items=args.limit,
                            n_boot=args.n_boot)
    abl = AblationConfig(n_prompts=args.n_prompts, n_shots=args.n_shots, seed=args.seed,
                         n_boot=args.n_boot)
    return att, abl


def heads_summary(run, model: str, task: str, k: int = 10, n_key_value_heads: int | None = None
                  ) -> dict:
    """The ``--json`` object: per lens its top ``k`` heads ``[layer, head, score]`` (scores to 4
    significant digits) and its cost; ``alpha_stability`` (mean pairwise Spearman and top-10
    Jaccard of the seeds' α) when the alpha lens ran with two seeds or more. NaN is ``None``."""
    scores = run.scores
    lenses = {}
    for lens in scores.lenses:
        row = scores.lens(lens).df.iloc[0]
        lenses[lens] = {
            "top": [[layer, head, round_sig_or_none(s)] for layer, head, s in scores.top(k, lens)],
            "forward_passes": int(row["forward_passes"]),
            "backward_passes": int(row["backward_passes"]),
            "seconds": round(float(row["seconds"]), 3),
        }
    obj = {"model": model, "task": task, "lenses": lenses}
    n_heads = scores.shape[1]
    if n_key_value_heads and n_key_value_heads < n_heads:  # GQA / MQA: per key/value group too
        g = scores.by_kv_group(n_key_value_heads)
        obj["kv_groups"] = {
            "n_key_value_heads": int(n_key_value_heads), "aggregation": "sum over query heads",
            "top": {lens: [[int(r.layer), int(r.kv_group), round_sig_or_none(r.score)]
                           for r in d.sort_values("score", ascending=False).head(5).itertuples()]
                    for lens, d in g.groupby("lens", sort=False)}}
    stab = None if run.alpha is None else run.alpha.stability
    if "alpha" in lenses and stab is not None and len(stab):
        jac = next((c for c in stab.columns if c.endswith("_jaccard")), None)
        obj["alpha_stability"] = {
            "spearman_mean": round_or_none(stab["spearman"].mean()),
            "top10_jaccard_mean": round_or_none(stab[jac].mean()) if jac else None,
        }
    return obj


def _print_table(obj: dict) -> None:
    import pandas as pd

    rows = [{"lens": lens, "top-5 heads": " ".join(f"L{layer}H{head}" for layer, head, _ in d["top"][:5]),
             "forward": d["forward_passes"], "backward": d["backward_passes"],
             "seconds": d["seconds"]} for lens, d in obj["lenses"].items()]
    print(f"{obj['model']} on {obj['task']}: top heads per lens (higher score = more important)")
    print(pd.DataFrame(rows).to_string(index=False))
    if "kv_groups" in obj:
        kv = obj["kv_groups"]
        print(f"per key/value group ({kv['n_key_value_heads']} groups per layer, {kv['aggregation']}):")
        for lens, top in kv["top"].items():
            print(f"  {lens}: " + " ".join(f"L{layer}G{g}" for layer, g, _ in top))
    if "alpha_stability" in obj:
        s = obj["alpha_stability"]
        print(f"α over seeds: mean pairwise Spearman {s['spearman_mean']}, "
              f"top-10 Jaccard {s['top10_jaccard_mean']}")


def cmd_heads(args) -> int:
    """Score every head of ``--model`` on ``--task`` with ``--lenses``; write the table to
    ``--out`` and print the summary (``--json``: one JSON object)."""
    from sitelens.lenses import head_scores, parse_lenses
    from sitelens.models import model_name
    from sitelens.site import SiteAdapter

    lenses = parse_lenses(split_csv(args.lenses))
    adapter = SiteAdapter.load(args.adapter) if args.adapter else None
    model, task = load_task_and_model(args, check=None if adapter is None else adapter.check_model)
    att, abl = _configs(args)
    run = head_scores(
        model, task, lenses, seeds=range(args.seed, args.seed + args.seeds),
        fit_config=fit_config_from_args(args), attribution=att, ablation=abl, adapter=adapter,
        progress=True,
    )
    run.scores.to_csv(args.out)
    print(f"wrote {args.out} ({len(run.scores)} rows: {len(lenses)} lenses x "
          f"{model.cfg.n_layers * model.cfg.n_heads} heads)", file=sys.stderr)
    obj = heads_summary(run, model_name(model), task.name,
                        n_key_value_heads=getattr(model.cfg, "n_key_value_heads", None))
    if "alpha" in lenses:
        if adapter is not None:
            print(f"alpha lens: the α of --adapter {args.adapter} (one fit, no interval over seeds; "
                  'meta "source": "adapter" in the CSV)', file=sys.stderr)
        k = 10 if args.json else 5  # the heads the summary shows
        saturation_notice(run.scores.map("alpha"), k, f"the alpha lens's top-{k}")
    if args.json:
        print(json.dumps(obj, allow_nan=False))
    else:
        _print_table(obj)
    return 0
