"""The CI skip rule of tests/conftest.py, run on a throwaway suite (pytester, in process, with the
conftest's two hooks as its only plugin): under ``CI`` a skip whose reason names no GPU or missing
backend fails, wherever it happens (in the test, in a fixture, by a ``skipif`` mark, at module
level); a GPU or HookedTransformer skip and an xfail stay as they are; without ``CI`` every skip is a
skip."""

from __future__ import annotations

import types

import conftest

pytest_plugins = ["pytester"]

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
