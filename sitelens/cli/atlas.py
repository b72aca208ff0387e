"""``sitelens atlas``: the head atlas as one self-contained HTML page (:mod:`sitelens.atlas`).

Without ``--refit`` the page is built from the tables under ``--data`` (default: those shipped with
sitelens, :data:`sitelens.atlas.DEFAULT_DATA_DIR`, from any folder; no model is loaded, seconds).
``--refit`` first fits and measures every model's atlas from ``--tasks-dir`` (reusing cached fits
under ``--cache-dir``) and rewrites the tables.
"""

from __future__ import annotations

import sys
from pathlib import Path

from sitelens.cli.common import load_spec
from sitelens.cli.types import split_csv
from sitelens.io import atomic_write_text


def cmd_atlas(args) -> int:
    from sitelens.atlas import ATLAS_MODELS, AtlasConfig, build_atlas_html, load_atlas, payload, refit_atlas

    models = split_csv(args.models) or None
    if args.refit:
        cfg = AtlasConfig(seeds=tuple(range(args.seed, args.seed + args.seeds)),
                          transfer_limit=args.limit)
        from sitelens.pipelines.executors import make_executor

        with make_executor(args.executor, threads=args.threads) as executor:
            refit_atlas(models or list(ATLAS_MODELS), args.tasks_dir, args.data, cfg,
                        cache_dir=args.cache_dir, executor=executor, load=load_spec(args), joint=args.joint,
                        carry=args.carry,
                        log=lambda m: print(m, file=sys.stderr, flush=True))
    datas = load_atlas(args.data, models)
    page = build_atlas_html(payload(datas), plotly=args.plotly)
    atomic_write_text(args.out, page)
    size = Path(args.out).stat().st_size / 1e6
    summary = ", ".join(f"{d.model} ({len(d.tasks)} tasks)" for d in datas)
    bundle = "cartesian" if 'content="cartesian"' in page[:2000] else "full"
    print(f"wrote {args.out} ({size:.1f} MB, plotly.js {bundle} bundle): {summary}")
    return 0
