"""Lazy package names (PEP 562): ``import sitelens`` (and ``sitelens --help``, a refused command
line, ``sitelens atlas`` from the committed tables) imports none of torch, TransformerLens,
transformers or plotly, so no package ``__init__`` imports its modules. Each lists its public names
twice: as imports inside ``if TYPE_CHECKING:`` for type checkers, IDEs and the API docs, and, for
the interpreter, by the module that defines them::

    __getattr__, __dir__ = lazy_names(__name__, {"sitelens.models.load": ("load_model", ...)})

``tests/test_light_imports.py`` checks that the two lists agree. A name is looked up in its module
at every access and never stored in the package: the package shows what its module holds now, so a
monkeypatch of either the module or the package is seen while it lasts and gone when it is undone.
Any other name is a submodule, imported on first access (``sitelens.models.kv``), as after an
eager import of the package's modules.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence


def lazy_names(package: str, exports: Mapping[str, Sequence[str]]
               ) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """The module ``__getattr__`` and ``__dir__`` of ``package``, whose public names are defined in
    other modules: ``exports`` maps a module to the names it defines (``package`` itself to its
    submodules)."""
    home = {name: module for module, names in exports.items() for name in names}

    def __getattr__(name: str):
        module = home.get(name)
        if module is not None and module != package:
            return getattr(importlib.import_module(module), name)
        if not name.startswith("__"):
            try:
                return importlib.import_module(f"{package}.{name}")
            except ModuleNotFoundError as e:
                if e.name != f"{package}.{name}":
                    raise
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(home))

    return __getattr__, __dir__


def resolve(ref: str | Callable) -> Callable:
    """What a registry entry names: ``"package.module:name"`` is imported on first use (so the
    registries of lenses, selectors and methods import no tensor library, and the command line
    reads its choices from them); a callable is returned as it is."""
    if not isinstance(ref, str):
        return ref
    module, sep, name = ref.partition(":")
    if not sep or not module or not name:
        raise ValueError(f"A registry entry names its implementation as 'package.module:name', got {ref!r}.")
    return getattr(importlib.import_module(module), name)


__all__ = ["lazy_names", "resolve"]
