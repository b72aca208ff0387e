"""``sitelens patch intra | inter | effects``: activation patching (:mod:`sitelens.patching`).

Each prints a short table (or, with ``--json``, one JSON object whose NaNs are ``null``) and
writes the full result to ``--out`` as CSV.
"""

from __future__ import annotations

import json
import sys

from sitelens.cli.common import (
    adapter_or_fit,
    fit_from_args,
    load_spec,
    load_task_and_model,
    saturation_notice,
)
from sitelens.cli.types import split_csv
from sitelens.cli.validate import check_heads, inter_tasks
from sitelens.format import round_or_none, round_values
from sitelens.io import atomic_write_csv


def cmd_patch(args) -> int:
    """Run the patch subcommand ``args.patch_cmd``."""
    return {"intra": patch_intra, "inter": patch_inter, "effects": patch_effects}[
        args.patch_cmd](args)


def patch_intra(args) -> int:
    """Inject the task embedding into the top-k / bottom-k / random-k heads by α, for each k."""
    from sitelens.patching import intra_task
    from sitelens.site import alpha_saturation

    ks = [int(k) for k in split_csv(args.ks)] or None
    model, task = load_task_and_model(args, check=lambda m: check_heads(m, ks or [], "--ks"))
    adapter = adapter_or_fit(model, task, args)
    n_sat = alpha_saturation(adapter.alpha).n_saturated
    saturation_notice(adapter.alpha, min(ks or [1]),
                      f"the top-k heads by α for every k below {n_sat} (and top vs bottom there)")
    df = intra_task(
        model, task, adapter, ks=ks, n_random_seeds=args.n_random_seeds, split=args.split,
        limit=args.limit, seed=args.seed, n_boot=args.n_boot,
    )
    if args.out:
        atomic_write_csv(args.out, df)
    sel = df[df.selection.isin(["top", "bottom", "random"])]
    table = sel.groupby(["k", "selection"])["accuracy"].mean().unstack("selection")
    ref = df.set_index("selection")["accuracy"]
    if args.json:
        obj = {
            "model": str(df["model"].iloc[0]), "task": task.name, "n": int(df["n"].iloc[0]),
            "zero_shot": round_or_none(ref.get("zero_shot", float("nan"))),
            "site": round_or_none(ref.get("site", float("nan"))),
            "rows": [{"k": int(k), "top": round_or_none(r["top"]),
                      "bottom": round_or_none(r["bottom"]), "random": round_or_none(r["random"])}
                     for k, r in table.iterrows()],
        }
        print(json.dumps(obj))
    else:
        print(f"zero-shot {ref.get('zero_shot', float('nan')):.3f}  SITE "
              f"{ref.get('site', float('nan')):.3f}  (first-token accuracy, n={df['n'].iloc[0]})")
        print(table[["top", "bottom", "random"]].round(3).to_string())
    return 0


def _inter_adapters(model, tasks, args) -> dict:
    """``{task name: adapter}``: the ``--adapters`` directories in the order of ``--tasks``, or
    SITE fitted on each task with the fit options."""
    from sitelens.site import SiteAdapter

    dirs = split_csv(args.adapters)
    adapters = {}
    for i, task in enumerate(tasks):
        if dirs:
            adapters[task.name] = SiteAdapter.load(dirs[i])
        else:
            print(f"fitting SITE on {task.name}", file=sys.stderr)
            adapters[task.name] = fit_from_args(model, task, args)
    return adapters


def _inter_summary(df, tasks, alpha_m, sim, seed: int) -> dict:
    """The ``--json`` object of ``patch inter`` (accuracies rounded, NaN as ``None``);
    ``alpha_m`` is the accuracy matrix of the alpha mode, ``sim`` the α similarities."""
    from sitelens.patching import transfer_matrix, transfer_similarity_correlation, within_between

    obj = {
        "model": str(df["model"].iloc[0]),
        "tasks": [t.name for t in tasks],
        "alpha": {a: round_values(row) for a, row in alpha_m.iterrows()},
        "topk": {a: round_values(row) for a, row in transfer_matrix(df, mode="topk").iterrows()},
        "zero_shot": round_values(df.groupby("target_task")["zero_shot"].first()),
        "within_between": round_values(within_between(alpha_m)),
    }
    if len(tasks) >= 3:
        c = transfer_similarity_correlation(sim["spearman"], df, mode="alpha", seed=seed)
        obj["similarity_transfer_spearman"] = {"rho": round_or_none(c["rho"]),
                                               "p_value": round_or_none(c["p_value"])}
    return obj


def patch_inter(args) -> int:
    """Inject each task B's embedding through each task A's α (and A's top-k heads), all pairs;
    with three or more tasks, correlate α similarity with transfer."""
    from sitelens.models import load_model
    from sitelens.patching import alpha_similarity, inter_task, transfer_matrix

    tasks = inter_tasks(args)
    model = load_model(args.model, spec=load_spec(args))
    check_heads(model, [args.k], "--k")
    adapters = _inter_adapters(model, tasks, args)
    df = inter_task(model, tasks, adapters, k=args.k, split=args.split, limit=args.limit,
                    seed=args.seed, n_boot=args.n_boot)
    if args.out:
        atomic_write_csv(args.out, df)
    sim = alpha_similarity(adapters, k=args.k)
    alpha_m = transfer_matrix(df, mode="alpha")  # [A tasks, B tasks]
    obj = _inter_summary(df, tasks, alpha_m, sim, args.seed)
    if args.json:
        print(json.dumps(obj))
    else:
        print("accuracy on B (columns) with B's embedding through A's α (rows):")
        print(alpha_m.round(3).to_string())
        print("\nα similarity (Spearman):")
        print(sim["spearman"].round(3).to_string())
        if "similarity_transfer_spearman" in obj:
            print(f"\nSpearman(α similarity, transfer) = {obj['similarity_transfer_spearman']}")
    return 0


def _write_effects_csv(path: str, eff) -> None:
    """``layer, head, effect`` rows of the ``[n_layers, n_heads]`` effects."""
    import numpy as np
    import pandas as pd

    L, H = eff.shape
    layer, head = np.divmod(np.arange(L * H), H)
    atomic_write_csv(path, pd.DataFrame({"layer": layer, "head": head, "effect": eff.flatten().numpy()}))


def patch_effects(args) -> int:
    """Per-head causal effects (Function Vectors style); with ``--adapter``, its embedding is the
    mean activation and Spearman ρ(effect, α) is reported."""
    from sitelens.models import model_name
    from sitelens.patching import effect_alpha_correlation, head_causal_effects

    model, task = load_task_and_model(args)
    adapter = None
    if args.adapter:
        from sitelens.site import SiteAdapter

        adapter = SiteAdapter.load(args.adapter)
        adapter.check_model(model)
    eff, st = head_causal_effects(
        model, task, n_prompts=args.n_prompts, n_shots=args.n_shots, seed=args.seed,
        batched=not args.serial, embedding=None if adapter is None else adapter.embedding,
        n_mean_prompts=args.n_mean_prompts, return_stats=True,
    )  # [n_layers, n_heads]
    H = eff.shape[1]
    if args.out:
        _write_effects_csv(args.out, eff)
    order = eff.flatten().argsort(descending=True)[: args.top]
    obj = {
        "model": model_name(model), "task": task.name, "n_prompts": st["n_prompts"],
        "mode": st["mode"], "seconds": round(st["seconds"], 3),
        "baseline_prob": round_or_none(st["baseline_prob"]),
        "top_heads": [{"head": f"L{int(i) // H}H{int(i) % H}",
                       "effect": round_or_none(eff.flatten()[i])} for i in order],
    }
    if adapter is not None:
        obj["rho_alpha"] = round_or_none(effect_alpha_correlation(eff, adapter.alpha))
    if args.json:
        print(json.dumps(obj))
    else:
        print(f"baseline P(answer) on corrupted prompts {obj['baseline_prob']}; "
              f"{obj['mode']} in {obj['seconds']}s")
        print("top heads by causal effect: "
              + ", ".join(f"{h['head']}={h['effect']:+.4f}" for h in obj["top_heads"]))
        if "rho_alpha" in obj:
            print(f"Spearman ρ(effect, α) = {obj['rho_alpha']}")
    return 0
