"""The house rules of the package layout, checked on the source (no import of sitelens needed).

- imports point one way: no cycle among sitelens's modules, counting imports inside functions and
  following a name imported from a package ``__init__`` to the module that defines it;
- packages sit in layers (:data:`LAYERS`) and import only from their own layer or below;
- no private name (``_x``) is imported across packages or from ``benchmarks/``, and no package
  ``__init__`` re-exports one (a top-level module counts as its own package);
- configuration is passed, never written into the environment: no ``os.environ`` write of a
  ``SITELENS_*`` variable;
- every committed benchmark report names the command that regenerates it.

No rule counts lines: a module is as long as what it holds needs.

Each checker is also run on a small planted package in a temporary folder, so a checker that
stopped seeing cycles, private imports or environment writes fails here too.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "sitelens"

# Lowest first; a module may import from its own layer or any layer below it. The leaves are the
# top-level modules; `sitelens/__init__.py` (the public API) sits above all.
LAYERS = [
    {"errors", "io", "provenance", "format", "lazy", "stats", "heads", "threads"},
    {"models", "testing"},  # sitelens.testing builds models; load_model names its tiny ones
    {"tasks"},
    {"site"},
    {"eval"},
    {"patching"},
    {"baselines"},
    {"lenses", "viz"},
    {"pipelines"},
    {"atlas"},
    {"cli"},
    {"__init__"},
]


class Graph:
    """Modules of one package (dotted names; a package's ``__init__`` is ``pkg.__init__``) and the
    modules each one imports, resolved to the defining module."""

    def __init__(self, root: Path):
        self.root, self.pkg, self.base = root, root.name, root.parent
        self.files = {self.modname(f): f for f in sorted(root.rglob("*.py"))}
        self.trees = {m: ast.parse(f.read_text()) for m, f in self.files.items()}
        self.edges: dict[str, set[str]] = {m: set() for m in self.files}
        self.private: list[str] = []
        for m, tree in self.trees.items():
            for target, name in self.imports(m, tree):
                self.add(m, target, name)

    def modname(self, f: Path) -> str:
        return ".".join(f.relative_to(self.base).with_suffix("").parts)

    def module_of(self, dotted: str) -> str | None:
        if dotted in self.files:
            return dotted
        if f"{dotted}.__init__" in self.files:
            return f"{dotted}.__init__"
        return None

    def imports(self, m: str, tree):
        """``(module, name or None)`` for every import of the package anywhere in ``m``."""
        here = m.split(".")[:-1]
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    yield a.name, None
            elif isinstance(node, ast.ImportFrom):
                mod = node.module or ""
                if node.level:
                    mod = ".".join(here[: len(here) - node.level + 1] + ([mod] if mod else []))
                for a in node.names:
                    yield mod, a.name

    def unit(self, m: str) -> str:
        """The package a module belongs to (a top-level module is its own)."""
        parts = m.removesuffix(".__init__").split(".")
        return parts[1] if len(parts) > 1 else "__init__"

    def defining(self, init: str, name: str, seen=()) -> str:
        """The module that defines ``name`` re-exported by the package ``init`` (or ``init``)."""
        pkg = init.removesuffix(".__init__")
        for target, imported in self.imports(init, self.trees[init]):
            if imported == name and (target == pkg or target.startswith(pkg + ".")):
                mod = self.module_of(target)
                if mod and mod.endswith("__init__") and mod not in seen and mod != init:
                    return self.defining(mod, name, (*seen, init))
                if mod:
                    return mod
        return init

    def add(self, m: str, target: str, name: str | None) -> None:
        if not (target == self.pkg or target.startswith(self.pkg + ".")):
            return
        mod = self.module_of(f"{target}.{name}") if name else None  # `from pkg import submodule`
        if mod is None:
            mod = self.module_of(target)
            if mod is None:
                return
            if name and mod.endswith("__init__") and not name.startswith("_"):
                mod = self.defining(mod, name)
        if name and name.startswith("_") and not name.startswith("__"):
            if m.endswith("__init__") or self.unit(m) != self.unit(mod):
                self.private.append(f"{m} imports {name} from {mod}")
        if mod != m:
            self.edges[m].add(mod)

    def cycles(self) -> list[list[str]]:
        """Strongly connected components of more than one module, leaving out the edges into a
        package ``__init__`` (importing a submodule runs its package's ``__init__``; that is not
        a dependency of the submodule on its siblings)."""
        edges = {m: {t for t in ts if not t.endswith("__init__")} for m, ts in self.edges.items()}
        index: dict[str, int] = {}
        low: dict[str, int] = {}
        stack: list[str] = []
        on: set[str] = set()
        out: list[list[str]] = []

        def visit(v: str) -> None:
            index[v] = low[v] = len(index)
            stack.append(v)
            on.add(v)
            for w in edges.get(v, ()):
                if w not in index:
                    visit(w)
                    low[v] = min(low[v], low[w])
                elif w in on:
                    low[v] = min(low[v], index[w])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))

        for v in list(edges):
            if v not in index:
                visit(v)
        return out


def layer_of(unit: str) -> int:
    for i, layer in enumerate(LAYERS):
        if unit in layer:
            return i
    raise AssertionError(f"sitelens/{unit} is in no layer of tests/test_house.py::LAYERS: place it")


def upward_imports(g: Graph) -> list[str]:
    bad = []
    for m, targets in g.edges.items():
        for t in targets:
            a, b = g.unit(m), g.unit(t)
            if a != b and layer_of(b) > layer_of(a):
                bad.append(f"{m} ({a}) imports {t} ({b}), a higher layer")
    return bad


def environ_writes(root: Path) -> list[str]:
    """``os.environ[...] = ...``, ``os.environ.update/setdefault(...)`` or ``os.putenv`` of a
    ``SITELENS_*`` name (a literal or a module-level constant holding one)."""
    found = []
    for f in sorted(root.rglob("*.py")):
        tree = ast.parse(f.read_text())
        consts = {t.id: n.value.value for n in ast.walk(tree) if isinstance(n, ast.Assign)
                  and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
                  for t in n.targets if isinstance(t, ast.Name)}

        def names_sitelens(node, consts=consts) -> bool:
            if node is None:
                return True  # a computed key (a loop over names, a dict): counted as a write
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                return node.value.startswith("SITELENS_")
            if isinstance(node, ast.Name):
                return consts.get(node.id, "SITELENS_").startswith("SITELENS_")
            return True

        def is_environ(node) -> bool:
            return isinstance(node, ast.Attribute) and node.attr == "environ"

        for node in ast.walk(tree):
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    if isinstance(t, ast.Subscript) and is_environ(t.value) and names_sitelens(t.slice):
                        found.append(f"{f.relative_to(root.parent)}:{node.lineno}")
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                fn = node.func
                if is_environ(fn.value) and fn.attr in ("update", "setdefault"):
                    key = node.args[0] if fn.attr == "setdefault" and node.args else None
                    if names_sitelens(key):
                        found.append(f"{f.relative_to(root.parent)}:{node.lineno}")
                elif fn.attr == "putenv" and names_sitelens(node.args[0] if node.args else None):
                    found.append(f"{f.relative_to(root.parent)}:{node.lineno}")
    return found


@pytest.fixture(scope="module")
def graph() -> Graph:
    return Graph(PKG)


def test_no_import_cycle(graph):
    assert graph.cycles() == []


def test_imports_point_down_the_layers(graph):
    assert upward_imports(graph) == []


def test_no_private_name_crosses_a_package(graph):
    from_outside = []
    for f in sorted((ROOT / "benchmarks").rglob("*.py")) + sorted((ROOT / "scripts").rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sitelens"):
                from_outside += [f"{f.name} imports {a.name} from {node.module}" for a in node.names
                                 if a.name.startswith("_") and not a.name.startswith("__")]
    assert graph.private == [] and from_outside == []


def test_no_sitelens_variable_written_into_the_environment():
    assert environ_writes(PKG) == []


# ------------------------------------------------------------------------------------------------
# the checkers on a planted package: each rule broken once


def _plant(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "sitelens"
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


def test_checkers_catch_planted_breaks(tmp_path):
    root = _plant(tmp_path, {
        "__init__.py": "from sitelens.a.x import f\n",
        "errors.py": "import os\nNAME = 'SITELENS_DEVICE'\n\ndef g(v):\n    os.environ[NAME] = v\n",
        "a/__init__.py": "from sitelens.a.x import f, _helper\n",  # re-exports a private name
        "a/x.py": "def f():\n    from sitelens.b import h  # a cycle through a function-level import\n"
                  "def _helper(): ...\n",
        "b/__init__.py": "from sitelens.b.y import h\n",
        "b/y.py": "from sitelens.a import f\nfrom sitelens.a.x import _helper\n\ndef h(): ...\n",
    })
    g = Graph(root)
    assert g.cycles() == [["sitelens.a.x", "sitelens.b.y"]]  # followed through both __init__ files
    assert sorted(g.private) == ["sitelens.a.__init__ imports _helper from sitelens.a.x",
                                 "sitelens.b.y imports _helper from sitelens.a.x"]
    assert environ_writes(root) == ["sitelens/errors.py:5"]
    clean = _plant(tmp_path / "clean", {"__init__.py": "", "a/__init__.py": "", "a/x.py": "import os\n"
                                        "X = os.environ.get('SITELENS_CACHE')\n"})
    assert Graph(clean).cycles() == [] and Graph(clean).private == [] and environ_writes(clean) == []


def test_every_result_names_its_command():
    """Every committed results table says in its first lines which command regenerates it."""
    command = re.compile(r"python (benchmarks|scripts)/|sitelens [a-z]+|bash (benchmarks|scripts)/")
    silent = [f.name for f in sorted((ROOT / "benchmarks" / "results").glob("*.md"))
              if not command.search("\n".join(f.read_text().splitlines()[:5]))]
    assert silent == []
