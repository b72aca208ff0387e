"""Lazy package attributes (PEP 562): a package's public names are imported on first access.

``import sitelens`` (and ``sitelens --help``, a bad command line, ``sitelens atlas`` from committed
tables) must not pay for torch, TransformerLens, transformers or plotly; the package ``__init__``
files therefore import nothing heavy. Each lists its public names as ordinary imports inside an
``if TYPE_CHECKING:`` block -- read by type checkers, IDEs, the API docs and the layer checks of
``tests/test_house.py`` -- and ends with::

    __getattr__, __dir__ = attach(__name__, __file__)

:func:`attach` reads that block from the source (one source of truth: the names cannot drift from
the imports that define them) and returns the module ``__getattr__`` / ``__dir__`` that import a
name's module when the name is first used, then bind it in the package (later accesses are plain
attribute reads). ``from sitelens.models import load_model`` works unchanged: ``from`` imports fall
back to the module's ``__getattr__``.

A re-exported name can share its name with a submodule (``sitelens.eval.evaluate`` is the
function ``evaluate`` and the module ``sitelens/eval/evaluate.py``). Eager imports bound the
function last; lazily, importing the submodule first would make the import system bind the module
over the name. :class:`LazyModule` (the package's class after :func:`attach`) refuses exactly that
one binding, so the name keeps meaning what the ``TYPE_CHECKING`` block says. And when a module
runs, the names the lazy packages import from it are bound at once (:func:`bind_names_of`), so a
package name is the object its module defined even if that module's attribute is patched before
the name is first used (as with the eager imports this replaces).
"""

from __future__ import annotations

import ast
import importlib
import sys
import types
from collections.abc import Callable
from pathlib import Path

# name -> (module, attribute); attribute None: the module itself
Targets = dict[str, tuple[str, "str | None"]]


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def type_checking_imports(source: str) -> Targets:
    """The names bound by the top-level ``if TYPE_CHECKING:`` blocks of ``source``:
    ``from m import a as b`` gives ``b -> (m, a)``, ``import m.x as y`` gives ``y -> (m.x, None)``."""
    out: Targets = {}
    for node in ast.parse(source).body:
        if not (isinstance(node, ast.If) and _is_type_checking(node.test)):
            continue
        for stmt in node.body:
            if isinstance(stmt, ast.ImportFrom) and stmt.level == 0 and stmt.module:
                for a in stmt.names:
                    out[a.asname or a.name] = (stmt.module, a.name)
            elif isinstance(stmt, ast.Import):
                for a in stmt.names:
                    if a.asname:
                        out[a.asname] = (a.name, None)
    return out


def resolve(package: str, module: str, attr: str | None):
    """The object ``from module import attr`` gives (``import module`` when ``attr`` is None):
    the attribute, else the submodule ``module.attr``. A name imported from the package itself
    (``from sitelens import baselines``) is its submodule."""
    if attr is None:
        return importlib.import_module(module)
    if module == package:
        return importlib.import_module(f"{module}.{attr}")
    mod = importlib.import_module(module)
    try:
        return getattr(mod, attr)
    except AttributeError:
        return importlib.import_module(f"{module}.{attr}")


# every package set up by attach(), for bind_names_of
PACKAGES: list[types.ModuleType] = []


def bind_names_of(module: types.ModuleType) -> None:
    """Bind, in every lazy package, the names it imports from ``module``, which has just run: the
    package holds the objects ``module`` defined, as an eager import would have, so a later
    monkeypatch of ``module``'s attribute does not reach the package's name (and does not stay
    there after the patch is undone). A name already bound, or not defined by ``module`` (yet), is
    left alone."""
    for package in PACKAGES:
        names = package.__dict__
        for name, (source, attr) in names["__lazy_targets__"].items():
            if source == module.__name__ and name not in names:
                if attr is None:
                    names[name] = module
                elif attr in module.__dict__:
                    names[name] = module.__dict__[attr]


def submodule(package: str, name: str) -> types.ModuleType:
    """The submodule ``package.name``, imported; :class:`AttributeError` where there is none."""
    if not name.startswith("__"):
        try:
            return importlib.import_module(f"{package}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{package}.{name}":
                raise
    raise AttributeError(f"module {package!r} has no attribute {name!r}")


class LazyModule(types.ModuleType):
    """A package whose public names are lazy (its ``__class__`` after :func:`attach`).

    The import system binds every newly imported submodule as an attribute of its package, right
    after the submodule ran; that binding is the moment to bind what every lazy package imports
    from it (:func:`bind_names_of`). Where the package re-exports another object under the
    submodule's name (the function ``evaluate`` of the module ``evaluate``), the submodule itself
    is not bound."""

    def __setattr__(self, name: str, value) -> None:
        if isinstance(value, types.ModuleType):
            bind_names_of(value)
            targets = self.__dict__.get("__lazy_targets__", {})
            if name in targets:
                module, attr = targets[name]
                if attr is not None and value.__name__ != f"{module}.{attr}" and module != self.__name__:
                    return  # the submodule stays in sys.modules; the name keeps its re-export
        super().__setattr__(name, value)


def attach(package: str, file: str, extra: dict[str, Callable[[], object]] | None = None):
    """``(__getattr__, __dir__)`` for the package ``package`` whose source is ``file``: the names of
    its ``TYPE_CHECKING`` imports, plus ``extra`` (name -> a function that builds the value), each
    imported (built) on first access and then bound in the package; any other name is a submodule
    (imported), else an :class:`AttributeError`."""
    targets = type_checking_imports(Path(file).read_text(encoding="utf-8"))
    extra = dict(extra or {})
    module = sys.modules[package]
    module.__lazy_targets__ = targets
    module.__class__ = LazyModule
    PACKAGES.append(module)
    for source in {s for s, _ in targets.values()} & set(sys.modules):  # already imported
        bind_names_of(sys.modules[source])

    def __getattr__(name: str):
        if name in extra:
            value = extra[name]()
        elif name in targets:
            value = resolve(package, *targets[name])
        else:  # a submodule, as after the eager imports (``sitelens.models.kv.unembed_last``)
            value = submodule(package, name)
        module.__dict__[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(module.__dict__) | set(targets) | set(extra))

    return __getattr__, __dir__


__all__ = ["PACKAGES", "LazyModule", "Targets", "attach", "bind_names_of", "resolve",
           "submodule", "type_checking_imports"]
