"""``sitelens fit``, ``sitelens eval`` and ``sitelens demo``."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from sitelens.cli.common import fit_from_args, load_task_and_model, top_heads_line
from sitelens.cli.summary import few_items_warning, fit_data_lines, summary_json, summary_text
from sitelens.cli.types import split_csv
from sitelens.io import atomic_write_csv


def _print_summary(summary, as_json: bool = False) -> None:
    """The summary (:func:`~sitelens.cli.summary.summary_text` or ``summary_json``) on stdout, and
    the few-items warning on stderr."""
    print(summary_json(summary) if as_json else summary_text(summary))
    warning = few_items_warning(summary)
    if warning:
        print(warning, file=sys.stderr)


def cmd_fit(args) -> int:
    """Fit SITE (stage 1 + stage 2) on ``--task`` and save the adapter to ``--out``; print the
    timings, the data it used (split sizes, passes; a warning on stderr for a tiny validation
    set) and the top heads."""
    from sitelens.io import new_dir_or_nothing

    out = Path(args.out)
    # --out is made first so that a bad path fails before any work, and removed if the work fails
    with new_dir_or_nothing(out):
        model, task = load_task_and_model(args)
        adapter = fit_from_args(model, task, args)
        adapter.save(out)
    m = adapter.meta
    print(
        f"saved {out}  stage1 {m['stage1_seconds']:.1f}s  stage2 {m['stage2_seconds']:.1f}s  "
        f"best step {m['best_step']}  valid loss {m['final_valid_loss']:.3f}"
    )
    for line in fit_data_lines(m):
        print(line, file=sys.stderr if line.startswith("warning:") else sys.stdout)
    print("top heads: " + top_heads_line(adapter))
    return 0


# The per-item file's names of the columns that are a method's mean, not an item's own figure:
# the generation (and label ranking) is timed once per method's batch of items.
ITEMS_FILE_NAMES = {"seconds_per_item": "method_seconds_per_item",
                    "label_seconds_per_item": "method_label_seconds_per_item"}


def _with_settings(df, model, task, adapter, args):
    """The per-item rows with the settings that made them as leading columns (model and weight
    fingerprint, task hash, split, the --limit asked and the items scored, n_shots, seed, protocol,
    the adapter's fit settings, numerics version), so an ``--items`` file says what it was computed
    with. The method's mean time per item (timed over the method's items together) is
    ``method_seconds_per_item`` (:data:`ITEMS_FILE_NAMES`), never a per-item figure."""
    from sitelens.models import fingerprint, model_name
    from sitelens.provenance import NUMERICS_VERSION, settings_hash, task_hash

    settings = {
        "model": model_name(model), "fingerprint": fingerprint(model),
        "task_hash": task_hash(task), "split": args.split,
        "limit": -1 if args.limit is None else args.limit,
        # the items each method was scored on: a --limit above the split's size caps nothing
        "n_items": int(df.groupby("method").size().max()) if "method" in df.columns else len(df),
        "n_shots": args.n_shots,
        "seed": args.seed, "protocol": getattr(args, "protocol", None) or (
            adapter.meta.get("protocol", "default") if adapter is not None else "default"),
        "adapter": "" if adapter is None else settings_hash(adapter.meta.get("hyperparameters")),
        "numerics_version": NUMERICS_VERSION,
    }
    # the generation is timed per method, not per item: its mean is named as the method's
    out = df.rename(columns=ITEMS_FILE_NAMES)
    for i, (k, v) in enumerate(settings.items()):
        if k not in out.columns:
            out.insert(i, k, v)
    return out


def cmd_eval(args) -> int:
    """Evaluate ``--methods`` on a split of ``--task``; print the summary, every accuracy with its
    95% interval over items (``--json``: one JSON object; a warning on stderr under 100 items),
    and write the per-item rows, with the settings that made them, to ``--items``. Label metrics
    with ``--label-metrics`` or for a task that declares its labels."""
    from sitelens.eval.evaluation import evaluate, summarize
    from sitelens.site import SiteAdapter

    methods = split_csv(args.methods)
    adapter = SiteAdapter.load(args.adapter) if args.adapter else None
    if "site" in methods and adapter is None:
        from sitelens.errors import AdapterError

        raise AdapterError("Method 'site' needs --adapter DIR (write one with `sitelens fit`).")
    model, task = load_task_and_model(args)
    df = evaluate(
        model, task, methods=methods, adapter=adapter, split=args.split, limit=args.limit,
        n_shots=args.n_shots, seed=args.seed, protocol=getattr(args, "protocol", None),
        label_metrics=True if args.label_metrics else None,
        progress=True,
    )
    if args.items:
        atomic_write_csv(args.items, _with_settings(df, model, task, adapter, args))
    _print_summary(summarize(df), args.json)
    return 0


def cmd_demo(args) -> int:
    """Fit SITE on ``--task`` and compare zero-shot / 10-shot ICL / SITE on ``--limit`` test
    items; print the summary, the top heads and a few SITE predictions."""
    from sitelens.eval.evaluation import evaluate, summarize

    model, task = load_task_and_model(args)
    t0 = time.perf_counter()
    adapter = fit_from_args(model, task, args)
    print(f"fitted SITE on {task.name} in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    for line in fit_data_lines(adapter.meta):
        print(line, file=sys.stderr)
    df = evaluate(model, task, adapter=adapter, limit=args.limit, seed=args.seed, progress=True)
    _print_summary(summarize(df))
    print("\ntop heads by α: " + top_heads_line(adapter))
    ex = df[df.method == "site"].head(5)
    print("\nSITE examples (zero-shot prompts, no demonstrations):")
    for r in ex.itertuples():
        print(f"  {r.input!r:>20} -> {r.prediction!r:<20} target {r.target!r}  {'✓' if r.correct else '✗'}")
    return 0
