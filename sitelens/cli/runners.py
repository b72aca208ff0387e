"""``sitelens bench`` and ``sitelens figures``: the commands that drive the resumable runners
(:func:`sitelens.pipelines.bench.run_bench`, :func:`sitelens.pipelines.figures.make_figures`)."""

from __future__ import annotations

import sys

from sitelens.cli.common import load_spec
from sitelens.cli.types import split_csv
from sitelens.cli.validate import bench_tasks
from sitelens.io import atomic_write_text, check_output, ensure_dir


def cmd_bench(args) -> int:
    """Run models × tasks × methods into the ``--out`` CSV (resuming: cells already there are
    skipped), then write its markdown summary (``.md``) and dNTP plot (``.dntp.html``) beside it
    and print the summary."""
    from sitelens.pipelines.bench import run_bench
    from sitelens.pipelines.bench_summary import dntp_accuracy_figure, summary_markdown
    from sitelens.pipelines.executors import make_executor
    from sitelens.viz.export import write_figure_html

    out = check_output(args.out, "csv")  # the results CSV; the summary goes beside it
    md_path, html_path = out.with_suffix(".md"), out.with_suffix(".dntp.html")
    check_output(md_path, "md", option="--out (its .md summary)")
    check_output(html_path, "html", option="--out (its .dntp.html plot)")
    ensure_dir(out.parent)
    with make_executor(args.executor, threads=args.threads) as executor:
        df = run_bench(
            [m for m in args.models.split(",") if m], bench_tasks(args),
            [m for m in args.methods.split(",") if m], out, limit=args.limit, seed=args.seed,
            progress=True, n_ctx=args.n_ctx, executor=executor, load=load_spec(args),
            label_metrics=args.label_metrics, joint=args.joint,
        )
    md = summary_markdown(df)
    atomic_write_text(md_path, md)
    fig = dntp_accuracy_figure(df)
    write_figure_html(fig, html_path)  # beside it one shared plotly.min.js: renders offline
    print(md)
    return 0


def _figures_headline(m: dict) -> str:
    """One line per model of ``summary.json``: the top-vs-bottom gaps of intra-task patching,
    transfer within vs between task families, ρ(α similarity, transfer)."""
    main = f"{m['main_sparsity']:g}"
    gaps = "; ".join(
        f"λ={lam} {key}: top {d[key]['top']} vs bottom {d[key]['bottom']}"
        for lam, d in m["intra"].items() for key in d if key.startswith("k=")
    )
    tr = m["transfer"]["alpha"]
    return (f"{m['model']}: {gaps}; transfer within {tr['within']} vs between {tr['between']} "
            f"(λ={main}); ρ(α sim, transfer) "
            f"{m['similarity_transfer_spearman']['spearman']['rho']}")


def cmd_figures(args) -> int:
    """Reproduce ``figures/`` (or ``--out``) from real runs: cells are cached under ``OUT/.runs``
    and reused when their key matches; prints one headline per model."""
    from sitelens.pipelines import figures as F

    kw = {}
    if args.tasks:
        kw["tasks"] = split_csv(args.tasks)
    if args.intra_tasks:
        kw["intra_tasks"] = split_csv(args.intra_tasks)
    if args.effect_tasks:
        kw["effect_tasks"] = split_csv(args.effect_tasks)
    res = F.make_figures(
        args.out, models=split_csv(args.models), limit=args.limit,
        sparsity=[float(x) for x in split_csv(args.sparsity)], seed=args.seed,
        n_examples=args.n_examples, n_prompts=args.n_prompts, n_shots=args.n_shots,
        effect_prompts=args.effect_prompts, n_random_seeds=args.n_random_seeds, n_boot=args.n_boot,
        formats=("html",) if args.no_png else ("png", "html"), threads=args.threads,
        progress=not args.quiet, executor=args.executor, load=load_spec(args), joint=args.joint,
        **kw,
    )
    s = res.summary
    if s.get("png_error"):
        print(f"note: no PNGs ({s['png_error']})", file=sys.stderr)
    for m in s["models"]:
        print(_figures_headline(m))
    print(f"wrote {res.out_dir}/ (summary.json, summary.csv, one folder per model)")
    return 0
