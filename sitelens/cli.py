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
    p.add_argument("--tasks", default="", help="comma-separated task specs (names, dirs, files)")
    p.add_argument("--tasks-dir", help="every FV-layout task directory under DIR")
    p.add_argument("--abstractive", action="store_true", help="with --tasks-dir: abstractive tasks only")
    p.add_argument("--methods", default="zero-shot,icl,site,fv,tv,ltv,mtv,i2cl,lora,ia3")
    p.add_argument("--out", required=True, help="results CSV (appended cell by cell; resumes)")
    p.add_argument("--limit", type=int, default=100, help="test items per task")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None)

    p = sub.add_parser("demo", help="fit SITE on a built-in task, compare zero-shot / ICL / SITE")
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--task", default="antonym")
    p.add_argument("--limit", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None)
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
    from sitelens.errors import OutputError

    probe = out if out.exists() else next((p for p in out.parents if p.exists()), Path("."))
    import os

    if not os.access(probe, os.W_OK):
        raise OutputError(f"Cannot write to {out}: {probe} is not writable. Choose another --out.")


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

    specs = [t for t in args.tasks.split(",") if t]
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
    out.parent.mkdir(parents=True, exist_ok=True)
    df = run_bench(
        [m for m in args.models.split(",") if m], _bench_tasks(args),
        [m for m in args.methods.split(",") if m], out, limit=args.limit, seed=args.seed,
        progress=True,
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


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        _setup(args)
        commands = {"fit": cmd_fit, "eval": cmd_eval, "bench": cmd_bench, "demo": cmd_demo}
        return commands[args.cmd](args)
    except SitelensError as e:
        print(f"sitelens: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
