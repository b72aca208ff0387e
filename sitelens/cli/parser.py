"""The argument parser of ``sitelens``: usage errors on one line, every option typed.

:func:`build_parser` makes the parser of every subcommand. Usage errors print ONE line on stderr,
``sitelens: error: ... (see `sitelens CMD --help`)``, and exit with status 2
(:class:`OneLineErrorParser`). Every number and list is checked while parsing (counts >= 1, seeds
and threads in range, finite λ, no duplicate list items, known methods and lenses); checks that
need files, tasks or models run later (:mod:`sitelens.cli.validate`).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

from sitelens.cli.frontier_options import add_frontier_options
from sitelens.cli.helptext import document
from sitelens.cli.options import add_executor_option, add_guard_options, add_label_metrics_option
from sitelens.models import ATLAS_MODELS, DEFAULT_MODEL, FIGURE_MODELS
from sitelens.models.spec import BACKENDS

DESCRIPTION = (
    "The sitelens command line. fit: fit a SITE adapter and save it; eval: zero-shot / ICL / SITE on a "
    "task; run: fit and eval with one model load (resumable); demo: fit and compare on a built-in "
    "task; bench: models x tasks x methods, one resumable table; patch intra|inter|effects: "
    "activation patching; heads: which heads matter, by several lenses "
    "(alpha, gradients, attribution patching, ablation, exact effects, direct logit attribution); figures: "
    "reproduce figures/ (resumable); atlas: the head atlas page. Bad input prints one line, `sitelens: "
    "error: ...`, and exits 2. `sitelens COMMAND --help`: every option and its default."
)


def one_line(msg) -> str:
    """``msg`` on one line (a value with a newline in it must not start a second line)."""
    return " ".join(part.strip() for part in str(msg).splitlines() if part.strip())


def split_csv(s: str | None) -> list[str]:
    """The non-empty, stripped items of a comma-separated option value (``[]`` for ``None``)."""
    return [x.strip() for x in (s or "").split(",") if x.strip()]


class OneLineErrorParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are ONE line on stderr, ``sitelens: error: ...``
    with a pointer to ``--help`` (no usage block), and exit status 2. Subcommand parsers are
    made with this class too (``add_subparsers(parser_class=OneLineErrorParser)``)."""

    def error(self, message: str):
        self.exit(2, f"sitelens: error: {one_line(message)} (see `{self.prog} --help`)\n")

    def parse_known_args(self, args=None, namespace=None):
        ns, extras = super().parse_known_args(args, namespace)
        for a in self._actions:  # Python < 3.12 turns `--opt=--` into [] without calling the type
            if a.option_strings and a.nargs is None and isinstance(getattr(ns, a.dest, None), list):
                self.error(f"argument {'/'.join(a.option_strings)}: expected one argument, got "
                           "'--'")
        return ns, extras


# ----------------------------------------------------------------------------------------------
# option types: each raises argparse.ArgumentTypeError, which the parser prints as one line


def int_in_range(lo: int, hi: int | None = None, what: str = "a positive integer") -> Callable:
    """An option type: an integer in ``[lo, hi]`` (``hi=None``: no upper bound)."""

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


def finite_float(what: str) -> Callable:
    """An option type: a finite float (no ``nan``, no ``inf``)."""

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


def device_name(s: str) -> str:
    """An option type: a device that exists here (``cpu``, ``cuda``, ``cuda:N``, ``mps``;
    :func:`sitelens.models.resolve_device`), e.g. no ``cuda`` where torch sees no GPU."""
    from sitelens.errors import ModelError
    from sitelens.models.devices import resolve_device

    try:
        resolve_device(s)
    except ModelError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return s.strip()


device_name.__name__ = "device"


POSITIVE_INT = int_in_range(1)
SEED = int_in_range(0, 2**32 - 1, "an integer seed in [0, 4294967295]")
THREADS = int_in_range(1, 1024, "a number of threads in [1, 1024]")
LAMBDA = finite_float("a finite number")
SPLITS = ("train", "valid", "test")


def csv_list_of(check_item: Callable[[str], None], what: str) -> Callable:
    """An option type: a comma-separated, non-empty list without duplicates whose items
    ``check_item`` accepts; the string itself is kept (the commands split it with
    :func:`split_csv`)."""

    def parse(s: str) -> str:
        items = split_csv(s)
        if not items:
            raise argparse.ArgumentTypeError(f"must list at least one {what}, got {s!r}")
        for x in items:
            check_item(x)
        dup = next((x for i, x in enumerate(items) if x in items[:i]), None)
        if dup is not None:
            raise argparse.ArgumentTypeError(f"lists {dup!r} twice; give each {what} once")
        return s

    parse.__name__ = what
    return parse


def _check_k(x: str) -> None:
    try:
        POSITIVE_INT(x)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"must be comma-separated positive integers (numbers of heads), got {x!r}"
        ) from None


def _check_lambda(x: str) -> None:
    try:
        LAMBDA(x)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"must be comma-separated finite numbers (λ values), got {x!r}"
        ) from None


def _method_checker(registry: str) -> Callable[[str], None]:
    """A check that a method name is known: to ``sitelens.baselines`` (``registry="bench"``) or
    to :func:`sitelens.eval.evaluate.evaluate` (``"eval"``), with close matches in the error."""

    def check(x: str) -> None:
        import difflib

        if registry == "bench":
            from sitelens.baselines import available_methods

            names = available_methods()
        else:
            from sitelens.eval.methods import METHODS

            names = list(METHODS)
        if x not in names:
            close = difflib.get_close_matches(x, names, n=3, cutoff=0.5)
            raise argparse.ArgumentTypeError(
                f"unknown method {x!r}; use {', '.join(names)}"
                + (f" (did you mean {', '.join(close)}?)" if close else "")
            )

    return check


def _check_lens(x: str) -> None:
    """A lens name of the registry (:func:`sitelens.lenses.parse_lenses`; ``ablation`` = both
    ablations), with close matches in the error."""
    from sitelens.errors import LensError
    from sitelens.lenses import parse_lenses

    try:
        parse_lenses([x])
    except LensError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _any_name(x: str) -> None:
    """Any item is accepted (names of models and tasks are checked before the model loads)."""


KS = csv_list_of(_check_k, "k")
LAMBDAS = csv_list_of(_check_lambda, "λ")
BENCH_METHODS = csv_list_of(_method_checker("bench"), "method")
EVAL_METHODS = csv_list_of(_method_checker("eval"), "method")
NAMES = csv_list_of(_any_name, "name")
LENS_NAMES = csv_list_of(_check_lens, "lens")


class DefaultInt(int):
    """An int default that the fit command can tell apart from the same value given on the
    command line (``--protocol official`` changes the default, not a value the user chose)."""


# ----------------------------------------------------------------------------------------------
# option groups shared by several subcommands


def add_common_options(p: argparse.ArgumentParser) -> None:
    """``--model``, ``--task`` (required), ``--seed``, ``--dedupe``, ``--threads``."""
    p.add_argument("--model", default=DEFAULT_MODEL, help="bundled name, TL name or HF dir")
    p.add_argument("--task", required=True, help="built-in name, FV-layout dir, or JSON file")
    p.add_argument("--seed", type=SEED, default=0)
    p.add_argument("--dedupe", action="store_true", help="drop duplicate items in the task file")
    p.add_argument("--threads", type=THREADS, default=None, help="torch CPU threads")
    add_device_options(p)


def add_fit_options(p: argparse.ArgumentParser) -> None:
    """The stage-1 and stage-2 options (``FitConfig`` fields, ``--protocol``)."""
    p.add_argument("--n-prompts", type=POSITIVE_INT, default=50, help="few-shot prompts for stage 1")
    p.add_argument("--n-shots", type=POSITIVE_INT, default=10)
    p.add_argument("--lr", type=float, default=0.2)
    p.add_argument("--n-examples", type=POSITIVE_INT, default=400, help="training examples in stage 2")
    p.add_argument("--batch-size", type=POSITIVE_INT, default=DefaultInt(8),
                   help="stage-2 batch size (default 8; 1 with --protocol official)")
    p.add_argument("--sparsity", type=LAMBDA, default=0.0, help="λ of the λ·mean(α) penalty")
    p.add_argument("--protocol", choices=["default", "official"], default="default",
                   help="stage 2 as sitelens does it (batched passes, best α) or as the paper's "
                        "code does (400 i.i.d. steps of batch 1, final α, no space before digits)")


DTYPE_CHOICES = ("float32", "bfloat16", "float16")
DEVICE_MAP_CHOICES = ("auto", "balanced", "balanced_low_0", "sequential")


def add_device_options(p: argparse.ArgumentParser) -> None:
    """``--device``, ``--dtype``, ``--n-devices``, ``--backend``, ``--device-map``: where, in what
    precision and on which backend every model the command loads runs (``load_model``'s arguments)."""
    g = p.add_argument_group("device and precision")
    g.add_argument("--device", type=device_name, default=None,
                   help="cpu, cuda, cuda:N or mps (default: cpu for the bundled models)")
    g.add_argument("--dtype", choices=DTYPE_CHOICES, default=None,
                   help="weights and activations (default float32); α, its optimizer state, "
                        "means, losses and KL stay float32")
    g.add_argument("--n-devices", type=POSITIVE_INT, default=None,
                   help="split the model over N CUDA GPUs from --device on (pipeline of layers)")
    g.add_argument("--backend", choices=BACKENDS, default=None,
                   help="hooked (HookedTransformer, TransformerLens 3.x) or bridge (TransformerBridge, "
                        "TransformerLens 4) (default: $SITELENS_BACKEND, else hooked)")
    g.add_argument("--device-map", choices=DEVICE_MAP_CHOICES, default=None,
                   help="bridge backend only: Hugging Face's device_map (instead of --device / "
                        "--n-devices)")


# ----------------------------------------------------------------------------------------------
# one builder per subcommand


def _add_fit(sub) -> None:
    p = sub.add_parser("fit", help="fit a SITE adapter (stage 1 + stage 2) and save it")
    add_common_options(p)
    add_fit_options(p)
    p.add_argument("--out", required=True, help="output directory for the adapter")


def _add_eval(sub) -> None:
    p = sub.add_parser("eval", help="evaluate zero-shot / ICL / SITE on a task")
    add_common_options(p)
    p.add_argument("--adapter", help="adapter directory (needed for the site method)")
    add_eval_options(p)
    p.add_argument("--n-shots", type=POSITIVE_INT, default=10)
    p.add_argument("--items", help="also write per-item results to this CSV")
    p.add_argument("--protocol", choices=["default", "official"], default=None,
                   help="generation and scoring: sitelens's or the paper code's (20 tokens, no "
                        "newline stop, '(' cut, St.→Saint); default: the adapter's, else default")


def add_eval_options(p: argparse.ArgumentParser) -> None:
    """``--methods``, ``--split``, ``--limit``, ``--json``, ``--label-metrics`` (eval and run)."""
    p.add_argument("--methods", type=EVAL_METHODS, default="zero-shot,icl,site")
    p.add_argument("--split", choices=SPLITS, default="test")
    p.add_argument("--limit", type=POSITIVE_INT, default=None)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_label_metrics_option(p)


def _add_run(sub) -> None:  # the command: sitelens.cli.run
    p = sub.add_parser("run", help="fit and evaluate with one model load; resumable (--out DIR)")
    add_common_options(p)
    add_fit_options(p)
    add_eval_options(p)
    p.add_argument("--out", help="the run's folder: adapter/, eval.json, items.csv, run.json "
                                 "(default: runs/MODEL/TASK)")


def _add_bench(sub) -> None:
    p = sub.add_parser("bench", help="models × tasks × methods → one resumable results table")
    p.add_argument("--models", type=NAMES, default=DEFAULT_MODEL, help="comma-separated model names")
    p.add_argument("--tasks", nargs="+", default=[],
                   help="task specs (names, dirs, files), space- or comma-separated")
    p.add_argument("--tasks-dir", help="every FV-layout task directory under DIR")
    p.add_argument("--abstractive", action="store_true", help="with --tasks-dir: abstractive tasks only")
    p.add_argument("--methods", type=BENCH_METHODS,
                   default="zero-shot,icl,site,fv,tv,ltv,mtv,i2cl,lora,ia3")
    p.add_argument("--out", required=True, help="results CSV (appended cell by cell; resumes)")
    p.add_argument("--limit", type=POSITIVE_INT, default=100, help="test items per task")
    p.add_argument("--seed", type=SEED, default=0)
    p.add_argument("--threads", type=THREADS, default=None)
    p.add_argument("--n-ctx", type=POSITIVE_INT, default=None,
                   help="context length for the models (default 2048; squad_val needs 4096)")
    add_label_metrics_option(p)
    add_executor_option(p, "the (model, task, method) cells")
    add_device_options(p)


def _add_demo(sub) -> None:
    p = sub.add_parser("demo", help="fit SITE on a built-in task, compare zero-shot / ICL / SITE")
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--task", default="antonym")
    p.add_argument("--limit", type=POSITIVE_INT, default=50)
    p.add_argument("--seed", type=SEED, default=0)
    p.add_argument("--threads", type=THREADS, default=None)
    add_device_options(p)


def _add_patch_intra(psub) -> None:
    q = psub.add_parser("intra", help="inject into the top-k / bottom-k / random-k heads by α")
    add_common_options(q)
    add_fit_options(q)
    q.add_argument("--adapter", help="adapter directory (default: fit one with the --fit options)")
    q.add_argument("--ks", type=KS, help="comma-separated k (default 1, 2, 4, ..., all heads)")
    q.add_argument("--n-random-seeds", type=POSITIVE_INT, default=3)
    q.add_argument("--split", choices=SPLITS, default="test")
    q.add_argument("--limit", type=POSITIVE_INT, default=None)
    q.add_argument("--n-boot", type=POSITIVE_INT, default=1000)
    q.add_argument("--json", action="store_true",
                   help='print {"model", "task", "n", "zero_shot", "site", "rows": '
                        '[{"k", "top", "bottom", "random"}, ...]}')
    q.add_argument("--out", help="write the full result (one row per condition) to this CSV")


def _add_patch_inter(psub) -> None:
    q = psub.add_parser("inter", help="inject task B's embedding through task A's α, all pairs")
    q.add_argument("--model", default=DEFAULT_MODEL)
    q.add_argument("--tasks", required=True, type=NAMES,
                   help="comma-separated tasks (built-in names, dirs, files)")
    q.add_argument("--adapters", type=NAMES,
                   help="comma-separated adapter dirs, one per task (default: fit)")
    add_fit_options(q)
    q.add_argument("--k", type=POSITIVE_INT, default=10, help="top-k heads of the topk mode")
    q.add_argument("--split", choices=SPLITS, default="test")
    q.add_argument("--limit", type=POSITIVE_INT, default=None)
    q.add_argument("--n-boot", type=POSITIVE_INT, default=1000)
    q.add_argument("--seed", type=SEED, default=0)
    q.add_argument("--threads", type=THREADS, default=None)
    add_device_options(q)
    q.add_argument("--json", action="store_true",
                   help='print {"tasks", "alpha": {A: {B: acc}}, "topk": ..., "zero_shot", '
                        '"within_between", "similarity_transfer_spearman"}')
    q.add_argument("--out", help="write the long result to this CSV")


def _add_patch_effects(psub) -> None:
    q = psub.add_parser("effects", help="per-head causal effects (Function Vectors style)")
    add_common_options(q)
    q.add_argument("--adapter", help="adapter directory: its embedding is the mean activation "
                                     "and its α is correlated with the effects")
    q.add_argument("--n-prompts", type=POSITIVE_INT, default=16, help="corrupted prompts")
    q.add_argument("--n-shots", type=POSITIVE_INT, default=10)
    q.add_argument("--n-mean-prompts", type=POSITIVE_INT, default=50,
                   help="clean prompts for the mean activation (without --adapter)")
    q.add_argument("--serial", action="store_true", help="one forward pass per head (reference)")
    q.add_argument("--top", type=POSITIVE_INT, default=10, help="heads listed in the summary")
    q.add_argument("--json", action="store_true",
                   help='print {"model", "task", "top_heads": [{"head", "effect"}], '
                        '"baseline_prob", "seconds", "rho_alpha"}')
    q.add_argument("--out", help="write layer, head, effect to this CSV")


def _add_patch(sub) -> None:
    p = sub.add_parser("patch", help="activation patching: intra | inter | effects")
    psub = p.add_subparsers(dest="patch_cmd", required=True, parser_class=OneLineErrorParser,
                            metavar="SUBCOMMAND")
    _add_patch_intra(psub)
    _add_patch_inter(psub)
    _add_patch_effects(psub)


def _add_heads(sub) -> None:
    p = sub.add_parser("heads", help="which heads matter: per-head scores of several lenses")
    add_common_options(p)
    from sitelens.lenses import ALIASES, available_lenses  # sitelens.cli has imported it already

    aliases = "; ".join(f"{a} = {', '.join(names)}" for a, names in ALIASES.items())
    p.add_argument("--lenses", type=LENS_NAMES,
                   help=f"comma-separated lenses: {', '.join(available_lenses())} ({aliases})")
    p.add_argument("--seeds", type=POSITIVE_INT, default=DefaultInt(5),
                   help="SITE fits of the alpha lens, seeds SEED, SEED+1, ... (default 5; dla alone: one; "
                        "--frontier: default 1)")
    p.add_argument("--n-prompts", type=POSITIVE_INT, default=16,
                   help="corrupted prompts (atp, atp-star, effect) and clean prompts (ablation)")
    p.add_argument("--n-shots", type=POSITIVE_INT, default=10)
    p.add_argument("--n-mean-prompts", type=POSITIVE_INT, default=50,
                   help="few-shot prompts of stage 1 (the task embedding) in every fit, and of the "
                        "embedding when nothing is fitted and there is no --adapter")
    p.add_argument("--limit", type=POSITIVE_INT, default=64,
                   help="zero-shot train items of alpha-grad")
    p.add_argument("--n-boot", type=POSITIVE_INT, default=1000,
                   help="bootstrap resamples of the intervals")
    p.add_argument("--lr", type=float, default=0.2)
    p.add_argument("--n-examples", type=POSITIVE_INT, default=400,
                   help="training examples in stage 2 of each fit")
    p.add_argument("--batch-size", type=POSITIVE_INT, default=DefaultInt(8),
                   help="stage-2 batch size (default 8; 1 with --protocol official)")
    p.add_argument("--sparsity", type=LAMBDA, default=0.0, help="λ of the λ·mean(α) penalty")
    p.add_argument("--protocol", choices=["default", "official"], default="default",
                   help="stage 2 of the fits as sitelens does it or as the paper's code does")
    p.add_argument("--adapter", help="adapter directory: its embedding feeds alpha-grad, atp, "
                                     "atp-star and effect, its α alpha and dla, nothing is fitted "
                                     "(default: the first seed's fit, else the task embedding)")
    add_frontier_options(p)  # --out, --json and --frontier's options


def _add_atlas(sub) -> None:
    p = sub.add_parser("atlas", help="the head atlas: one self-contained HTML page (no server)")
    p.add_argument("--out", required=True, help="the HTML file to write")
    p.add_argument("--data", default=None, help="atlas tables, one folder per model (default: the "
                   "tables shipped with sitelens, sitelens/data/atlas, found from any folder)")
    p.add_argument("--models", type=NAMES, default=None,
                   help="comma-separated models (default: every folder under --data; with "
                        f"--refit: {','.join(ATLAS_MODELS)})")
    p.add_argument("--refit", action="store_true",
                   help="fit and measure the atlas from --tasks-dir first (cached fits reused)")
    p.add_argument("--tasks-dir", default="../shared/datasets/fv",
                   help="FV-layout task folders for --refit ("
                        + ", ".join(f"{m}: {which}" for m, which in ATLAS_MODELS.items()) + ")")
    p.add_argument("--seeds", type=POSITIVE_INT, default=1, help="SITE fits per task with --refit")
    p.add_argument("--seed", type=SEED, default=0)
    p.add_argument("--limit", type=POSITIVE_INT, default=20,
                   help="test items per target task in the transfer measurement (--refit)")
    p.add_argument("--cache-dir", default="runs/atlas", help="cached fits of --refit")
    p.add_argument("--plotly", choices=("auto", "cartesian", "full"), default="auto",
                   help="the plotly.js inlined: its cartesian bundle (fetched by scripts/setup.sh; "
                        "opens in about half the time), the full one, or auto (cartesian when present)")
    p.add_argument("--threads", type=THREADS, default=None)
    add_executor_option(p, "the (task, seed) fits of --refit")
    add_device_options(p)


def _add_figures(sub) -> None:
    p = sub.add_parser("figures", help="reproduce figures/ from real runs (resumable)")
    p.add_argument("--out", default="figures", help="output directory (cells cached in OUT/.runs)")
    p.add_argument("--models", type=NAMES, default=",".join(FIGURE_MODELS))
    p.add_argument("--tasks", type=NAMES, default=None,
                   help="comma-separated task set (default: the families)")
    p.add_argument("--intra-tasks", type=NAMES, default=None,
                   help="comma-separated intra-task subset")
    p.add_argument("--effect-tasks", type=NAMES, default=None)
    p.add_argument("--limit", type=POSITIVE_INT, default=40, help="test items per task")
    p.add_argument("--sparsity", type=LAMBDAS, default="0,5",
                   help="comma-separated λ for intra-task patching")
    p.add_argument("--n-examples", type=POSITIVE_INT, default=200, help="stage-2 training examples")
    p.add_argument("--n-prompts", type=POSITIVE_INT, default=20, help="stage-1 few-shot prompts")
    p.add_argument("--n-shots", type=POSITIVE_INT, default=10)
    p.add_argument("--effect-prompts", type=POSITIVE_INT, default=8)
    p.add_argument("--n-random-seeds", type=POSITIVE_INT, default=3)
    p.add_argument("--n-boot", type=POSITIVE_INT, default=1000)
    p.add_argument("--no-png", action="store_true", help="HTML + CSV only")
    p.add_argument("--seed", type=SEED, default=0)
    p.add_argument("--threads", type=THREADS, default=None)
    p.add_argument("--quiet", action="store_true")
    add_executor_option(p, "the fits and patching cells")
    add_device_options(p)


def build_parser() -> argparse.ArgumentParser:
    """The ``sitelens`` parser: subcommands fit, eval, run, bench, demo, patch (intra, inter, effects),
    heads, figures and atlas; ``args.cmd`` names the subcommand (``args.patch_cmd`` the patch one)."""
    ap = OneLineErrorParser(prog="sitelens", description=DESCRIPTION)
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=OneLineErrorParser,
                            metavar="COMMAND")
    for add in (_add_fit, _add_eval, _add_run, _add_bench, _add_demo, _add_patch, _add_heads,
                _add_figures, _add_atlas):
        add(sub)
    # --force, --save-adapter (sitelens.cli.options); then every option with help text and its
    # default (sitelens.cli.helptext)
    return document(add_guard_options(ap))


def command_name(args) -> str:
    """The subcommand as the user typed it: ``"fit"``, ..., ``"patch intra"``."""
    return args.cmd if args.cmd != "patch" else f"patch {args.patch_cmd}"
