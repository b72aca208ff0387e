"""``sitelens run``: a whole task in one process: one model load, then the SITE fit and the
evaluation, written to one folder exactly as ``sitelens fit`` and ``sitelens eval`` would write
them, and resumed.

``--out DIR`` (default ``runs/MODEL/TASK``) holds:

- ``adapter/``: the adapter, as ``sitelens fit --out DIR/adapter`` writes it (only with the
  ``site`` method; nothing is fitted without it);
- ``eval.json``: the summary, as ``sitelens eval --json`` prints it;
- ``items.csv``: the per-item rows with their settings, as ``sitelens eval --items`` writes them;
- ``run.json``: the settings each part was made with (:func:`run_settings`), written after the part.

Resuming (:func:`plan_run`, before any model loads): a part whose settings in ``run.json`` equal
this run's is reused (the adapter is not refitted, a finished evaluation is not rerun; with both
done no model is loaded at all); a part left there with other settings, or without a record of
them, is refused unless ``--force``, which replaces it. Only the parts that differ are redone.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from sitelens.cli.common import fit_config_from_args, fit_from_args, load_task_and_model, top_heads_line
from sitelens.cli.fit_eval import _print_summary, _with_settings
from sitelens.cli.summary import fit_data_lines
from sitelens.cli.types import split_csv
from sitelens.errors import UsageError
from sitelens.io import atomic_write_csv, atomic_write_json, atomic_write_text, check_dir, check_output

ADAPTER, EVAL, ITEMS, RECORD = "adapter", "eval.json", "items.csv", "run.json"


def default_out(args) -> Path:
    """``runs/MODEL/TASK``: the last part of ``--model`` (a name or a Hugging Face folder) and
    the task's name."""
    return Path("runs") / Path(args.model.rstrip("/")).name / args._task.name


def run_settings(args) -> dict:
    """What made each part, as JSON-able dicts: ``base`` (model as given, task and the hash of its
    splits, seed, the load options with the backend used, the numerics version), ``fit`` (the
    adapter's hyperparameters as ``adapter.json`` records them; None without the site method) and
    ``eval`` (methods, split, limit, shots, protocol, label metrics, and the fit its site rows
    used)."""

    from sitelens.models.spec import chosen_backend
    from sitelens.provenance import NUMERICS_VERSION, canonical, task_hash

    task, methods = args._task, split_csv(args.methods)
    load = {k: getattr(args, k) for k in ("device", "dtype", "n_devices", "device_map")}
    load["backend"] = chosen_backend(args.backend)  # the backend used, also when not given
    base = {"model": args.model, "task": task.name, "task_hash": task_hash(task), "seed": args.seed,
            "load": load, "numerics_version": NUMERICS_VERSION}
    fit = None
    if "site" in methods:
        cfg = fit_config_from_args(args)
        fit = {"config": type(cfg).__name__,
               **dict(cfg.settings(), n_prompts=args.n_prompts, n_shots=args.n_shots)}
    ev = {"methods": methods, "split": args.split, "limit": args.limit,
          "n_shots": args.n_shots if "icl" in methods else None, "protocol": args.protocol,
          "label_metrics": bool(args.label_metrics), "fit": fit}
    return json.loads(json.dumps(canonical({"base": base, "fit": fit, "eval": ev})))


def _record(out: Path) -> dict | None:
    """``run.json`` of ``out`` (None if absent or unreadable)."""
    try:
        rec = json.loads((out / RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) else None


def _differs(old, new, prefix: str = "") -> list[str]:
    """The keys whose values differ between two settings dicts, nested keys dotted."""
    if not (isinstance(old, dict) and isinstance(new, dict)):
        return [prefix.rstrip(".") or "all"] if old != new else []
    return [d for k in sorted(set(old) | set(new))
            for d in _differs(old.get(k), new.get(k), f"{prefix}{k}.")]


def _changed(old: dict | None, new: dict, parts: tuple[str, ...]) -> str:
    """The options whose settings differ between the record ``old`` and ``new`` in ``parts``,
    as the user types them (:func:`sitelens.cli.options.option_names`)."""
    from sitelens.cli.configs import CONFIGS
    from sitelens.cli.options import option_names

    if not old:
        return f"unknown: no {RECORD}"
    diff = [d for p in parts for d in _differs(old.get(p), new.get(p))]
    return ", ".join(option_names(diff, CONFIGS["run"]))


def _refuse(out: Path, what: str, why: str) -> None:
    raise UsageError(f"--out {out} already holds {what} {why}; refusing to replace it: pass --force "
                     "to replace it, or choose another --out.")


def plan_run(args) -> dict:
    """Check ``--out`` (a writable folder, its files of the right kinds) and what an earlier run
    left there, before any model loads; return (and keep as ``args._plan``) ``{"out", "settings",
    "fit": "reuse" | "fit" | None, "eval": "reuse" | "run"}``. A part made with other settings, or
    one without a record of its settings, raises :class:`UsageError` unless ``--force``."""
    if args.out is None:
        args.out = str(default_out(args))
    out = check_dir(args.out)
    for name, kind in ((EVAL, "json"), (ITEMS, "csv"), (RECORD, "json")):
        check_output(out / name, kind, option=f"--out (its {name})")
    now = run_settings(args)
    rec = _record(out) or {}
    load = (rec.get("base") or {}).get("load")
    if isinstance(load, dict) and load.get("backend", "") is None:
        # a run.json written before the backend used was recorded: it ran on the default, which
        # follows the same rule today
        load["backend"] = now["base"]["load"]["backend"]
    same_base = rec.get("base") == now["base"]
    has_adapter = (out / ADAPTER / "adapter.json").exists() or (out / ADAPTER).is_file()
    has_eval = (out / EVAL).exists() or (out / ITEMS).exists()
    plan = {"out": out, "settings": now, "fit": None, "eval": "run"}
    if now["fit"] is not None:
        plan["fit"] = "reuse" if has_adapter and same_base and rec.get("fit") == now["fit"] else "fit"
        if plan["fit"] == "fit" and has_adapter and not args.force:
            _refuse(out, "an adapter", f"fitted with other settings ({_changed(rec, now, ('base', 'fit'))})")
    if has_eval and same_base and rec.get("eval") == now["eval"] and plan["fit"] != "fit":
        plan["eval"] = "reuse" if (out / EVAL).exists() and (out / ITEMS).exists() else "run"
    elif has_eval and not args.force:
        _refuse(out, "an evaluation",
                f"made with other settings ({_changed(rec, now, ('base', 'eval')) or 'its fit'})")
    args._plan = plan
    return plan


def _write_record(out: Path, settings: dict, parts: tuple[str, ...]) -> None:
    atomic_write_json(out / RECORD, {"base": settings["base"],
                                     **{p: settings[p] for p in parts}})


def _fit_or_reuse(model, task, args, plan):
    """The adapter of ``OUT/adapter``: fitted and saved (then ``run.json`` records the fit), or
    the earlier one, checked against ``model``."""
    from sitelens.io import ensure_dir
    from sitelens.site import SiteAdapter

    out, where = plan["out"], plan["out"] / ADAPTER
    if plan["fit"] == "reuse":
        adapter = SiteAdapter.load(where)
        adapter.check_model(model)
        m = adapter.meta
        print(f"reused the adapter in {where} (same settings; fitted in stage1 "
              f"{m['stage1_seconds']:.1f}s  stage2 {m['stage2_seconds']:.1f}s)", file=sys.stderr)
        return adapter
    adapter = fit_from_args(model, task, args)
    ensure_dir(where)  # after the fit: one that fails leaves no empty folder (writable: plan_run)
    adapter.save(where)
    _write_record(out, plan["settings"], ("fit",))  # the evaluation, if any, is now stale
    m = adapter.meta
    print(f"saved {where}  stage1 {m['stage1_seconds']:.1f}s  stage2 {m['stage2_seconds']:.1f}s  "
          f"best step {m['best_step']}  valid loss {m['final_valid_loss']:.3f}", file=sys.stderr)
    for line in fit_data_lines(m):
        print(line, file=sys.stderr)
    return adapter


def _finished(plan, as_json: bool) -> int:
    """Print the earlier run's summary (``eval.json`` with ``--json``; else the table, from
    ``items.csv``, and the adapter's top heads) without loading a model."""
    import pandas as pd

    from sitelens.eval.evaluation import summarize

    out = plan["out"]
    print(f"{out} holds this run, with the same settings: nothing to redo (the adapter and the "
          f"evaluation are reused)", file=sys.stderr)
    if as_json:
        print((out / EVAL).read_text(encoding="utf-8").strip())
        return 0
    items = pd.read_csv(out / ITEMS, keep_default_na=False, na_values=[""])
    _print_summary(summarize(items.drop(columns=["model"], errors="ignore")))
    if plan["fit"] == "reuse":
        from sitelens.site import SiteAdapter

        print("top heads by α: " + top_heads_line(SiteAdapter.load(out / ADAPTER)))
    return 0


def cmd_run(args) -> int:
    """Fit SITE (or reuse ``OUT/adapter``) and evaluate ``--methods`` with one model load; write
    the adapter, ``eval.json`` and ``items.csv``; print the summary with its intervals and the top
    heads (on stderr with ``--json``, whose stdout is one JSON object)."""
    from sitelens.cli.summary import summary_json
    from sitelens.eval.evaluation import evaluate, summarize

    plan = getattr(args, "_plan", None) or plan_run(args)
    if plan["eval"] == "reuse":
        return _finished(plan, args.json)
    out, methods = plan["out"], split_csv(args.methods)
    model, task = load_task_and_model(args)
    adapter = _fit_or_reuse(model, task, args, plan) if plan["fit"] else None
    df = evaluate(
        model, task, methods=methods, adapter=adapter, split=args.split, limit=args.limit,
        n_shots=args.n_shots, seed=args.seed, protocol=args.protocol,
        label_metrics=True if args.label_metrics else None, progress=True,
    )
    summary = summarize(df)
    atomic_write_csv(out / ITEMS, _with_settings(df, model, task, adapter, args))
    atomic_write_text(out / EVAL, summary_json(summary) + "\n")
    _write_record(out, plan["settings"], ("fit", "eval"))
    _print_summary(summary, args.json)
    if adapter is not None:
        print("top heads by α: " + top_heads_line(adapter), file=sys.stderr if args.json else sys.stdout)
    print(f"wrote {out}/ ({ADAPTER + '/, ' if adapter is not None else ''}{EVAL}, {ITEMS}, {RECORD})",
          file=sys.stderr)
    return 0


__all__ = ["cmd_run", "default_out", "plan_run", "run_settings"]
