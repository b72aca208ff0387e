"""Where the atlas tables live, and what to say when there are none.

The tables of the bundled models ship inside the package (``sitelens/data/atlas/{model}/``, package
data of the wheel; in a checkout the same folder), so ``sitelens atlas`` and :func:`load_atlas`
find them from any folder and from an installed package. Only this module names that folder.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

DEFAULT_DATA_DIR = Path(__file__).resolve().parent.parent / "data" / "atlas"

# what a refit costs: SmolLM2's summary.json records 2,436 s of fits, 3,716 s of transfer and
# 1,602 s of fast lenses on 2 CPU threads (about 2 hours, 57 tasks)
REFIT_COST = "which takes hours per model on a CPU (about 2 h for SmolLM2's 57 tasks on 2 threads)"


def data_dir(path: str | Path | None = None) -> Path:
    """``path``, or the tables shipped with sitelens (:data:`DEFAULT_DATA_DIR`) when ``None``."""
    return DEFAULT_DATA_DIR if path is None else Path(path)


def models_under(root: str | Path) -> list[str]:
    """The models with tables under ``root`` (sorted folder names holding a ``summary.json``)."""
    root = Path(root)
    return sorted(p.name for p in root.iterdir() if (p / "summary.json").is_file()) if root.is_dir() else []


def _same(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


def no_tables_message(root: str | Path, missing: Sequence[str] = ()) -> str:
    """Why the tables of ``missing`` (all models when empty) are not under ``root``, and what to do,
    in the order a user should try it: the shipped tables, ``--models`` among those there,
    ``--data DIR``, and only last a refit (its real cost)."""
    root = Path(root)
    have = models_under(root)
    what = f"for {', '.join(missing)} " if missing else ""
    where = (f"it holds tables of {', '.join(have)}" if have else
             "it has no model folder with a summary.json" if root.is_dir() else "it does not exist")
    shipped = models_under(DEFAULT_DATA_DIR)
    if _same(root, DEFAULT_DATA_DIR) and not shipped:
        where += "; this sitelens installation lacks its shipped tables: reinstall it"
    steps = []
    if have and missing:
        steps.append("choose among those with --models")
    if not _same(root, DEFAULT_DATA_DIR) and shipped:
        steps.append(f"drop --data to use the tables shipped with sitelens ({', '.join(shipped)})")
    steps.append("point --data DIR at a folder with one subfolder of tables per model")
    todo = ", or ".join(steps)
    return (f"No atlas tables {what}under {root} ({where}). {todo[0].upper()}{todo[1:]}; only as a last "
            "resort rebuild them with `sitelens atlas --refit --tasks-dir DIR` (FV-layout task folders, "
            f"e.g. ../shared/datasets/fv), {REFIT_COST}.")


MINIMAL_FILE = "minimal.csv"  # the fast selectors' k* (sitelens.atlas.minimal); optional


def read_minimal(directory: str | Path, summary: dict):
    """``(table, note)``: ``minimal.csv`` of an atlas folder when it was made with the weights and
    numerics of ``summary`` (its ``fingerprint`` and ``numerics_version``), else ``(None, why)``:
    the page and the widget then say why instead of the minimal sets."""
    import pandas as pd

    path = Path(directory) / MINIMAL_FILE
    how = "run scripts/atlas_minimal.py (sitelens.atlas.minimal.build_minimal) to compute it"
    if not path.is_file():
        return None, f"No minimal sets for this model (no {MINIMAL_FILE} beside its tables): {how}."
    try:
        df = pd.read_csv(path, keep_default_na=False, na_values=[""], dtype={"k_star": str})
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        return None, f"{MINIMAL_FILE} is unreadable ({type(e).__name__}); {how}."
    want = {"fingerprint": str(summary.get("fingerprint")),
            "numerics_version": str(summary.get("numerics_version"))}
    for col, v in want.items():
        got = sorted(set(df[col].astype(str))) if col in df else ["(none)"]
        if got != [v]:
            return None, (f"{MINIMAL_FILE} was made with {col} {', '.join(got)}, the atlas tables "
                          f"with {v}: it is stale and not shown; {how}.")
    return df, ""
