"""The head atlas: every head of every task, explorable in a browser page and in Jupyter.

- :mod:`~sitelens.atlas.data`: fit and measure (:func:`build_atlas_data`), keep the tables small
  (:class:`AtlasData`; the bundled models' tables ship in the package, ``sitelens/data/atlas/{model}/``,
  found from any folder: :mod:`~sitelens.atlas.tables`);
- :mod:`~sitelens.atlas.views`: the payload and the lookups both front ends show;
- :mod:`~sitelens.atlas.html`: ``sitelens atlas`` — one self-contained HTML file;
- :mod:`~sitelens.atlas.widget`: :func:`explore` — the same views as a Jupyter widget.

:func:`refit_atlas` rebuilds the data of the bundled models from an FV-layout task folder
(SmolLM2: every task; Gemma-3-270M: the abstractive ones; duplicate items dropped, as
``--dedupe`` does), reusing cached fits.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from sitelens.atlas.data import AtlasConfig, AtlasData, build_atlas_data, task_family
from sitelens.atlas.html import build_atlas_html
from sitelens.atlas.tables import DEFAULT_DATA_DIR, no_tables_message
from sitelens.atlas.views import head_card, overview, pair_view, payload, task_map
from sitelens.models import ATLAS_MODELS, LoadSpec  # ATLAS_MODELS: which FV tasks each atlas covers


def atlas_task_dirs(tasks_dir: str | Path, which: str = "all") -> list[Path]:
    """The FV-layout task folders under ``tasks_dir`` (sorted), all or only the abstractive ones."""
    from sitelens.errors import TaskError
    from sitelens.pipelines.bench import FV_EXTRACTIVE

    root = Path(tasks_dir)
    dirs = sorted(p for p in root.iterdir() if p.is_dir() and (p / "train.json").exists()) \
        if root.is_dir() else []
    if not dirs:
        raise TaskError(f"No FV-layout task folders (TASK/train.json) under {root}; pass "
                        "--tasks-dir ../shared/datasets/fv.")
    if which == "abstractive":
        dirs = [p for p in dirs if p.name not in FV_EXTRACTIVE]
    return dirs


def load_atlas(data_dir: str | Path | None = None, models: Sequence[str] | None = None
               ) -> list[AtlasData]:
    """The atlas tables of ``models`` (default: every model folder) under ``data_dir`` (default
    :data:`DEFAULT_DATA_DIR`, the tables shipped with sitelens, wherever it runs)."""
    from sitelens.atlas.tables import data_dir as resolve
    from sitelens.atlas.tables import models_under
    from sitelens.errors import OutputError

    root = resolve(data_dir)
    names = list(models) if models else models_under(root)
    missing = [n for n in names if not (root / n / "summary.json").is_file()]
    if not names or missing:
        raise OutputError(no_tables_message(root, missing))
    return [AtlasData.load(root / n) for n in names]


def lens_rows_from_heads(results_dir: str | Path, model: str):
    """The per-task lens scores of ``benchmarks/heads.py`` for ``model`` (empty when absent)."""
    import pandas as pd

    parts = []
    for f in sorted(Path(results_dir).glob(f"heads/{model}/*/scores.csv")):
        if ".stale-" in f.parent.name or ".tmp" in f.parent.name:
            continue
        parts.append(pd.read_csv(f))
    if not parts:
        return None
    return pd.concat(parts, ignore_index=True)


def refit_atlas(
    models: Sequence[str], tasks_dir: str | Path, data_dir: str | Path | None = None,
    config: AtlasConfig | None = None, *, cache_dir: str | Path = "runs/atlas",
    heads_results: str | Path | None = "benchmarks/results",
    log: Callable[[str], None] | None = None, n_ctx: int = 4096, executor=None,
    load: LoadSpec | None = None, joint: bool = False, carry: bool = False,
) -> list[AtlasData]:
    """Fit (or reuse) and measure every model's atlas and save it under ``data_dir/{model}``
    (default: :data:`DEFAULT_DATA_DIR`, where the shipped tables live).

    ``n_ctx`` 4096: the 10-shot prompts of ``squad_val`` reach 2,052 tokens on SmolLM2, past the
    default 2048 (the context length changes no number, only the size of TransformerLens's
    causal mask, and is not part of the fit cache key). ``executor``: where the fits run
    (:func:`sitelens.pipelines.executors.make_executor`; default in this process). ``load``: how
    every model loads, here and in the workers (:class:`~sitelens.models.LoadSpec`). ``joint``: the
    fits of this process run all tasks at once (:func:`build_atlas_data`). ``carry``: the tables
    already under ``data_dir/{model}`` are brought to the current numerics version by measuring
    only the tasks the bumps since touched (:func:`sitelens.atlas.carry.carry_atlas_data`; tables
    already current are left as they are)."""
    from sitelens.models import load_model, model_name
    from sitelens.pipelines.executors import make_executor
    from sitelens.tasks import load_task

    out = []
    ex = make_executor(executor)
    try:
        for name in models:
            model = load_model(name, n_ctx=n_ctx, spec=load)
            mname = model_name(model)
            which = ATLAS_MODELS.get(mname, "all")
            tasks = [load_task(p, dedupe=True) for p in atlas_task_dirs(tasks_dir, which)]
            lenses = lens_rows_from_heads(heads_results, mname) if heads_results else None
            if carry:
                out.append(_carry(model, tasks, Path(data_dir or DEFAULT_DATA_DIR) / mname, config,
                                  cache_dir=cache_dir, lenses=lenses, log=log, joint=joint))
                continue
            data = build_atlas_data(model, tasks, config, cache_dir=cache_dir, lenses=lenses,
                                    log=log, executor=ex, model_spec=name, n_ctx=n_ctx, load=load,
                                    joint=joint)
            data.save(Path(data_dir or DEFAULT_DATA_DIR) / mname)
            out.append(data)
    finally:
        if ex is not executor:
            ex.close()
    return out


def _carry(model, tasks, directory: Path, config, **kw) -> AtlasData:
    from sitelens.atlas.carry import carry_atlas_data
    from sitelens.errors import OutputError
    from sitelens.provenance import NUMERICS_VERSION

    if not (directory / "summary.json").is_file():
        raise OutputError(f"--carry needs the tables to carry under {directory}, and there are none: "
                          "refit without --carry.")
    previous = AtlasData.load(directory)
    if previous.summary.get("numerics_version") == NUMERICS_VERSION:
        (kw.get("log") or (lambda m: None))(f"{previous.model}: tables already at numerics "
                                            f"{NUMERICS_VERSION}; nothing to carry")
        return previous
    data = carry_atlas_data(model, tasks, previous, config, **kw)
    data.save(directory)
    return data


def explore(data_dir: str | Path | None = None, models: Sequence[str] | None = None):
    """The atlas as a Jupyter widget (:func:`sitelens.atlas.widget.explore`; ``data_dir`` default:
    the tables shipped with sitelens)."""
    from sitelens.atlas.widget import explore as _explore

    return _explore(data_dir, models)


__all__ = [
    "ATLAS_MODELS", "DEFAULT_DATA_DIR", "AtlasConfig", "AtlasData", "atlas_task_dirs", "build_atlas_data",
    "build_atlas_html", "explore", "head_card", "load_atlas", "overview", "pair_view", "payload",
    "refit_atlas", "task_family", "task_map",
]
