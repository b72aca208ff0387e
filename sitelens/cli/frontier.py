"""``sitelens heads --frontier``: how few heads carry the task (:func:`sitelens.lenses.frontier.frontier`).

Writes ``--out/frontier.csv`` (one row per selector × k × injection × seed) and
``--out/summary.json`` (k* and stability per selector); prints the k* table or, with ``--json``,
the summary. Bad input (an unknown selector, a budget above the model's head count, a task too small
to split, a malformed number) exits 2 before any model loads; for a model whose head count is not
known before loading it, the budgets are checked right after the load, before any work.
"""

from __future__ import annotations

import inspect
import json
import sys

from sitelens.cli.common import fit_config_from_args, load_task_and_model
from sitelens.cli.parser import split_csv
from sitelens.errors import UsageError

# heads (n_layers × n_heads) of the models whose size is known before loading them
KNOWN_HEADS = {"smollm2-135m-instruct": 30 * 9, "gemma-3-270m": 18 * 4}


def _tiny_heads() -> int:
    from sitelens.models import tiny_model

    d = inspect.signature(tiny_model).parameters
    return d["n_layers"].default * d["n_heads"].default


def known_head_count(model: str) -> int | None:
    from sitelens.models.registry import TINY_MODELS

    return _tiny_heads() if model in TINY_MODELS else KNOWN_HEADS.get(model)


def parse_budgets(text: str) -> list[int]:
    try:
        ks = [int(x) for x in split_csv(text)]
    except ValueError:
        raise UsageError(f"--budgets must be comma-separated whole numbers, got {text!r}.") from None
    if not ks or min(ks) < 1:
        raise UsageError(f"--budgets must be positive whole numbers, got {text!r}.")
    return ks


# the options only --frontier reads (sitelens.cli.frontier_options)
FRONTIER_DESTS = ("budgets", "selectors", "greedy_max_k", "greedy_pool", "test_limit", "no_exact_match",
                  "n_bootstrap")


def check_frontier_options(args) -> None:
    """``sitelens heads``: ``--lenses`` unless ``--frontier``; with ``--frontier``: the selectors,
    the budgets (against the head count when known before loading), positive sizes, and a task
    large enough to split (``args._task``, loaded by validate)."""
    if not getattr(args, "frontier", False):
        from sitelens.cli.guards import given

        ignored = [f"--{d.replace('_', '-')}" for d in FRONTIER_DESTS if d in given(args)]
        if ignored:
            raise UsageError(f"{', '.join(ignored)} apply only with --frontier: add --frontier "
                             f"(and drop --lenses) or drop {', '.join(ignored)}.")
        if not args.lenses:
            raise UsageError("heads needs --lenses (the lenses to score) or --frontier; see "
                             "sitelens heads --help.")
        return
    if args.lenses:
        raise UsageError("--frontier runs its own selectors (--selectors); drop --lenses.")
    from sitelens.lenses.selectors import check_budgets, check_task_splits, parse_selectors

    parse_selectors(split_csv(args.selectors))
    ks = parse_budgets(args.budgets)
    n = known_head_count(args.model)
    if n is not None:
        check_budgets(ks, n)
    for opt in ("greedy_max_k", "greedy_pool", "test_limit"):
        v = getattr(args, opt)
        if v is not None and v < 1:
            raise UsageError(f"--{opt.replace('_', '-')} must be at least 1, got {v}.")
    if args.n_bootstrap < 0:
        raise UsageError(f"--n-bootstrap must be at least 0, got {args.n_bootstrap}.")
    if getattr(args, "_task", None) is not None:
        check_task_splits(args._task)


def _print_summary(summary: dict, model: str, task: str) -> None:
    import pandas as pd

    rows = [{"selector": sel, **{f"k* {inj}": ks for inj, ks in d["k_star"].items()},
             "stability": None if d["stability"] is None else round(d["stability"], 2),
             "note": d["note"], "forward": d["forward_passes"], "backward": d["backward_passes"],
             "seconds": round(d["seconds"], 1)} for sel, d in summary["selectors"].items()]
    print(f"{model} on {task}: smallest k reaching {summary['threshold']:.0%} of full SITE "
          f"({summary['full_site']:.3f}; zero-shot {summary['zero_shot']:.3f}; n = {summary['n_test']})")
    print(pd.DataFrame(rows).to_string(index=False))


def cmd_frontier(args) -> int:
    from sitelens.lenses import AttributionConfig
    from sitelens.lenses.frontier import frontier
    from sitelens.lenses.selectors import FrontierConfig, check_budgets
    from sitelens.models import model_name

    budgets = parse_budgets(args.budgets)
    model, task = load_task_and_model(
        args, check=lambda m: check_budgets(budgets, m.cfg.n_layers * m.cfg.n_heads))
    att = AttributionConfig(n_prompts=args.n_prompts, n_shots=args.n_shots, seed=args.seed,
                            n_mean_prompts=args.n_mean_prompts, n_alpha_items=args.limit,
                            n_boot=args.n_boot)
    cfg = FrontierConfig(fit=fit_config_from_args(args), attribution=att, n_prompts=args.n_mean_prompts,
                         n_shots=args.n_shots, greedy_max_k=args.greedy_max_k,
                         greedy_pool=args.greedy_pool, test_limit=args.test_limit,
                         exact_match=not args.no_exact_match, n_bootstrap=args.n_bootstrap)
    seeds = 1 if type(args.seeds) is not int else args.seeds  # --seeds given: that many fits
    res = frontier(model, task, budgets=budgets, selectors=split_csv(args.selectors),
                   seeds=range(args.seed, args.seed + seeds), config=cfg, progress=True)
    csv, js = res.to_dir(args.out)
    print(f"wrote {csv} ({len(res.table)} rows) and {js}", file=sys.stderr)
    if args.json:
        print(json.dumps(json.loads(js.read_text())))
    else:
        _print_summary(res.summary, model_name(model), task.name)
    return 0
