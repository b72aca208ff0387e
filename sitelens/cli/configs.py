"""One config dataclass per subcommand: its fields are the command's options (default, help, type,
and what reads them), turned into its parser by :func:`sitelens.cli.options.add_options`. The first
paragraph of a config's docstring is the command's help; ``COMMAND`` is its name.

Option groups that several commands share are base classes (:class:`Compute`, :class:`OneTask`,
:class:`Stage2`, :class:`FitOptions`, :class:`EvalOptions`, :class:`HeadOptions`); a command that
takes an option with another default declares the field again. The stage-2 defaults are
:class:`~sitelens.site.FitConfig`'s own. ``READ_WHEN`` says when the command reads the options
whose ``read_by`` names it (an option given that would not be read is refused:
:func:`sitelens.cli.options.check_ignored`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import ClassVar

from sitelens.cli.options import When, option
from sitelens.cli.types import (
    BENCH_METHODS,
    DEVICE,
    EVAL_METHODS,
    EXECUTOR,
    KS,
    LAMBDA,
    LAMBDAS,
    LENS_NAMES,
    NAMES,
    POSITIVE_INT,
    SEED,
    THREADS,
    int_in_range,
    split_csv,
)
from sitelens.lenses.registry import ALIASES, available_lenses
from sitelens.models.registry import ATLAS_MODELS, DEFAULT_MODEL, FIGURE_MODELS
from sitelens.models.spec import BACKENDS
from sitelens.site.config import FitConfig

FIT_DEFAULTS = {f.name: f.default for f in fields(FitConfig)}
SPLITS = ("train", "valid", "test")
PROTOCOLS = ("default", "official")
DEVICE_GROUP = "device and precision"
EXECUTOR_HELP = ("where {} run: local (this process, the default), processes:N (N worker processes) "
                 "or ray[:ADDRESS] (Ray: a local instance, or auto / the HOST:PORT of a running "
                 "cluster); the results are the same")
FORCE_HELP = ("replace an earlier result at the output path (without it, an existing adapter or "
              "result file is refused)")
LABEL_METRICS_HELP = ("also score by ranking the labels of a closed label set (label_acc_first, "
                      "label_acc_full, label_acc_full_norm, chance; docs/tasks.md); without it only "
                      "tasks with a labels.json get them")
# the frontier's selectors (sitelens.lenses.selectors.SELECTORS, which imports torch; a test checks
# that the two agree)
SELECTOR_NAMES = "alpha,alpha-sparse,alpha-grad,atp,effect,greedy,sparse"


# ----------------------------------------------------------------------------------------------
# option groups


@dataclass
class Compute:
    """Where and how every model of the command runs (``read_by="compute"``)."""

    seed: int = option(0, type=SEED, read_by=("compute",),
                       help="random seed of the task split, the prompt and demonstration draws "
                            "and the fits")
    threads: int | None = option(None, type=THREADS, read_by=("compute",),
                                 help="torch CPU threads (default: torch's own choice)")
    device: str | None = option(None, type=DEVICE, read_by=("compute",), group=DEVICE_GROUP,
                                help="cpu, cuda, cuda:N or mps (default: cpu for the bundled models)")
    dtype: str | None = option(None, choices=("float32", "bfloat16", "float16"), read_by=("compute",),
                               group=DEVICE_GROUP,
                               help="weights and activations (default float32); α, its optimizer "
                                    "state, means, losses and KL stay float32")
    n_devices: int | None = option(None, type=POSITIVE_INT, read_by=("compute",), group=DEVICE_GROUP,
                                   help="split the model over N CUDA GPUs from --device on "
                                        "(pipeline of layers)")
    backend: str | None = option(None, choices=BACKENDS, read_by=("compute",), group=DEVICE_GROUP,
                                 help="hooked (HookedTransformer, TransformerLens 3.x) or bridge "
                                      "(TransformerBridge, TransformerLens 4) (default: "
                                      "$SITELENS_BACKEND, else hooked)")
    device_map: str | None = option(None, choices=("auto", "balanced", "balanced_low_0", "sequential"),
                                    read_by=("compute",), group=DEVICE_GROUP,
                                    help="bridge backend only: Hugging Face's device_map (instead "
                                         "of --device / --n-devices)")


@dataclass
class OneTask(Compute):
    model: str = option(DEFAULT_MODEL, help="bundled name, TL name or HF dir")
    task: str | None = option(required=True, help="built-in name, FV-layout dir, or JSON file")
    dedupe: bool = option(False, help="drop duplicate items in the task file")


@dataclass
class Stage2:
    """Stage 2 of a SITE fit (``read_by="fit"``; ``--protocol``: ``"protocol"``)."""

    lr: float = option(FIT_DEFAULTS["lr"], type=float, read_by=("fit",),
                       help="stage-2 learning rate (Adam on the logits of α)")
    n_examples: int = option(FIT_DEFAULTS["n_examples"], type=POSITIVE_INT, read_by=("fit",),
                             help="training examples in stage 2")
    batch_size: int = option(FIT_DEFAULTS["batch_size"], type=POSITIVE_INT, read_by=("fit",),
                             help=f"stage-2 batch size (default {FIT_DEFAULTS['batch_size']}; "
                                  "1 with --protocol official)")
    sparsity: float = option(FIT_DEFAULTS["sparsity"], type=LAMBDA, read_by=("fit",),
                             help="λ of the λ·mean(α) penalty")
    protocol: str = option("default", choices=PROTOCOLS, read_by=("protocol",),
                           help="stage 2 as sitelens does it (batched passes, best α) or as the "
                                "paper's code does (400 i.i.d. steps of batch 1, final α, no space "
                                "before digits)")


@dataclass
class FitOptions(Stage2):
    """Stage 1 and stage 2 of a SITE fit."""

    n_prompts: int = option(50, type=POSITIVE_INT, read_by=("fit",), help="few-shot prompts for stage 1")
    n_shots: int = option(10, type=POSITIVE_INT, read_by=("shots",),
                          help="demonstrations per few-shot prompt")


@dataclass
class EvalOptions:
    methods: str = option("zero-shot,icl,site", type=EVAL_METHODS,
                          help="comma-separated methods: zero-shot, icl, site")
    split: str = option("test", choices=SPLITS, help="the split scored")
    limit: int | None = option(None, type=POSITIVE_INT,
                               help="the first N items of the split (default: all of them)")
    json: bool = option(False, help="print one JSON object")
    label_metrics: bool = option(False, help=LABEL_METRICS_HELP)


# ----------------------------------------------------------------------------------------------
# fit, eval, run, demo, bench


@dataclass
class FitCommand(OneTask, FitOptions):
    """fit a SITE adapter (stage 1 + stage 2) and save it"""

    COMMAND: ClassVar[str] = "fit"
    out: str | None = option(required=True, help="output directory for the adapter")
    force: bool = option(False, help=FORCE_HELP)


@dataclass
class EvalCommand(OneTask, EvalOptions):
    """evaluate zero-shot / ICL / SITE on a task"""

    COMMAND: ClassVar[str] = "eval"
    READ_WHEN: ClassVar[dict] = {"shots": (When(
        lambda a: "icl" in split_csv(a.methods), "to the icl method, which --methods does not ask "
        "for", "add icl to --methods or drop --n-shots"),)}
    adapter: str | None = option(help="adapter directory (needed for the site method)")
    n_shots: int = option(10, type=POSITIVE_INT, read_by=("shots",),
                          help="demonstrations per few-shot prompt")
    items: str | None = option(help="also write per-item results to this CSV")
    protocol: str | None = option(None, choices=PROTOCOLS,
                                  help="generation and scoring: sitelens's or the paper code's (20 "
                                       "tokens, no newline stop, '(' cut, St.→Saint); default: the "
                                       "adapter's, else default")
    force: bool = option(False, help=FORCE_HELP)


@dataclass
class RunCommand(OneTask, FitOptions, EvalOptions):
    """fit and evaluate with one model load; resumable (--out DIR)"""

    COMMAND: ClassVar[str] = "run"
    READ_WHEN: ClassVar[dict] = {
        "fit": (When(lambda a: "site" in split_csv(a.methods), "to the fit of the site method, "
                     "which --methods does not ask for", "add site to --methods or drop {flags}"),),
        "shots": (When(lambda a: bool({"icl", "site"} & set(split_csv(a.methods))),
                       "to the demonstrations of icl and of the site fit, which --methods does not "
                       "ask for", "add icl or site to --methods or drop --n-shots"),),
    }
    methods: str = option("zero-shot,icl,site", type=EVAL_METHODS,
                          help="comma-separated methods: zero-shot, icl, site (site: fit, or reuse, "
                               "the adapter in OUT/adapter)")
    out: str | None = option(help="the run's folder: adapter/, eval.json, items.csv, run.json "
                                  "(default: runs/MODEL/TASK)")
    force: bool = option(False, help="replace the parts of an earlier run in --out whose settings "
                                     "differ (without it they are refused); parts with the same "
                                     "settings are reused, never redone")


@dataclass
class DemoCommand(Compute):
    """fit SITE on a built-in task, compare zero-shot / ICL / SITE"""

    COMMAND: ClassVar[str] = "demo"
    model: str = option(DEFAULT_MODEL, help="bundled name, TL name or HF dir")
    task: str = option("antonym", help="a built-in task (sitelens.builtin_tasks())")
    limit: int = option(50, type=POSITIVE_INT, help="test items compared")


@dataclass
class BenchCommand(Compute):
    """models × tasks × methods → one resumable results table"""

    COMMAND: ClassVar[str] = "bench"
    models: str = option(DEFAULT_MODEL, type=NAMES, help="comma-separated model names")
    tasks: tuple[str, ...] = option((), nargs="+",
                                    help="task specs (names, dirs, files), space- or comma-separated")
    tasks_dir: str | None = option(help="every FV-layout task directory under DIR")
    abstractive: bool = option(False, help="with --tasks-dir: abstractive tasks only")
    methods: str = option("zero-shot,icl,site,fv,tv,ltv,mtv,i2cl,lora,ia3", type=BENCH_METHODS,
                          help="comma-separated methods (sitelens.available_methods())")
    out: str | None = option(required=True, help="results CSV (appended cell by cell; resumes)")
    limit: int = option(100, type=POSITIVE_INT, help="test items per task")
    n_ctx: int | None = option(None, type=POSITIVE_INT, help="context length for the models "
                               "(default 2048; squad_val needs 4096)")
    label_metrics: bool = option(False, help=LABEL_METRICS_HELP)
    executor: str = option("local", type=EXECUTOR,
                           help=EXECUTOR_HELP.format("the (model, task, method) cells"))


# ----------------------------------------------------------------------------------------------
# patch intra | inter | effects


def _fits_itself(cmd: str, opt: str) -> dict:
    """``READ_WHEN`` of a command that fits its adapter unless ``opt`` gives it."""
    dest = opt[2:]
    no_adapter = When(lambda a: not getattr(a, dest),
                      f"when {cmd} fits the adapter itself, with no {opt} (fit options); an adapter "
                      f"given with {opt} is used as it was fitted",
                      f"drop {{flags}}, or drop {opt} to fit one with them")
    save = When(no_adapter.test, f"to an adapter that {cmd} fits itself (no {opt})",
                f"drop --save-adapter ({opt} is saved already)")
    return {"fit": (no_adapter,), "shots": (no_adapter,), "protocol": (no_adapter,), "save": (save,)}


@dataclass
class PatchOptions:
    split: str = option("test", choices=SPLITS, help="the split scored")
    limit: int | None = option(None, type=POSITIVE_INT,
                               help="the first N items of the split (default: all of them)")
    n_boot: int = option(1000, type=POSITIVE_INT, help="bootstrap resamples of the 95% intervals")
    force: bool = option(False, help=FORCE_HELP)


@dataclass
class PatchIntraCommand(OneTask, FitOptions, PatchOptions):
    """inject into the top-k / bottom-k / random-k heads by α"""

    COMMAND: ClassVar[str] = "patch intra"
    READ_WHEN: ClassVar[dict] = _fits_itself("patch intra", "--adapter")
    adapter: str | None = option(help="adapter directory (default: fit one with the --fit options)")
    ks: str | None = option(type=KS, help="comma-separated k (default 1, 2, 4, ..., all heads)")
    n_random_seeds: int = option(3, type=POSITIVE_INT,
                                 help="random head sets per k (the random-k control)")
    json: bool = option(False, help='print {"model", "task", "n", "zero_shot", "site", "rows": '
                                    '[{"k", "top", "bottom", "random"}, ...]}')
    out: str | None = option(help="write the full result (one row per condition) to this CSV")
    save_adapter: str | None = option(metavar="DIR", read_by=("save",),
                                      help="keep the adapter fitted here (no --adapter) in DIR, to "
                                           "reuse with --adapter DIR")


@dataclass
class PatchInterCommand(Compute, FitOptions, PatchOptions):
    """inject task B's embedding through task A's α, all pairs"""

    COMMAND: ClassVar[str] = "patch inter"
    READ_WHEN: ClassVar[dict] = _fits_itself("patch inter", "--adapters")
    model: str = option(DEFAULT_MODEL, help="bundled name, TL name or HF dir")
    tasks: str | None = option(required=True, type=NAMES,
                               help="comma-separated tasks (built-in names, dirs, files)")
    adapters: str | None = option(type=NAMES,
                                  help="comma-separated adapter dirs, one per task (default: fit)")
    k: int = option(10, type=POSITIVE_INT, help="top-k heads of the topk mode")
    json: bool = option(False, help='print {"tasks", "alpha": {A: {B: acc}}, "topk": ..., '
                                    '"zero_shot", "within_between", "similarity_transfer_spearman"}')
    out: str | None = option(help="write the long result to this CSV")


@dataclass
class PatchEffectsCommand(OneTask):
    """per-head causal effects (Function Vectors style)"""

    COMMAND: ClassVar[str] = "patch effects"
    READ_WHEN: ClassVar[dict] = {"embedding": (When(
        lambda a: not a.adapter, "without --adapter (with it, the adapter's embedding is the mean "
        "activation)", "drop --n-mean-prompts or --adapter"),)}
    adapter: str | None = option(help="adapter directory: its embedding is the mean activation and "
                                      "its α is correlated with the effects")
    n_prompts: int = option(16, type=POSITIVE_INT, help="corrupted prompts")
    n_shots: int = option(10, type=POSITIVE_INT, help="demonstrations per few-shot prompt")
    n_mean_prompts: int = option(50, type=POSITIVE_INT, read_by=("embedding",),
                                 help="clean prompts for the mean activation (without --adapter)")
    serial: bool = option(False, help="one forward pass per head (reference)")
    top: int = option(10, type=POSITIVE_INT, help="heads listed in the summary")
    json: bool = option(False, help='print {"model", "task", "top_heads": [{"head", "effect"}], '
                                    '"baseline_prob", "seconds", "rho_alpha"}')
    out: str | None = option(help="write layer, head, effect to this CSV")
    force: bool = option(False, help=FORCE_HELP)


# ----------------------------------------------------------------------------------------------
# heads and frontier


@dataclass
class HeadOptions(OneTask, Stage2):
    """The lenses' and the fits' options of heads and frontier."""

    seeds: int = option(5, type=POSITIVE_INT, read_by=("seeds",),
                        help="SITE fits of the alpha lens, seeds SEED, SEED+1, ... (default 5; dla "
                             "alone: one)")
    n_prompts: int = option(16, type=POSITIVE_INT, read_by=("corrupted",),
                            help="corrupted prompts (atp, atp-star, effect) and clean prompts "
                                 "(ablation)")
    n_shots: int = option(10, type=POSITIVE_INT, help="demonstrations per few-shot prompt")
    n_mean_prompts: int = option(50, type=POSITIVE_INT, read_by=("embedding",),
                                 help="few-shot prompts of stage 1 (the task embedding) in every "
                                      "fit, and of the embedding when nothing is fitted and there "
                                      "is no --adapter")
    limit: int = option(64, type=POSITIVE_INT, read_by=("alpha-grad",),
                        help="zero-shot train items of alpha-grad")
    n_boot: int = option(1000, type=POSITIVE_INT, read_by=("intervals",),
                         help="bootstrap resamples of the intervals")
    n_examples: int = option(FIT_DEFAULTS["n_examples"], type=POSITIVE_INT, read_by=("fit",),
                             help="training examples in stage 2 of each fit")
    protocol: str = option("default", choices=PROTOCOLS, read_by=("protocol",),
                           help="stage 2 of the fits as sitelens does it or as the paper's code does")
    force: bool = option(False, help=FORCE_HELP)


def _lenses(a) -> set[str]:
    from sitelens.lenses import parse_lenses

    return set(parse_lenses(split_csv(a.lenses)))


def _read_by_lenses(test, what: str, add: str) -> When:
    return When(lambda a: test(_lenses(a)), f"{what}, which --lenses {{a.lenses}} does not ask for",
                f"{add} to --lenses or drop {{flags}}")


_HEADS_NO_ADAPTER = When(
    lambda a: not a.adapter, "when heads fits α itself (no --adapter); with --adapter every lens "
    "reads that adapter (its α for alpha and dla, its embedding for the others) and nothing is "
    "fitted", "drop {flags}, or drop --adapter to fit with them")
_HEADS_FITS = _read_by_lenses(lambda ls: bool(ls & {"alpha", "dla"}),
                              "to the fits of the alpha and dla lenses", "add alpha")


@dataclass
class HeadsCommand(HeadOptions):
    """which heads matter: per-head scores of several lenses"""

    COMMAND: ClassVar[str] = "heads"
    READ_WHEN: ClassVar[dict] = {
        "fit": (_HEADS_NO_ADAPTER, _HEADS_FITS),
        "protocol": (_HEADS_NO_ADAPTER, _HEADS_FITS),
        "embedding": (_HEADS_NO_ADAPTER,),
        "seeds": (_HEADS_NO_ADAPTER, _read_by_lenses(
            lambda ls: "alpha" in ls, "to the alpha lens (SITE fits over seeds)", "add alpha")),
        "corrupted": (_read_by_lenses(
            lambda ls: bool(ls & {"atp", "atp-star", "effect", "ablation-mean", "ablation-zero"}),
            "to the atp, atp-star, effect and ablation lenses", "add one of them"),),
        "alpha-grad": (_read_by_lenses(lambda ls: "alpha-grad" in ls, "to the alpha-grad lens",
                                       "add alpha-grad"),),
        "intervals": (_read_by_lenses(lambda ls: bool(ls - {"alpha", "dla"}),
                                      "to the intervals of the lenses other than alpha and dla",
                                      "add one of them"),),
    }
    lenses: str | None = option(required=True, type=LENS_NAMES, help="comma-separated lenses: "
                                + ", ".join(available_lenses()) + " (" + "; ".join(
                                    f"{a} = {', '.join(ns)}" for a, ns in ALIASES.items()) + ")")
    adapter: str | None = option(help="adapter directory: its embedding feeds alpha-grad, atp, "
                                      "atp-star and effect, its α alpha and dla, nothing is fitted "
                                      "(default: the first seed's fit, else the task embedding)")
    out: str | None = option(required=True, help="write the HeadScores table to this CSV")
    json: bool = option(False, help='print {"model", "task", "lenses": {lens: {"top": [[layer, '
                                    'head, score], ...], "forward_passes", "backward_passes", '
                                    '"seconds"}}, "alpha_stability"}')


@dataclass
class FrontierCommand(HeadOptions):
    """how few heads carry the task: accuracy against the number of heads, per selector"""

    COMMAND: ClassVar[str] = "frontier"
    seeds: int = option(1, type=POSITIVE_INT, help="SITE fits of the alpha selectors, seeds SEED, "
                                                   "SEED+1, ...")
    out: str | None = option(required=True, help="the directory of frontier.csv and summary.json")
    json: bool = option(False, help="print the summary (k* and stability per selector)")
    budgets: str = option("1,2,5,10,20,50", type=KS, help="comma-separated head budgets k (each at "
                                                          "most the model's head count)")
    selectors: str = option(SELECTOR_NAMES, help=f"comma-separated: {SELECTOR_NAMES}")
    greedy_max_k: int | None = option(None, type=POSITIVE_INT,
                                      help="greedy's largest set (default: the largest budget)")
    greedy_pool: int | None = option(None, type=POSITIVE_INT,
                                     help="prune greedy's candidates to the top-P heads of alpha-grad")
    test_limit: int | None = option(None, type=POSITIVE_INT, help="the first test items only")
    no_exact_match: bool = option(False, help="first-token accuracy only (exact match generates "
                                              "under every set: slow)")
    n_bootstrap: int = option(0, type=int_in_range(0, what="a whole number >= 0"),
                              help="resamples of the selection items for the stability (each "
                                   "reruns every selector)")


# ----------------------------------------------------------------------------------------------
# figures, atlas


@dataclass
class FiguresCommand(Compute):
    """reproduce figures/ from real runs (resumable)"""

    COMMAND: ClassVar[str] = "figures"
    out: str = option("figures", help="output directory (cells cached in OUT/.runs)")
    models: str = option(",".join(FIGURE_MODELS), type=NAMES, help="comma-separated models")
    tasks: str | None = option(type=NAMES, help="comma-separated task set (default: the families)")
    intra_tasks: str | None = option(type=NAMES, help="comma-separated intra-task subset")
    effect_tasks: str | None = option(type=NAMES, help="comma-separated tasks of the per-head causal "
                                      "effects (default: the built-in set, those in --tasks)")
    limit: int = option(40, type=POSITIVE_INT, help="test items per task")
    sparsity: str = option("0,5", type=LAMBDAS, help="comma-separated λ for intra-task patching")
    n_examples: int = option(200, type=POSITIVE_INT, help="stage-2 training examples")
    n_prompts: int = option(20, type=POSITIVE_INT, help="stage-1 few-shot prompts")
    n_shots: int = option(10, type=POSITIVE_INT, help="demonstrations per few-shot prompt")
    effect_prompts: int = option(8, type=POSITIVE_INT,
                                 help="corrupted prompts per task for the causal effects")
    n_random_seeds: int = option(3, type=POSITIVE_INT,
                                 help="random head sets per k (the random-k control)")
    n_boot: int = option(1000, type=POSITIVE_INT, help="bootstrap resamples of the 95% intervals")
    no_png: bool = option(False, help="HTML + CSV only")
    quiet: bool = option(False, help="no progress output")
    executor: str = option("local", type=EXECUTOR,
                           help=EXECUTOR_HELP.format("the fits and patching cells"))


@dataclass
class AtlasCommand(Compute):
    """the head atlas: one self-contained HTML page (no server)"""

    COMMAND: ClassVar[str] = "atlas"
    READ_WHEN: ClassVar[dict] = {"compute": (When(
        lambda a: a.refit, "with --refit (without it the page is built from the tables under --data "
        "and nothing is fitted)", "add --refit or drop {flags}"),)}
    out: str | None = option(required=True, help="the HTML file to write")
    data: str | None = option(help="atlas tables, one folder per model (default: the tables shipped "
                                   "with sitelens, sitelens/data/atlas, found from any folder)")
    models: str | None = option(type=NAMES, help="comma-separated models (default: every folder "
                                f"under --data; with --refit: {','.join(ATLAS_MODELS)})")
    refit: bool = option(False, help="fit and measure the atlas from --tasks-dir first (cached fits "
                                     "reused)")
    tasks_dir: str = option("../shared/datasets/fv", read_by=("compute",),
                            help="FV-layout task folders for --refit (" + ", ".join(
                                f"{m}: {which}" for m, which in ATLAS_MODELS.items()) + ")")
    seeds: int = option(1, type=POSITIVE_INT, read_by=("compute",), help="SITE fits per task with --refit")
    limit: int = option(20, type=POSITIVE_INT, read_by=("compute",),
                        help="test items per target task in the transfer measurement (--refit)")
    cache_dir: str = option("runs/atlas", read_by=("compute",), help="cached fits of --refit")
    plotly: str = option("auto", choices=("auto", "cartesian", "full"),
                         help="the plotly.js inlined: its cartesian bundle (fetched by "
                              "scripts/setup.sh; opens in about half the time), the full one, or "
                              "auto (cartesian when present)")
    executor: str = option("local", type=EXECUTOR, read_by=("compute",),
                           help=EXECUTOR_HELP.format("the (task, seed) fits of --refit"))


COMMANDS: tuple[type, ...] = (
    FitCommand, EvalCommand, RunCommand, BenchCommand, DemoCommand, PatchIntraCommand,
    PatchInterCommand, PatchEffectsCommand, HeadsCommand, FrontierCommand, FiguresCommand,
    AtlasCommand)
CONFIGS: dict[str, type] = {c.COMMAND: c for c in COMMANDS}
