"""The public API, ``sitelens.__all__``: light to import, complete, and what the docs use.

- ``import sitelens`` does not load plotly (plots import it on first access);
- every name in ``__all__`` resolves, once, and ``from sitelens import *`` gives them all;
- every ``sl.NAME`` / ``sitelens.NAME`` / ``from sitelens import NAME`` in the README, the docs
  pages and the notebooks is a submodule or in ``__all__``;
- ``sitelens.cli.main`` is the console script (pyproject) and ``python -m sitelens.cli`` runs it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import sitelens

ROOT = Path(__file__).resolve().parents[1]


def _run_python(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, text=True,
                          capture_output=True, timeout=300)


def test_import_does_not_load_plotly():
    r = _run_python("import sitelens, sys; assert 'plotly' not in sys.modules, 'plotly loaded'; "
                    "import sitelens.cli; assert 'plotly' not in sys.modules, 'plotly via cli'")
    assert r.returncode == 0, r.stderr


def test_plotting_names_load_on_first_access():
    r = _run_python(
        "import sys, sitelens\n"
        "assert 'make_figures' in dir(sitelens) and 'plotly' not in sys.modules\n"
        "from sitelens import make_figures, FigureConfig\n"
        "assert 'plotly' in sys.modules\n"
        "import sitelens.pipelines.figures as F\n"
        "assert make_figures is F.make_figures and FigureConfig is F.FigureConfig\n"
    )
    assert r.returncode == 0, r.stderr


def test_every_public_name_resolves():
    names = sitelens.__all__
    assert len(names) == len(set(names)), "a name is listed twice in __all__"
    for name in names:
        assert getattr(sitelens, name) is not None, name
    ns: dict = {}
    exec("from sitelens import *", ns)
    assert set(names) <= set(ns)
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        sitelens.no_such_name  # noqa: B018


def test_api_names_the_issue_asks_for():
    must = {"Method", "Fitted", "prepare_bridge", "FigureConfig", "make_figures",
            "NUMERICS_VERSION", "Protocol", "MethodError", "UsageError", "SitelensError"}
    assert must <= set(sitelens.__all__)


def _doc_texts() -> list[tuple[str, str]]:
    """(file, text) of the README, the docs pages and the notebooks' code cells."""
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    out = [(str(f.relative_to(ROOT)), f.read_text(encoding="utf-8")) for f in files]
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(nb.read_text(encoding="utf-8"))["cells"]
        code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        out.append((str(nb.relative_to(ROOT)), code))
    return out


_ATTR = re.compile(r"(?<![\w./-])(?:sl|sitelens)\.([A-Za-z_]\w*)")
_FROM = re.compile(r"from sitelens import \(?([\w, \n]+)\)?")


def _used_names(text: str) -> set[str]:
    names = set(_ATTR.findall(text))
    for group in _FROM.findall(text):
        names |= {n.strip() for n in group.split(",") if n.strip()}
    return names


def test_names_used_in_the_docs_are_public():
    missing = []
    for where, text in _doc_texts():
        for name in sorted(_used_names(text)):
            if name.startswith("__"):
                continue  # sl.__all__, sitelens.__version__
            if importlib.util.find_spec(f"sitelens.{name}") is not None:
                continue  # a subpackage: sitelens.models, sl.lenses, ...
            if name not in sitelens.__all__:
                missing.append(f"{where}: {name}")
    assert not missing, "used in the docs but not in sitelens.__all__: " + ", ".join(missing)


def test_console_script_is_cli_entry():
    # entry() runs main() and exits with its status (tests/test_cli_entry.py)
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    scripts = pyproject.split("[project.scripts]", 1)[1].split("\n[", 1)[0]
    assert re.search(r'^sitelens\s*=\s*"sitelens\.cli:entry"', scripts, re.M), scripts
    from sitelens.cli import build_parser, entry, main

    assert callable(entry) and callable(main) and callable(build_parser)
    r = subprocess.run([sys.executable, "-m", "sitelens.cli", "--help"], cwd=ROOT, text=True,
                       capture_output=True, timeout=300)
    assert r.returncode == 0 and "patch" in r.stdout and "figures" in r.stdout, r.stderr


def test_eval_evaluate_is_the_function_even_after_its_module_is_imported():
    """A package attribute named like one of its submodules is replaced by the module when that
    submodule is imported; evaluate's module is named apart, so the name stays the function."""
    import importlib

    import sitelens
    import sitelens.eval

    importlib.import_module("sitelens.eval.evaluation")
    from sitelens.eval import evaluate

    assert callable(evaluate) and evaluate is sitelens.evaluate
    assert evaluate.__module__ == "sitelens.eval.evaluation"
