"""The parser of ``sitelens``: one subparser per config of :mod:`sitelens.cli.configs` (``patch
intra`` under ``patch``), usage errors on one line.

Usage errors print ONE line on stderr, ``sitelens: error: ... (see `sitelens CMD --help`)``, and
exit with status 2 (:class:`OneLineErrorParser`).
"""

from __future__ import annotations

import argparse

from sitelens.cli.configs import COMMANDS
from sitelens.cli.options import add_options

DESCRIPTION = (
    "The sitelens command line. fit: fit a SITE adapter and save it; eval: zero-shot / ICL / SITE on a "
    "task; run: fit and eval with one model load (resumable); demo: fit and compare on a built-in "
    "task; bench: models x tasks x methods, one resumable table; patch intra|inter|effects: "
    "activation patching; heads: which heads matter, by several lenses "
    "(alpha, gradients, attribution patching, ablation, exact effects, direct logit attribution); "
    "frontier: how few heads carry the task; figures: reproduce figures/ (resumable); atlas: the "
    "head atlas page. Bad input prints one line, `sitelens: error: ...`, and exits 2. `sitelens "
    "COMMAND --help`: every option and its default."
)
PATCH_HELP = "activation patching: intra | inter | effects"


def one_line(msg) -> str:
    """``msg`` on one line (a value with a newline in it must not start a second line)."""
    return " ".join(part.strip() for part in str(msg).splitlines() if part.strip())


class OneLineErrorParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are ONE line on stderr, ``sitelens: error: ...``
    with a pointer to ``--help`` (no usage block), and exit status 2."""

    def error(self, message: str):
        self.exit(2, f"sitelens: error: {one_line(message)} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    """The ``sitelens`` parser; ``args.cmd`` names the subcommand (``args.patch_cmd`` the patch
    one)."""
    ap = OneLineErrorParser(prog="sitelens", description=DESCRIPTION)
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=OneLineErrorParser,
                            metavar="COMMAND")
    patch = None
    for config in COMMANDS:
        head, _, name = config.COMMAND.partition(" ")
        if name and patch is None:
            patch = sub.add_parser(head, help=PATCH_HELP).add_subparsers(
                dest="patch_cmd", required=True, parser_class=OneLineErrorParser,
                metavar="SUBCOMMAND")
        summary = " ".join(config.__doc__.split("\n\n")[0].split())
        add_options((patch if name else sub).add_parser(name or head, help=summary), config)
    return ap


def command_name(args) -> str:
    """The subcommand as the user typed it: ``"fit"``, ..., ``"patch intra"``."""
    return args.cmd if args.cmd != "patch" else f"patch {args.patch_cmd}"
