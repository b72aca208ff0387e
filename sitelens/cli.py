"""The ``sitelens`` command line: fit | eval | demo (and more as the toolkit grows).

Only this module prints and writes files; errors from bad input are printed without a traceback
and exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from sitelens.errors import SitelensError


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2-135m-instruct", help="bundled name, TL name or HF dir")
    p.add_argument("--task", required=True, help="built-in name, FV-layout dir, or JSON file")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dedupe", action="store_true", help="drop duplicate items in the task file")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")


def _fit_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--n-prompts", type=int, default=50, help="few-shot prompts for stage 1")
    p.add_argument("--n-shots", type=int, default=10)
    p.add_argument("--lr", type=float, default=0.2)
    p.add_argument("--n-examples", type=int, default=400, help="training examples in stage 2")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--sparsity", type=float, default=0.0, help="λ of the λ·mean(α) penalty")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="sitelens", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("fit", help="fit a SITE adapter (stage 1 + stage 2) and save it")
    _common(p)
    _fit_args(p)
    p.add_argument("--out", required=True, help="output directory for the adapter")

    p = sub.add_parser("eval", help="evaluate zero-shot / ICL / SITE on a task")
    _common(p)
    p.add_argument("--adapter", help="adapter directory (needed for the site method)")
    p.add_argument("--methods", default="zero-shot,icl,site")
    p.add_argument("--split", default="test")
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--n-shots", type=int, default=10)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--items", help="also write per-item results to this CSV")

    p = sub.add_parser("bench", help="models × tasks × methods → one resumable results table")
    p.add_argument("--models", default="smollm2-135m-instruct", help="comma-separated model names")
    p.add_argument("--tasks", nargs="+", default=[],
                   help="task specs (names, dirs, files), space- or comma-separated")
    p.add_argument("--tasks-dir", help="every FV-layout task directory under DIR")
    p.add_argument("--abstractive", action="store_true", help="with --tasks-dir: abstractive tasks only")
    p.add_argument("--methods", default="zero-shot,icl,site,fv,tv,ltv,mtv,i2cl,lora,ia3")
    p.add_argument("--out", required=True, help="results CSV (appended cell by cell; resumes)")
    p.add_argument("--limit", type=int, default=100, help="test items per task")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--n-ctx", type=int, default=None,
                   help="context length for the models (default 2048; squad_val needs 4096)")

    p = sub.add_parser("demo", help="fit SITE on a built-in task, compare zero-shot / ICL / SITE")
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--task", default="antonym")
    p.add_argument("--limit", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None)

    _add_patch_parsers(sub)
    return ap


def _setup(args) -> None:
    import torch

    if getattr(args, "threads", None):
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)


def _load(args):
    from sitelens.models import load_model
    from sitelens.tasks import load_task

    task = load_task(args.task, seed=args.seed, dedupe=getattr(args, "dedupe", False))
    t0 = time.perf_counter()
    model = load_model(args.model)
    print(f"loaded {args.model} in {time.perf_counter() - t0:.1f}s; task {task}", file=sys.stderr)
    return model, task


def _fit(model, task, args, progress=True):
    from sitelens.site import FitConfig, fit_site

    cfg = FitConfig(
        lr=getattr(args, "lr", 0.2),
        n_examples=getattr(args, "n_examples", 400),
        batch_size=getattr(args, "batch_size", 8),
        sparsity=getattr(args, "sparsity", 0.0),
        seed=args.seed,
    )
    return fit_site(
        model, task, n_prompts=getattr(args, "n_prompts", 50),
        n_shots=getattr(args, "n_shots", 10), config=cfg, progress=progress,
    )


def cmd_fit(args) -> int:
    out = Path(args.out)
    _check_writable(out)
    model, task = _load(args)
    adapter = _fit(model, task, args)
    adapter.save(out)
    m = adapter.meta
    print(
        f"saved {out}  stage1 {m['stage1_seconds']:.1f}s  stage2 {m['stage2_seconds']:.1f}s  "
        f"best step {m['best_step']}  valid loss {m['final_valid_loss']:.3f}"
    )
    print("top heads: " + ", ".join(f"L{lay}H{h}={a:.2f}" for lay, h, a in adapter.top_heads(8)))
    return 0


def _check_writable(out: Path) -> None:
    """Fail before any work if ``out`` cannot be created and written (a file in the way, no
    permission, ...)."""
    from sitelens.site import ensure_writable_dir

    ensure_writable_dir(out)


def cmd_eval(args) -> int:
    from sitelens.evaluate import evaluate, summarize
    from sitelens.site import SiteAdapter

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    adapter = SiteAdapter.load(args.adapter) if args.adapter else None
    if "site" in methods and adapter is None:
        from sitelens.errors import AdapterError

        raise AdapterError("Method 'site' needs --adapter DIR (write one with `sitelens fit`).")
    model, task = _load(args)
    df = evaluate(
        model, task, methods=methods, adapter=adapter, split=args.split, limit=args.limit,
        n_shots=args.n_shots, seed=args.seed,
    )
    if args.items:
        df.to_csv(args.items, index=False)
    summary = summarize(df)
    if args.json:
        obj = {
            r.method: {
                "first_token_acc": round(float(r.first_token_acc), 4),
                "exact_match": round(float(r.exact_match), 4),
                "n": int(r.n),
                "seconds_per_item": round(float(r.seconds_per_item), 5),
            }
            for r in summary.itertuples()
        }
        print(json.dumps(obj))
    else:
        print(summary.to_string(index=False))
    return 0


def _bench_tasks(args) -> list:
    from sitelens.errors import TaskError
    from sitelens.tasks import load_task

    specs = [t for arg in args.tasks for t in arg.split(",") if t]  # a/{x,y} or a/x,a/y
    if args.tasks_dir:
        root = Path(args.tasks_dir)
        if not root.is_dir():
            raise TaskError(f"--tasks-dir {root} is not a directory.")
        names = sorted(p.name for p in root.iterdir() if (p / "train.json").exists())
        if args.abstractive:
            from sitelens.bench import FV_EXTRACTIVE

            names = [n for n in names if n not in FV_EXTRACTIVE]
        specs += [str(root / n) for n in names]
    if not specs:
        raise TaskError("Give --tasks NAME[,NAME...] or --tasks-dir DIR.")
    return [load_task(s, seed=args.seed, dedupe=True) for s in specs]


def cmd_bench(args) -> int:
    from sitelens.bench import dntp_accuracy_figure, run_bench, summary_markdown

    out = Path(args.out)
    _check_writable(out.parent)
    df = run_bench(
        [m for m in args.models.split(",") if m], _bench_tasks(args),
        [m for m in args.methods.split(",") if m], out, limit=args.limit, seed=args.seed,
        progress=True, n_ctx=args.n_ctx,
    )
    md = summary_markdown(df)
    out.with_suffix(".md").write_text(md)
    fig = dntp_accuracy_figure(df)
    fig.write_html(out.with_suffix(".dntp.html"), include_plotlyjs="cdn")
    print(md)
    return 0


def cmd_demo(args) -> int:
    from sitelens.evaluate import evaluate, summarize

    model, task = _load(args)
    t0 = time.perf_counter()
    adapter = _fit(model, task, args)
    print(f"fitted SITE on {task.name} in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    df = evaluate(model, task, adapter=adapter, limit=args.limit, seed=args.seed)
    print(summarize(df).to_string(index=False))
    print("\ntop heads by α: " + ", ".join(f"L{la}H{h}={a:.2f}" for la, h, a in adapter.top_heads(8)))
    ex = df[df.method == "site"].head(5)
    print("\nSITE examples (zero-shot prompts, no demonstrations):")
    for r in ex.itertuples():
        print(f"  {r.input!r:>20} -> {r.prediction!r:<20} target {r.target!r}  {'✓' if r.correct else '✗'}")
    return 0


# ----------------------------------------------------------------------------------------------
# patch intra|inter|effects, figures


def _csv_list(s: str | None) -> list[str]:
    return [x.strip() for x in (s or "").split(",") if x.strip()]


def _add_patch_parsers(sub) -> None:
    p = sub.add_parser("patch", help="activation patching: intra | inter | effects")
    psub = p.add_subparsers(dest="patch_cmd", required=True)

    q = psub.add_parser("intra", help="inject into the top-k / bottom-k / random-k heads by α")
    _common(q)
    _fit_args(q)
    q.add_argument("--adapter", help="adapter directory (default: fit one with the --fit options)")
    q.add_argument("--ks", help="comma-separated k (default 1, 2, 4, ..., all heads)")
    q.add_argument("--n-random-seeds", type=int, default=3)
    q.add_argument("--split", default="test")
    q.add_argument("--limit", type=int, default=None)
    q.add_argument("--n-boot", type=int, default=1000)
    q.add_argument("--json", action="store_true",
                   help='print {"model", "task", "n", "zero_shot", "site", "rows": '
                        '[{"k", "top", "bottom", "random"}, ...]}')
    q.add_argument("--out", help="write the full result (one row per condition) to this CSV")

    q = psub.add_parser("inter", help="inject task B's embedding through task A's α, all pairs")
    q.add_argument("--model", default="smollm2-135m-instruct")
    q.add_argument("--tasks", required=True, help="comma-separated tasks (built-in names, dirs, files)")
    q.add_argument("--adapters", help="comma-separated adapter dirs, one per task (default: fit)")
    _fit_args(q)
    q.add_argument("--k", type=int, default=10, help="top-k heads of the topk mode")
    q.add_argument("--split", default="test")
    q.add_argument("--limit", type=int, default=None)
    q.add_argument("--n-boot", type=int, default=1000)
    q.add_argument("--seed", type=int, default=0)
    q.add_argument("--threads", type=int, default=None)
    q.add_argument("--json", action="store_true",
                   help='print {"tasks", "alpha": {A: {B: acc}}, "topk": ..., "zero_shot", '
                        '"within_between", "similarity_transfer_spearman"}')
    q.add_argument("--out", help="write the long result to this CSV")

    q = psub.add_parser("effects", help="per-head causal effects (Function Vectors style)")
    _common(q)
    q.add_argument("--adapter", help="adapter directory: its embedding is the mean activation "
                                     "and its α is correlated with the effects")
    q.add_argument("--n-prompts", type=int, default=16, help="corrupted prompts")
    q.add_argument("--n-shots", type=int, default=10)
    q.add_argument("--n-mean-prompts", type=int, default=50,
                   help="clean prompts for the mean activation (without --adapter)")
    q.add_argument("--serial", action="store_true", help="one forward pass per head (reference)")
    q.add_argument("--top", type=int, default=10, help="heads listed in the summary")
    q.add_argument("--json", action="store_true",
                   help='print {"model", "task", "top_heads": [{"head", "effect"}], '
                        '"baseline_prob", "seconds", "rho_alpha"}')
    q.add_argument("--out", help="write layer, head, effect to this CSV")

    p = sub.add_parser("figures", help="reproduce figures/ from real runs (resumable)")
    p.add_argument("--out", default="figures", help="output directory (cells cached in OUT/.runs)")
    p.add_argument("--models", default="smollm2-135m-instruct,gemma-3-270m")
    p.add_argument("--tasks", default=None, help="comma-separated task set (default: the families)")
    p.add_argument("--intra-tasks", default=None, help="comma-separated intra-task subset")
    p.add_argument("--effect-tasks", default=None)
    p.add_argument("--limit", type=int, default=40, help="test items per task")
    p.add_argument("--sparsity", default="0,5", help="comma-separated λ for intra-task patching")
    p.add_argument("--n-examples", type=int, default=200, help="stage-2 training examples")
    p.add_argument("--n-prompts", type=int, default=20, help="stage-1 few-shot prompts")
    p.add_argument("--n-shots", type=int, default=10)
    p.add_argument("--effect-prompts", type=int, default=8)
    p.add_argument("--n-random-seeds", type=int, default=3)
    p.add_argument("--n-boot", type=int, default=1000)
    p.add_argument("--no-png", action="store_true", help="HTML + CSV only")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--quiet", action="store_true")


def _adapter_or_fit(model, task, args):
    from sitelens.site import SiteAdapter

    if getattr(args, "adapter", None):
        adapter = SiteAdapter.load(args.adapter)
        adapter.check_model(model)
        return adapter
    print(f"fitting SITE on {task.name} (pass --adapter DIR to reuse one)", file=sys.stderr)
    return _fit(model, task, args, progress=False)


def _r4(x):
    x = float(x)
    return None if x != x else round(x, 4)


def cmd_patch(args) -> int:
    return {"intra": _patch_intra, "inter": _patch_inter, "effects": _patch_effects}[
        args.patch_cmd](args)


def _patch_intra(args) -> int:
    from sitelens.patching import intra_task

    model, task = _load(args)
    adapter = _adapter_or_fit(model, task, args)
    ks = [int(k) for k in _csv_list(args.ks)] or None
    df = intra_task(
        model, task, adapter, ks=ks, n_random_seeds=args.n_random_seeds, split=args.split,
        limit=args.limit, seed=args.seed, n_boot=args.n_boot,
    )
    if args.out:
        df.to_csv(args.out, index=False)
    sel = df[df.selection.isin(["top", "bottom", "random"])]
    table = sel.groupby(["k", "selection"])["accuracy"].mean().unstack("selection")
    ref = df.set_index("selection")["accuracy"]
    if args.json:
        obj = {
            "model": str(df["model"].iloc[0]), "task": task.name, "n": int(df["n"].iloc[0]),
            "zero_shot": _r4(ref.get("zero_shot", float("nan"))),
            "site": _r4(ref.get("site", float("nan"))),
            "rows": [{"k": int(k), "top": _r4(r["top"]), "bottom": _r4(r["bottom"]),
                      "random": _r4(r["random"])} for k, r in table.iterrows()],
        }
        print(json.dumps(obj))
    else:
        print(f"zero-shot {ref.get('zero_shot', float('nan')):.3f}  SITE "
              f"{ref.get('site', float('nan')):.3f}  (first-token accuracy, n={df['n'].iloc[0]})")
        print(table[["top", "bottom", "random"]].round(3).to_string())
    return 0


def _patch_inter(args) -> int:
    from sitelens.models import load_model
    from sitelens.patching import (
        alpha_similarity,
        inter_task,
        transfer_matrix,
        transfer_similarity_correlation,
        within_between,
    )
    from sitelens.site import SiteAdapter
    from sitelens.tasks import load_task

    names = _csv_list(args.tasks)
    if len(names) < 2:
        from sitelens.errors import TaskError

        raise TaskError("patch inter needs at least two tasks: --tasks a,b[,c...].")
    tasks = [load_task(n, seed=args.seed) for n in names]
    dirs = _csv_list(args.adapters)
    if dirs and len(dirs) != len(tasks):
        from sitelens.errors import AdapterError

        raise AdapterError(f"--adapters has {len(dirs)} directories for {len(tasks)} tasks; "
                           "give one per task, in the order of --tasks.")
    model = load_model(args.model)
    adapters = {}
    for i, task in enumerate(tasks):
        if dirs:
            adapters[task.name] = SiteAdapter.load(dirs[i])
        else:
            print(f"fitting SITE on {task.name}", file=sys.stderr)
            adapters[task.name] = _fit(model, task, args, progress=False)
    df = inter_task(model, tasks, adapters, k=args.k, split=args.split, limit=args.limit,
                    seed=args.seed, n_boot=args.n_boot)
    if args.out:
        df.to_csv(args.out, index=False)
    sim = alpha_similarity(adapters, k=args.k)
    alpha_m = transfer_matrix(df, mode="alpha")
    obj = {
        "model": str(df["model"].iloc[0]),
        "tasks": [t.name for t in tasks],
        "alpha": {a: {b: _r4(v) for b, v in row.items()} for a, row in alpha_m.iterrows()},
        "topk": {a: {b: _r4(v) for b, v in row.items()}
                 for a, row in transfer_matrix(df, mode="topk").iterrows()},
        "zero_shot": {b: _r4(v) for b, v in df.groupby("target_task")["zero_shot"].first().items()},
        "within_between": {k: _r4(v) for k, v in within_between(alpha_m).items()},
    }
    if len(tasks) >= 3:
        c = transfer_similarity_correlation(sim["spearman"], df, mode="alpha", seed=args.seed)
        obj["similarity_transfer_spearman"] = {"rho": _r4(c["rho"]), "p_value": _r4(c["p_value"])}
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


def _patch_effects(args) -> int:
    import numpy as np

    from sitelens.patching import effect_alpha_correlation, head_causal_effects

    model, task = _load(args)
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
    L, H = eff.shape
    if args.out:
        import pandas as pd

        layer, head = np.divmod(np.arange(L * H), H)
        pd.DataFrame({"layer": layer, "head": head, "effect": eff.flatten().numpy()}).to_csv(
            args.out, index=False)
    order = eff.flatten().argsort(descending=True)[: args.top]
    obj = {
        "model": _model_label(model), "task": task.name, "n_prompts": st["n_prompts"],
        "mode": st["mode"], "seconds": round(st["seconds"], 3),
        "baseline_prob": _r4(st["baseline_prob"]),
        "top_heads": [{"head": f"L{int(i) // H}H{int(i) % H}", "effect": _r4(eff.flatten()[i])}
                      for i in order],
    }
    if adapter is not None:
        obj["rho_alpha"] = _r4(effect_alpha_correlation(eff, adapter.alpha))
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


def _model_label(model) -> str:
    from sitelens.models import model_name

    return model_name(model)


def cmd_figures(args) -> int:
    from sitelens import figures as F

    kw = {}
    if args.tasks:
        kw["tasks"] = _csv_list(args.tasks)
    if args.intra_tasks:
        kw["intra_tasks"] = _csv_list(args.intra_tasks)
    if args.effect_tasks:
        kw["effect_tasks"] = _csv_list(args.effect_tasks)
    res = F.make_figures(
        args.out, models=_csv_list(args.models), limit=args.limit,
        sparsity=[float(x) for x in _csv_list(args.sparsity)], seed=args.seed,
        n_examples=args.n_examples, n_prompts=args.n_prompts, n_shots=args.n_shots,
        effect_prompts=args.effect_prompts, n_random_seeds=args.n_random_seeds, n_boot=args.n_boot,
        formats=("html",) if args.no_png else ("png", "html"), threads=args.threads,
        progress=not args.quiet, **kw,
    )
    s = res.summary
    if s.get("png_error"):
        print(f"note: no PNGs ({s['png_error']})", file=sys.stderr)
    for m in s["models"]:
        main = f"{m['main_sparsity']:g}"
        gaps = "; ".join(
            f"λ={lam} {key}: top {d[key]['top']} vs bottom {d[key]['bottom']}"
            for lam, d in m["intra"].items() for key in d if key.startswith("k=")
        )
        tr = m["transfer"]["alpha"]
        print(f"{m['model']}: {gaps}; transfer within {tr['within']} vs between {tr['between']} "
              f"(λ={main}); ρ(α sim, transfer) "
              f"{m['similarity_transfer_spearman']['spearman']['rho']}")
    print(f"wrote {res.out_dir}/ (summary.json, summary.csv, one folder per model)")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        _setup(args)
        commands = {"fit": cmd_fit, "eval": cmd_eval, "bench": cmd_bench, "demo": cmd_demo}
        commands.update({"patch": cmd_patch, "figures": cmd_figures})
        return commands[args.cmd](args)
    except SitelensError as e:
        print(f"sitelens: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
