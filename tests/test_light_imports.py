"""Light imports (issue 33, item 2): ``import sitelens``, ``sitelens --help`` (and every
subcommand's), bad command lines and ``sitelens atlas`` from the committed tables import neither
torch, TransformerLens, transformers nor plotly; the public names still resolve, on first access
(:mod:`sitelens.lazy`), each to the object its ``TYPE_CHECKING`` import names, and monkeypatching
a package or a module works as on any module.

Each check runs in a fresh interpreter (``sys.modules`` of this one already holds everything) and
reports which heavy libraries it found loaded. A copy of the package with one eager import planted
in ``sitelens/__init__.py`` makes the same check report torch, so the check can fail.

Two bad-input paths do import torch, and only torch: ``--device`` (which devices exist is
torch's answer) and ``--adapter`` (an adapter is checked by reading its tensors).
"""

from __future__ import annotations

import ast
import importlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformer_lens", "transformers", "plotly")

# a command line per subcommand that validation refuses (unknown names, bad numbers, bad
# outputs); each runs in a fresh temporary working directory
BAD = [
    ["fit", "--model", "tiny-random", "--task", "no_such_task", "--out", "ad"],
    ["fit", "--model", "no-such-model", "--task", "antonym", "--out", "ad"],
    ["fit", "--model", "tiny-random", "--task", "antonym", "--out", "ad", "--lr=-1"],
    ["eval", "--model", "tiny-random", "--task", "antonym", "--methods", "nope"],
    ["eval", "--model", "tiny-random", "--task", "antonym", "--methods", "icl", "--n-shots",
     "100000"],
    ["run", "--model", "tiny-random", "--task", "no_such_task"],
    ["run", "--model", "tiny-random", "--task", "antonym", "--methods", "zero-shot", "--lr", "0.1"],
    ["run", "--model", "tiny-random", "--task", "antonym", "--out", "r", "--limit", "0"],
    ["bench", "--models", "tiny-random", "--tasks", "antonym", "--methods", "nope", "--out", "b.csv"],
    ["bench", "--models", "tiny-random", "--tasks", "antonym", "--methods", "zero-shot", "--out",
     "b.txt"],
    ["demo", "--model", "tiny-random", "--task", "antonym", "--seed", "-1"],
    ["patch", "intra", "--model", "tiny-random", "--task", "antonym", "--out", "i.txt"],
    ["patch", "inter", "--model", "tiny-random", "--tasks", "antonym", "--out", "x.csv"],
    ["patch", "effects", "--model", "tiny-random", "--task", "antonym", "--n-prompts", "0"],
    ["heads", "--model", "tiny-random", "--task", "antonym", "--lenses", "nope", "--out", "h.csv"],
    ["frontier", "--model", "tiny-random", "--task", "antonym", "--budgets", "0", "--out", "fr"],
    ["figures", "--models", "tiny-random", "--tasks", "antonym", "--out", "figs"],
    ["atlas", "--out", "a.html", "--data", "no_such_dir"],
    ["no-such-command"],
]
HELP = [["--help"]] + [[c, "--help"] for c in ("fit", "eval", "run", "bench", "demo", "heads",
                                                 "frontier", "figures", "atlas", "patch")] + [
    ["patch", c, "--help"] for c in ("intra", "inter", "effects")]


def heavy_after(code: str, pythonpath: Path = ROOT) -> dict:
    """Run ``code`` in a fresh interpreter (with ``pythonpath`` first on the path) and return
    ``{"heavy": [...], "out": ...}``: the :data:`HEAVY` libraries then in ``sys.modules`` and what
    ``code`` left in the variable ``out``."""
    prog = "import json, sys\nout = None\n" + textwrap.dedent(code) + (
        f"\nprint(json.dumps({{'heavy': [m for m in {HEAVY!r} if m in sys.modules], 'out': out}}))")
    env = {**os.environ, "PYTHONPATH": str(pythonpath), "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-c", prog], cwd=pythonpath, env=env, text=True,
                       capture_output=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def cli_code(argvs: list[list[str]]) -> str:
    """Code that runs ``sitelens.cli.main`` on each command line, each in a fresh temporary
    working directory, its stdout and stderr captured; ``out``: the exit statuses."""
    return textwrap.dedent(f"""
    import contextlib, io, os, tempfile
    from sitelens.cli import main
    out = []
    for argv in {argvs!r}:
        with tempfile.TemporaryDirectory() as d:
            os.chdir(d)
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                out.append(main(argv))
    """)


def test_import_sitelens_is_light():
    assert heavy_after("import sitelens, sitelens.cli")["heavy"] == []


def test_help_of_every_command_is_light():
    r = heavy_after(cli_code(HELP))
    assert r["out"] == [0] * len(HELP)
    assert r["heavy"] == []


def test_bad_input_is_refused_before_any_heavy_import():
    r = heavy_after(cli_code(BAD))
    assert r["out"] == [2] * len(BAD)
    assert r["heavy"] == []


@pytest.mark.parametrize("argv", [
    ["fit", "--model", "tiny-random", "--task", "antonym", "--out", "ad", "--device", "tpu"],
    ["eval", "--model", "tiny-random", "--task", "antonym", "--adapter", "no_such_adapter"],
], ids=["device", "adapter"])
def test_bad_device_or_adapter_imports_torch_only(argv):
    r = heavy_after(cli_code([argv]))
    assert r["out"] == [2]
    assert r["heavy"] == ["torch"]


def test_atlas_from_the_committed_tables_imports_no_model_library(tmp_path):
    """The page inlines plotly.js, read through ``plotly.offline`` (the bundle file); no figure
    code (``plotly.graph_objects``), no torch."""
    code = cli_code([["atlas", "--out", str(tmp_path / "a.html")]])  # the packaged tables
    r = heavy_after(code + "\nout = (out, 'plotly.graph_objects' in sys.modules)")
    assert r["out"] == [[0], False]
    assert (tmp_path / "a.html").stat().st_size > 0
    assert [m for m in r["heavy"] if m != "plotly"] == []


def test_public_names_resolve_on_first_access():
    r = heavy_after("""
    import sitelens
    from sitelens.models.load import load_model
    from sitelens.site.adapter import fit_site
    from sitelens.viz.plotting import alpha_heatmap
    from sitelens import viz
    assert sitelens.load_model is load_model and sitelens.fit_site is fit_site
    assert viz.plotting.alpha_heatmap is alpha_heatmap
    assert all(getattr(sitelens, n) is not None for n in sitelens.__all__)
    assert set(sitelens.__all__) <= set(dir(sitelens))
    out = sorted(set(sitelens.__all__) & set(vars(sitelens)))
    """)
    # the subpackages are bound by the import system; no other name is stored in the package
    assert r["out"] == ["atlas", "baselines", "lenses", "patching"]
    assert {"torch", "plotly"} <= set(r["heavy"])  # resolving them is what imports the libraries


PACKAGES = ["sitelens", "sitelens.models", "sitelens.tasks", "sitelens.site", "sitelens.eval",
            "sitelens.patching", "sitelens.baselines", "sitelens.lenses", "sitelens.pipelines",
            "sitelens.viz"]


def type_checking_imports(source: str) -> dict[str, tuple[str, str]]:
    """The names bound by the top-level ``if TYPE_CHECKING:`` block of ``source``:
    ``from m import a`` gives ``a -> (m, a)``."""
    out = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for stmt in node.body:
                assert isinstance(stmt, ast.ImportFrom) and stmt.module, ast.unparse(stmt)
                out |= {a.asname or a.name: (stmt.module, a.name) for a in stmt.names}
    return out


def submodules(package: types.ModuleType) -> set[str]:
    folder = Path(package.__file__).parent
    return {p.stem for p in folder.glob("*.py") if p.stem != "__init__"} | {
        p.name for p in folder.iterdir() if (p / "__init__.py").is_file()}


@pytest.mark.parametrize("package", PACKAGES)
def test_every_lazy_name_is_what_its_import_gives(package):
    """The two lists of a package's names agree: each name of its ``TYPE_CHECKING`` block (what
    type checkers and the docs read) is, at run time, the object its import statement names (a
    function or class imported from a module, from the module that defines it), and the package
    resolves no other name of its own (what ``dir`` lists beyond the package's own
    globals); every name of ``__all__`` resolves."""
    mod = importlib.import_module(package)
    assert type(mod) is types.ModuleType  # nothing overrides a module's attribute setting
    targets = type_checking_imports(Path(mod.__file__).read_text())
    for name, (module, attr) in targets.items():
        source = importlib.import_module(module)
        want = getattr(source, attr) if module != package else importlib.import_module(f"{module}.{attr}")
        assert getattr(mod, name) is want, (package, name)
        if isinstance(want, (type, types.FunctionType)) and not hasattr(source, "__path__"):
            assert want.__module__ == module, (package, name)  # from where it is defined, not a re-export
    assert set(dir(mod)) - set(vars(mod)) - set(targets) == set(), package
    assert set(targets) <= set(getattr(mod, "__all__", ()))
    for name in getattr(mod, "__all__", ()):
        assert getattr(mod, name) is not None, (package, name)
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        mod.no_such_name  # noqa: B018


@pytest.mark.parametrize("package", PACKAGES)
def test_no_name_is_also_a_submodule(package):
    """A package names nothing after one of its submodules but that submodule: importing the
    submodule binds it as the package's attribute, which would hide the other object (the function
    ``evaluate`` is therefore ``sitelens.evaluate``, and ``sitelens.eval.evaluation`` its module)."""
    mod = importlib.import_module(package)
    targets = type_checking_imports(Path(mod.__file__).read_text())
    clash = {n: t for n, t in targets.items() if n in submodules(mod) and t != (package, n)}
    assert clash == {}


def test_old_module_paths_are_gone():
    """One path per module: the paths of modules before they moved into packages do not import."""
    for old in ("sitelens.plotting", "sitelens.bench", "sitelens.metrics", "sitelens.evaluate"):
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(old)


def test_type_checking_imports_reads_the_block():
    src = textwrap.dedent("""
        import os
        from typing import TYPE_CHECKING
        from a import eager
        if TYPE_CHECKING:
            from pkg.x import f, g as h
            from pkg import sub
    """)
    assert type_checking_imports(src) == {"f": ("pkg.x", "f"), "h": ("pkg.x", "g"),
                                          "sub": ("pkg", "sub")}


def test_an_eager_import_planted_in_the_package_is_caught(tmp_path):
    """The mutation: ``sitelens/__init__.py`` importing ``load_model`` at the top (as it once did)
    makes ``import sitelens`` load torch, and the check above sees it."""
    shutil.copytree(ROOT / "sitelens", tmp_path / "sitelens",
                    ignore=shutil.ignore_patterns("__pycache__"))
    init = tmp_path / "sitelens" / "__init__.py"
    init.write_text(init.read_text() + "\nfrom sitelens.models import load_model  # planted\n")
    assert "torch" in heavy_after("import sitelens", pythonpath=tmp_path)["heavy"]
    assert heavy_after("import sitelens; out = sitelens.__file__", pythonpath=tmp_path)["out"] \
        == str(init)


def test_monkeypatching_a_module_or_a_package_works_and_is_undone(monkeypatch):
    """A package name is looked up in its module at every access: a patch of the module is seen
    through the package while it lasts, a patch of the package name replaces only that name, and
    undoing either leaves the real object everywhere."""
    import sitelens
    import sitelens.tasks
    import sitelens.tasks.core as core

    real, fake = core.load_task, object()
    with monkeypatch.context() as m:
        m.setattr(core, "load_task", fake)
        assert sitelens.tasks.load_task is fake and sitelens.load_task is fake
    assert core.load_task is real and sitelens.tasks.load_task is real and sitelens.load_task is real
    with monkeypatch.context() as m:
        m.setattr(sitelens.tasks, "load_task", fake)
        assert sitelens.tasks.load_task is fake and core.load_task is real
    assert sitelens.tasks.load_task is real and sitelens.load_task is real
    assert sitelens.tasks.regression is sys.modules["sitelens.tasks.regression"]  # a submodule
    assert not hasattr(sitelens.tasks, "no_such_module")
