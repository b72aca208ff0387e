"""``sitelens frontier``: how few heads carry the task (:func:`sitelens.lenses.frontier.frontier`).

Writes ``--out/frontier.csv`` (one row per selector × k × injection × seed) and
``--out/summary.json`` (k* and stability per selector); prints the k* table or, with ``--json``,
the summary. Bad input (an unknown selector, a budget above the model's head count, a task too small
to split, a malformed number) exits 2 before any model loads; for a model whose head count is not
known before loading it (no bundled record), the budgets are checked right after the load, before
any work.

Resuming: ``--out/cells/`` keeps each finished part as it finishes (each seed's and resample's
fit and each selector's sets for every budget, each seed's scored rows:
:class:`sitelens.lenses.frontier.CellStore`) and ``--out/frontier_run.json`` the settings of
the run (:func:`frontier_settings`). A rerun of the same command reads the finished parts instead
of redoing them; one with other settings is refused before any model loads, naming the options
that differ, unless ``--force``, which redoes every part.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from sitelens.cli.common import fit_config_from_args, load_task_and_model
from sitelens.cli.types import split_csv


def known_head_count(model: str) -> int | None:
    """``n_layers * n_heads`` of a bundled or tiny test model, from its record; None for another
    model (known once it is loaded)."""
    from sitelens.models.registry import BUNDLED, TINY_MODELS

    if model in TINY_MODELS:
        import inspect

        from sitelens.testing import tiny_model

        d = inspect.signature(tiny_model).parameters
        kw = {name: TINY_MODELS[model].get(name, d[name].default) for name in ("n_layers", "n_heads")}
        return kw["n_layers"] * kw["n_heads"]
    record = BUNDLED.get(model)
    return None if record is None else record.n_layers * record.n_heads


def check_frontier_options(args) -> None:
    """``sitelens frontier``: the selectors, the budgets against the head count when it is known
    before loading, and a task large enough to split (``args._task``, loaded by validate)."""
    from sitelens.lenses.registry import parse_selectors
    from sitelens.lenses.selectors import check_budgets, check_task_splits

    parse_selectors(split_csv(args.selectors))
    n = known_head_count(args.model)
    if n is not None:
        check_budgets([int(k) for k in split_csv(args.budgets)], n)
    if getattr(args, "_task", None) is not None:
        check_task_splits(args._task)


CELLS, RECORD = "cells", "frontier_run.json"
NOT_SETTINGS = ("out", "json", "force", "threads")  # options that change no number of the frontier


def frontier_settings(args) -> dict:
    """What makes a frontier, as JSON: every option of ``sitelens frontier`` but
    :data:`NOT_SETTINGS`, the hash of the task's items and the numerics version."""
    from dataclasses import fields

    from sitelens.cli.configs import FrontierCommand
    from sitelens.provenance import NUMERICS_VERSION, canonical, task_hash

    d = {f.name: getattr(args, f.name, None) for f in fields(FrontierCommand) if f.name not in NOT_SETTINGS}
    task = getattr(args, "_task", None)
    d["task_hash"] = task_hash(task) if task is not None else None
    d["numerics_version"] = NUMERICS_VERSION
    return json.loads(json.dumps(canonical(d)))


def plan_frontier(args) -> None:
    """Before any model loads: an ``--out`` holding a frontier (its ``frontier.csv`` or its
    record) made with other settings is refused, naming the options that differ, unless
    ``--force``; the same settings resume."""
    from sitelens.cli.configs import FrontierCommand
    from sitelens.cli.options import option_names
    from sitelens.cli.run import _differs
    from sitelens.errors import UsageError

    out = Path(args.out)
    now = frontier_settings(args)
    try:
        rec = json.loads((out / RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        rec = None
    held = (out / "frontier.csv").exists() or (out / CELLS).exists()
    if held and rec != now and not args.force:
        why = (", ".join(option_names(_differs(rec, now), FrontierCommand)) if isinstance(rec, dict)
               else f"unknown: no {RECORD}")
        raise UsageError(f"--out {out} already holds a frontier made with other settings ({why}); "
                         "refusing to replace it: pass --force to redo it, or choose another --out.")
    args._frontier_settings = now


def _k_cell(a: dict) -> str:
    """k* with its bootstrap interval over valid items, e.g. ``"5 [2, 10]"``; ``"—"`` for no k*."""
    if a.get("k_star") is None:
        return "—"
    iv = a.get("k_star_interval")
    same = iv is None or iv[0] == iv[1] == a["k_star"] == "not reached"  # on every resample too
    return f"{a['k_star']}" + ("" if same else f" [{iv[0]}, {iv[1]}]")


def _print_summary(summary: dict, model: str, task: str) -> None:
    """One row per selector and injection; every figure beside k* is the one at k*."""
    import pandas as pd

    def num(x, nd=2):
        return "—" if x is None else f"{x:.{nd}f}"

    rows = []
    for sel, d in summary["selectors"].items():
        for inj, a in d["at_k_star"].items():
            ci = a.get("test_ci")
            acc = "—" if ci is None else f"{a['test_acc']:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]"
            sd = a.get("stability_sd")
            stab = ("not measured" if a.get("stability") is None
                    else f"{a['stability']:.2f}" + (f" ± {sd:.2f}" if sd is not None else "")
                    + f" (n = {a['n_pairs']})")
            rows.append({"selector": sel, "injection": inj, "k* (valid)": _k_cell(a),
                         "test acc at k*": acc,
                         "adj. stability at k*": stab if isinstance(a.get("k_star"), int) else "—",
                         "note": a.get("note", ""), "forward": d["forward_passes"],
                         "backward": d["backward_passes"], "seconds": round(d["seconds"], 1)})
    g = summary["full_site_minus_zero_shot"]
    print(f"{model} on {task}: smallest k whose valid accuracy reaches {summary['threshold']:.0%} of "
          f"full SITE's (valid {num(summary['full_site_valid'], 3)}, n = {summary['n_valid']}); "
          f"reported on test (full SITE {num(summary['full_site'], 3)}, zero-shot "
          f"{num(summary['zero_shot'], 3)}, n = {summary['n_test']}; full SITE − zero-shot "
          f"{100 * g['diff']:+.1f} [{100 * g['ci_low']:.1f}, {100 * g['ci_high']:.1f}] points over "
          f"{g['n']} {g['over']})")
    if summary["status"] != "ok":
        print("no k*: full SITE does not beat zero-shot on these items (the interval of the difference "
              "reaches 0), so 90% of it says nothing about heads")
    print(pd.DataFrame(rows).to_string(index=False))


def cmd_frontier(args) -> int:
    from sitelens.lenses import AttributionConfig
    from sitelens.lenses.frontier import frontier
    from sitelens.lenses.selectors import FrontierConfig, check_budgets
    from sitelens.models import model_name

    budgets = [int(k) for k in split_csv(args.budgets)]
    model, task = load_task_and_model(
        args, check=lambda m: check_budgets(budgets, m.cfg.n_layers * m.cfg.n_heads))
    att = AttributionConfig(n_prompts=args.n_prompts, n_shots=args.n_shots, seed=args.seed,
                            n_mean_prompts=args.n_mean_prompts, n_alpha_items=args.limit,
                            n_boot=args.n_boot)
    cfg = FrontierConfig(fit=fit_config_from_args(args), attribution=att, n_prompts=args.n_mean_prompts,
                         n_shots=args.n_shots, greedy_max_k=args.greedy_max_k,
                         greedy_pool=args.greedy_pool, test_limit=args.test_limit,
                         exact_match=not args.no_exact_match, n_bootstrap=args.n_bootstrap)
    from sitelens.io import atomic_write_json, ensure_dir

    out = ensure_dir(args.out)
    settings = getattr(args, "_frontier_settings", None) or frontier_settings(args)
    atomic_write_json(out / RECORD, settings)  # before any part: the cells are of these settings
    res = frontier(model, task, budgets=budgets, selectors=split_csv(args.selectors),
                   seeds=range(args.seed, args.seed + args.seeds), config=cfg, progress=True,
                   resume_dir=out / CELLS, force=args.force)
    csv, js = res.to_dir(args.out)
    print(f"wrote {csv} ({len(res.table)} rows) and {js}", file=sys.stderr)
    if args.json:
        print(json.dumps(json.loads(js.read_text())))
    else:
        _print_summary(res.summary, model_name(model), task.name)
    return 0
