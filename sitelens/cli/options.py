"""Options from config dataclasses: each subcommand is one dataclass (:mod:`sitelens.cli.configs`)
whose fields are its options, and :func:`add_options` turns it into the subcommand's parser.

A field made with :func:`option` is the option ``--field-name`` (underscores as dashes):

- its default is the field's default, written once; the help ends with ``(default: X)`` unless it
  names its default itself; a field whose default is ``False`` is a switch;
- ``type`` checks and converts the value while parsing (a callable that raises
  ``argparse.ArgumentTypeError``, printed as one line: :mod:`sitelens.cli.types`);
- ``at_least`` / ``above``: the range of a number, checked while parsing with the type
  (:func:`sitelens.cli.types.bounded`); every number an option takes has a range, from these or
  from its type's ``bounds`` (counts >= 1, seeds, threads), and a test checks that none lacks one;
- ``path``: the option is a path, checked before any work (:func:`sitelens.cli.validate.validate`,
  :func:`~sitelens.cli.validate.check_outputs`, :func:`~sitelens.cli.guards.check_no_replace`):
  ``"path"`` any path, ``"csv"`` / ``"html"`` a file of that kind, ``"dir"`` a writable directory
  (``result``: the result file in it), ``"adapter"`` a directory to save an adapter in;
- ``read_by`` names what reads the option (``"fit"``, ``"seeds"``, ...). A command maps such a name
  to the conditions under which it reads it (its ``READ_WHEN``, :class:`When`); an option given on
  the command line whose conditions fail is refused (:func:`check_ignored`) instead of ignored. A
  name the command does not map is always read.

Which options were typed (not defaulted) is recorded while parsing: every option's action is
:class:`Given`, which stores the value and appends the option to ``args._given`` (so ``--sparsity 0``
counts as typed, and nothing parses the command line twice).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field, fields

from sitelens.errors import UsageError


def config(cls: type) -> type:
    """A command's config: a dataclass whose fields are its options. Only the fields are made
    (no ``__init__``, ``__repr__`` or ``__eq__``: the parsed options are an argparse namespace),
    which keeps ``import sitelens.cli``, and so every ``--help``, about 15 ms faster."""
    return dataclass(cls, init=False, repr=False, eq=False)


def option(default=None, *, help: str, type: Callable | None = None, choices=None,
           required: bool = False, nargs=None, metavar: str | None = None,
           read_by: tuple[str, ...] = (), group: str | None = None, path: str | None = None,
           result: str | None = None, at_least: float | None = None, above: float | None = None):
    """A config field that is a command-line option (the module docstring says how it becomes
    one); ``at_least`` / ``above``: its range (a number ``>=`` / ``>`` that bound)."""
    if at_least is not None or above is not None:
        from sitelens.cli.types import bounded

        type = bounded(type or float, at_least=at_least, above=above)
    return field(default=default, metadata={
        "help": help, "type": type, "choices": choices, "required": required, "nargs": nargs,
        "metavar": metavar, "read_by": read_by, "group": group, "path": path, "result": result})


@dataclass(frozen=True, eq=False)
class When:
    """A condition under which a command reads an option: ``test(args)``, and the words of the
    refusal, ``{flags} apply only {why}: {fix}.`` (both formatted with ``a``, the parsed options,
    and ``flags``, the options refused)."""

    test: Callable
    why: str
    fix: str = "drop {flags}"


def flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


# Settings that a resume record holds under a name that is not an option of the command: the
# FitConfig fields that it has no option for follow --protocol (the official protocol's own
# defaults), the task's items follow --task, the numerics version follows the installed sitelens.
SETTING_OPTIONS = {"config": "--protocol", "init": "--protocol", "eval_every": "--protocol",
                   "n_valid": "--protocol", "task_hash": "--task (its items)",
                   "numerics_version": "the installed sitelens (its numerics version)"}


def option_names(keys, config: type) -> list[str]:
    """The command-line options behind the differing settings ``keys`` of a resume record
    (dotted keys: their last part), for a refusal that names what the user changed: a field of
    the command's config is its flag, the others as :data:`SETTING_OPTIONS` says (else their
    name); ``--protocol`` first (it changes other options' defaults), each once; the task's
    items only where neither ``--task`` nor ``--seed`` (which draws the split) explains them."""
    names = {f.name for f in fields(config)}
    out = []
    for key in keys:
        last = str(key).rsplit(".", 1)[-1]
        out.append(flag(last) if last in names else SETTING_OPTIONS.get(last, last))
    out = list(dict.fromkeys(out))
    if "--task" in out or "--seed" in out:  # these change the items (the seed draws the split)
        out = [o for o in out if o != SETTING_OPTIONS["task_hash"]]
    return sorted(out, key=lambda o: o != "--protocol")


def has_default(default) -> bool:
    """Whether a default is worth showing: not None, not False (a switch that is off), not an
    empty sequence."""
    return not (default is None or default is False or (isinstance(default, (list, tuple))
                                                        and not default))


def help_text(text: str, default) -> str:
    """``text`` with ``(default: X)`` appended where the default is worth showing and ``text``
    does not name it; ``%`` escaped for argparse's %-formatting."""
    if has_default(default) and "default" not in text:
        text += f" (default: {default})"
    return text.replace("%", "%%")


class Given(argparse.Action):
    """Store the option's value (``const`` for a switch) and record the option as typed, in the
    order typed, in ``namespace._given``."""

    def __call__(self, parser, namespace, values, option_string=None):
        if self.nargs is None and isinstance(values, list):  # Python < 3.12: `--opt=--` gives []
            parser.error(f"argument {'/'.join(self.option_strings)}: expected one argument, got '--'")
        setattr(namespace, self.dest, self.const if self.nargs == 0 else values)
        namespace._given = (*getattr(namespace, "_given", ()), self.dest)


def add_options(p: argparse.ArgumentParser, config: type) -> argparse.ArgumentParser:
    """Add every field of the dataclass ``config`` to ``p`` as an option; a field without help
    text raises ``RuntimeError`` (so the tests catch it at build time)."""
    groups: dict[str | None, object] = {None: p}
    for f in fields(config):
        m = f.metadata
        if not m.get("help"):
            raise RuntimeError(f"`{p.prog} {flag(f.name)}` has no help text: give it one in "
                               f"{config.__name__} (sitelens/cli/configs.py).")
        default = f.default
        if m["group"] not in groups:
            groups[m["group"]] = p.add_argument_group(m["group"])
        kw = dict(dest=f.name, action=Given, default=default, help=help_text(m["help"], default))
        if default is False:
            kw.update(nargs=0, const=True)
        else:
            kw.update(type=m["type"], choices=m["choices"], required=m["required"],
                      nargs=m["nargs"], metavar=m["metavar"])
        groups[m["group"]].add_argument(flag(f.name), **kw)
    return p


def given(args) -> tuple[str, ...]:
    """The options typed on the command line (their ``dest``), in the order typed."""
    return tuple(dict.fromkeys(getattr(args, "_given", ())))


def paths(args, config: type):
    """``(flag, value, kind, result)`` of every path option of ``config`` that has a value in
    ``args`` (``kind`` and ``result``: the field's ``path`` and ``result``)."""
    for f in fields(config):
        if f.metadata.get("path") and getattr(args, f.name, None) is not None:
            yield flag(f.name), getattr(args, f.name), f.metadata["path"], f.metadata["result"]


def _failed(args, config: type, dest: str) -> When | None:
    """The first condition under which ``config`` reads ``dest`` that fails for ``args``."""
    read_by = next((f.metadata.get("read_by", ()) for f in fields(config) if f.name == dest), ())
    read_when = getattr(config, "READ_WHEN", {})
    return next((w for name in read_by for w in read_when.get(name, ()) if not w.test(args)), None)


def is_read(args, config: type, dest: str) -> bool:
    """Whether the command ``config`` reads the option ``dest`` with the others in ``args``."""
    return hasattr(args, dest) and _failed(args, config, dest) is None


def check_ignored(args, config: type) -> None:
    """Refuse the options typed on the command line that the command ``config`` would not read
    with the others given (:func:`is_read`); those failing the same condition are named together."""
    refused: dict[When, list[str]] = {}
    for dest in given(args):
        failed = _failed(args, config, dest)
        if failed is not None:
            refused.setdefault(failed, []).append(dest)
    if refused:
        when, dests = next(iter(refused.items()))
        flags = ", ".join(flag(d) for d in dests)
        verb = "applies" if len(dests) == 1 else "apply"
        raise UsageError(f"{flags} {verb} only {when.why.format(a=args, flags=flags)}: "
                         f"{when.fix.format(a=args, flags=flags)}.")


__all__ = ["Given", "When", "add_options", "config", "check_ignored", "flag", "given", "has_default",
           "help_text", "is_read", "option", "paths"]
