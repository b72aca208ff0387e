"""Options that several subcommands share and that need nothing from the parser module: where the
cells of a sweep run (``--executor``), whether label metrics are computed (``--label-metrics``),
``--force`` (replace an earlier result) and ``patch intra``'s ``--save-adapter`` (keep the adapter
it fits), the last two added by :func:`add_guard_options` (what they guard: :mod:`sitelens.cli.guards`)."""

from __future__ import annotations

import argparse

FORCE_COMMANDS = ("fit", "eval", "run", "patch intra", "patch inter", "patch effects", "heads")
FORCE_HELP = {"run": "replace the parts of an earlier run in --out whose settings differ (without "
                     "it they are refused); parts with the same settings are reused, never redone"}


def children(parser: argparse.ArgumentParser) -> dict:
    """``{name: subparser}`` of ``parser``'s subcommands (``{}`` without any)."""
    for a in parser._actions:
        if a.nargs == argparse.PARSER:
            return dict(a.choices)
    return {}


def subparsers(ap: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """``{"fit": parser, ..., "patch intra": parser, ...}``: every leaf command of ``ap``."""
    out = {}
    for name, p in children(ap).items():
        sub = children(p)
        out.update({f"{name} {n}": q for n, q in sub.items()} if sub else {name: p})
    return out


def add_guard_options(ap: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """``--force`` on :data:`FORCE_COMMANDS` and ``--save-adapter`` on ``patch intra``."""
    parsers = subparsers(ap)
    for cmd in FORCE_COMMANDS:
        parsers[cmd].add_argument(
            "--force", action="store_true",
            help=FORCE_HELP.get(cmd) or "replace an earlier result at the output path (without "
                 "it, an existing adapter or result file is refused)")
    parsers["patch intra"].add_argument(
        "--save-adapter", metavar="DIR",
        help="keep the adapter fitted here (no --adapter) in DIR, to reuse with --adapter DIR")
    return ap


def executor_spec(s: str) -> str:
    """An option type: an ``--executor`` value, ``local``, ``processes:N`` or ``ray[:ADDRESS]``
    (:func:`sitelens.pipelines.executors.parse_executor`; nothing is started while parsing)."""
    from sitelens.errors import ExecutorError
    from sitelens.pipelines.executors import parse_executor

    try:
        parse_executor(s)
    except ExecutorError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return s


executor_spec.__name__ = "executor"


def add_executor_option(p: argparse.ArgumentParser, what: str) -> None:
    """``--executor local|processes:N|ray[:ADDRESS]``: where the cells of a sweep run."""
    p.add_argument("--executor", type=executor_spec, default="local",
                   help=f"where {what} run: local (this process, the default), processes:N (N "
                        "worker processes) or ray[:ADDRESS] (Ray: a local instance, or auto / the "
                        "HOST:PORT of a running cluster); the results are the same")


def add_label_metrics_option(p: argparse.ArgumentParser) -> None:
    """``--label-metrics``: also rank the labels of a task with a closed label set
    (:func:`sitelens.eval.labels.wanted_label_set`); without it only a task that declares its
    labels (``labels.json``) is ranked."""
    p.add_argument("--label-metrics", action="store_true",
                   help="also score by ranking the labels of a closed label set (label_acc_first, "
                        "label_acc_full, label_acc_full_norm, chance; docs/tasks.md); without it "
                        "only tasks with a labels.json get them")
