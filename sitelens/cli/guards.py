"""No result replaced without ``--force``: :func:`check_no_replace` runs before any model loads
(from :func:`sitelens.cli.validate.check_outputs`) and raises a
:class:`~sitelens.errors.UsageError`, printed as one line with exit status 2, for an output that
already holds an earlier result (an adapter in ``fit --out`` or ``--save-adapter``, a file at
``--out`` / ``--items``) unless ``--force``. ``bench`` and
``figures`` are not checked: their results are keyed and resumed, never replaced; the ``atlas``
page is a view of its tables, rebuilt in seconds; ``run`` and ``frontier`` resume or refuse
(:func:`sitelens.cli.run.plan_run`, :func:`sitelens.cli.frontier.plan_frontier`)."""

from __future__ import annotations

from pathlib import Path

from sitelens.cli.configs import CONFIGS
from sitelens.cli.options import paths
from sitelens.errors import UsageError


def _adapter_in(path) -> bool:
    p = Path(path)
    return (p / "adapter.json").exists() or (p / "adapter.safetensors").exists()


def check_no_replace(args, cmd: str) -> None:
    """Refuse to replace an earlier adapter or result file unless ``--force`` (commands without
    the option are not checked): an adapter in a path option of kind ``"adapter"``, a file at one
    of kind ``"csv"`` or at the ``result`` of a directory (:func:`sitelens.cli.options.paths`)."""
    if not hasattr(args, "force") or args.force or cmd in ("run", "frontier"):
        return
    for option, value, kind, result in paths(args, CONFIGS[cmd]):
        if kind == "adapter" and _adapter_in(value):
            raise UsageError(f"{option} {value} already holds an adapter; refusing to replace it: "
                             f"pass --force to replace it, or choose another {option}.")
        path = Path(value) / result if result else Path(value) if kind == "csv" else None
        if path is not None and path.is_file():
            raise UsageError(f"{option} {path} already exists (an earlier result); refusing to "
                             f"replace it: pass --force to replace it, or choose another {option}.")
