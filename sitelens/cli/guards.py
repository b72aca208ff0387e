"""No result replaced without ``--force``: :func:`check_no_replace` runs before any model loads
(from :func:`sitelens.cli.validate.check_outputs`) and raises a
:class:`~sitelens.errors.UsageError`, printed as one line with exit status 2, for an output that
already holds an earlier result (an adapter in ``fit --out`` or ``--save-adapter``, a file at
``--out`` / ``--items``, ``frontier.csv`` in ``frontier --out``) unless ``--force``. ``bench`` and
``figures`` are not checked: their results are keyed and resumed, never replaced; the ``atlas``
page is a view of its tables, rebuilt in seconds; ``run`` resumes or refuses part by part
(:func:`sitelens.cli.run.plan_run`)."""

from __future__ import annotations

from pathlib import Path

from sitelens.errors import UsageError


def _adapter_in(path) -> bool:
    p = Path(path)
    return (p / "adapter.json").exists() or (p / "adapter.safetensors").exists()


def check_no_replace(args, cmd: str) -> None:
    """Refuse to replace an earlier adapter or result file unless ``--force`` (commands without
    the option are not checked)."""
    if not hasattr(args, "force") or args.force or cmd == "run":
        return
    adapters = [("--out", args.out)] if cmd == "fit" else []
    if getattr(args, "save_adapter", None):
        adapters.append(("--save-adapter", args.save_adapter))
    for option, path in adapters:
        if _adapter_in(path):
            raise UsageError(f"{option} {path} already holds an adapter; refusing to replace it: "
                             f"pass --force to replace it, or choose another {option}.")
    files = [("--items", getattr(args, "items", None))]
    if cmd == "frontier":  # --out is a directory: its frontier.csv is the result
        files.append(("--out", str(Path(args.out) / "frontier.csv")))
    elif cmd != "fit":
        files.append(("--out", getattr(args, "out", None)))
    for option, path in files:
        if path and Path(path).is_file():
            raise UsageError(f"{option} {path} already exists (an earlier result); refusing to "
                             f"replace it: pass --force to replace it, or choose another {option}.")
