"""Shared fixtures. The unit tier runs on both backends through ``tiny`` / ``tiny_mha``:

- ``hooked``: a tiny ``HookedTransformer`` (TransformerLens 3.x only),
- ``bridge``: a tiny ``TransformerBridge`` around a Hugging Face Llama.

``SITELENS_BACKEND=bridge`` (or ``hooked``) restricts the run to one backend (the TL 4.x CI job
sets ``bridge``); on TransformerLens 4.x, where ``HookedTransformer`` is gone, only ``bridge`` runs.
Tests that need HookedTransformer internals call :func:`needs_hooked` and are skipped, with the
reason, on a bridge.

The browser tier (marker ``browser``: headless system Chromium via Playwright, network cut off) gets
its fixtures ``chromium`` / ``offline_page`` from ``tests/browser_util.py``.

Under CI (the environment variable ``CI`` set, as ``.ci/run`` does) a skip is a failure unless its
reason says the test needs a GPU or a backend this job does not run (HookedTransformer on
TransformerLens 4, the bridge where it is not under test): a missing Chromium, data folder or dev
tool must not leave CI green. Nor may a broken TransformerLens 3.x: there
``from transformer_lens import HookedTransformer`` must succeed under CI, or the session fails with
the import's error before any test runs (otherwise ``has_hooked_transformer()`` would read False,
every HookedTransformer test would skip with an allowed reason, and the job would stay green).
"""

import importlib.metadata
import os
import re

import pytest
import torch
from browser_util import chromium, offline_page  # noqa: F401  (the browser tier's fixtures)

from sitelens.models import has_hooked_transformer, is_bridge
from sitelens.testing import tiny_model

torch.set_num_threads(min(2, torch.get_num_threads()))

# the skip reasons CI accepts: the hardware or the backend the job does not have, or the offline
# mirror of the public reference code (tests/test_reference_bench.py: not part of the project, and
# nothing is downloaded at run time; those tests run wherever the mirror is)
CI_SKIP_OK = re.compile(r"\bGPUs?\b|\bCUDA\b|HookedTransformer|TransformerBridge|bridge backend"
                        r"|offline mirror of .* is absent")


def ci_skip_allowed(reason: str) -> bool:
    return bool(CI_SKIP_OK.search(reason))


def _fail_a_ci_skip(report) -> None:
    if not os.environ.get("CI") or not report.skipped or hasattr(report, "wasxfail"):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    if not ci_skip_allowed(reason):
        report.outcome = "failed"
        report.longrepr = (f"skipped under CI: {reason} (only a test that needs a GPU or a backend "
                           "this job does not install may skip)")


def hooked_backend_error() -> str | None:
    """Why the hooked backend does not import where it must: on TransformerLens 3.x (the version
    read from the installed distribution, not from the import under test) the error of ``from
    transformer_lens import HookedTransformer``; None when it imports, on 4.x (where
    HookedTransformer is gone) and without TransformerLens."""
    try:
        version = importlib.metadata.version("transformer_lens")
    except importlib.metadata.PackageNotFoundError:
        return None
    if version.split(".")[0] != "3":
        return None
    try:
        from transformer_lens import HookedTransformer  # noqa: F401
    except Exception as e:  # any failure of a 3.x install's import, not only ImportError
        return (f"TransformerLens {version} is installed but its hooked backend does not import "
                f"({type(e).__name__}: {e}); under CI every HookedTransformer test would skip")
    return None


def pytest_sessionstart(session):
    if os.environ.get("CI") and (error := hooked_backend_error()):
        pytest.exit(error, returncode=pytest.ExitCode.INTERNAL_ERROR)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _fail_a_ci_skip(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    _fail_a_ci_skip(outcome.get_result())


def backends_under_test() -> list[str]:
    env = os.environ.get("SITELENS_BACKEND", "").strip().lower()
    if env:
        return [env]
    return ["hooked", "bridge"] if has_hooked_transformer() else ["bridge"]


BACKENDS = backends_under_test()


def needs_hooked(model, reason: str) -> None:
    """Skip the calling test on a TransformerBridge, with ``reason``."""
    if is_bridge(model):
        pytest.skip(f"HookedTransformer only: {reason}")


@pytest.fixture(scope="session", params=BACKENDS)
def backend(request):
    return request.param


@pytest.fixture(scope="session", params=["mha", "gqa"])
def tiny(request, backend):
    """A tiny random model on each backend: multi-head (4 q heads) and grouped-query (2 kv heads)."""
    kv = None if request.param == "mha" else 2
    return tiny_model(n_layers=2, n_heads=4, d_head=8, n_key_value_heads=kv, seed=0, backend=backend)


@pytest.fixture(scope="session")
def tiny_mha(backend):
    return tiny_model(n_layers=2, n_heads=4, d_head=8, seed=0, backend=backend)


@pytest.fixture(scope="session")
def smollm2():
    from sitelens.models import load_model

    return load_model("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def gemma():
    from sitelens.models import load_model

    return load_model("gemma-3-270m")
