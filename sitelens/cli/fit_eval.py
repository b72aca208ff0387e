"""``sitelens fit``, ``sitelens eval`` and ``sitelens demo``."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from sitelens.cli.common import fit_from_args, load_task_and_model, top_heads_line
from sitelens.cli.parser import split_csv
from sitelens.format import round_or_none
from sitelens.io import atomic_write_csv


def cmd_fit(args) -> int:
    """Fit SITE (stage 1 + stage 2) on ``--task`` and save the adapter to ``--out``."""
    from sitelens.site import ensure_writable_dir

    out = Path(args.out)
    ensure_writable_dir(out)  # fail before any work if --out cannot be created and written
    model, task = load_task_and_model(args)
    adapter = fit_from_args(model, task, args)
    adapter.save(out)
    m = adapter.meta
    print(
        f"saved {out}  stage1 {m['stage1_seconds']:.1f}s  stage2 {m['stage2_seconds']:.1f}s  "
        f"best step {m['best_step']}  valid loss {m['final_valid_loss']:.3f}"
    )
    print("top heads: " + top_heads_line(adapter))
    return 0


def _summary_json(summary) -> str:
    """``{method: {"first_token_acc", "exact_match", "n", "seconds_per_item"}}`` as one line, plus
    ``label_acc_first``, ``label_acc_full``, ``label_acc_full_norm`` and ``chance`` for a task with
    a closed label set (None where undefined)."""
    labelled = [c for c in ("label_acc_first", "label_acc_full", "label_acc_full_norm", "chance")
                if c in summary.columns]
    obj = {
        r.method: {
            "first_token_acc": round(float(r.first_token_acc), 4),
            "exact_match": round(float(r.exact_match), 4),
            "n": int(r.n),
            "seconds_per_item": round(float(r.seconds_per_item), 5),
            **{c: round_or_none(getattr(r, c)) for c in labelled},
        }
        for r in summary.itertuples()
    }
    return json.dumps(obj)


def _with_settings(df, model, task, adapter, args):
    """The per-item rows with the settings that made them as leading columns (model and weight
    fingerprint, task hash, split, n_shots, seed, protocol, the adapter's fit settings, numerics
    version), so an ``--items`` file says what it was computed with."""
    from sitelens.models import fingerprint, model_name
    from sitelens.provenance import NUMERICS_VERSION, settings_hash, task_hash

    settings = {
        "model": model_name(model), "fingerprint": fingerprint(model),
        "task_hash": task_hash(task), "split": args.split,
        "limit": -1 if args.limit is None else args.limit, "n_shots": args.n_shots,
        "seed": args.seed, "protocol": getattr(args, "protocol", None) or (
            adapter.meta.get("protocol", "default") if adapter is not None else "default"),
        "adapter": "" if adapter is None else settings_hash(adapter.meta.get("hyperparameters")),
        "numerics_version": NUMERICS_VERSION,
    }
    out = df.copy()
    for i, (k, v) in enumerate(settings.items()):
        if k not in out.columns:
            out.insert(i, k, v)
    return out


def cmd_eval(args) -> int:
    """Evaluate ``--methods`` on a split of ``--task``; print the summary (``--json``: one JSON
    object) and write the per-item rows, with the settings that made them, to ``--items``."""
    from sitelens.eval.evaluate import evaluate, summarize
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
        progress=True,
    )
    if args.items:
        atomic_write_csv(args.items, _with_settings(df, model, task, adapter, args))
    summary = summarize(df)
    print(_summary_json(summary) if args.json else summary.to_string(index=False))
    return 0


def cmd_demo(args) -> int:
    """Fit SITE on ``--task`` and compare zero-shot / 10-shot ICL / SITE on ``--limit`` test
    items; print the summary, the top heads and a few SITE predictions."""
    from sitelens.eval.evaluate import evaluate, summarize

    model, task = load_task_and_model(args)
    t0 = time.perf_counter()
    adapter = fit_from_args(model, task, args)
    print(f"fitted SITE on {task.name} in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    df = evaluate(model, task, adapter=adapter, limit=args.limit, seed=args.seed, progress=True)
    print(summarize(df).to_string(index=False))
    print("\ntop heads by α: " + top_heads_line(adapter))
    ex = df[df.method == "site"].head(5)
    print("\nSITE examples (zero-shot prompts, no demonstrations):")
    for r in ex.itertuples():
        print(f"  {r.input!r:>20} -> {r.prediction!r:<20} target {r.target!r}  {'✓' if r.correct else '✗'}")
    return 0
