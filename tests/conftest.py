"""Shared fixtures. The unit tier runs on both backends through ``tiny`` / ``tiny_mha``:

- ``hooked``: a tiny ``HookedTransformer`` (TransformerLens 3.x only),
- ``bridge``: a tiny ``TransformerBridge`` around a Hugging Face Llama.

``SITELENS_BACKEND=bridge`` (or ``hooked``) restricts the run to one backend (the TL 4.x CI job
sets ``bridge``); on TransformerLens 4.x, where ``HookedTransformer`` is gone, only ``bridge`` runs.
Tests that need HookedTransformer internals call :func:`needs_hooked` and are skipped, with the
reason, on a bridge.
"""

import os

import pytest
import torch

from sitelens.models import has_hooked_transformer, is_bridge, tiny_model

torch.set_num_threads(min(2, torch.get_num_threads()))


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


_BASELINES_REASON = (
    "sitelens.baselines (TV, LTV, FV, I2CL, LoRA, (IA)3) use HookedTransformer hook names "
    "(blocks.{l}.hook_resid_pre/post, hook_attn_out, hook_mlp_out) and ln_final/unembed on a "
    "stop_at_layer residual; not yet ported to TransformerBridge"
)
# Tests that build their model with tiny_model() directly (the default backend) and need
# HookedTransformer internals: skipped, with the reason, when only the bridge runs.
HOOKED_ONLY = {
    "tests/test_baselines.py::test_ltv_w_is_the_ridge_closed_form": _BASELINES_REASON,
    "tests/test_baselines.py::test_ltv_adds_w_h_at_the_last_token_only": _BASELINES_REASON,
    "tests/test_baselines.py::test_fv_adds_exactly_the_summed_head_outputs": _BASELINES_REASON,
    "tests/test_baselines.py::test_tv_replaces_exactly_one_state": _BASELINES_REASON,
    "tests/test_baselines.py::test_i2cl_trains_only_its_scalars": _BASELINES_REASON,
    "tests/test_baselines.py::test_lora_zero_init_is_identity_and_counts_params": _BASELINES_REASON,
    "tests/test_baselines.py::test_ia3_unit_init_is_identity_and_counts_params": _BASELINES_REASON,
    "tests/test_baselines.py::test_evaluate_runs_every_baseline": _BASELINES_REASON,
    "tests/test_metrics.py::test_bench_writes_tidy_rows_and_resumes_without_refitting":
        "the bench run includes the 'tv' baseline: " + _BASELINES_REASON,
}


def pytest_collection_modifyitems(config, items):
    if "hooked" in BACKENDS:  # tiny_model() defaults to a HookedTransformer
        return
    for item in items:
        reason = HOOKED_ONLY.get(item.nodeid.split("[")[0])
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=f"HookedTransformer only: {reason}"))


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
