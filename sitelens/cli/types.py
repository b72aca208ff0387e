"""Option types: each checks one option's value while parsing and raises
``argparse.ArgumentTypeError``, which the parser prints as one line (counts >= 1, seeds and threads
in range, finite λ, lists without duplicates, known methods, lenses, devices and executors).
Checks that need files, tasks or models run later (:mod:`sitelens.cli.validate`)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def split_csv(s: str | None) -> list[str]:
    """The non-empty, stripped items of a comma-separated option value (``[]`` for ``None``)."""
    return [x.strip() for x in (s or "").split(",") if x.strip()]


def _named(parse: Callable, what: str) -> Callable:
    parse.__name__ = what  # argparse names the type in "invalid <name> value"
    return parse


def int_in_range(lo: int, hi: int | None = None, what: str = "a positive integer") -> Callable:
    """An integer in ``[lo, hi]`` (``hi=None``: no upper bound); its ``bounds`` are ``(lo, hi)``."""

    def parse(s: str) -> int:
        try:
            v = int(s)
        except ValueError:
            v = None
        if v is None or v < lo or (hi is not None and v > hi):
            raise argparse.ArgumentTypeError(f"must be {what}, got {s!r}")
        return v

    parse.bounds = (lo, hi)
    return _named(parse, what)


def finite_float(what: str) -> Callable:
    """A finite float (no ``nan``, no ``inf``)."""

    def parse(s: str) -> float:
        try:
            v = float(s)
        except ValueError:
            v = math.nan
        if not math.isfinite(v):
            raise argparse.ArgumentTypeError(f"must be {what}, got {s!r}")
        return v

    return _named(parse, what)


def _library_check(module: str, function: str, what: str, strip: bool = False) -> Callable:
    """A value that ``module.function`` (a library check raising a SitelensError, imported on first
    use) accepts; the library's message is the option's error."""

    def parse(s: str) -> str:
        import importlib

        from sitelens.errors import SitelensError

        try:
            getattr(importlib.import_module(module), function)(s)
        except SitelensError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        return s.strip() if strip else s

    return _named(parse, what)


def bounded(parse: Callable, *, at_least: float | None = None, above: float | None = None) -> Callable:
    """``parse`` (a type of this module, or ``float``/``int``), then the value ``>= at_least`` or
    ``> above`` (the range of :func:`sitelens.cli.options.option`); its ``bounds`` name them."""
    kind = ("a finite number" if parse in (float, LAMBDA) else "an integer" if parse is int
            else getattr(parse, "__name__", "a number"))
    what = f"{kind} {'>= ' + format(at_least, 'g') if at_least is not None else '> ' + format(above, 'g')}"
    inner = LAMBDA if parse is float else parse  # nan and inf are never in a range

    def check(s: str):
        try:
            v = inner(s)
        except (argparse.ArgumentTypeError, ValueError):
            v = None
        if v is None or (at_least is not None and v < at_least) or (above is not None and v <= above):
            raise argparse.ArgumentTypeError(f"must be {what}, got {s!r}")
        return v

    check.bounds = (at_least if at_least is not None else above, None)
    return _named(check, what)


# cpu, cuda, cuda:N or mps that exists here (e.g. no cuda where torch sees no GPU)
DEVICE = _library_check("sitelens.models.devices", "resolve_device", "device", strip=True)
# local, processes:N or ray[:ADDRESS] (nothing is started while parsing)
EXECUTOR = _library_check("sitelens.pipelines.executors", "parse_executor", "executor")
POSITIVE_INT = int_in_range(1)
NON_NEGATIVE_INT = int_in_range(0, what="an integer >= 0")
SEED = int_in_range(0, 2**32 - 1, "an integer seed in [0, 4294967295]")
THREADS = int_in_range(1, 1024, "a number of threads in [1, 1024]")
LAMBDA = finite_float("a finite number")


def csv_list_of(check_item: Callable[[str], None], what: str) -> Callable:
    """A comma-separated, non-empty list without duplicates whose items ``check_item`` accepts;
    the string itself is kept (the commands split it with :func:`split_csv`)."""

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

    return _named(parse, what)


def _item(parse: Callable, what: str) -> Callable[[str], None]:
    def check(x: str) -> None:
        try:
            parse(x)
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(f"must be comma-separated {what}, got {x!r}") from None

    return check


def _method(registry: str) -> Callable[[str], None]:
    """A method name known to ``sitelens.baselines`` (``"bench"``) or to
    :func:`sitelens.eval.evaluation.evaluate` (``"eval"``), with close matches in the error."""

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
                + (f" (did you mean {', '.join(close)}?)" if close else ""))

    return check


def _lens(x: str) -> None:
    """A lens name of the registry (:func:`sitelens.lenses.parse_lenses`; ``ablation`` = both
    ablations), with close matches in the error."""
    from sitelens.errors import LensError
    from sitelens.lenses import parse_lenses

    try:
        parse_lenses([x])
    except LensError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


KS = csv_list_of(_item(POSITIVE_INT, "positive integers (numbers of heads)"), "k")
# λ of the λ·mean(α) penalty: a negative one would reward large α
LAMBDAS = csv_list_of(_item(bounded(LAMBDA, at_least=0), "numbers >= 0 (λ values)"), "λ")
BENCH_METHODS = csv_list_of(_method("bench"), "method")
EVAL_METHODS = csv_list_of(_method("eval"), "method")
NAMES = csv_list_of(lambda x: None, "name")  # models and tasks are checked before the load
LENS_NAMES = csv_list_of(_lens, "lens")
