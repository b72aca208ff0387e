"""Bad input on every subcommand and every option (README "Troubleshooting"): exit status 2, ONE
non-empty stderr line ``sitelens: error: ...`` naming the problem and the fix, no traceback, no
output on stdout and no file left behind. Validation runs before any model is loaded, so these
tests are fast; only the checks that need the model's head count load the tiny test model.

Most cases call ``sitelens.cli.main(argv)`` in-process, each in a fresh temporary working
directory (the output paths of the commands lie in it and it must be unchanged afterwards); a few
run the real ``sitelens`` executable to check the exit status and stderr of a process.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_cli_options import leaf_parsers

from sitelens.cli import build_parser, main
from sitelens.lenses import ALIASES, LENSES
from sitelens.models import BUNDLED_MODELS, TINY_MODELS, has_hooked_transformer
from sitelens.tasks import builtin_tasks

TASKS = set(builtin_tasks())
MODELS = set(BUNDLED_MODELS) | set(TINY_MODELS)
LENS_NAMES = set(LENSES) | set(ALIASES)

# A valid command line per subcommand (tiny model, outputs in the working directory); each case
# appends ``--option=BAD``, which overrides the value given here.
BASE = {
    "fit": ["fit", "--model", "tiny-random", "--task", "antonym", "--out", "ad"],
    "eval": ["eval", "--model", "tiny-random", "--task", "antonym", "--methods", "zero-shot",
             "--items", "items.csv"],
    "run": ["run", "--model", "tiny-random", "--task", "antonym", "--out", "r"],
    "bench": ["bench", "--models", "tiny-random", "--tasks", "antonym", "--methods", "zero-shot",
              "--out", "b.csv"],
    "demo": ["demo", "--model", "tiny-random", "--task", "antonym"],
    "patch intra": ["patch", "intra", "--model", "tiny-random", "--task", "antonym", "--out", "i.csv"],
    "patch inter": ["patch", "inter", "--model", "tiny-random", "--tasks", "antonym,first_letter",
                    "--out", "x.csv"],
    "patch effects": ["patch", "effects", "--model", "tiny-random", "--task", "antonym",
                      "--out", "e.csv"],
    "heads": ["heads", "--model", "tiny-random", "--task", "antonym", "--lenses", "alpha-grad",
              "--out", "h.csv"],
    "frontier": ["frontier", "--model", "tiny-random", "--task", "antonym", "--budgets", "1,2",
                 "--out", "fr"],
    "figures": ["figures", "--models", "tiny-random", "--tasks", "antonym,first_letter",
                "--out", "figs"],
    "atlas": ["atlas", "--out", "a.html", "--refit",
              "--tasks-dir", str(Path(__file__).parent / "data" / "fv")],  # one FV-layout task
}


# ----------------------------------------------------------------------------------------------
# running a command line and checking the outcome


@contextlib.contextmanager
def _chdir(path):
    old = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


def _tree(root: str) -> set[str]:
    return {str(p.relative_to(root)) for p in Path(root).rglob("*")}


def _run(argv: list[str], setup=None):
    """``main(argv)`` in a fresh temporary working directory (``setup(dir)`` prepares files);
    returns (status, stdout, stderr, files added or removed)."""
    with tempfile.TemporaryDirectory() as d, _chdir(d):
        if setup is not None:
            setup(Path(d))
        before = _tree(d)
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main(argv)
        return rc, out.getvalue(), err.getvalue(), before ^ _tree(d)


def _check(rc, out: str, err: str, changed, argv, *needles) -> str:
    assert rc == 2, (argv, rc, out, err)
    assert "Traceback" not in err, err
    lines = err.splitlines()
    assert len(lines) == 1, (argv, err)
    assert lines[0].startswith("sitelens: error: ") and lines[0][len("sitelens: error: "):].strip(), err
    assert out == "", (argv, out)
    assert not changed, (argv, changed)
    for n in needles:
        assert n in err, (n, err)
    return err


def _rejected(argv: list[str], *needles: str, setup=None) -> str:
    return _check(*_run(argv, setup), argv, *needles)


# ----------------------------------------------------------------------------------------------
# strategies for bad values


def _int_ok(s: str, lo: int, hi: int | None = None) -> bool:
    try:
        v = int(s)
    except ValueError:
        return False
    return v >= lo and (hi is None or v <= hi)


def _float(s: str) -> float:
    try:
        return float(s)
    except ValueError:
        return math.nan


_TEXT = st.text(max_size=12)
_FLOAT_TEXT = st.floats(allow_nan=True, allow_infinity=True).map(repr)  # never an int literal
_ODD = st.sampled_from(["--", "-", "", " ", "\n", "\x00", "1\n2"])  # argparse's and paths' corners


def bad_int(lo: int, hi: int | None = None):
    low = st.integers(max_value=lo - 1).map(str)
    high = st.integers(min_value=hi + 1).map(str) if hi is not None else st.nothing()
    return st.one_of(low, high, _FLOAT_TEXT, _ODD, _TEXT.filter(lambda s: not _int_ok(s, lo, hi)))


BAD_POS = bad_int(1)
BAD_SEED = bad_int(0, 2**32 - 1)
BAD_NONNEG_INT = bad_int(0)
BAD_THREADS = bad_int(1, 1024)
BAD_LR = st.one_of(  # not a positive finite number
    st.sampled_from(["nan", "inf", "-inf", "1e999", "0", "-0.0"]),
    st.floats(max_value=0).map(repr),
    _ODD,
    _TEXT.filter(lambda s: not (math.isfinite(_float(s)) and _float(s) > 0)),
)
BAD_NONNEG = st.one_of(  # not a finite number >= 0
    st.sampled_from(["nan", "inf", "-inf", "1e999", "NaN", "-1", "-1e-9"]),
    st.floats(max_value=-1e-300).map(repr),
    _ODD,
    _TEXT.filter(lambda s: not (math.isfinite(_float(s)) and _float(s) >= 0)),
)


def _items(s: str) -> list[str]:
    return [x.strip() for x in s.split(",") if x.strip()]


def _list_ok(s: str, item_ok, min_items: int = 1) -> bool:
    """How the CLI reads a comma-separated list: items stripped, empty ones dropped; at least
    ``min_items``, each accepted, no duplicates."""
    xs = _items(s)
    return len(xs) >= min_items and all(item_ok(x) for x in xs) and len(set(xs)) == len(xs)


def bad_list(item_ok, good: list[str], min_items: int = 1, item=_TEXT):
    """Comma-separated lists that the CLI must refuse: a bad item, too few items or a duplicate."""
    pieces = st.one_of(st.sampled_from(good), item)
    lists = st.lists(pieces, min_size=0, max_size=4).map(",".join)
    dup = st.sampled_from(good).map(lambda g: f"{g},{g}")
    return st.one_of(lists, dup, st.sampled_from(["", ",", " , "])).filter(
        lambda s: not _list_ok(s, item_ok, min_items))


def _lambda_ok(s: str) -> bool:
    return math.isfinite(_float(s)) and _float(s) >= 0


BAD_KS = bad_list(lambda s: _int_ok(s, 1), ["1", "2", "4"])
BAD_LAMBDAS = bad_list(_lambda_ok, ["0", "5", "0.5"])
BAD_BENCH_METHODS = bad_list(lambda s: s in {"zero-shot", "icl", "site", "fv", "tv", "ltv", "ltv-valid",
                                               "sv", "mtv", "i2cl", "lora", "ia3"}, ["zero-shot", "icl"])
BAD_EVAL_METHODS = bad_list(lambda s: s in {"zero-shot", "icl", "site"}, ["zero-shot", "icl"])
BAD_LENSES = bad_list(lambda s: s in LENS_NAMES, ["alpha", "atp", "ablation"])
BAD_MODEL = _TEXT.filter(lambda s: s not in MODELS)
BAD_MODELS = bad_list(lambda s: s in MODELS, ["tiny-random", "tiny-random-gqa"])
BAD_TASK = _TEXT.filter(lambda s: s not in TASKS)
# task lists of patch inter / figures: a bad name, fewer than two, or a duplicate
BAD_TASK_LIST = bad_list(lambda s: s in TASKS, ["antonym", "first_letter"], min_items=2)
# bench --tasks (one word here): split on commas, not stripped; at least one unknown, or none
BAD_BENCH_TASKS = st.one_of(
    _TEXT.filter(lambda s: any(x not in TASKS for x in s.split(",") if x)
                 or not [x for x in s.split(",") if x]),
    st.just(""),
)
# --intra-tasks / --effect-tasks: not a subset of --tasks antonym,first_letter
BAD_SUBSET = bad_list(lambda s: s in ("antonym", "first_letter"), ["antonym", "first_letter"])


def _device_ok(s: str) -> bool:
    """What ``--device`` accepts: cpu, mps where present, cuda / cuda:N where torch sees that GPU."""
    import torch

    try:
        dev = torch.device(s.strip())
    except (RuntimeError, ValueError):
        return False
    n_gpu = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return (dev.type == "cpu" or (dev.type == "mps" and torch.backends.mps.is_available())
            or (dev.type == "cuda" and n_gpu > (dev.index or 0)))


# not a device, a device type sitelens does not run on, or a GPU this machine does not have
BAD_DEVICE = st.one_of(
    st.sampled_from(["tpu", "gpu", "meta", "cuda:x", "cuda:99", "cuda", "cpu:-1", "xla", "CUDA"]),
    _ODD, _TEXT,
).filter(lambda s: not _device_ok(s))


def _executor_ok(s: str) -> bool:
    """What ``--executor`` accepts: local, processes:N (N in 1..1024, ASCII digits), ray,
    ray:auto, ray:HOST:PORT (HOST letters, digits, dots and inner dashes; PORT in 1..65535)."""
    if s in ("local", "ray", "ray:auto"):
        return True
    kind, _, arg = s.partition(":")
    if kind == "processes":
        return arg.isascii() and arg.isdigit() and 1 <= int(arg) <= 1024
    if kind == "ray":
        host, sep, port = arg.rpartition(":")
        return (bool(sep) and re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?", host)
                is not None and port.isascii() and port.isdigit() and 1 <= int(port) <= 65535)
    return False


# not an executor: another word, processes:N out of range or not a number, ray:ADDRESS malformed
BAD_EXECUTOR = st.one_of(
    st.sampled_from(["gpu", "processes", "processes:", "processes:0", "processes:2.5",
                     "processes:٣", "ray:", "ray:not-an-address", "ray:host:0", "ray::6379",
                     "local:1", "Ray", " ray", "dask"]),
    st.integers(max_value=0).map(lambda n: f"processes:{n}"),
    st.integers(min_value=1025).map(lambda n: f"processes:{n}"),
    st.integers(min_value=65536).map(lambda n: f"ray:127.0.0.1:{n}"),
    _ODD, _TEXT,
).filter(lambda s: not _executor_ok(s))


def bad_choice(choices):
    return st.one_of(_TEXT.filter(lambda s: s not in choices), _ODD, st.sampled_from(["TEST", " test"]))


KINDS = {
    "pos": BAD_POS, "seed": BAD_SEED, "threads": BAD_THREADS, "lr": BAD_LR, "nonneg": BAD_NONNEG,
    "nonneg_int": BAD_NONNEG_INT,
    "ks": BAD_KS, "lambdas": BAD_LAMBDAS, "bench_methods": BAD_BENCH_METHODS,
    "eval_methods": BAD_EVAL_METHODS, "lenses": BAD_LENSES, "model": BAD_MODEL,
    "models": BAD_MODELS, "task": BAD_TASK, "task_list": BAD_TASK_LIST,
    "bench_tasks": BAD_BENCH_TASKS, "subset": BAD_SUBSET, "device": BAD_DEVICE,
    "executor": BAD_EXECUTOR,
}

NAMED_BY_LOADER = {"model", "models", "task", "task_list", "bench_tasks"}
# what the loaders' messages (or argparse's, for a missing value) name instead of the option
LOADER_NEEDLE = {
    "model": r"[Mm]odel|argument --model", "models": r"[Mm]odel|argument --models",
    "task": r"[Tt]ask|argument --task", "task_list": r"[Tt]asks?|argument --tasks",
    "bench_tasks": r"[Tt]asks?|argument --tasks",
}
DEVICE = [("--device", "device"), ("--n-devices", "pos")]  # --dtype, --device-map: choices
COMMON = [("--model", "model"), ("--task", "task"), ("--seed", "seed"), ("--threads", "threads")
          ] + DEVICE
FIT = [("--n-prompts", "pos"), ("--n-shots", "pos"), ("--lr", "lr"), ("--n-examples", "pos"),
       ("--batch-size", "pos"), ("--sparsity", "nonneg"), ("--eval-every", "pos"), ("--n-valid", "pos"),
       ("--patience", "nonneg_int")]
OPTIONS = {
    "fit": COMMON + FIT,
    "eval": COMMON + [("--methods", "eval_methods"), ("--limit", "pos"), ("--n-shots", "pos")],
    "bench": [("--models", "models"), ("--tasks", "bench_tasks"), ("--methods", "bench_methods"),
              ("--limit", "pos"), ("--seed", "seed"), ("--threads", "threads"), ("--n-ctx", "pos"),
              ("--executor", "executor"), ("--joint", "pos")] + DEVICE,
    "demo": COMMON + [("--limit", "pos")],
    "run": COMMON + FIT + [("--methods", "eval_methods"), ("--limit", "pos")],
    "patch intra": COMMON + FIT + [("--ks", "ks"), ("--n-random-seeds", "pos"), ("--limit", "pos"),
                                   ("--n-boot", "pos")],
    "patch inter": [("--model", "model"), ("--tasks", "task_list"), ("--k", "pos"),
                    ("--limit", "pos"), ("--n-boot", "pos"), ("--seed", "seed"),
                    ("--threads", "threads")] + FIT + DEVICE,
    "patch effects": COMMON + [("--n-prompts", "pos"), ("--n-shots", "pos"),
                               ("--n-mean-prompts", "pos"), ("--top", "pos")],
    "heads": COMMON + [("--lenses", "lenses"), ("--seeds", "pos"), ("--n-prompts", "pos"),
                       ("--n-shots", "pos"), ("--n-mean-prompts", "pos"), ("--limit", "pos"),
                       ("--n-boot", "pos"), ("--lr", "lr"), ("--n-examples", "pos"),
                       ("--batch-size", "pos"), ("--sparsity", "nonneg")],
    "frontier": COMMON + [("--seeds", "pos"), ("--n-prompts", "pos"), ("--n-shots", "pos"),
                          ("--n-mean-prompts", "pos"), ("--limit", "pos"), ("--n-boot", "pos"),
                          ("--lr", "lr"), ("--n-examples", "pos"), ("--batch-size", "pos"),
                          ("--sparsity", "nonneg")],
    "figures": [("--models", "models"), ("--tasks", "task_list"), ("--intra-tasks", "subset"),
                ("--effect-tasks", "subset"), ("--limit", "pos"), ("--sparsity", "lambdas"),
                ("--n-examples", "pos"), ("--n-prompts", "pos"), ("--n-shots", "pos"),
                ("--effect-prompts", "pos"), ("--n-random-seeds", "pos"), ("--n-boot", "pos"),
                ("--seed", "seed"), ("--threads", "threads"), ("--executor", "executor")] + DEVICE,
    "atlas": [("--models", "models"), ("--seeds", "pos"), ("--seed", "seed"), ("--limit", "pos"),
              ("--threads", "threads"), ("--executor", "executor")] + DEVICE,
}
# path options: explicit cases below (test_bad_paths)
PATH_OPTIONS = {("fit", "--out"), ("run", "--out"), ("eval", "--items"), ("eval", "--adapter"),
                ("bench", "--out"),
                ("bench", "--tasks-dir"), ("patch intra", "--adapter"), ("patch intra", "--out"),
                ("patch inter", "--adapters"), ("patch inter", "--out"),
                ("patch effects", "--adapter"), ("patch effects", "--out"), ("heads", "--adapter"),
                ("heads", "--out"), ("frontier", "--out"), ("figures", "--out"), ("atlas", "--out"),
                ("atlas", "--data"),
                ("patch intra", "--save-adapter"),
                ("atlas", "--tasks-dir"), ("atlas", "--cache-dir")}


def _subparsers():
    """{"fit": parser, ..., "patch intra": parser, ...} from the real parser."""
    return leaf_parsers(build_parser())


def _choice_options():
    return [(cmd, a.option_strings[-1], tuple(a.choices))
            for cmd, p in _subparsers().items() for a in p._actions
            if a.option_strings and a.choices is not None]


CASES = [(cmd, opt, kind) for cmd, opts in OPTIONS.items() for opt, kind in opts]
# the frontier's own options: explicit cases below (test_frontier_options); heads does not take them
FRONTIER_BAD = {"--budgets": "0,2", "--selectors": "alpah", "--greedy-max-k": "0", "--greedy-pool": "0",
                "--test-limit": "0", "--n-bootstrap": "-1"}


def test_every_option_is_covered():
    """Each option that takes a value is in OPTIONS, PATH_OPTIONS or has choices (generic case)."""
    covered = ({(c, o) for c, o, _ in CASES} | PATH_OPTIONS | {(c, o) for c, o, _ in _choice_options()}
               | {("frontier", o) for o in FRONTIER_BAD})
    missing = [(cmd, a.option_strings[-1]) for cmd, p in _subparsers().items() for a in p._actions
               if a.option_strings and a.nargs != 0 and (cmd, a.option_strings[-1]) not in covered]
    assert not missing, f"options without a bad-input case: {missing}"
    assert set(_subparsers()) == set(BASE)


SETTINGS = settings(max_examples=10, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


@pytest.mark.parametrize("cmd, option, kind", CASES, ids=[f"{c}:{o}" for c, o, _ in CASES])
@SETTINGS
@given(data=st.data())
def test_bad_value(cmd, option, kind, data):
    value = data.draw(KINDS[kind], label=option)
    # the message names the option, or, for names the model and task loaders reject, what it is
    needle = "lr" if kind == "lr" else "" if kind in NAMED_BY_LOADER else option
    err = _rejected(BASE[cmd] + [f"{option}={value}"], needle)
    if kind in NAMED_BY_LOADER:
        assert re.search(LOADER_NEEDLE[kind], err), (f"the error does not say it is a {kind}", value, err)


@pytest.mark.parametrize("option", list(FRONTIER_BAD))
def test_frontier_options(option):
    """A bad value is refused naming the option; heads, which does not read it, does not take it."""
    # an unknown selector's message names what it is and the closest one
    needle = "Unknown selector 'alpah'.*Did you mean 'alpha'" if option == "--selectors" else option
    err = _rejected(BASE["frontier"] + [option, FRONTIER_BAD[option]])
    assert re.search(needle, err), err
    good = "1" if option != "--selectors" else "alpha"
    _rejected(BASE["heads"] + [option, good], f"unrecognized arguments: {option}")


@pytest.mark.parametrize("cmd", list(BASE))
def test_every_base_command_passes_validation(cmd):
    """Each BASE line is valid (parsed, validated and its outputs checked without an error), so a
    case's rejection comes from the option it appends."""
    from sitelens.cli import check_outputs, validate

    args = build_parser().parse_args(BASE[cmd])
    with tempfile.TemporaryDirectory() as d, _chdir(d):
        validate(args)
        check_outputs(args)


@pytest.mark.parametrize("cmd, option, choices", _choice_options(),
                         ids=[f"{c}:{o}" for c, o, _ in _choice_options()])
@SETTINGS
@given(data=st.data())
def test_bad_choice(cmd, option, choices, data):
    value = data.draw(bad_choice(choices), label=option)
    _rejected(BASE[cmd] + [f"{option}={value}"], f"argument {option}")


# ----------------------------------------------------------------------------------------------
# explicit cases: the list, argparse's own errors, paths, checks that need the model


def _file(rel: str, text: str = "x"):
    def setup(d: Path):
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_text(text)
    return setup


def _dir(rel: str):
    return lambda d: (d / rel).mkdir(parents=True)


def _bad_adapter(d: Path):
    (d / "ad").mkdir()
    (d / "ad" / "adapter.json").write_text("{not json")
    (d / "ad" / "adapter.safetensors").write_bytes(b"\0" * 16)


def _adapter(d: Path):
    """A valid adapter of tiny-random's shape in ad/ (validation loads it)."""
    from sitelens.site import SiteAdapter

    SiteAdapter(alpha=torch.full((2, 4), 0.5), embedding=torch.zeros(2, 4, 16), meta={}).save(d / "ad")


def _tables(d: Path):
    (d / "d" / "m").mkdir(parents=True)
    (d / "d" / "m" / "summary.json").write_text("{}")


# options the command would ignore with the others given (sitelens.cli.guards), and earlier
# results that only --force replaces
IGNORED = [
    ("run-fit-options-without-site", BASE["run"] + ["--methods", "icl", "--sparsity", "1"],
     ["--sparsity applies only to the fit of the site method", "add site"], None),
    ("run-n-shots-without-demonstrations", BASE["run"] + ["--methods", "zero-shot", "--n-shots",
                                                          "3"], ["--n-shots applies only"], None),
    ("intra-adapter-sparsity", BASE["patch intra"] + ["--adapter", "ad", "--sparsity", "5"],
     ["--sparsity applies only when patch intra fits the adapter itself", "drop --sparsity"],
     _adapter),
    ("intra-adapter-fit-options", BASE["patch intra"] + ["--adapter", "ad", "--lr", "0.1",
                                                         "--protocol", "official"],
     ["--lr, --protocol apply only", "--adapter"], _adapter),
    ("intra-adapter-save-adapter", BASE["patch intra"] + ["--adapter", "ad", "--save-adapter", "k"],
     ["--save-adapter applies only to an adapter that patch intra fits"], _adapter),
    ("inter-adapters-n-examples", BASE["patch inter"] + ["--adapters", "ad,ad/", "--n-examples", "8"],
     ["--n-examples applies only", "--adapters"], _adapter),
    ("effects-adapter-mean-prompts", BASE["patch effects"] + ["--adapter", "ad",
                                                              "--n-mean-prompts", "4"],
     ["--n-mean-prompts applies only without --adapter"], _adapter),
    ("heads-adapter-seeds-sparsity", BASE["heads"] + ["--adapter", "ad", "--seeds", "3",
                                                      "--sparsity", "5"],
     ["--seeds, --sparsity apply only when heads fits α itself"], _adapter),
    ("heads-seeds-without-alpha", BASE["heads"] + ["--lenses", "atp", "--seeds", "3"],
     ["--seeds applies only to the alpha lens", "add alpha to --lenses"], None),
    ("heads-fit-options-without-a-fit", BASE["heads"] + ["--lenses", "atp", "--sparsity", "5"],
     ["--sparsity applies only to the fits of the alpha and dla lenses"], None),
    ("heads-limit-without-alpha-grad", BASE["heads"] + ["--lenses", "atp", "--limit", "8"],
     ["--limit applies only to the alpha-grad lens"], None),
    ("heads-n-prompts-without-its-lenses", BASE["heads"] + ["--n-prompts", "4"],
     ["--n-prompts applies only to the atp, atp-star, ablation and effect lenses"], None),
    ("heads-n-boot-alpha-only", BASE["heads"] + ["--lenses", "alpha", "--n-boot", "10"],
     ["--n-boot applies only"], None),
    ("eval-n-shots-without-icl", BASE["eval"] + ["--n-shots", "3"],
     ["--n-shots applies only to the icl method"], None),
    ("atlas-refit-options-without-refit", ["atlas", "--out", "a.html", "--data", "d", "--seeds", "2",
                                           "--executor", "processes:2"],
     ["--seeds, --executor apply only with --refit"], _tables),
    ("fit-out-holds-an-adapter", BASE["fit"], ["--out ad already holds an adapter", "--force"],
     _adapter),
    ("intra-save-adapter-holds-an-adapter", BASE["patch intra"] + ["--save-adapter", "ad"],
     ["--save-adapter ad already holds an adapter", "--force"], _adapter),
    ("eval-items-exists", BASE["eval"], ["--items items.csv already exists", "--force"],
     _file("items.csv", "a,b\n1,2\n")),
    ("heads-out-exists", BASE["heads"], ["--out h.csv already exists", "--force"],
     _file("h.csv", "a,b\n1,2\n")),
    ("intra-out-exists", BASE["patch intra"], ["--out i.csv already exists"], _file("i.csv", "a,b\n")),
    ("inter-out-exists", BASE["patch inter"], ["--out x.csv already exists"], _file("x.csv", "a,b\n")),
    ("effects-out-exists", BASE["patch effects"], ["--out e.csv already exists"],
     _file("e.csv", "a,b\n")),
]


EXPLICIT = [
    # the list
    ("bench-unknown-method", BASE["bench"] + ["--methods", "nope"], ["unknown method 'nope'"], None),
    ("bench-typo-method", BASE["bench"] + ["--methods", "zero-shot,lorra"], ["did you mean lora"],
     None),
    ("intra-ks-0", BASE["patch intra"] + ["--ks", "0"], ["--ks"], None),
    ("intra-ks-negative", BASE["patch intra"] + ["--ks=-2"], ["--ks"], None),
    ("intra-ks-float", BASE["patch intra"] + ["--ks", "1,2.5"], ["--ks", "'2.5'"], None),
    ("intra-ks-word", BASE["patch intra"] + ["--ks", "all"], ["--ks"], None),
    ("inter-k-0", BASE["patch inter"] + ["--k", "0"], ["--k"], None),
    ("inter-k-negative", BASE["patch inter"] + ["--k=-1"], ["--k"], None),
    # argparse's own errors: one line, no usage block
    ("no-command", [], ["required: COMMAND", "sitelens --help"], None),
    ("unknown-command", ["fitt"], ["invalid choice: 'fitt'"], None),
    ("patch-no-subcommand", ["patch"], ["required: SUBCOMMAND"], None),
    ("fit-missing-out", ["fit", "--task", "antonym"], ["required: --out", "sitelens fit --help"], None),
    ("eval-missing-task", ["eval"], ["required: --task"], None),
    ("bench-missing-out", ["bench", "--tasks", "antonym"], ["required: --out"], None),
    ("inter-missing-tasks", ["patch", "inter"], ["required: --tasks"], None),
    ("missing-value", BASE["eval"] + ["--limit"], ["expected one argument"], None),
    ("bad-int", BASE["eval"] + ["--limit", "ten"], ["argument --limit", "'ten'"], None),
    ("dash-dash-value", BASE["fit"] + ["--lr=--"], ["argument --lr: expected one argument"], None),
    ("unrecognized", BASE["eval"] + ["--bogus", "1"], ["unrecognized arguments: --bogus"], None),
    ("unrecognized-newline", BASE["eval"] + ["a\nb"], ["unrecognized arguments"], None),
    # values
    ("lr-inf", BASE["fit"] + ["--lr", "inf"], ["argument --lr: must be a finite number > 0"], None),
    ("lr-zero", BASE["fit"] + ["--lr", "0"], ["must be a finite number > 0, got '0'"], None),
    ("sparsity-nan", BASE["fit"] + ["--sparsity", "nan"], ["--sparsity"], None),
    ("sparsity-negative", BASE["fit"] + ["--sparsity", "-1"],
     ["argument --sparsity: must be a finite number >= 0, got '-1'"], None),
    ("figures-sparsity-negative", BASE["figures"] + ["--sparsity", "0,-5"],
     ["--sparsity", "numbers >= 0", "'-5'"], None),
    ("figures-sparsity-abc", BASE["figures"] + ["--sparsity", "abc"], ["--sparsity", "'abc'"], None),
    ("figures-models-unknown", BASE["figures"] + ["--models", "unknown"],
     ["Unknown model 'unknown'"], None),
    ("figures-one-task", BASE["figures"] + ["--tasks", "antonym"], ["at least two --tasks"], None),
    ("figures-intra-not-in-tasks", BASE["figures"] + ["--intra-tasks", "last_letter"],
     ["--intra-tasks names 'last_letter'"], None),
    ("unknown-model", BASE["eval"] + ["--model", "smollm2-135m-instuct"],
     ["Unknown model 'smollm2-135m-instuct'", "Close matches: smollm2-135m-instruct"], None),
    ("empty-model", BASE["eval"] + ["--model", ""], ["Bad model name ''"], None),
    ("model-dir-without-config", BASE["eval"] + ["--model", "m"], ["no config.json"], _dir("m")),
    ("unknown-task", BASE["eval"] + ["--task", "antonymm"], ["Unknown task 'antonymm'", "antonym"],
     None),
    ("task-newline", BASE["eval"] + ["--task", "anto\nnym"], ["Unknown task"], None),
    ("task-nul", BASE["eval"] + ["--task", "anto\0nym"], ["Unknown task"], None),
    ("task-too-long", BASE["eval"] + ["--task", "t" * 5000], ["task"], None),
    ("split", BASE["eval"] + ["--split", "dev"], ["invalid choice: 'dev'"], None),
    ("too-many-shots", BASE["eval"] + ["--methods", "icl", "--n-shots", "1000"],
     ["--n-shots 1000: task 'antonym' needs at least 1429 pairs for 1000 shots", "has 75"], None),
    ("fit-too-many-shots", BASE["fit"] + ["--n-shots", "500"],
     ["--n-shots 500: task 'antonym' needs at least 716 pairs for 500 shots"], None),
    ("site-without-adapter", BASE["eval"] + ["--methods", "site"], ["needs --adapter"], None),
    ("inter-one-task", BASE["patch inter"] + ["--tasks", "antonym"], ["at least two tasks"], None),
    ("inter-duplicate-task", BASE["patch inter"] + ["--tasks", "antonym,antonym"],
     ["'antonym' twice"], None),
    ("bench-no-tasks", ["bench", "--models", "tiny-random", "--out", "b.csv"], ["Give --tasks"], None),
    ("bench-abstractive-without-dir", BASE["bench"] + ["--abstractive"], ["--tasks-dir"], None),
    ("bench-duplicate-method", BASE["bench"] + ["--methods", "icl,icl"], ["'icl' twice"], None),
    ("seed-too-big", BASE["eval"] + ["--seed", str(2**32)], ["--seed"], None),
    ("threads-0", BASE["bench"] + ["--threads", "0"], ["--threads"], None),
    ("n-ctx-0", BASE["bench"] + ["--n-ctx", "0"], ["--n-ctx"], None),
    # --executor (sitelens.pipelines.executors.parse_executor): checked while parsing, nothing started
    ("bench-executor-processes-0", BASE["bench"] + ["--executor", "processes:0"],
     ["argument --executor", "processes:N needs N in 1..1024, got '0'"], None),
    ("bench-executor-ray-not-an-address", BASE["bench"] + ["--executor", "ray:not-an-address"],
     ["argument --executor", "auto or HOST:PORT", "'not-an-address'"], None),
    ("bench-executor-gpu", BASE["bench"] + ["--executor", "gpu"],
     ["argument --executor", "local, processes:N", "got 'gpu'"], None),
    ("figures-executor-port-0", BASE["figures"] + ["--executor", "ray:127.0.0.1:0"],
     ["argument --executor", "PORT in 1..65535"], None),
    ("atlas-executor-processes-word", BASE["atlas"] + ["--executor", "processes:two"],
     ["argument --executor", "got 'two'"], None),
    # heads: lens names (sitelens.lenses.parse_lenses), seeds, shots, option combinations
    ("heads-unknown-lens", BASE["heads"] + ["--lenses", "alpha,atp*"],
     ["argument --lenses", "Unknown lens 'atp*'", "alpha-grad"], None),
    ("heads-typo-lens", BASE["heads"] + ["--lenses", "ablation-man"], ["Unknown lens 'ablation-man'"],
     None),
    ("heads-duplicate-lens", BASE["heads"] + ["--lenses", "dla,dla"], ["'dla' twice"], None),
    ("heads-empty-lenses", BASE["heads"] + ["--lenses", ","], ["--lenses", "at least one lens"], None),
    ("heads-missing-lenses", ["heads", "--task", "antonym", "--out", "h.csv"],
     ["required: --lenses", "sitelens heads --help"], None),
    ("heads-missing-out", ["heads", "--task", "antonym", "--lenses", "atp"], ["required: --out"], None),
    ("heads-seeds-0", BASE["heads"] + ["--seeds", "0"], ["argument --seeds", "'0'"], None),
    ("heads-seeds-negative", BASE["heads"] + ["--seeds=-3"], ["argument --seeds"], None),
    ("heads-seeds-past-max", BASE["heads"] + ["--seed", str(2**32 - 1), "--seeds", "2"],
     ["--seeds 2 runs up to seed 4294967296"], None),
    ("heads-too-many-shots", BASE["heads"] + ["--n-shots", "500"],
     ["needs at least 716 pairs for 500 shots and the splits"], None),
    ("heads-protocol", BASE["heads"] + ["--protocol", "paper"], ["invalid choice: 'paper'"], None),
    ("heads-lr-nan", BASE["heads"] + ["--lr", "nan"], ["argument --lr: must be a finite number > 0"],
     None),
    ("heads-unknown-model", BASE["heads"] + ["--model", "tiny-randm"], ["Unknown model 'tiny-randm'"],
     None),
    # devices and precision (checked before any model loads)
    ("device-tpu", BASE["fit"] + ["--device", "tpu"], ["argument --device", "Unknown device 'tpu'"],
     None),
    ("device-bad-index", BASE["eval"] + ["--device", "cuda:x"], ["argument --device"], None),
    ("dtype-int8", BASE["bench"] + ["--dtype", "int8"], ["argument --dtype", "invalid choice"],
     None),
    ("device-map-with-device", BASE["demo"] + ["--device-map", "auto", "--device", "cpu"],
     ["--device-map"], None),
    ("n-devices-0", BASE["patch intra"] + ["--n-devices", "0"], ["argument --n-devices"], None),
]
if not torch.cuda.is_available():  # on a machine with GPUs these are valid
    EXPLICIT += [
        ("device-cuda-without-gpu", BASE["fit"] + ["--device", "cuda"],
         ["argument --device", "sees no CUDA GPU"], None),
        ("n-devices-without-gpus", BASE["heads"] + ["--n-devices", "2"],
         ["--n-devices", "needs CUDA GPUs cuda:0 to cuda:1"], None),
        ("figures-n-devices-without-gpus", BASE["figures"] + ["--n-devices", "4"],
         ["--n-devices"], None),
    ]
if has_hooked_transformer() and os.environ.get("SITELENS_BACKEND", "hooked") == "hooked":
    EXPLICIT += [("device-map-hooked", BASE["fit"] + ["--device-map", "balanced"],
                  ["--device-map", "--n-devices instead"], None)]

PATHS = [
    ("fit-out-blocked-by-file", BASE["fit"] + ["--out", "f.txt/ad"], ["f.txt is a file"],
     _file("f.txt")),
    ("fit-out-empty", BASE["fit"] + ["--out", ""], ["--out is empty"], None),
    ("fit-out-nul", BASE["fit"] + ["--out", "a\0b"], ["NUL"], None),
    ("fit-out-too-long", BASE["fit"] + ["--out", "a" * 5000], ["--out"], None),
    ("run-out-blocked-by-file", BASE["run"] + ["--out", "f.txt/r"], ["f.txt is a file"],
     _file("f.txt")),
    ("run-out-is-file", BASE["run"] + ["--out", "f.txt"], ["f.txt"], _file("f.txt")),
    ("run-out-empty", BASE["run"] + ["--out", ""], ["--out is empty"], None),
    ("run-eval-json-is-dir", BASE["run"], ["eval.json", "is a directory"], _dir("r/eval.json")),
    ("run-earlier-eval-without-record", BASE["run"], ["already holds an evaluation", "--force"],
     _file("r/items.csv", "a\n1\n")),
    ("figures-out-blocked", BASE["figures"] + ["--out", "f.txt"], ["f.txt"], _file("f.txt")),
    ("bench-out-is-dir", BASE["bench"] + ["--out", "res.csv"], ["is a directory"], _dir("res.csv")),
    ("bench-out-not-csv", BASE["bench"] + ["--out", "res.md"], ["csv"], None),
    ("bench-out-empty", BASE["bench"] + ["--out", ""], ["--out is empty"], None),
    ("bench-tasks-dir-missing", BASE["bench"] + ["--tasks-dir", "nope"], ["not a directory"], None),
    ("bench-tasks-dir-file", BASE["bench"] + ["--tasks-dir", "f.txt"], ["not a directory"],
     _file("f.txt")),
    ("bench-tasks-dir-empty", BASE["bench"] + ["--tasks-dir", "tasks"], ["holds no task folder"],
     _dir("tasks")),
    ("eval-items-is-dir", BASE["eval"] + ["--items", "items.csv"], ["is a directory"],
     _dir("items.csv")),
    ("eval-items-not-csv", BASE["eval"] + ["--items", "items.txt"], ["csv"], None),
    ("eval-adapter-missing", BASE["eval"] + ["--methods", "site", "--adapter", "nope"],
     ["is not an adapter directory"], None),
    ("eval-adapter-corrupted", BASE["eval"] + ["--methods", "site", "--adapter", "ad"],
     ["is corrupted"], _bad_adapter),
    ("intra-adapter-empty-dir", BASE["patch intra"] + ["--adapter", "ad"],
     ["is not an adapter directory"], _dir("ad")),
    ("intra-out-is-dir", BASE["patch intra"] + ["--out", "o.csv"], ["is a directory"], _dir("o.csv")),
    ("inter-adapters-count", BASE["patch inter"] + ["--adapters", "a"], ["--adapters has 1"], None),
    ("inter-adapters-missing", BASE["patch inter"] + ["--adapters", "a,b"],
     ["is not an adapter directory"], None),
    ("inter-out-empty", BASE["patch inter"] + ["--out", ""], ["--out is empty"], None),
    ("effects-adapter-missing", BASE["patch effects"] + ["--adapter", "nope"],
     ["is not an adapter directory"], None),
    ("effects-out-blocked", BASE["patch effects"] + ["--out", "f.txt/e.csv"], ["f.txt"],
     _file("f.txt")),
    ("heads-out-is-dir", BASE["heads"] + ["--out", "h.csv"], ["is a directory"], _dir("h.csv")),
    ("heads-out-not-csv", BASE["heads"] + ["--out", "h.json"], ["must be a csv file"], None),
    ("heads-out-empty", BASE["heads"] + ["--out", ""], ["--out is empty"], None),
    ("heads-out-blocked", BASE["heads"] + ["--out", "f.txt/h.csv"], ["f.txt is a file"],
     _file("f.txt")),
    ("heads-out-other-kind", BASE["heads"] + ["--out", "h.csv"], ["already holds"],
     _file("h.csv", '{"a": 1}')),
    ("heads-adapter-missing", BASE["heads"] + ["--adapter", "nope"], ["is not an adapter directory"],
     None),
    ("heads-adapter-corrupted", BASE["heads"] + ["--adapter", "ad"], ["is corrupted"], _bad_adapter),
    ("atlas-no-tables", ["atlas", "--out", "a.html", "--data", "none"],
     ["No atlas tables", "sitelens atlas --refit"], None),
    ("atlas-model-without-tables", ["atlas", "--out", "a.html", "--data", "d", "--models",
                                    "tiny-random"], ["No atlas tables for tiny-random"], _dir("d")),
    ("atlas-out-not-html", ["atlas", "--out", "a.csv", "--data", "d"], ["must be a html file"],
     _file("d/m/summary.json", "{}")),
    ("atlas-out-is-dir", BASE["atlas"] + ["--out", "a.html"], ["is a directory"], _dir("a.html")),
    ("atlas-out-empty", BASE["atlas"] + ["--out", ""], ["--out is empty"], None),
    ("atlas-tasks-dir-missing", BASE["atlas"] + ["--tasks-dir", "nope"],
     ["--tasks-dir nope is not a directory"], None),
    ("atlas-cache-dir-blocked", BASE["atlas"] + ["--cache-dir", "f.txt/c"], ["f.txt is a file"],
     _file("f.txt")),
    ("atlas-data-blocked", BASE["atlas"] + ["--data", "f.txt"], ["--data"], _file("f.txt")),
    ("atlas-seed-range", BASE["atlas"] + ["--seed", "4294967295", "--seeds", "2"],
     ["beyond 4294967295"], None),
    ("intra-save-adapter-blocked", BASE["patch intra"] + ["--save-adapter", "f.txt/ad"],
     ["f.txt is a file"], _file("f.txt")),
    ("intra-save-adapter-empty", BASE["patch intra"] + ["--save-adapter", ""],
     ["--save-adapter is empty"], None),
]


@pytest.mark.parametrize("argv, needles, setup", [c[1:] for c in EXPLICIT], ids=[c[0] for c in EXPLICIT])
def test_explicit(argv, needles, setup):
    _rejected(argv, *needles, setup=setup)


@pytest.mark.parametrize("argv, needles, setup", [c[1:] for c in PATHS], ids=[c[0] for c in PATHS])
def test_bad_paths(argv, needles, setup):
    _rejected(argv, *needles, setup=setup)


@pytest.mark.parametrize("argv, needles, setup", [c[1:] for c in IGNORED], ids=[c[0] for c in IGNORED])
def test_ignored_options_and_earlier_results(argv, needles, setup):
    _rejected(argv, *needles, setup=setup)


def test_help_still_exits_0():
    rc, out, err, changed = _run(["patch", "intra", "--help"])
    assert rc == 0 and "--ks" in out and not err and not changed


@pytest.mark.parametrize("argv", [
    BASE["patch intra"] + ["--ks", "1,9"],  # the tiny model has 2 layers x 4 heads = 8
    BASE["patch intra"] + ["--ks", "100"],
    BASE["patch inter"] + ["--k", "9"],
], ids=["intra-ks-9", "intra-ks-100", "inter-k-9"])
def test_k_beyond_the_heads(argv):
    """Needs the model (its head count): checked right after the load, before any fit or output."""
    _rejected(argv, "more than the 8 attention heads of tiny-random", "between 1 and 8")


def test_heads_dla_needs_a_hooked_transformer(monkeypatch):
    """dla reads W_O, W_U and the norms: refused before the load when models load as bridges."""
    monkeypatch.setenv("SITELENS_BACKEND", "bridge")
    # the fix offered: the hooked backend where this TransformerLens has it, else dropping dla
    fix = "SITELENS_BACKEND=hooked" if has_hooked_transformer() else "drop dla"
    _rejected(BASE["heads"] + ["--lenses", "atp,dla"], "--lenses dla", fix)
    monkeypatch.delenv("SITELENS_BACKEND")  # the default backend: bridge on TransformerLens 4
    monkeypatch.setattr("sitelens.models.spec.has_hooked_transformer", lambda: False)
    _rejected(BASE["heads"] + ["--lenses", "dla"], "--lenses dla", "drop dla")


@pytest.mark.parametrize("cmd", ["bench", "figures", "atlas"])
def test_executor_ray_without_ray(monkeypatch, cmd):
    """--executor ray where the ray package is missing: refused before any model loads."""
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails as if not installed
    _rejected(BASE[cmd] + ["--executor", "ray"], "--executor ray needs the ray package",
              "pip install 'sitelens[ray]'")


def test_heads_lens_error_is_parse_lenses_error():
    """The parser's message for a bad lens is the library's own (sitelens.lenses.parse_lenses)."""
    from sitelens.lenses import parse_lenses

    with pytest.raises(ValueError) as e:
        parse_lenses(["nope"])
    _rejected(BASE["heads"] + ["--lenses", "nope"], str(e.value))


@pytest.fixture
def empty_hf_cache(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.delenv("SITELENS_ALLOW_DOWNLOAD", raising=False)
    return tmp_path / "hf"


def test_uncached_transformerlens_model_fails_at_once(empty_hf_cache):
    from sitelens.errors import ModelError
    from sitelens.models import check_model_available, load_model

    err = _rejected(BASE["eval"] + ["--model", "gpt2"], "Model 'gpt2' is not in the local Hugging "
                    "Face cache", "hf download gpt2", "local Hugging Face directory",
                    "smollm2-135m-instruct, gemma-3-270m")
    assert str(empty_hf_cache) in err
    with pytest.raises(ModelError, match="not in the local Hugging Face cache"):
        load_model("gpt2")  # the library raises the same error, without a network attempt
    # a cached snapshot passes the check (the load itself is not attempted here)
    snap = empty_hf_cache / "models--gpt2" / "snapshots" / "abc"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    (empty_hf_cache / "models--gpt2" / "refs").mkdir()
    (empty_hf_cache / "models--gpt2" / "refs" / "main").write_text("abc")
    check_model_available("gpt2")


def test_unknown_method_in_the_library():
    from sitelens.baselines import get_method
    from sitelens.errors import MethodError, SitelensError

    with pytest.raises(MethodError, match="Unknown method 'lorra'.*Did you mean: lora") as e:
        get_method("lorra")
    assert isinstance(e.value, SitelensError) and isinstance(e.value, ValueError)


# ----------------------------------------------------------------------------------------------
# the real executable: exit status and stderr of a process


def _exe() -> list[str]:
    exe = Path(sys.executable).with_name("sitelens")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "sitelens.cli"]


def test_subprocess(tmp_path):
    """Three real processes, run side by side: an uncached TransformerLens model (no network
    attempt: the HF cache is an empty directory and offline mode is NOT set), an argparse error
    and an unknown bench method."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "SITELENS_ALLOW_DOWNLOAD")}
    env.update(HF_HOME=str(tmp_path / "hf"), OMP_NUM_THREADS="1")
    runs = {
        "gpt2": (["eval", "--model", "gpt2", "--task", "antonym", "--items", "i.csv"],
                 "not in the local Hugging Face cache"),
        "argparse": (["fit", "--task", "antonym"], "required: --out"),
        "method": (BASE["bench"] + ["--methods", "nope"], "unknown method 'nope'"),
    }
    procs = {}
    for name, (args, _) in runs.items():
        (tmp_path / name).mkdir()
        procs[name] = subprocess.Popen(_exe() + args, cwd=tmp_path / name, env=env, text=True,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=300)
        _check(proc.returncode, out, err, set(os.listdir(tmp_path / name)), runs[name][0],
               runs[name][1])
