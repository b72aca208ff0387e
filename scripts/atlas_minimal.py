"""Compute the fast selectors' k* for every task of the atlas and write ``minimal.csv`` beside each
model's atlas tables (:mod:`sitelens.atlas.minimal`; resumable per task, cells under --cache-dir).

    OMP_NUM_THREADS=2 python scripts/atlas_minimal.py --models smollm2-135m-instruct \\
        --tasks-dir ../shared/datasets/fv [--tasks antonym,synonym] [--out-dir DIR]

``--tasks``: only these atlas tasks; their rows replace theirs in an existing current
``minimal.csv`` (rows of the other tasks are kept). ``--out-dir``: write ``DIR/{model}/minimal.csv``
instead of into ``--data``. Bad input prints one line ``atlas_minimal: error: ...`` and exits 2
before any model loads.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def main(argv=None) -> int:
    from sitelens.atlas import ATLAS_MODELS, atlas_task_dirs, load_atlas
    from sitelens.atlas.minimal import MinimalConfig, build_minimal
    from sitelens.atlas.tables import MINIMAL_FILE, data_dir, read_minimal
    from sitelens.errors import SitelensError
    from sitelens.lenses.registry import DEFAULT_BUDGETS

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(ATLAS_MODELS))
    p.add_argument("--tasks", default=None, help="comma-separated atlas tasks (default: all)")
    p.add_argument("--tasks-dir", default="../shared/datasets/fv")
    p.add_argument("--data", default=None, help="atlas tables (default: those shipped with sitelens)")
    p.add_argument("--out-dir", default=None, help="write OUT/{model}/minimal.csv (default: --data)")
    p.add_argument("--cache-dir", default="runs/atlas")
    p.add_argument("--budgets", default=",".join(map(str, DEFAULT_BUDGETS)))
    p.add_argument("--test-limit", type=int, default=None, help="the first test items only")
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)

    def fail(msg: str) -> int:
        print(f"atlas_minimal: error: {msg}", file=sys.stderr)
        return 2

    try:  # everything checked before a model loads
        models = [m for m in args.models.split(",") if m]
        datas = load_atlas(args.data, models)
        budgets = tuple(int(k) for k in args.budgets.split(","))
        wanted = [t for t in (args.tasks or "").split(",") if t]
        for d in datas:
            unknown = [t for t in wanted if t not in d.tasks]
            if unknown:
                return fail(f"{d.model} has no atlas task {unknown[0]!r}")
            dirs = atlas_task_dirs(args.tasks_dir, ATLAS_MODELS.get(d.model, "all"))
            missing = [t for t in (wanted or d.tasks) if t not in {x.name for x in dirs}]
            if missing:
                return fail(f"no task folder {missing[0]!r} under {args.tasks_dir}")
    except (SitelensError, ValueError) as e:
        return fail(str(e).splitlines()[0])
    if args.test_limit is not None and args.test_limit < 1:
        return fail("--test-limit must be at least 1")

    import pandas as pd
    import torch

    from sitelens.models import load_model
    from sitelens.tasks import load_task

    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = MinimalConfig(budgets=budgets, test_limit=args.test_limit)
    for d in datas:
        names = wanted or d.tasks
        dirs = {x.name: x for x in atlas_task_dirs(args.tasks_dir, ATLAS_MODELS.get(d.model, "all"))}
        tasks = [load_task(dirs[n], dedupe=True) for n in names]  # as the atlas loaded them
        model = load_model(d.model, n_ctx=4096)
        t0 = time.perf_counter()
        rows = build_minimal(model, d, tasks, cfg, cache_dir=args.cache_dir,
                             log=lambda m: print(m, file=sys.stderr, flush=True))
        out = Path(args.out_dir) / d.model if args.out_dir else data_dir(args.data) / d.model
        old, _ = read_minimal(out, d.summary)
        if old is not None and wanted:
            rows = pd.concat([old[~old.task.isin(names)], rows], ignore_index=True)
        out.mkdir(parents=True, exist_ok=True)
        from sitelens.io import atomic_write_csv

        atomic_write_csv(out / MINIMAL_FILE, rows)
        skipped = rows[rows.skipped.fillna("") != ""]
        print(f"wrote {out / MINIMAL_FILE}: {rows.task.nunique()} tasks ({len(skipped)} skipped), "
              f"{time.perf_counter() - t0:.1f}s for {len(tasks)} task(s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
