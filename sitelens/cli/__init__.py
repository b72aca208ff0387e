"""The ``sitelens`` command line (the console script ``sitelens = sitelens.cli:entry``).

Subcommands:

- ``sitelens fit``: fit a SITE adapter (stage 1 + stage 2) on a task and save it;
- ``sitelens eval``: evaluate zero-shot / ICL / SITE on a task (``--json``, per-item ``--items``);
- ``sitelens run``: fit and evaluate with one model load, into one resumable folder;
- ``sitelens demo``: fit SITE on a built-in task and compare zero-shot / ICL / SITE;
- ``sitelens bench``: models × tasks × methods into one resumable results table;
- ``sitelens patch intra | inter | effects``: activation patching (top-k / bottom-k / random-k
  heads by α, cross-task transfer, per-head causal effects);
- ``sitelens heads``: which heads matter, scored by several lenses (learned α over seeds, α and
  attribution-patching gradients, ablation, exact effects, direct logit attribution) into one
  :class:`~sitelens.lenses.HeadScores` CSV;
- ``sitelens frontier``: how few heads carry the task (accuracy against the number of heads, per
  selector);
- ``sitelens figures``: reproduce ``figures/`` from real runs (resumable);
- ``sitelens atlas``: the head atlas, one self-contained HTML page (``--refit`` rebuilds its data).

Bad input is refused before any model is loaded and before anything is written: one line on
stderr, ``sitelens: error: ...``, and exit status 2. The library returns data; this package (and
the ``bench`` / ``figures`` runners it calls) prints and writes the files, through
:mod:`sitelens.io`.

Modules: :mod:`~sitelens.cli.configs` (one config dataclass per subcommand: its options),
:mod:`~sitelens.cli.options` (configs into parsers; options that would be ignored),
:mod:`~sitelens.cli.types` (option types), :mod:`~sitelens.cli.parser` (the parser: one-line usage
errors), :mod:`~sitelens.cli.validate` (the checks before a model loads),
:mod:`~sitelens.cli.guards` (results that would be replaced), :mod:`~sitelens.cli.common` (loading,
fitting from the options), and the commands: :mod:`~sitelens.cli.fit_eval` (fit, eval, demo),
:mod:`~sitelens.cli.run` (run), :mod:`~sitelens.cli.patch` (patch), :mod:`~sitelens.cli.heads`
(heads), :mod:`~sitelens.cli.frontier` (frontier), :mod:`~sitelens.cli.runners` (bench, figures),
:mod:`~sitelens.cli.atlas` (atlas).
"""

from __future__ import annotations

import gc
import sys
from typing import NoReturn

from sitelens.cli.atlas import cmd_atlas
from sitelens.cli.common import setup_torch
from sitelens.cli.fit_eval import cmd_demo, cmd_eval, cmd_fit
from sitelens.cli.frontier import cmd_frontier
from sitelens.cli.heads import cmd_heads
from sitelens.cli.parser import build_parser, one_line
from sitelens.cli.patch import cmd_patch
from sitelens.cli.run import cmd_run
from sitelens.cli.runners import cmd_bench, cmd_figures
from sitelens.cli.validate import check_outputs, validate
from sitelens.errors import SitelensError

COMMANDS = {
    "fit": cmd_fit,
    "eval": cmd_eval,
    "run": cmd_run,
    "bench": cmd_bench,
    "demo": cmd_demo,
    "patch": cmd_patch,
    "heads": cmd_heads,
    "frontier": cmd_frontier,
    "figures": cmd_figures,
    "atlas": cmd_atlas,
}


def main(argv: list[str] | None = None) -> int:
    """Run ``sitelens`` on ``argv`` (default: ``sys.argv[1:]``) and return the exit status: 0,
    or 2 for bad input (printed as one line ``sitelens: error: ...`` on stderr)."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # --help (0), or a usage error already printed as one line (2)
        return e.code if isinstance(e.code, int) else 0 if e.code is None else 2
    try:
        validate(args)
        check_outputs(args)
        setup_torch(args)  # after every check: bad input is refused without importing torch
        return COMMANDS[args.cmd](args)
    except SitelensError as e:
        print(f"sitelens: error: {one_line(e)}", file=sys.stderr)
        return 2


def entry() -> NoReturn:
    """The ``sitelens`` console script and ``python -m sitelens.cli``: :func:`main` on the command
    line, then exit with its status.

    Before the interpreter shuts down, every live object is frozen out of the cyclic garbage
    collector's sight (:func:`gc.freeze`). Shutdown still runs the atexit handlers, closes files and
    tears the modules down; only its final collections stop walking the millions of objects torch,
    TransformerLens and transformers leave behind: measured 1.4 s of exit after ``import
    transformer_lens`` alone, 0.15 s frozen. Only here, in the process's entry point: a caller of
    :func:`main` in a long-lived process (a notebook, the tests) keeps its collector."""
    status = main()
    gc.freeze()
    sys.exit(status)


__all__ = [
    "COMMANDS", "build_parser", "check_outputs", "cmd_bench", "cmd_demo", "cmd_eval", "cmd_figures",
    "cmd_fit", "cmd_frontier", "cmd_heads", "cmd_patch", "cmd_run", "entry", "main", "validate",
]
