"""Light imports (issue 33, item 2): ``import sitelens``, ``sitelens --help`` (and every
subcommand's), bad command lines and ``sitelens atlas`` from the committed tables import neither
torch, TransformerLens, transformers nor plotly; the public names still resolve, on first access.

Each check runs in a fresh interpreter (``sys.modules`` of this one already holds everything) and
reports which heavy libraries it found loaded. A copy of the package with one eager import planted
in ``sitelens/__init__.py`` makes the same check report torch, so the check can fail.

Two bad-input paths do import torch, and only torch: ``--device`` (which devices exist is
torch's answer) and ``--adapter`` (an adapter is checked by reading its tensors).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

from sitelens.lazy import LazyModule, resolve, type_checking_imports

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
    ["figures", "--models", "tiny-random", "--tasks", "antonym", "--out", "figs"],
    ["atlas", "--out", "a.html", "--data", "no_such_dir"],
    ["no-such-command"],
]
HELP = [["--help"]] + [[c, "--help"] for c in ("fit", "eval", "run", "bench", "demo", "heads",
                                                 "figures", "atlas", "patch")] + [
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
    assert sitelens.load_model is load_model and sitelens.fit_site is fit_site
    assert sitelens.plotting.alpha_heatmap is alpha_heatmap
    assert all(getattr(sitelens, n) is not None for n in sitelens.__all__)
    assert set(sitelens.__all__) <= set(dir(sitelens))
    out = sorted(set(sitelens.__all__) - set(vars(sitelens)))
    """)
    assert r["out"] == []  # each name bound in the package once resolved
    assert {"torch", "plotly"} <= set(r["heavy"])  # resolving them is what imports the libraries


PACKAGES = ["sitelens", "sitelens.models", "sitelens.tasks", "sitelens.site", "sitelens.eval",
            "sitelens.patching", "sitelens.baselines", "sitelens.lenses"]


@pytest.mark.parametrize("package", PACKAGES)
def test_every_lazy_name_is_what_its_import_gives(package):
    """Each name of a package's ``TYPE_CHECKING`` block is the object its import statement names,
    and every name of its ``__all__`` resolves."""
    import importlib

    mod = importlib.import_module(package)
    targets = type_checking_imports(Path(mod.__file__).read_text())
    assert targets, package
    for name, (module, attr) in targets.items():
        assert getattr(mod, name) is resolve(package, module, attr), (package, name)
    for name in mod.__all__:
        assert getattr(mod, name) is not None, (package, name)


def test_a_submodule_does_not_shadow_the_function_of_its_name():
    """``sitelens.eval.evaluate`` (and ``sitelens.evaluate``) stay the function when the module
    of the same name is imported first; the deprecated module paths still import."""
    r = heavy_after("""
    import importlib, types, warnings
    import sitelens.eval.evaluate
    module = sys.modules["sitelens.eval.evaluate"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import sitelens.evaluate
        import sitelens.bench
        old_metrics = importlib.import_module("sitelens.metrics")
    import sitelens.pipelines.bench
    out = [sitelens.eval.evaluate is module.evaluate, sitelens.evaluate is module.evaluate,
           sys.modules["sitelens.evaluate"] is module, sitelens.bench is sitelens.pipelines.bench,
           old_metrics is sys.modules["sitelens.eval.metrics"], sitelens.metrics is old_metrics]
    """)
    assert r["out"] == [True] * 6


def test_type_checking_imports_reads_the_block():
    src = textwrap.dedent("""
        import os
        from typing import TYPE_CHECKING
        from a import eager
        if TYPE_CHECKING:
            from pkg.x import f, g as h
            from pkg import sub
            import pkg.y as y
            import pkg.z
        if typing.TYPE_CHECKING:
            from pkg.w import k
    """)
    assert type_checking_imports(src) == {"f": ("pkg.x", "f"), "h": ("pkg.x", "g"),
                                          "sub": ("pkg", "sub"), "y": ("pkg.y", None),
                                          "k": ("pkg.w", "k")}


def test_lazy_module_refuses_only_a_shadowing_submodule():
    m = types.ModuleType("pkg")
    m.__lazy_targets__ = {"run": ("pkg.run", "run"), "sub": ("pkg", "sub"),
                          "tool": ("pkg.other", "tool")}
    m.__class__ = LazyModule
    m.run = types.ModuleType("pkg.run")  # the submodule pkg.run: its function keeps the name
    assert "run" not in vars(m)
    m.sub = sub = types.ModuleType("pkg.sub")  # a submodule named as itself
    m.tool = tool = types.ModuleType("pkg.other.tool")  # a module re-exported under its name
    m.run = run = object()  # anything but a module
    assert (m.sub, m.tool, m.run) == (sub, tool, run)


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


def test_a_patch_before_first_use_does_not_reach_the_package():
    """A package name is bound when its module runs (as the eager import did): patching the
    module's attribute before the name's first use changes neither ``sitelens.tasks.load_task``
    nor ``sitelens.load_task``. A submodule is an attribute without an import, as it was."""
    r = heavy_after("""
    import sitelens.tasks.core as core
    real = core.load_task
    core.load_task = None  # a monkeypatch, before anything used the package's name
    import sitelens, sitelens.tasks
    out = [sitelens.tasks.load_task is real, sitelens.load_task is real,
           sitelens.tasks.regression is sys.modules["sitelens.tasks.regression"],  # a submodule
           hasattr(sitelens.tasks, "no_such_module")]
    """)
    assert r["out"] == [True, True, True, False]


def test_bind_names_of_binds_only_what_the_module_defines(monkeypatch):
    from sitelens import lazy

    pkg = types.ModuleType("pkg")
    pkg.__lazy_targets__ = {"f": ("pkg.m", "f"), "g": ("pkg.m", "g"), "m2": ("pkg.m", None),
                            "h": ("pkg.other", "h")}
    monkeypatch.setattr(lazy, "PACKAGES", [pkg])
    m = types.ModuleType("pkg.m")
    m.f = f = object()
    lazy.bind_names_of(m)
    assert (pkg.f, pkg.m2) == (f, m) and not hasattr(pkg, "g") and not hasattr(pkg, "h")
