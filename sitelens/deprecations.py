"""Module paths of sitelens that moved, importable as deprecated aliases of the modules that hold the code.

The package is laid out by concern (``tasks/``, ``site/``, ``eval/``, ``patching/``, ``pipelines/``,
``viz/``); a module that moved keeps its old dotted name through :class:`MovedModuleFinder`, which
imports the new module under the old name and warns with a :class:`DeprecationWarning` that names
the new path. The alias is the same module object, so attributes, monkeypatches and ``isinstance``
checks see one module, not a copy.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings

# old dotted name -> new dotted name
MOVED_MODULES: dict[str, str] = {
    "sitelens.attention": "sitelens.models.attention",
    "sitelens.shots": "sitelens.tasks.shots",
    "sitelens.regression": "sitelens.tasks.regression",
    "sitelens.labels": "sitelens.eval.labels",
    "sitelens.evaluate": "sitelens.eval.evaluate",
    "sitelens.metrics": "sitelens.eval.metrics",
    "sitelens.injection": "sitelens.site.injection",
    "sitelens.training": "sitelens.site.training",
    "sitelens.effects": "sitelens.patching.effects",
    "sitelens.analysis": "sitelens.patching.analysis",
    "sitelens.bench": "sitelens.pipelines.bench",
    "sitelens.figures": "sitelens.pipelines.figures",
    "sitelens.report": "sitelens.pipelines.report",
    "sitelens.runs": "sitelens.pipelines.store",
    "sitelens.executors": "sitelens.pipelines.executors",
    "sitelens.transfer": "sitelens.pipelines.transfer",
    "sitelens.plotting": "sitelens.viz.plotting",
    "sitelens.export": "sitelens.viz.export",
}


class _AliasLoader(importlib.abc.Loader):
    """Loads an old name as the new module itself: ``create_module`` returns it, and ``exec_module``
    gives it back its own ``__spec__`` (the import system writes the alias's spec over it)."""

    def __init__(self, new: str):
        self.new = new

    def create_module(self, spec):
        module = importlib.import_module(self.new)
        self.spec = module.__spec__
        return module

    def exec_module(self, module) -> None:
        module.__spec__ = self.spec


class MovedModuleFinder(importlib.abc.MetaPathFinder):
    """Finds the old names of :data:`MOVED_MODULES` and warns once per import."""

    def find_spec(self, fullname, path=None, target=None):
        new = MOVED_MODULES.get(fullname)
        if new is None:
            return None
        warnings.warn(f"{fullname} is deprecated; import {new} instead", DeprecationWarning, stacklevel=2)
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(new))


def install() -> None:
    """Put the finder on ``sys.meta_path`` (once). Nothing is imported until an old name is.

    ``sitelens.evaluate`` is also the name of the function :func:`sitelens.evaluate`; importing the
    old module through the finder makes the import system bind the module as the package's
    attribute ``evaluate``, which the package (a :class:`sitelens.lazy.LazyModule`) refuses, so
    ``sitelens.evaluate`` stays the function."""
    if not any(isinstance(f, MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.append(MovedModuleFinder())
