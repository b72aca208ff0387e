"""No option ignored in silence, no result replaced without ``--force``.

:func:`sitelens.cli.options.add_guard_options` adds ``--force`` to every command that writes a
result file of its own (``fit``, ``eval``, ``patch intra|inter|effects``, ``heads``) and
``--save-adapter`` to ``patch intra``. Both checks below run before any model loads (from
:func:`sitelens.cli.validate.validate` and :func:`~sitelens.cli.validate.check_outputs`) and raise
a :class:`~sitelens.errors.UsageError`, printed as one line with exit status 2:

- :func:`check_ignored_options`: an option given on the command line that the command would not
  read with the others given (a fit option with ``--adapter``, a lens option for lenses not asked
  for, ``--n-shots`` without ``icl``, a ``--refit`` option without ``--refit``);
- :func:`check_no_replace`: an output that already holds an earlier result (an adapter in ``fit
  --out`` or ``--save-adapter``, a file at ``--out`` / ``--items``) unless ``--force``. ``bench``
  and ``figures`` are not checked: their results are keyed and resumed, never replaced; the
  ``atlas`` page is a view of its tables, rebuilt in seconds.

Which options were *given* (not defaults) is read from a second parse of the command line with
every default suppressed (:func:`explicit_options`), so ``--sparsity 0`` counts as given too.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from sitelens.cli.options import FORCE_COMMANDS, children, subparsers
from sitelens.cli.parser import build_parser, command_name, split_csv
from sitelens.errors import UsageError

FIT_OPTIONS = ("n_prompts", "n_shots", "lr", "n_examples", "batch_size", "sparsity", "protocol")


def explicit_options(argv: list[str]) -> set[str]:
    """The ``dest`` of every option given in ``argv`` (abbreviations included), from a parse of
    ``argv`` with every default suppressed; ``argv`` must parse (it did, once, already)."""
    ap = build_parser()
    for p in [ap, *children(ap).values(), *subparsers(ap).values()]:
        for a in p._actions:
            if a.option_strings:
                a.default = argparse.SUPPRESS
    return set(vars(ap.parse_args(argv)))


def given(args) -> set[str]:
    """The options given on the command line: ``args._given`` (set by :func:`sitelens.cli.main`),
    else those whose value differs from the parser's default."""
    if getattr(args, "_given", None) is not None:
        return set(args._given)
    p = subparsers(build_parser())[command_name(args)]
    return {a.dest for a in p._actions if a.option_strings and a.dest in vars(args)
            and getattr(args, a.dest) != a.default}


def _flags(dests) -> str:
    return ", ".join("--" + d.replace("_", "-") for d in dests)


def _refuse(dests, why: str, fix: str) -> None:
    """Raise ``{flags} apply only {why}: {fix}.``; ``{flags}`` in ``fix`` names the options."""
    verb = "applies" if len(dests) == 1 else "apply"
    raise UsageError(f"{_flags(dests)} {verb} only {why}: {fix.format(flags=_flags(dests))}.")


def _heads(args, have: set[str]) -> None:
    from sitelens.lenses import parse_lenses

    lenses = set(parse_lenses(split_csv(args.lenses)))
    fits = not args.adapter and bool(lenses & {"alpha", "dla"})
    if args.adapter:
        bad = [d for d in ("seeds", "n_mean_prompts", *FIT_OPTIONS[2:]) if d in have]
        if bad:
            _refuse(bad, "when heads fits α itself (no --adapter); with --adapter every lens reads "
                         "that adapter (its α for alpha and dla, its embedding for the others) and "
                         "nothing is fitted", "drop {flags}, or drop --adapter to fit with them")
    needs = {
        "seeds": ("alpha" in lenses, "to the alpha lens (SITE fits over seeds)", "add alpha"),
        "lr": (fits, "to the fits of the alpha and dla lenses", "add alpha"),
        "n_prompts": (bool(lenses & {"atp", "atp-star", "effect", "ablation-mean", "ablation-zero"}),
                      "to the atp, atp-star, effect and ablation lenses", "add one of them"),
        "limit": ("alpha-grad" in lenses, "to the alpha-grad lens", "add alpha-grad"),
        "n_boot": (bool(lenses - {"alpha", "dla"}),
                   "to the intervals of the lenses other than alpha and dla", "add one of them"),
    }
    for d in ("n_examples", "batch_size", "sparsity", "protocol"):
        needs[d] = needs["lr"]
    for d, (used, what, add) in needs.items():
        if d in have and not used:
            bad = [e for e, n in needs.items() if e in have and n is needs[d]]
            _refuse(bad, f"{what}, which --lenses {args.lenses} does not ask for",
                    f"{add} to --lenses or drop {{flags}}")


def _run(args, have: set[str]) -> None:
    """``sitelens run``: fit options need the site method (nothing is fitted without it);
    ``--n-shots`` needs icl or site (the demonstrations of ICL and of stage 1)."""
    methods = set(split_csv(args.methods))
    bad = [d for d in FIT_OPTIONS if d in have and d not in ("n_shots", "protocol")]
    if bad and "site" not in methods:
        _refuse(bad, "to the fit of the site method, which --methods does not ask for",
                "add site to --methods or drop {flags}")
    if "n_shots" in have and not methods & {"icl", "site"}:
        _refuse(["n_shots"], "to the demonstrations of icl and of the site fit, which --methods "
                             "does not ask for", "add icl or site to --methods or drop --n-shots")


def check_ignored_options(args, cmd: str) -> None:
    """Refuse an option given on the command line that ``cmd`` would ignore with the others."""
    have = given(args)
    if cmd == "heads" and not getattr(args, "frontier", False):  # --frontier: check_frontier_options
        return _heads(args, have)
    if cmd in ("patch intra", "patch inter") and (args.adapters if cmd == "patch inter"
                                                  else args.adapter):
        bad = [d for d in FIT_OPTIONS if d in have]
        opt = "--adapters" if cmd == "patch inter" else "--adapter"
        if bad:
            _refuse(bad, f"when {cmd} fits the adapter itself, with no {opt} (fit options); "
                         f"an adapter given with {opt} is used as it was fitted",
                    f"drop {{flags}}, or drop {opt} to fit one with them")
        if "save_adapter" in have:
            _refuse(["save_adapter"], f"to an adapter that {cmd} fits itself (no {opt})",
                    f"drop --save-adapter ({opt} is saved already)")
    if cmd == "patch effects" and args.adapter and "n_mean_prompts" in have:
        _refuse(["n_mean_prompts"], "without --adapter (with it, the adapter's embedding is the "
                                    "mean activation)", "drop --n-mean-prompts or --adapter")
    if cmd == "eval" and "n_shots" in have and "icl" not in split_csv(args.methods):
        _refuse(["n_shots"], "to the icl method, which --methods does not ask for",
                "add icl to --methods or drop --n-shots")
    if cmd == "run":
        _run(args, have)
    if cmd == "atlas" and not args.refit:
        bad = [d for d in ("tasks_dir", "seeds", "seed", "limit", "cache_dir", "executor", "threads",
                           "device", "dtype", "n_devices", "device_map", "backend") if d in have]
        if bad:
            _refuse(bad, "with --refit (without it the page is built from the tables under "
                         "--data and nothing is fitted)", "add --refit or drop {flags}")


def _adapter_in(path) -> bool:
    p = Path(path)
    return (p / "adapter.json").exists() or (p / "adapter.safetensors").exists()


def check_no_replace(args, cmd: str) -> None:
    """Refuse to replace an earlier adapter or result file unless ``--force``."""
    if getattr(args, "force", False) or cmd == "run":  # run: sitelens.cli.run.plan_run
        return
    adapters = [("--out", args.out)] if cmd == "fit" else []
    if getattr(args, "save_adapter", None):
        adapters.append(("--save-adapter", args.save_adapter))
    for option, path in adapters:
        if _adapter_in(path):
            raise UsageError(f"{option} {path} already holds an adapter; refusing to replace it: "
                             f"pass --force to replace it, or choose another {option}.")
    files = [("--items", getattr(args, "items", None))]
    if getattr(args, "frontier", False):  # --out is a directory: its frontier.csv is the result
        files.append(("--out", str(Path(args.out) / "frontier.csv")))
    elif cmd != "fit" and cmd in FORCE_COMMANDS:
        files.append(("--out", getattr(args, "out", None)))
    for option, path in files:
        if path and Path(path).is_file():
            raise UsageError(f"{option} {path} already exists (an earlier result); refusing to "
                             f"replace it: pass --force to replace it, or choose another {option}.")
