"""The benchmark scripts as modules for the tests. A script runs as ``python benchmarks/NAME.py``,
so ``benchmarks/`` is on its path and its shared package imports as ``lib``; here ``benchmarks/``
goes on the path too (last: a script's name never hides an installed module), and
:func:`bench_module` loads a script from its file, once, as the module ``benchmarks_NAME``."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
if str(BENCH) not in sys.path:
    sys.path.append(str(BENCH))


def bench_module(name: str) -> types.ModuleType:
    """``benchmarks/{name}.py`` as a module (its ``__main__`` block does not run)."""
    key = f"benchmarks_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, BENCH / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module  # before it runs: dataclasses and pickling look it up there
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[key]
            raise
    return sys.modules[key]
