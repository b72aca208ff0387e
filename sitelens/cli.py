"""The ``sitelens`` command line: fit | eval | demo (and more as the toolkit grows).

Only this module prints and writes files; errors from bad input are printed without a traceback
and exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

from sitelens.errors import SitelensError, UsageError
from sitelens.io import atomic_write_csv, atomic_write_text, check_dir, check_output, ensure_dir

# ----------------------------------------------------------------------------------------------
# argument parsing: one-line errors; every number and list is checked while parsing


def _one_line(msg) -> str:
    """``msg`` on one line (a value with a newline in it must not start a second line)."""
    return " ".join(part.strip() for part in str(msg).splitlines() if part.strip())


class _Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are ONE line on stderr, ``sitelens: error: ...``
    with a pointer to ``--help`` (no usage block), and exit status 2. Subcommand parsers are
    made with this class too (``add_subparsers(parser_class=_Parser)``)."""

    def error(self, message: str):
        self.exit(2, f"sitelens: error: {_one_line(message)} (see `{self.prog} --help`)\n")

    def parse_known_args(self, args=None, namespace=None):
        ns, extras = super().parse_known_args(args, namespace)
        for a in self._actions:  # Python < 3.12 turns `--opt=--` into [] without calling the type
            if a.option_strings and a.nargs is None and isinstance(getattr(ns, a.dest, None), list):
                self.error(f"argument {'/'.join(a.option_strings)}: expected one argument, got "
                           "'--'")
        return ns, extras


def _int_type(lo: int, hi: int | None = None, what: str = "a positive integer"):
    def parse(s: str) -> int:
        try:
            v = int(s)
        except ValueError:
            v = None
        if v is None or v < lo or (hi is not None and v > hi):
            raise argparse.ArgumentTypeError(f"must be {what}, got {s!r}")
        return v

    parse.__name__ = what
    return parse


def _float_type(what: str):
    def parse(s: str) -> float:
        try:
            v = float(s)
        except ValueError:
            v = math.nan
        if not math.isfinite(v):
            raise argparse.ArgumentTypeError(f"must be {what}, got {s!r}")
        return v

    parse.__name__ = what
    return parse


_POS_INT = _int_type(1)
_SEED = _int_type(0, 2**32 - 1, "an integer seed in [0, 4294967295]")
_THREADS = _int_type(1, 1024, "a number of threads in [1, 1024]")
_LAMBDA = _float_type("a finite number")
_SPLITS = ("train", "valid", "test")


def _list_type(item, what: str):
    """A comma-separated, non-empty list without duplicates whose items ``item`` accepts; the
    string itself is kept (the commands split it)."""

    def parse(s: str) -> str:
        items = _csv_list(s)
        if not items:
            raise argparse.ArgumentTypeError(f"must list at least one {what}, got {s!r}")
        for x in items:
            item(x)
        dup = next((x for i, x in enumerate(items) if x in items[:i]), None)
        if dup is not None:
            raise argparse.ArgumentTypeError(f"lists {dup!r} twice; give each {what} once")
        return s

    parse.__name__ = what
    return parse


def _ks_item(x: str) -> None:
    try:
        _POS_INT(x)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"must be comma-separated positive integers (numbers of heads), got {x!r}"
        ) from None


def _lambda_item(x: str) -> None:
    try:
        _LAMBDA(x)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"must be comma-separated finite numbers (λ values), got {x!r}"
        ) from None


def _method_item(allowed: str):
    def check(x: str) -> None:
        import difflib

        if allowed == "bench":
            from sitelens.baselines import available_methods

            names = available_methods()
        else:
            from sitelens.evaluate import METHODS

            names = list(METHODS)
        if x not in names:
            close = difflib.get_close_matches(x, names, n=3, cutoff=0.5)
            raise argparse.ArgumentTypeError(
                f"unknown method {x!r}; use {', '.join(names)}"
                + (f" (did you mean {', '.join(close)}?)" if close else "")
            )

    return check


def _name_item(x: str) -> None:
    return None


_KS = _list_type(_ks_item, "k")
_LAMBDAS = _list_type(_lambda_item, "λ")
_BENCH_METHODS = _list_type(_method_item("bench"), "method")
_EVAL_METHODS = _list_type(_method_item("eval"), "method")
_NAMES = _list_type(_name_item, "name")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2-135m-instruct", help="bundled name, TL name or HF dir")
    p.add_argument("--task", required=True, help="built-in name, FV-layout dir, or JSON file")
    p.add_argument("--seed", type=_SEED, default=0)
    p.add_argument("--dedupe", action="store_true", help="drop duplicate items in the task file")
    p.add_argument("--threads", type=_THREADS, default=None, help="torch CPU threads")


class _Unset(int):
    """An int default that :func:`_fit` can tell apart from the same value given on the command
    line (``--protocol official`` changes the default, not a value the user chose)."""


def _fit_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--n-prompts", type=_POS_INT, default=50, help="few-shot prompts for stage 1")
    p.add_argument("--n-shots", type=_POS_INT, default=10)
    p.add_argument("--lr", type=float, default=0.2)
    p.add_argument("--n-examples", type=_POS_INT, default=400, help="training examples in stage 2")
    p.add_argument("--batch-size", type=_POS_INT, default=_Unset(8),
                   help="stage-2 batch size (default 8; 1 with --protocol official)")
    p.add_argument("--sparsity", type=_LAMBDA, default=0.0, help="λ of the λ·mean(α) penalty")
    p.add_argument("--protocol", choices=["default", "official"], default="default",
                   help="stage 2 as sitelens does it (batched passes, best α) or as the paper's "
                        "code does (400 i.i.d. steps of batch 1, final α, no space before digits)")


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="sitelens", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=_Parser, metavar="COMMAND")

    p = sub.add_parser("fit", help="fit a SITE adapter (stage 1 + stage 2) and save it")
    _common(p)
    _fit_args(p)
    p.add_argument("--out", required=True, help="output directory for the adapter")

    p = sub.add_parser("eval", help="evaluate zero-shot / ICL / SITE on a task")
    _common(p)
    p.add_argument("--adapter", help="adapter directory (needed for the site method)")
    p.add_argument("--methods", type=_EVAL_METHODS, default="zero-shot,icl,site")
    p.add_argument("--split", choices=_SPLITS, default="test")
    p.add_argument("--limit", type=_POS_INT, default=None)
    p.add_argument("--n-shots", type=_POS_INT, default=10)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--items", help="also write per-item results to this CSV")
    p.add_argument("--protocol", choices=["default", "official"], default=None,
                   help="generation and scoring: sitelens's or the paper code's (20 tokens, no "
                        "newline stop, '(' cut, St.→Saint); default: the adapter's, else default")

    p = sub.add_parser("bench", help="models × tasks × methods → one resumable results table")
    p.add_argument("--models", type=_NAMES, default="smollm2-135m-instruct",
                   help="comma-separated model names")
    p.add_argument("--tasks", nargs="+", default=[],
                   help="task specs (names, dirs, files), space- or comma-separated")
    p.add_argument("--tasks-dir", help="every FV-layout task directory under DIR")
    p.add_argument("--abstractive", action="store_true", help="with --tasks-dir: abstractive tasks only")
    p.add_argument("--methods", type=_BENCH_METHODS,
                   default="zero-shot,icl,site,fv,tv,ltv,mtv,i2cl,lora,ia3")
    p.add_argument("--out", required=True, help="results CSV (appended cell by cell; resumes)")
    p.add_argument("--limit", type=_POS_INT, default=100, help="test items per task")
    p.add_argument("--seed", type=_SEED, default=0)
    p.add_argument("--threads", type=_THREADS, default=None)
    p.add_argument("--n-ctx", type=_POS_INT, default=None,
                   help="context length for the models (default 2048; squad_val needs 4096)")

    p = sub.add_parser("demo", help="fit SITE on a built-in task, compare zero-shot / ICL / SITE")
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--task", default="antonym")
    p.add_argument("--limit", type=_POS_INT, default=50)
    p.add_argument("--seed", type=_SEED, default=0)
    p.add_argument("--threads", type=_THREADS, default=None)

    _add_patch_parsers(sub)
    return ap


def _setup(args) -> None:
    import torch

    if getattr(args, "threads", None):
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)


def _load(args, check=None):
    """The task (already loaded by :func:`_validate` when it ran) and the model; ``check(model)``
    runs before anything is printed (checks that need the model, e.g. k <= its heads)."""
    from sitelens.models import load_model
    from sitelens.tasks import load_task

    task = getattr(args, "_task", None)
    if task is None:
        task = load_task(args.task, seed=args.seed, dedupe=getattr(args, "dedupe", False))
    t0 = time.perf_counter()
    model = load_model(args.model)
    if check is not None:
        check(model)
    print(f"loaded {args.model} in {time.perf_counter() - t0:.1f}s; task {task}", file=sys.stderr)
    return model, task


def _fit(model, task, args, progress=True):
    from sitelens.site import FitConfig, fit_site

    official = getattr(args, "protocol", "default") == "official"
    batch_size = getattr(args, "batch_size", 8)
    if official and isinstance(batch_size, _Unset):
        batch_size = 1
    cfg = (FitConfig.official if official else FitConfig)(
        lr=getattr(args, "lr", 0.2),
        n_examples=getattr(args, "n_examples", 400),
        batch_size=int(batch_size),
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
        n_shots=args.n_shots, seed=args.seed, protocol=getattr(args, "protocol", None),
    )
    if args.items:
        atomic_write_csv(args.items, df)
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

    if getattr(args, "_tasks", None) is not None:  # loaded by _validate
        return args._tasks
    if args.abstractive and not args.tasks_dir:
        raise UsageError("--abstractive selects among the tasks of --tasks-dir; give --tasks-dir DIR.")
    specs = [t for arg in args.tasks for t in arg.split(",") if t]  # a/{x,y} or a/x,a/y
    if args.tasks_dir:
        root = Path(args.tasks_dir)
        if not root.is_dir():
            raise TaskError(f"--tasks-dir {root} is not a directory; give the directory that holds "
                            "one FV-layout folder (TASK/train.json, ...) per task.")
        names = sorted(p.name for p in root.iterdir() if (p / "train.json").exists())
        if args.abstractive:
            from sitelens.bench import FV_EXTRACTIVE

            names = [n for n in names if n not in FV_EXTRACTIVE]
        if not names:
            raise TaskError(f"--tasks-dir {root} holds no task folder (TASK/train.json); give the "
                            "directory that holds one FV-layout folder per task.")
        specs += [str(root / n) for n in names]
    if not specs:
        raise TaskError("Give --tasks NAME[,NAME...] or --tasks-dir DIR.")
    tasks = []
    for s in specs:
        try:
            tasks.append(load_task(s, seed=args.seed, dedupe=True))
        except OSError as e:  # e.g. a name too long for a path
            raise TaskError(f"Cannot read the task {s!r}: {e.strerror or e}; give a built-in task "
                            "name, an FV-layout directory or a JSON file.") from e
    return tasks


def cmd_bench(args) -> int:
    from sitelens.bench import dntp_accuracy_figure, run_bench, summary_markdown

    out = check_output(args.out, "csv")  # the results CSV; the summary goes beside it
    md_path, html_path = out.with_suffix(".md"), out.with_suffix(".dntp.html")
    check_output(md_path, "md", option="--out (its .md summary)")
    check_output(html_path, "html", option="--out (its .dntp.html plot)")
    ensure_dir(out.parent)
    df = run_bench(
        [m for m in args.models.split(",") if m], _bench_tasks(args),
        [m for m in args.methods.split(",") if m], out, limit=args.limit, seed=args.seed,
        progress=True, n_ctx=args.n_ctx,
    )
    md = summary_markdown(df)
    atomic_write_text(md_path, md)
    fig = dntp_accuracy_figure(df)
    atomic_write_text(html_path, fig.to_html(include_plotlyjs="cdn"))
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
    psub = p.add_subparsers(dest="patch_cmd", required=True, parser_class=_Parser,
                            metavar="SUBCOMMAND")

    q = psub.add_parser("intra", help="inject into the top-k / bottom-k / random-k heads by α")
    _common(q)
    _fit_args(q)
    q.add_argument("--adapter", help="adapter directory (default: fit one with the --fit options)")
    q.add_argument("--ks", type=_KS, help="comma-separated k (default 1, 2, 4, ..., all heads)")
    q.add_argument("--n-random-seeds", type=_POS_INT, default=3)
    q.add_argument("--split", choices=_SPLITS, default="test")
    q.add_argument("--limit", type=_POS_INT, default=None)
    q.add_argument("--n-boot", type=_POS_INT, default=1000)
    q.add_argument("--json", action="store_true",
                   help='print {"model", "task", "n", "zero_shot", "site", "rows": '
                        '[{"k", "top", "bottom", "random"}, ...]}')
    q.add_argument("--out", help="write the full result (one row per condition) to this CSV")

    q = psub.add_parser("inter", help="inject task B's embedding through task A's α, all pairs")
    q.add_argument("--model", default="smollm2-135m-instruct")
    q.add_argument("--tasks", required=True, type=_NAMES,
                   help="comma-separated tasks (built-in names, dirs, files)")
    q.add_argument("--adapters", type=_NAMES,
                   help="comma-separated adapter dirs, one per task (default: fit)")
    _fit_args(q)
    q.add_argument("--k", type=_POS_INT, default=10, help="top-k heads of the topk mode")
    q.add_argument("--split", choices=_SPLITS, default="test")
    q.add_argument("--limit", type=_POS_INT, default=None)
    q.add_argument("--n-boot", type=_POS_INT, default=1000)
    q.add_argument("--seed", type=_SEED, default=0)
    q.add_argument("--threads", type=_THREADS, default=None)
    q.add_argument("--json", action="store_true",
                   help='print {"tasks", "alpha": {A: {B: acc}}, "topk": ..., "zero_shot", '
                        '"within_between", "similarity_transfer_spearman"}')
    q.add_argument("--out", help="write the long result to this CSV")

    q = psub.add_parser("effects", help="per-head causal effects (Function Vectors style)")
    _common(q)
    q.add_argument("--adapter", help="adapter directory: its embedding is the mean activation "
                                     "and its α is correlated with the effects")
    q.add_argument("--n-prompts", type=_POS_INT, default=16, help="corrupted prompts")
    q.add_argument("--n-shots", type=_POS_INT, default=10)
    q.add_argument("--n-mean-prompts", type=_POS_INT, default=50,
                   help="clean prompts for the mean activation (without --adapter)")
    q.add_argument("--serial", action="store_true", help="one forward pass per head (reference)")
    q.add_argument("--top", type=_POS_INT, default=10, help="heads listed in the summary")
    q.add_argument("--json", action="store_true",
                   help='print {"model", "task", "top_heads": [{"head", "effect"}], '
                        '"baseline_prob", "seconds", "rho_alpha"}')
    q.add_argument("--out", help="write layer, head, effect to this CSV")

    p = sub.add_parser("figures", help="reproduce figures/ from real runs (resumable)")
    p.add_argument("--out", default="figures", help="output directory (cells cached in OUT/.runs)")
    p.add_argument("--models", type=_NAMES, default="smollm2-135m-instruct,gemma-3-270m")
    p.add_argument("--tasks", type=_NAMES, default=None,
                   help="comma-separated task set (default: the families)")
    p.add_argument("--intra-tasks", type=_NAMES, default=None,
                   help="comma-separated intra-task subset")
    p.add_argument("--effect-tasks", type=_NAMES, default=None)
    p.add_argument("--limit", type=_POS_INT, default=40, help="test items per task")
    p.add_argument("--sparsity", type=_LAMBDAS, default="0,5",
                   help="comma-separated λ for intra-task patching")
    p.add_argument("--n-examples", type=_POS_INT, default=200, help="stage-2 training examples")
    p.add_argument("--n-prompts", type=_POS_INT, default=20, help="stage-1 few-shot prompts")
    p.add_argument("--n-shots", type=_POS_INT, default=10)
    p.add_argument("--effect-prompts", type=_POS_INT, default=8)
    p.add_argument("--n-random-seeds", type=_POS_INT, default=3)
    p.add_argument("--n-boot", type=_POS_INT, default=1000)
    p.add_argument("--no-png", action="store_true", help="HTML + CSV only")
    p.add_argument("--seed", type=_SEED, default=0)
    p.add_argument("--threads", type=_THREADS, default=None)
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

    ks = [int(k) for k in _csv_list(args.ks)] or None
    model, task = _load(args, check=lambda m: _check_heads(m, ks or [], "--ks"))
    adapter = _adapter_or_fit(model, task, args)
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
    _check_heads(model, [args.k], "--k")
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
        atomic_write_csv(args.out, df)
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
        atomic_write_csv(args.out, pd.DataFrame(
            {"layer": layer, "head": head, "effect": eff.flatten().numpy()}))
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


def check_outputs(args) -> None:
    """Refuse, before any work, every output path of the wrong kind or where a file of another
    kind lies (:func:`sitelens.io.check_output`); output directories must be writable."""
    if getattr(args, "items", None):
        check_output(args.items, "csv", option="--items")
    if args.cmd == "patch" and getattr(args, "out", None):
        check_output(args.out, "csv")
    if args.cmd in ("fit", "figures"):
        check_dir(args.out)


def _check_heads(model, ks: list[int], option: str) -> None:
    """Every k of ``ks`` at most the model's number of heads (the parser checked k >= 1)."""
    L, H = model.cfg.n_layers, model.cfg.n_heads
    bad = [k for k in ks if k > L * H]
    if bad:
        raise UsageError(
            f"{option} {bad[0]} is more than the {L * H} attention heads of "
            f"{_model_label(model)} ({L} layers x {H} heads); use k between 1 and {L * H}."
        )


def _check_path_arg(value: str, option: str) -> None:
    """An output or input path that the file system can take: not empty, no NUL character, not
    too long (caught here as one error instead of an OSError later)."""
    from sitelens.errors import OutputError

    if not value.strip():
        raise UsageError(f"{option} is empty; give a path.")
    if "\x00" in value:
        raise UsageError(f"{option} {value!r} contains a NUL character; give a valid path.")
    try:
        Path(value).exists()
    except OSError as e:
        raise OutputError(f"Cannot use {option} {value!r}: {e.strerror or e}; give another path.") from e


def _validate(args) -> None:
    """Everything that can be checked before a model is loaded and before anything is written:
    model names (bundled, TransformerLens names in the local Hugging Face cache, HF directories),
    tasks (loaded here, cheap, and kept for the command), enough training items for --n-shots,
    adapter directories, path arguments, option combinations. Raises a :class:`SitelensError`."""
    from sitelens.errors import AdapterError, TaskError
    from sitelens.models import check_model_available
    from sitelens.tasks import load_task as _load_task

    def load_task(spec: str, **kw):
        try:
            return _load_task(spec, **kw)
        except OSError as e:  # e.g. a name too long for a path
            raise TaskError(f"Cannot read the task {spec!r}: {e.strerror or e}; give a built-in "
                            "task name, an FV-layout directory or a JSON file.") from e

    cmd = args.cmd if args.cmd != "patch" else f"patch {args.patch_cmd}"
    for option in ("out", "items", "adapter", "tasks_dir"):
        value = getattr(args, option, None)
        if value is not None:
            _check_path_arg(value, "--" + option.replace("_", "-"))
    for value in _csv_list(getattr(args, "adapters", None)):
        _check_path_arg(value, "--adapters")

    if hasattr(args, "lr"):  # the fit options: FitConfig's own checks (--lr positive, finite)
        from sitelens.site import FitConfig

        FitConfig(lr=args.lr, n_examples=args.n_examples, batch_size=int(args.batch_size),
                  sparsity=args.sparsity, seed=args.seed)

    models = [args.model] if hasattr(args, "model") else _csv_list(args.models)
    for name in models:
        check_model_available(name)

    if cmd in ("fit", "eval", "demo", "patch intra", "patch effects"):
        args._task = load_task(args.task, seed=args.seed, dedupe=getattr(args, "dedupe", False))
        tasks = [args._task]
    elif cmd == "patch inter":
        names = _csv_list(args.tasks)
        if len(names) < 2:
            raise TaskError("patch inter needs at least two tasks: --tasks a,b[,c...].")
        tasks = [load_task(n, seed=args.seed) for n in names]
        dirs = _csv_list(args.adapters)
        if dirs and len(dirs) != len(tasks):
            raise AdapterError(f"--adapters has {len(dirs)} directories for {len(tasks)} tasks; "
                               "give one per task, in the order of --tasks.")
    elif cmd == "bench":
        args._tasks = tasks = _bench_tasks(args)  # kept: cmd_bench's _bench_tasks returns them
    elif cmd == "figures":
        from sitelens.figures import FIGURE_TASKS

        names = _csv_list(args.tasks) or list(FIGURE_TASKS)
        if len(names) < 2:
            raise UsageError("figures needs at least two --tasks (inter-task patching runs over "
                             "pairs): --tasks a,b[,c...].")
        for option in ("intra_tasks", "effect_tasks"):
            extra = [n for n in _csv_list(getattr(args, option)) if n not in names]
            if extra:
                raise UsageError(f"--{option.replace('_', '-')} names {extra[0]!r}, which is not "
                                 f"in --tasks ({', '.join(names)}); pick a subset of --tasks.")
        tasks = [load_task(n, seed=args.seed) for n in names]
    else:  # pragma: no cover - every command is listed above
        tasks = []

    n_shots = getattr(args, "n_shots", None)
    uses_demos = cmd != "bench" and (cmd != "eval" or "icl" in _csv_list(args.methods))
    if n_shots and uses_demos:
        for task in tasks:
            if n_shots > len(task.train):
                raise TaskError(
                    f"Asked for {n_shots} demonstrations but {task.name} has only "
                    f"{len(task.train)} training items; use fewer shots (--n-shots) or a task "
                    "with more training items."
                )

    adapter_dirs = [args.adapter] if getattr(args, "adapter", None) else []
    adapter_dirs += _csv_list(getattr(args, "adapters", None))
    if adapter_dirs:
        from sitelens.site import SiteAdapter

        for d in adapter_dirs:
            SiteAdapter.load(d)  # a missing, truncated or corrupted adapter: AdapterError


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # --help (0), or a usage error already printed as one line (2)
        return e.code if isinstance(e.code, int) else 0 if e.code is None else 2
    try:
        _validate(args)
        _setup(args)
        check_outputs(args)
        commands = {"fit": cmd_fit, "eval": cmd_eval, "bench": cmd_bench, "demo": cmd_demo}
        commands.update({"patch": cmd_patch, "figures": cmd_figures})
        return commands[args.cmd](args)
    except SitelensError as e:
        print(f"sitelens: error: {_one_line(e)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
