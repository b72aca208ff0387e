"""``sitelens CMD --help`` that documents every option and its default.

:func:`document` runs once on the finished parser (:func:`sitelens.cli.parser.build_parser`): every
parser, subcommands included, gets :class:`DefaultsHelpFormatter`, which ends an option's help
with ``(default: X)`` unless the help already names its default; an option defined without help
gets the text of :data:`OPTION_HELP` (per subcommand in :data:`COMMAND_HELP`). The options that
several subcommands share mean the same thing in each, so their text is written once here rather
than at every ``add_argument``. An option left with no help at all is a programming error
(``RuntimeError`` at parser build time, so the tests catch it).

Help strings are %-formatted by argparse: a literal percent sign is written ``%%``.
"""

from __future__ import annotations

import argparse

OPTION_HELP: dict[str, str] = {
    "--model": "bundled name, TL name or HF dir",
    "--seed": "random seed of the task split, the prompt and demonstration draws and the fits",
    "--n-shots": "demonstrations per few-shot prompt",
    "--lr": "stage-2 learning rate (Adam on the logits of α)",
    "--threads": "torch CPU threads (default: torch's own choice)",
    "--split": "the split scored",
    "--limit": "the first N items of the split (default: all of them)",
    "--n-boot": "bootstrap resamples of the 95%% intervals",
    "--n-random-seeds": "random head sets per k (the random-k control)",
}
COMMAND_HELP: dict[tuple[str, str], str] = {
    ("eval", "--methods"): "comma-separated methods: zero-shot, icl, site",
    ("run", "--methods"): "comma-separated methods: zero-shot, icl, site (site: fit, or reuse, "
                          "the adapter in OUT/adapter)",
    ("bench", "--methods"): "comma-separated methods (sitelens.available_methods())",
    ("demo", "--task"): "a built-in task (sitelens.builtin_tasks())",
    ("demo", "--limit"): "test items compared",
    ("figures", "--models"): "comma-separated models",
    ("figures", "--effect-tasks"): "comma-separated tasks of the per-head causal effects "
                                   "(default: the built-in set, those in --tasks)",
    ("figures", "--effect-prompts"): "corrupted prompts per task for the causal effects",
    ("figures", "--quiet"): "no progress output",
}


def has_default(action: argparse.Action) -> bool:
    """Whether ``action`` has a default worth showing: not None, not False (a flag that is off),
    not an empty list, not suppressed."""
    d = action.default
    return not (d is None or d is False or d is argparse.SUPPRESS
                or (isinstance(d, (list, tuple)) and not d))


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Every option's help ends with ``(default: X)`` when it has a default (:func:`has_default`)
    that its help does not already name (a help that says "default" names it itself)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.option_strings and has_default(action) and "default" not in text:
            text += " (default: %(default)s)"
        return text


def subparsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """``parser`` and every subcommand parser under it, depth first."""
    out = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):  # an alias maps to the same parser
                out += subparsers(sub)
    return out


def command_of(parser: argparse.ArgumentParser) -> str:
    """``"fit"``, ``"patch intra"``, ... from the parser's prog (``sitelens patch intra``)."""
    return parser.prog.partition(" ")[2]


def document(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Give every parser under ``parser`` :class:`DefaultsHelpFormatter` and every option without
    help its text from :data:`COMMAND_HELP` / :data:`OPTION_HELP`; raise ``RuntimeError`` naming
    an option that has none there either."""
    for p in subparsers(parser):
        p.formatter_class = DefaultsHelpFormatter
        cmd = command_of(p)
        for action in p._actions:
            if not action.option_strings or action.help is not None:
                continue
            flag = action.option_strings[-1]
            action.help = COMMAND_HELP.get((cmd, flag), OPTION_HELP.get(flag))
            if action.help is None:
                raise RuntimeError(f"`{p.prog} {flag}` has no help text: give it one in "
                                   "sitelens/cli/parser.py or sitelens/cli/helptext.py.")
    return parser


__all__ = ["COMMAND_HELP", "OPTION_HELP", "DefaultsHelpFormatter", "command_of", "document",
           "has_default", "subparsers"]
