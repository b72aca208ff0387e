"""The options every result-writing command shares: ``--force`` (replace an earlier result) and
``patch intra``'s ``--save-adapter`` (keep the adapter it fits), added to the parser by
:func:`add_guard_options` (what they guard: :mod:`sitelens.cli.guards`)."""

from __future__ import annotations

import argparse

FORCE_COMMANDS = ("fit", "eval", "patch intra", "patch inter", "patch effects", "heads")


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
            help="replace an earlier result at the output path (without it, an existing adapter "
                 "or result file is refused)")
    parsers["patch intra"].add_argument(
        "--save-adapter", metavar="DIR",
        help="keep the adapter fitted here (no --adapter) in DIR, to reuse with --adapter DIR")
    return ap
