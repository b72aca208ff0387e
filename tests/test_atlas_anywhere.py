"""``sitelens atlas`` finds its tables wherever it runs: the bundled models' tables ship inside the
package (``sitelens/data/atlas``, package data of the wheel), so the page builds from any working
folder and from a wheel installed in a fresh virtual environment; where there are no tables, the
one-line error says where it looked and what to try, a refit (hours) last.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from sitelens.atlas import tables
from sitelens.cli import main

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ("gemma-3-270m", "smollm2-135m-instruct")


def _env_without_checkout_path() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["OMP_NUM_THREADS"] = "1"
    return env


def _error(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert out == "" and len(lines) == 1 and lines[0].startswith("sitelens: error: "), err
    return lines[0]


def test_default_tables_are_the_shipped_ones():
    import sitelens

    assert tables.DEFAULT_DATA_DIR == Path(sitelens.__file__).resolve().parent / "data" / "atlas"
    assert tables.models_under(tables.DEFAULT_DATA_DIR) == list(SHIPPED)
    assert tables.data_dir(None) == tables.DEFAULT_DATA_DIR
    assert tables.data_dir("x") == Path("x")


def test_atlas_from_another_folder(tmp_path):
    """The real command in a process whose working folder is not the checkout (about 9 s)."""
    env = _env_without_checkout_path()
    env["PYTHONPATH"] = str(ROOT)  # this checkout's sitelens, whatever is installed
    r = subprocess.run([sys.executable, "-m", "sitelens.cli", "atlas", "--out", "a.html"], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "gemma-3-270m (29 tasks), smollm2-135m-instruct (57 tasks)" in r.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.html"]  # nothing else written here
    assert '"default_model":"smollm2-135m-instruct"' in (tmp_path / "a.html").read_text(encoding="utf-8")


def test_a_cwd_relative_default_would_fail_elsewhere(tmp_path, monkeypatch, capsys):
    """Mutation: the old default (``figures/atlas`` under the working folder) is refused from another
    folder, where the shipped default passes the same check."""
    from sitelens.cli.parser import build_parser
    from sitelens.cli.validate import check_atlas_options

    monkeypatch.chdir(tmp_path)
    check_atlas_options(build_parser().parse_args(["atlas", "--out", "a.html"]))  # no error
    monkeypatch.setattr(tables, "DEFAULT_DATA_DIR", Path("figures/atlas"))
    assert "No atlas tables under figures/atlas" in _error(capsys, ["atlas", "--out", "a.html"])


def test_no_tables_messages_fit_the_situation(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    # --data pointing nowhere: the shipped tables first, --data DIR next, the refit and its cost last
    line = _error(capsys, ["atlas", "--out", "a.html", "--data", "nowhere"])
    assert "under nowhere (it does not exist)" in line
    i_ship, i_data = line.index("Drop --data"), line.index("point --data DIR")
    i_refit = line.index("only as a last resort")
    assert i_ship < i_data < i_refit
    assert ", ".join(SHIPPED) in line and "--refit --tasks-dir DIR" in line and "hours per model" in line
    # an empty folder
    (tmp_path / "empty").mkdir()
    assert "(it has no model folder with a summary.json)" in _error(
        capsys, ["atlas", "--out", "a.html", "--data", "empty"])
    # a model the shipped tables lack: choose among those there (no advice to drop --data)
    line = _error(capsys, ["atlas", "--out", "a.html", "--models", "tiny-random"])
    assert f"No atlas tables for tiny-random under {tables.DEFAULT_DATA_DIR}" in line
    assert f"it holds tables of {', '.join(SHIPPED)}" in line and "Choose among those with --models" in line
    assert "Drop --data" not in line
    # an installation without its shipped tables
    monkeypatch.setattr(tables, "DEFAULT_DATA_DIR", tmp_path / "pkg" / "data" / "atlas")
    line = _error(capsys, ["atlas", "--out", "a.html"])
    assert "lacks its shipped tables: reinstall it" in line and "Drop --data" not in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty"]  # nothing half-written


def test_load_atlas_defaults_to_the_shipped_tables_and_says_what_is_missing(tmp_path):
    from sitelens.atlas import load_atlas
    from sitelens.errors import OutputError

    with pytest.raises(OutputError, match="for nope under .*it holds tables of gemma-3-270m"):
        load_atlas(None, ["nope"])
    with pytest.raises(OutputError, match="it does not exist"):
        load_atlas(tmp_path / "x")


def _build_wheel(tmp_path: Path) -> Path:
    """A wheel of this checkout, built from a copy of what the build reads (nothing written here)."""
    src = tmp_path / "src"
    src.mkdir()
    for f in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / f, src / f)
    shutil.copytree(ROOT / "sitelens", src / "sitelens",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path / "dist"), str(src)], check=True, capture_output=True, timeout=600)
    (wheel,) = (tmp_path / "dist").glob("sitelens-*.whl")
    return wheel


@pytest.mark.integration
def test_atlas_from_a_wheel_in_a_fresh_venv(tmp_path):
    """The wheel carries the tables: installed (``--no-deps``) into a new virtual environment, whose
    only other path is this interpreter's site-packages (for torch, pandas, ...: a ``.pth``, which
    does not run that folder's own ``.pth`` files, so an editable install there stays out), the
    console script builds the page from a folder far from any checkout (about 30 s)."""
    import zipfile

    wheel = _build_wheel(tmp_path)
    names = zipfile.ZipFile(wheel).namelist()
    for model in SHIPPED:
        for f in ("alpha.csv", "similarity.csv", "transfer.csv", "tokens.csv", "lenses.csv", "summary.json"):
            assert f"sitelens/data/atlas/{model}/{f}" in names
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)  # its own pip
    py = venv / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    subprocess.run([str(py), "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)],
                   check=True, capture_output=True, timeout=600, env=_env_without_checkout_path())
    # after the install: with the .pth first, pip would take the editable sitelens for installed
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = _env_without_checkout_path()
    where = subprocess.run([str(py), "-c", "import sitelens.atlas as a; print(a.DEFAULT_DATA_DIR)"],
                           cwd=elsewhere, env=env, check=True, capture_output=True, text=True).stdout.strip()
    assert Path(where) == site / "sitelens" / "data" / "atlas"  # the installed copy, not the checkout
    r = subprocess.run([str(venv / "bin" / "sitelens"), "atlas", "--out", "a.html"], cwd=elsewhere, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "gemma-3-270m (29 tasks), smollm2-135m-instruct (57 tasks)" in r.stdout
