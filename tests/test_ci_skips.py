"""The CI skip rule of tests/conftest.py, run on a throwaway suite (pytester, in process, with the
conftest's two hooks as its only plugin): under ``CI`` a skip whose reason names no GPU or missing
backend fails, wherever it happens (in the test, in a fixture, by a ``skipif`` mark, at module
level); a GPU or HookedTransformer skip and an xfail stay as they are; without ``CI`` every skip is a
skip."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
import types
from pathlib import Path

import conftest
import pytest

pytest_plugins = ["pytester"]
ROOT = Path(__file__).resolve().parents[1]

SUITE = {
    "test_skips": """
        import pytest

        @pytest.fixture
        def chromium():
            pytest.skip("no Chromium executable found")

        def test_in_body():
            pytest.skip("no ../shared/datasets folder")

        def test_in_fixture(chromium):
            pass

        @pytest.mark.skipif(True, reason="playwright is not importable")
        def test_by_mark():
            pass

        def test_gpu():
            pytest.skip("needs a CUDA GPU")

        def test_backend():
            pytest.skip("HookedTransformer only: reads W_O")

        @pytest.mark.xfail(reason="known", strict=True)
        def test_xfail():
            assert False
    """,
    "test_module_skip": """
        import pytest
        pytest.skip("nbmake is not installed", allow_module_level=True)

        def test_never():
            pass
    """,
}


def ci_skip_hooks() -> types.ModuleType:
    """The conftest's two hooks as a plugin (read when called, so a monkeypatched conftest counts)."""
    plugin = types.ModuleType("ci_skip_hooks")
    plugin.pytest_runtest_makereport = conftest.pytest_runtest_makereport
    plugin.pytest_make_collect_report = conftest.pytest_make_collect_report
    return plugin


def run_suite(pytester, monkeypatch, ci: str | None):
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    pytester.makepyfile(**SUITE)
    return pytester.runpytest_inprocess("-p", "no:cacheprovider", "-rA", "--continue-on-collection-errors",
                                        plugins=[ci_skip_hooks()])


def _names(reports) -> list[str]:
    return sorted(r.nodeid.rsplit("::", 1)[-1] for r in reports)


def test_under_ci_only_a_gpu_or_backend_skip_passes(pytester, monkeypatch):
    result = run_suite(pytester, monkeypatch, "1")
    _, skipped, failed = result.reprec.listoutcomes()
    assert _names(failed) == ["test_by_mark", "test_in_body", "test_in_fixture", "test_module_skip.py"], (
        "under CI these skips must fail", _names(failed))
    assert _names(skipped) == ["test_backend", "test_gpu", "test_xfail"]  # an xfail is skipped + wasxfail
    assert _names(result.reprec.getfailedcollections()) == ["test_module_skip.py"]
    why = {r.nodeid.rsplit("::", 1)[-1]: str(r.longrepr) for r in failed}
    body = why["test_in_body"]
    assert body.startswith("skipped under CI: ") and "../shared/datasets" in body


def test_without_ci_a_skip_is_a_skip(pytester, monkeypatch):
    result = run_suite(pytester, monkeypatch, None)
    result.assert_outcomes(skipped=6, xfailed=1)


# ----------------------------------------------------------------------------------------------
# the hooked backend must import on TransformerLens 3.x under CI


def _installed(monkeypatch, version: str | None, module: types.ModuleType | None) -> None:
    """A TransformerLens distribution of ``version`` (None: not installed) whose package is
    ``module`` (None: the import fails, as a missing file or a broken dependency does)."""
    real = importlib.metadata.version

    def version_of(name):
        if name != "transformer_lens":
            return real(name)
        if version is None:
            raise importlib.metadata.PackageNotFoundError(name)
        return version

    monkeypatch.setattr(importlib.metadata, "version", version_of)
    monkeypatch.setitem(sys.modules, "transformer_lens", module)


def _package(kind: str) -> types.ModuleType | None:
    if kind == "missing":
        return None
    tl = types.ModuleType("transformer_lens")
    if kind == "hooked":
        tl.HookedTransformer = object
    else:  # the class's own imports fail (a broken dependency), with an error other than ImportError
        def broken(name):
            raise RuntimeError(f"{name}: a broken dependency")
        tl.__getattr__ = broken
    return tl


@pytest.mark.parametrize("version, package, error", [
    ("3.9.0", "missing", "ModuleNotFoundError: import of transformer_lens halted"),
    ("3.9.0", "broken", "RuntimeError: __path__: a broken dependency"),
    ("3.9.0", "hooked", None),
    ("4.0.0", "missing", None),  # 4.x has no HookedTransformer: the bridge job
    (None, "missing", None),  # not installed
])
def test_hooked_backend_error_only_where_tl3_cannot_import_it(version, package, error, monkeypatch):
    _installed(monkeypatch, version, _package(package))
    got = conftest.hooked_backend_error()
    if error is None:
        assert got is None, got
    else:
        assert got is not None and f"TransformerLens {version} is installed" in got and error in got, got


@pytest.mark.parametrize("ci", ["1", None])
def test_under_ci_a_broken_hooked_backend_fails_the_session(ci, pytester, monkeypatch):
    """The whole throwaway suite: under CI it does not run (exit status 3, the import's error
    printed); without CI it runs (its only test passes)."""
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    _installed(monkeypatch, "3.9.0", None)
    plugin = types.ModuleType("hooked_backend_hook")
    plugin.pytest_sessionstart = conftest.pytest_sessionstart
    pytester.makepyfile(test_one="def test_one():\n    pass\n")
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", plugins=[plugin])
    if ci:
        assert result.ret == pytest.ExitCode.INTERNAL_ERROR
        out = str(result.stdout) + str(result.stderr)
        assert "hooked backend does not import (ModuleNotFoundError" in out, out
    else:
        result.assert_outcomes(passed=1)


# ----------------------------------------------------------------------------------------------
# scripts/ci_skips.py: no test skipped by every CI job


def _junit(path, cases: dict[str, str | None]):
    """A JUnit file of ``{name: None (passed) | "skip: why" | "failure"}`` in classname tests.test_a."""
    rows = []
    for name, what in cases.items():
        body = ""
        if what == "failure":
            body = '<failure message="boom"/>'
        elif what is not None:
            body = f'<skipped message="{what}"/>'
        rows.append(f'<testcase classname="tests.test_a" name="{name}">{body}</testcase>')
    path.write_text(f'<testsuites><testsuite>{"".join(rows)}</testsuite></testsuites>')
    return path


def test_ci_skips_fails_a_test_no_job_ran(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("ci_skips", ROOT / "scripts" / "ci_skips.py")
    cs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cs)
    main = _junit(tmp_path / "main.xml", {
        "test_hooked_only": "HookedTransformer only", "test_both": None,
        "test_nowhere": "HookedTransformer only", "test_gpu": "needs a CUDA GPU", "test_x[bridge]": None,
        "test_gone": "TransformerBridge only", "test_p[bridge-8]": "HookedTransformer only"})
    tl39 = _junit(tmp_path / "tl39.xml", {
        "test_hooked_only": None, "test_both": None, "test_nowhere": "TransformerBridge only",
        "test_gpu": "needs a CUDA GPU", "test_x[hooked]": None, "test_p[hooked-8]": None})
    assert cs.main([str(main), str(tl39)]) == 1
    err = capsys.readouterr().err
    assert "2 tests skipped in one job and passed in none" in err
    assert "tests.test_a::test_nowhere: main skipped (HookedTransformer only); tl39 skipped" in err
    assert "tests.test_a::test_gone: main skipped (TransformerBridge only); tl39 not collected" in err
    # ran in tl39; no job has a GPU; its other backend's case ran
    assert "test_hooked_only" not in err and "test_gpu" not in err and "test_p" not in err
    _junit(tl39, {"test_hooked_only": None, "test_both": None, "test_nowhere": None, "test_gone": None,
                  "test_p[hooked-8]": None})
    assert cs.main([str(main), str(tl39)]) == 0
