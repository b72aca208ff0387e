"""Regenerate the frozen reference numbers of tests/test_golden.py (tests/golden/).

    python scripts/regenerate_golden.py            # after bumping sitelens.provenance.NUMERICS_VERSION
    python scripts/regenerate_golden.py --force    # a first generation (no tests/golden/golden.json yet)
    python scripts/regenerate_golden.py --check [--threads N] [--float64]
                                      # compare today's code with the golden numbers, write nothing

Writing refuses unless ``NUMERICS_VERSION`` is greater than the version stored in
``tests/golden/golden.json``; ``--force`` only allows a first generation (no readable golden file).
To change the golden SETTINGS, delete ``tests/golden/golden.json`` and run with ``--force``. The
tensors are written first, then the JSON (which holds their SHA-256), each atomically (temp file,
fsync, rename). Afterwards it prints what changed against the old golden numbers: the max |Δ| per
tensor and every prediction that changed. Runs with 1 torch thread unless ``--threads`` says so.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import test_golden as g  # noqa: E402


def _err(msg: str) -> None:
    print(f"regenerate_golden: {msg}", file=sys.stderr)


def _stored_version(directory: Path):
    try:
        return json.loads((directory / g.META_FILE).read_text(encoding="utf-8"))["numerics_version"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def report(old: dict, new: dict) -> list[str]:
    """Max |Δ| per tensor (against its tolerance) and every changed prediction of ``new`` vs ``old``."""
    lines = []
    diffs, _ = g.differences(old, {**new, "fit": {}, "items": {}})
    for key in sorted(diffs):
        tol = g._tolerance(key)
        flag = "  OUTSIDE TOLERANCE" if not diffs[key] <= tol else ""
        lines.append(f"  {key:<24} max |Δ| = {diffs[key]:.3g}  (tolerance {tol:.3g}){flag}")
    if new["fit"] and old["fit"] and new["fit"]["best_step"] != old["fit"]["best_step"]:
        lines.append(f"  fit best_step: {old['fit']['best_step']} -> {new['fit']['best_step']}")
    for m, items in new["items"].items():
        for i, (it, ref) in enumerate(zip(items, old["items"][m])):
            keys = ("answer_id", "argmax_id", "text", "prediction", "correct")
            changed = [k for k in keys if it[k] != ref[k]]
            if changed:
                lines.append(f"  {m} item {i} ({ref['input']!r}): "
                             + ", ".join(f"{k} {ref[k]!r} -> {it[k]!r}" for k in changed)
                             + f"  (golden min margin {min(ref['margins']):.3g}"
                             + ("" if g.robust(ref["margins"]) else ", not robust") + ")")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--force", action="store_true", help="allow a first generation (no golden yet)")
    ap.add_argument("--check", action="store_true",
                    help="compute under today's code and print the differences; write nothing")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    ap.add_argument("--float64", action="store_true",
                    help="with --check: run the model in float64 (the distance from float32 bounds "
                         "what another summation order can do)")
    ap.add_argument("--golden-dir", type=Path, default=g.GOLDEN_DIR)
    args = ap.parse_args(argv)

    from sitelens import provenance

    code = provenance.NUMERICS_VERSION
    stored = _stored_version(args.golden_dir)
    if not args.check:
        if stored is not None and not code > stored:
            _err(f"refusing to overwrite {args.golden_dir}: sitelens.provenance.NUMERICS_VERSION is "
                 f"{code} and the golden numbers are version {stored}. Bump NUMERICS_VERSION (and add "
                 "a line to NUMERICS_HISTORY) for a change of numerics first; --force only makes a "
                 "first generation (to change SETTINGS, delete golden.json, then --force).")
            return 2
        if stored is None and not args.force:
            _err(f"no readable golden numbers in {args.golden_dir}: run with --force for a first "
                 "generation.")
            return 2

    import torch

    from sitelens.models import load_model

    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    dtype = torch.float64 if args.float64 else None
    model = load_model(g.MODEL, dtype=dtype)
    old = None
    if stored is not None:
        try:
            old_meta, old = g.load_golden(args.golden_dir)
        except g.GoldenMismatch as e:
            _err(f"the old golden files are unusable ({e}); nothing to compare with.")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), {g.cpu_name()}, "
          f"model {g.MODEL} ({'float64' if args.float64 else 'float32'})")

    if args.check:
        if old is None:
            _err("--check needs golden numbers to compare with.")
            return 2
        try:
            g.check_metadata(old_meta, None if args.float64 else model)
        except g.GoldenMismatch as e:
            print(f"metadata: {e}")
        snap = g.compute(model, old)
        for k, v in list(snap["tensors"].items()):
            snap["tensors"][k] = v.float() if v.dtype == torch.float64 and k not in (
                "valid_loss", "train_loss") else v
        diffs, problems = g.differences(old, snap)
        print(f"computed in {time.perf_counter() - t0:.1f} s; max |Δ| against {args.golden_dir}:")
        for key in sorted(diffs):
            print(f"  {key:<24} {diffs[key]:.3g}  (tolerance {g._tolerance(key):.3g})")
        print(json.dumps({"max_abs_diff": diffs, "problems": problems}))
        print("\n".join(["problems:"] + problems) if problems else "all within tolerance")
        return 1 if problems else 0

    snap = g.compute(model)
    meta = g.save_golden(model, snap, args.golden_dir)
    print(f"wrote {args.golden_dir} (numerics version {meta['numerics_version']}, fingerprint "
          f"{meta['fingerprint']}) in {time.perf_counter() - t0:.1f} s")
    for m in g.METHODS:
        n = sum(g.robust(it["margins"]) for it in snap["items"][m])
        acc = sum(it["correct"] for it in snap["items"][m])
        print(f"  {m}: {n}/{len(snap['items'][m])} items robust (min margin > {g.ROBUST_MARGIN:.3g}); "
              f"exact match {acc}/{len(snap['items'][m])}")
    print(f"  fit: best step {snap['fit']['best_step']}, valid loss "
          f"{[round(v, 4) for v in snap['tensors']['valid_loss'].tolist()]}, "
          f"{int(g.fragile_heads(snap).sum())} fragile head(s) (first |grad| <= "
          f"{g.FRAGILE_GRAD:g} of the largest)")
    if old is not None:
        print(f"changes against the previous golden numbers (version {stored}):")
        print("\n".join(report(old, snap)) or "  none")
    return 0


if __name__ == "__main__":
    sys.exit(main())
