"""One config dataclass per subcommand: its fields are the command's options (default, help, type,
what reads them, what kind of path they are), turned into its parser by
:func:`sitelens.cli.options.add_options`. The first line of a config's docstring is the command's
help; ``COMMAND`` is its name.

Option groups that several commands share are base classes; a command that takes an option with
another default declares the field again. The stage-2 defaults are
:class:`~sitelens.site.FitConfig`'s own. ``READ_WHEN`` says when the command reads the options
whose ``read_by`` names it (an option typed that would not be read is refused:
:func:`sitelens.cli.options.check_ignored`).
"""

from __future__ import annotations

from dataclasses import fields
from typing import ClassVar

from sitelens.cli import types as T
from sitelens.cli.options import When, config, option
from sitelens.lenses.registry import ALIASES, DEFAULT_BUDGETS, REGISTRY, SELECTORS, available_lenses
from sitelens.models.registry import ATLAS_MODELS, DEFAULT_MODEL, FIGURE_MODELS
from sitelens.models.spec import BACKENDS
from sitelens.site.config import FitConfig

FIT_DEFAULTS = {f.name: f.default for f in fields(FitConfig)}
SPLITS, PROTOCOLS, DEVICES = ("train", "valid", "test"), ("default", "official"), "device and precision"


def count(default, help: str, **kw):
    """An option that counts something (an integer >= 1)."""
    return option(default, type=T.POSITIVE_INT, help=help, **kw)


def executor_option(what: str, **kw):
    return option("local", type=T.EXECUTOR, **kw, help=f"where {what} run: local (this process, the "
                  "default), processes:N (N worker processes) or ray[:ADDRESS] (Ray: a local "
                  "instance, or auto / the HOST:PORT of a running cluster); the results are the same")


def json_option(prints: str):
    return option(False, help=f"print {prints}")


SHOTS = "demonstrations per few-shot prompt"
LABEL_METRICS = ("also score by ranking the labels of a closed label set (label_acc_first, "
                 "label_acc_full, label_acc_full_norm, chance; docs/tasks.md); without it only tasks "
                 "with a labels.json get them")


# ----------------------------------------------------------------------------------------------
# option groups


@config
class Compute:
    """Where and how every model of the command runs (``read_by="compute"``)."""

    seed: int = option(0, type=T.SEED, read_by=("compute",), help="random seed of the task split, the "
                       "prompt and demonstration draws and the fits")
    threads: int | None = option(type=T.THREADS, read_by=("compute",),
                                 help="torch CPU threads (default: auto, the usable cores minus the ones "
                                 "busy with other work now, at least 1; see sitelens.threads)")
    device: str | None = option(type=T.DEVICE, read_by=("compute",), group=DEVICES,
                                help="cpu, cuda, cuda:N or mps (default: cpu for the bundled models)")
    dtype: str | None = option(choices=("float32", "bfloat16", "float16"), read_by=("compute",),
                               group=DEVICES, help="weights and activations (default float32); α, "
                               "its optimizer state, means, losses and KL stay float32")
    n_devices: int | None = count(None, "split the model over N CUDA GPUs from --device on (pipeline "
                                  "of layers)", read_by=("compute",), group=DEVICES)
    backend: str | None = option(choices=BACKENDS, read_by=("compute",), group=DEVICES, help="hooked "
                                 "(HookedTransformer, TransformerLens 3.x) or bridge (TransformerBridge, "
                                 "TransformerLens 3.9 and 4.x); adapters load on either (default: "
                                 "$SITELENS_BACKEND, else what the installed TransformerLens has: hooked "
                                 "on 3.x, bridge on 4.x)")
    device_map: str | None = option(choices=("auto", "balanced", "balanced_low_0", "sequential"),
                                    read_by=("compute",), group=DEVICES, help="bridge backend only: "
                                    "Hugging Face's device_map (instead of --device / --n-devices)")


@config
class Model:
    """The model a command loads."""

    model: str = option(DEFAULT_MODEL, help="bundled name, TL name or HF dir")


@config
class OneTask(Compute, Model):
    """A command on one model and one task."""

    task: str | None = option(required=True, help="built-in name, FV-layout dir, or JSON file")
    dedupe: bool = option(False, help="drop duplicate items in the task file")


@config
class Force:
    """A command that writes a result of its own (replaced only with ``--force``)."""

    force: bool = option(False, help="replace an earlier result at the output path (without it, an "
                                     "existing adapter or result file is refused)")


@config
class Stage2:
    """Stage 2 of a SITE fit (``read_by="fit"``; ``--protocol``: ``"protocol"``)."""

    lr: float = option(FIT_DEFAULTS["lr"], above=0, read_by=("fit",),
                       help="stage-2 learning rate (Adam on the logits of α)")
    n_examples: int = count(FIT_DEFAULTS["n_examples"], "training examples in stage 2", read_by=("fit",))
    batch_size: int = count(FIT_DEFAULTS["batch_size"], f"stage-2 batch size (default "
                            f"{FIT_DEFAULTS['batch_size']}; 1 with --protocol official)", read_by=("fit",))
    sparsity: float = option(FIT_DEFAULTS["sparsity"], at_least=0, read_by=("fit",),
                             help="λ of the λ·mean(α) penalty (a negative λ would reward large α)")
    protocol: str = option("default", choices=PROTOCOLS, read_by=("protocol",), help="stage 2 as "
                           "sitelens does it (batched passes, best α) or as the paper's code does "
                           "(400 i.i.d. steps of batch 1, final α, no space before digits)")


@config
class FitOptions(Stage2):
    """Stage 1 and stage 2 of a SITE fit, with stage 2's schedule options (the joint fits of heads
    and frontier run every batch under one schedule, so they take only :class:`Stage2`)."""

    n_prompts: int = count(50, "few-shot prompts for stage 1", read_by=("fit",))
    n_shots: int = count(10, SHOTS, read_by=("shots",))
    eval_every: int = count(FIT_DEFAULTS["eval_every"], f"stage-2 steps between validation checks (default "
                            f"{FIT_DEFAULTS['eval_every']}; 50 with --protocol official)", read_by=("fit",))
    n_valid: int = count(FIT_DEFAULTS["n_valid"], f"validation items that choose the kept α (default "
                         f"{FIT_DEFAULTS['n_valid']}; 100 with --protocol official)", read_by=("fit",))
    patience: int = option(FIT_DEFAULTS["patience"], type=T.NON_NEGATIVE_INT, read_by=("fit",),
                           help="stop stage 2 after this many validation checks in a row without a "
                           "lower validation loss (0: never stop early)")
    lr_rule: str = option(FIT_DEFAULTS["lr_rule"], choices=FitConfig.LR_RULES, read_by=("fit",),
                          help=f"--lr scaled for --batch-size: fixed, sqrt (×√(batch/{FitConfig.LR_BATCH})) "
                          f"or linear (×batch/{FitConfig.LR_BATCH})")


@config
class Scored:
    """The items scored."""

    split: str = option("test", choices=SPLITS, help="the split scored")
    limit: int | None = count(None, "the first N items of the split (default: all of them)")


@config
class EvalOptions(Scored):
    """The evaluation of eval and run."""

    methods: str = option("zero-shot,icl,site", type=T.EVAL_METHODS,
                          help="comma-separated methods: zero-shot, icl, site")
    json: bool = json_option("one JSON object")
    label_metrics: bool = option(False, help=LABEL_METRICS)


# ----------------------------------------------------------------------------------------------
# fit, eval, run, demo, bench


@config
class FitCommand(Force, FitOptions, OneTask):
    """fit a SITE adapter (stage 1 + stage 2) and save it"""

    COMMAND: ClassVar[str] = "fit"
    out: str | None = option(required=True, path="adapter", help="output directory for the adapter")


@config
class EvalCommand(Force, EvalOptions, OneTask):
    """evaluate zero-shot / ICL / SITE on a task"""

    COMMAND: ClassVar[str] = "eval"
    READ_WHEN: ClassVar[dict] = {"shots": (When(
        lambda a: "icl" in T.split_csv(a.methods), "to the icl method, which --methods does not ask "
        "for", "add icl to --methods or drop --n-shots"),)}
    adapter: str | None = option(path="path", help="adapter directory (needed for the site method)")
    n_shots: int = count(10, SHOTS, read_by=("shots",))
    items: str | None = option(path="csv", help="also write per-item results to this CSV")
    protocol: str | None = option(choices=PROTOCOLS, help="generation and scoring: sitelens's or the "
                                  "paper code's (20 tokens, no newline stop, '(' cut, St.→Saint); "
                                  "default: the adapter's, else default")


@config
class RunCommand(EvalOptions, FitOptions, OneTask):
    """fit and evaluate with one model load; resumable (--out DIR)"""

    COMMAND: ClassVar[str] = "run"
    READ_WHEN: ClassVar[dict] = {
        "fit": (When(lambda a: "site" in T.split_csv(a.methods), "to the fit of the site method, "
                     "which --methods does not ask for", "add site to --methods or drop {flags}"),),
        "shots": (When(lambda a: bool({"icl", "site"} & set(T.split_csv(a.methods))), "to the "
                       "demonstrations of icl and of the site fit, which --methods does not ask "
                       "for", "add icl or site to --methods or drop --n-shots"),),
    }
    methods: str = option("zero-shot,icl,site", type=T.EVAL_METHODS, help="comma-separated methods: "
                          "zero-shot, icl, site (site: fit, or reuse, the adapter in OUT/adapter)")
    out: str | None = option(path="path", help="the run's folder: adapter/, eval.json, items.csv, "
                             "run.json (default: runs/MODEL/TASK)")
    force: bool = option(False, help="replace the parts of an earlier run in --out whose settings "
                         "differ (without it they are refused); parts with the same settings are "
                         "reused, never redone")


@config
class DemoCommand(Compute, Model):
    """fit SITE on a built-in task, compare zero-shot / ICL / SITE"""

    COMMAND: ClassVar[str] = "demo"
    task: str = option("antonym", help="a built-in task (sitelens.builtin_tasks())")
    limit: int = count(50, "test items compared")


@config
class BenchCommand(Compute):
    """models × tasks × methods → one resumable results table"""

    COMMAND: ClassVar[str] = "bench"
    models: str = option(DEFAULT_MODEL, type=T.NAMES, help="comma-separated model names")
    tasks: tuple[str, ...] = option((), nargs="+", help="task specs (names, dirs, files), space- or "
                                    "comma-separated")
    tasks_dir: str | None = option(path="path", help="every FV-layout task directory under DIR")
    abstractive: bool = option(False, help="with --tasks-dir: abstractive tasks only")
    methods: str = option("zero-shot,icl,site,fv,tv,ltv,mtv,i2cl,lora,ia3", type=T.BENCH_METHODS,
                          help="comma-separated methods (sitelens.available_methods())")
    out: str | None = option(required=True, path="csv",
                             help="results CSV (appended cell by cell; resumes)")
    limit: int = count(100, "test items per task")
    n_ctx: int | None = count(None, "context length for the models (default 2048; squad_val needs 4096)")
    label_metrics: bool = option(False, help=LABEL_METRICS)
    executor: str = executor_option("the (model, task, method) cells")
    joint: int = count(1, "fit the site cells K tasks at a time, in one joint run each (their rows, "
                       "equal to one-task fits up to float rounding, are keyed apart); default 1: "
                       "one task at a time")


# ----------------------------------------------------------------------------------------------
# patch intra | inter | effects


def _fits_itself(cmd: str, opt: str) -> dict:
    """``READ_WHEN`` of a command that fits its adapter unless ``opt`` gives it."""
    no_adapter = When(lambda a: not getattr(a, opt[2:]), f"when {cmd} fits the adapter itself, with "
                      f"no {opt} (fit options); an adapter given with {opt} is used as it was fitted",
                      f"drop {{flags}}, or drop {opt} to fit one with them")
    save = When(no_adapter.test, f"to an adapter that {cmd} fits itself (no {opt})",
                f"drop --save-adapter ({opt} is saved already)")
    return {"fit": (no_adapter,), "shots": (no_adapter,), "protocol": (no_adapter,), "save": (save,)}


@config
class PatchOptions(Force, Scored):
    """What intra- and inter-task patching share."""

    n_boot: int = count(1000, "bootstrap resamples of the 95% intervals")


@config
class PatchIntraCommand(PatchOptions, FitOptions, OneTask):
    """inject into the top-k / bottom-k / random-k heads by α"""

    COMMAND: ClassVar[str] = "patch intra"
    READ_WHEN: ClassVar[dict] = _fits_itself("patch intra", "--adapter")
    adapter: str | None = option(path="path", help="adapter directory (default: fit one with the --fit "
                                 "options)")
    ks: str | None = option(type=T.KS, help="comma-separated k (default 1, 2, 4, ..., all heads)")
    n_random_seeds: int = count(3, "random head sets per k (the random-k control)")
    json: bool = json_option('{"model", "task", "n", "zero_shot", "site", "rows": [{"k", "top", '
                             '"bottom", "random"}, ...]}')
    out: str | None = option(path="csv", help="write the full result (one row per condition) to this CSV")
    save_adapter: str | None = option(metavar="DIR", path="adapter", read_by=("save",), help="keep "
                                      "the adapter fitted here (no --adapter) in DIR, to reuse with "
                                      "--adapter DIR")


@config
class PatchInterCommand(PatchOptions, FitOptions, Compute, Model):
    """inject task B's embedding through task A's α, all pairs"""

    COMMAND: ClassVar[str] = "patch inter"
    READ_WHEN: ClassVar[dict] = _fits_itself("patch inter", "--adapters")
    tasks: str | None = option(required=True, type=T.NAMES,
                               help="comma-separated tasks (built-in names, dirs, files)")
    adapters: str | None = option(type=T.NAMES, path="path",
                                  help="comma-separated adapter dirs, one per task (default: fit)")
    k: int = count(10, "top-k heads of the topk mode")
    json: bool = json_option('{"tasks", "alpha": {A: {B: acc}}, "topk": ..., "zero_shot", '
                             '"within_between", "similarity_transfer_spearman"}')
    out: str | None = option(path="csv", help="write the long result to this CSV")


@config
class PatchEffectsCommand(Force, OneTask):
    """per-head causal effects (Function Vectors style)"""

    COMMAND: ClassVar[str] = "patch effects"
    READ_WHEN: ClassVar[dict] = {"embedding": (When(
        lambda a: not a.adapter, "without --adapter (with it, the adapter's embedding is the mean "
        "activation)", "drop --n-mean-prompts or --adapter"),)}
    adapter: str | None = option(path="path", help="adapter directory: its embedding is the mean "
                                 "activation and its α is correlated with the effects")
    n_prompts: int = count(16, "corrupted prompts")
    n_shots: int = count(10, SHOTS)
    n_mean_prompts: int = count(50, "clean prompts for the mean activation (without --adapter)",
                                read_by=("embedding",))
    serial: bool = option(False, help="one forward pass per head (reference)")
    top: int = count(10, "heads listed in the summary")
    json: bool = json_option('{"model", "task", "top_heads": [{"head", "effect"}], "baseline_prob", '
                             '"seconds", "rho_alpha"}')
    out: str | None = option(path="csv", help="write layer, head, effect to this CSV")


# ----------------------------------------------------------------------------------------------
# heads and frontier


@config
class HeadOptions(Force, Stage2, OneTask):
    """The lenses' and the fits' options of heads and frontier."""

    seeds: int = count(5, "SITE fits of the alpha lens, seeds SEED, SEED+1, ... (default 5; dla alone: "
                       "one)", read_by=("seeds",))
    n_prompts: int = count(16, "corrupted prompts (atp, atp-star, effect) and clean prompts (ablation)",
                           read_by=("corrupted",))
    n_shots: int = count(10, SHOTS)
    n_mean_prompts: int = count(50, "few-shot prompts of stage 1 (the task embedding) in every fit, and "
                                "of the embedding when nothing is fitted and there is no --adapter",
                                read_by=("embedding",))
    limit: int = count(64, "zero-shot train items of alpha-grad", read_by=("alpha-grad",))
    n_boot: int = count(1000, "bootstrap resamples of the intervals", read_by=("intervals",))
    n_examples: int = count(FIT_DEFAULTS["n_examples"], "training examples in stage 2 of each fit",
                            read_by=("fit",))
    protocol: str = option("default", choices=PROTOCOLS, read_by=("protocol",),
                           help="stage 2 of the fits as sitelens does it or as the paper's code does")


def _lenses_reading(group: str, before: str = "", after: str = "") -> When:
    """Read when --lenses asks for a lens whose registry entry reads ``group``
    (:attr:`~sitelens.lenses.registry.Lens.reads`); the refusal names those lenses, an alias for
    all of its lenses."""
    readers = [lens.name for lens in REGISTRY.values() if group in lens.reads]
    names = list(readers)
    for alias, members in ALIASES.items():
        if set(members) <= set(names):
            at = names.index(members[0])
            names = [n for n in names if n not in members]
            names.insert(at, alias)
    words = (names[0] + " lens" if len(names) == 1
             else ", ".join(names[:-1]) + f" and {names[-1]} lenses")

    def asked(a) -> bool:
        from sitelens.lenses import parse_lenses

        return bool(set(parse_lenses(T.split_csv(a.lenses))) & set(readers))

    add = f"add {names[0]}" if len(names) == 1 else "add one of them"
    return When(asked, f"to the {before}{words}{after}, which --lenses {{a.lenses}} does not ask for",
                f"{add} to --lenses or drop {{flags}}")


_NO_ADAPTER = When(lambda a: not a.adapter, "when heads fits α itself (no --adapter); with --adapter "
                   "every lens reads that adapter (its α for alpha and dla, its embedding for the "
                   "others) and nothing is fitted", "drop {flags}, or drop --adapter to fit with them")
_FITS = _lenses_reading("fit", before="fits of the ")


@config
class HeadsCommand(HeadOptions):
    """which heads matter: per-head scores of several lenses"""

    COMMAND: ClassVar[str] = "heads"
    READ_WHEN: ClassVar[dict] = {
        "fit": (_NO_ADAPTER, _FITS), "protocol": (_NO_ADAPTER, _FITS), "embedding": (_NO_ADAPTER,),
        "seeds": (_NO_ADAPTER, _lenses_reading("seeds", after=" (SITE fits over seeds)")),
        "corrupted": (_lenses_reading("corrupted"),),
        "alpha-grad": (_lenses_reading("alpha-grad"),),
        "intervals": (_lenses_reading("intervals", before="intervals of the "),),
    }
    lenses: str | None = option(required=True, type=T.LENS_NAMES, help="comma-separated lenses: "
                                + ", ".join(available_lenses()) + " (" + "; ".join(
                                    f"{a} = {', '.join(ns)}" for a, ns in ALIASES.items()) + ")")
    adapter: str | None = option(path="path", help="adapter directory: its embedding feeds alpha-grad, "
                                 "atp, atp-star and effect, its α alpha and dla, nothing is fitted "
                                 "(default: the first seed's fit, else the task embedding)")
    out: str | None = option(required=True, path="csv", help="write the HeadScores table to this CSV")
    json: bool = json_option('{"model", "task", "lenses": {lens: {"top": [[layer, head, score], ...], '
                             '"forward_passes", "backward_passes", "seconds"}}, "alpha_stability"}')


@config
class FrontierCommand(HeadOptions):
    """how few heads carry the task: accuracy against the number of heads, per selector"""

    COMMAND: ClassVar[str] = "frontier"
    seeds: int = count(1, "SITE fits of the alpha selectors, seeds SEED, SEED+1, ...")
    out: str | None = option(required=True, path="dir", result="frontier.csv",
                             help="the directory of frontier.csv and summary.json")
    json: bool = json_option("the summary (k* chosen on valid with its interval; test accuracy and "
                             "chance-adjusted stability at k*, per selector)")
    budgets: str = option(",".join(map(str, DEFAULT_BUDGETS)), type=T.KS,
                          help="comma-separated head budgets k (each at most the model's head count)")
    selectors: str = option(",".join(SELECTORS), help="comma-separated selectors: " + ", ".join(SELECTORS))
    greedy_max_k: int | None = count(None, "greedy's largest set (default: the largest budget)")
    greedy_pool: int | None = count(None, "prune greedy's candidates to the top-P heads of alpha-grad")
    test_limit: int | None = count(None, "the first test items only")
    no_exact_match: bool = option(False, help="first-token accuracy only (exact match generates under "
                                  "every set: slow)")
    n_bootstrap: int = option(0, type=T.int_in_range(0, what="a whole number >= 0"), help="resamples of "
                              "the selection items for the stability (each reruns every selector)")


# ----------------------------------------------------------------------------------------------
# figures, atlas


@config
class FiguresCommand(Compute):
    """reproduce figures/ from real runs (resumable)"""

    COMMAND: ClassVar[str] = "figures"
    out: str = option("figures", path="dir", help="output directory (cells cached in OUT/.runs)")
    models: str = option(",".join(FIGURE_MODELS), type=T.NAMES, help="comma-separated models")
    tasks: str | None = option(type=T.NAMES, help="comma-separated task set (default: the families)")
    intra_tasks: str | None = option(type=T.NAMES, help="comma-separated intra-task subset")
    effect_tasks: str | None = option(type=T.NAMES, help="comma-separated tasks of the per-head causal "
                                      "effects (default: the built-in set, those in --tasks)")
    limit: int = count(40, "test items per task")
    sparsity: str = option("0,5", type=T.LAMBDAS, help="comma-separated λ for intra-task patching")
    n_examples: int = count(200, "stage-2 training examples")
    n_prompts: int = count(20, "stage-1 few-shot prompts")
    n_shots: int = count(10, SHOTS)
    effect_prompts: int = count(8, "corrupted prompts per task for the causal effects")
    n_random_seeds: int = count(3, "random head sets per k (the random-k control)")
    n_boot: int = count(1000, "bootstrap resamples of the 95% intervals")
    no_png: bool = option(False, help="HTML + CSV only")
    quiet: bool = option(False, help="no progress output")
    executor: str = executor_option("the fits and patching cells")
    joint: bool = option(False, help="fit the missing adapters of each λ all tasks at once, in this "
                         "process (equal to one-task fits up to float rounding)")


@config
class AtlasCommand(Compute):
    """the head atlas: one self-contained HTML page (no server)"""

    COMMAND: ClassVar[str] = "atlas"
    READ_WHEN: ClassVar[dict] = {"compute": (When(
        lambda a: a.refit, "with --refit (without it the page is built from the tables under --data "
        "and nothing is fitted)", "add --refit or drop {flags}"),)}
    out: str | None = option(required=True, path="html", help="the HTML file to write")
    data: str | None = option(path="path", help="atlas tables, one folder per model (default: the "
                              "tables shipped with sitelens, sitelens/data/atlas, found from any folder)")
    models: str | None = option(type=T.NAMES, help="comma-separated models (default: every folder under "
                                f"--data; with --refit: {','.join(ATLAS_MODELS)})")
    refit: bool = option(False, help="fit and measure the atlas from --tasks-dir first (cached fits "
                         "reused)")
    tasks_dir: str = option("../shared/datasets/fv", path="path", read_by=("compute",), help="FV-layout "
                            "task folders for --refit (" + ", ".join(f"{m}: {which}" for m, which in
                                                                     ATLAS_MODELS.items()) + ")")
    seeds: int = count(1, "SITE fits per task with --refit", read_by=("compute",))
    limit: int = count(20, "test items per target task in the transfer measurement (--refit)",
                       read_by=("compute",))
    cache_dir: str = option("runs/atlas", path="path", read_by=("compute",), help="cached fits of --refit")
    joint: bool = option(False, read_by=("compute",), help="--refit's fits in this process run all tasks "
                         "at once per seed (sitelens.site.fit_site_tasks: the same fits up to float "
                         "rounding, the rows of many tasks in every pass)")
    carry: bool = option(False, read_by=("compute",), help="--refit brings the tables under --data to "
                         "the current numerics version, measuring only the tasks the bumps since "
                         "touched (sitelens.tasks.numerics.numerics_touches; a few untouched tasks are "
                         "refitted to check the rule) and carrying every other row; its fits run "
                         "in this process")
    plotly: str = option("auto", choices=("auto", "cartesian", "full"), help="the plotly.js inlined: its "
                         "cartesian bundle (fetched by scripts/setup.sh; opens in about half the time), "
                         "the full one, or auto (cartesian when present)")
    executor: str = executor_option("the (task, seed) fits of --refit", read_by=("compute",))


COMMANDS: tuple[type, ...] = (
    FitCommand, EvalCommand, RunCommand, BenchCommand, DemoCommand, PatchIntraCommand,
    PatchInterCommand, PatchEffectsCommand, HeadsCommand, FrontierCommand, FiguresCommand,
    AtlasCommand)
CONFIGS: dict[str, type] = {c.COMMAND: c for c in COMMANDS}
