"""Adapters move between backends (issue 43, item 1): an adapter records the fingerprint of the
weights themselves (:func:`sitelens.models.weights_fingerprint`), the same for the same weights on a
``HookedTransformer`` and a ``TransformerBridge``, so an adapter fitted on one backend loads on the
other for the same local folder (tests/hf_families.py: a tiny Hugging Face model saved as a user's
folder); other weights or another dtype are still refused, with a message naming which; an adapter
of the older, backend-layout fingerprint still loads on its own backend. The bundled SmolLM2 both
ways: tests/test_integration.py::test_an_adapter_moves_between_backends_on_smollm2."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hf_families import save_family_dir
from test_hf_dirs import BRIDGE_UNSUPPORTED, FIT, _cli, _pairs

from sitelens import FitConfig, fit_site, load_task
from sitelens.errors import AdapterError
from sitelens.models import (
    backend_of,
    fingerprint,
    has_hooked_transformer,
    load_model,
    weights_fingerprint,
)
from sitelens.models.families import SUPPORTED_FAMILIES

_NO_HOOKED = "HookedTransformer only (TL 3.x): an adapter crossing to or from the hooked backend"
needs_both = pytest.mark.skipif(not has_hooked_transformer(), reason=_NO_HOOKED)


def _folder(tmp_path, name: str = "m", seed: int = 0) -> str:
    save_family_dir("qwen2", tmp_path / name, seed=seed)
    return str(tmp_path / name)


def _fit(model):
    return fit_site(model, load_task("antonym"), n_prompts=2, n_shots=2,
                    config=FitConfig(n_examples=4, batch_size=2, eval_every=1, n_valid=4))


@needs_both
@pytest.mark.parametrize("family", [f for f in SUPPORTED_FAMILIES if f not in BRIDGE_UNSUPPORTED])
def test_the_weights_fingerprint_is_the_same_on_both_backends(family, tmp_path):
    """Every family a HookedTransformer loads: its folder's weights fingerprint is the bridge's
    (the HookedTransformer folds LayerNorm into W_Q and W_U and scales Gemma's W_E, so these are
    not what it hashes), while the results' key (:func:`fingerprint`) stays each backend's own."""
    save_family_dir(family, tmp_path)
    hooked, bridge = (load_model(str(tmp_path), backend=b) for b in ("hooked", "bridge"))
    assert weights_fingerprint(hooked) == weights_fingerprint(bridge)
    assert fingerprint(hooked) != fingerprint(bridge)


@needs_both
@pytest.mark.parametrize("fit_on, eval_on", [("hooked", "bridge"), ("bridge", "hooked")])
def test_an_adapter_fitted_on_one_backend_evaluates_on_the_other(fit_on, eval_on, tmp_path,
                                                                 monkeypatch):
    """The issue's case on the command line: ``sitelens fit`` on one backend, ``sitelens eval
    --backend`` the other on the same folder (refused before: "weights ... but the model is ...");
    adapter.json records the backend it was fitted on."""
    m, pairs = _folder(tmp_path), _pairs(tmp_path)
    rc, err = _cli(["fit", "--model", m, "--task", pairs, "--out", "ad", "--backend", fit_on, *FIT],
                   tmp_path, monkeypatch)
    assert rc == 0, err
    meta = json.loads((tmp_path / "ad" / "adapter.json").read_text())
    assert (meta["backend"], meta["fingerprint_of"], meta["dtype"]) == (fit_on, "weights", "float32")
    rc, err = _cli(["eval", "--model", m, "--task", pairs, "--methods", "site", "--adapter", "ad",
                    "--backend", eval_on, "--limit", "2"], tmp_path, monkeypatch)
    assert rc == 0, err


def test_other_weights_or_another_dtype_are_refused_naming_what_differs(backend, tmp_path,
                                                                        monkeypatch):
    """The same family and sizes with other weights (seed 1), and the same weights in bfloat16: one
    line, exit 2, saying which differs."""
    m, other, pairs = _folder(tmp_path), _folder(tmp_path, "other", seed=1), _pairs(tmp_path)
    rc, err = _cli(["fit", "--model", m, "--task", pairs, "--out", "ad", "--backend", backend, *FIT],
                   tmp_path, monkeypatch)
    assert rc == 0, err
    evaluate = ["eval", "--task", pairs, "--methods", "site", "--adapter", "ad", "--limit", "2",
                "--backend", backend]
    rc, err = _cli([*evaluate, "--model", other], tmp_path, monkeypatch)
    last = err.strip().splitlines()[-1]
    assert rc == 2 and last.startswith("sitelens: error: Adapter was fitted on"), err
    assert "the weights themselves differ" in last and "the backend does not enter it" in last
    rc, err = _cli([*evaluate, "--model", m, "--dtype", "bfloat16"], tmp_path, monkeypatch)
    last = err.strip().splitlines()[-1]
    assert rc == 2 and "the dtype differs: the adapter's model was float32, this one is bfloat16" \
        in last, err


@needs_both
def test_an_adapter_of_the_older_fingerprint_loads_on_its_own_backend_only(tmp_path):
    """An adapter.json without ``fingerprint_of`` holds the backend-layout :func:`fingerprint` of
    the model it was fitted on: it still passes on that backend, and on the other one the refusal
    says to load it there or refit."""
    m = _folder(tmp_path)
    hooked, bridge = load_model(m, backend="hooked"), load_model(m, backend="bridge")
    fitted = _fit(hooked)
    meta = {k: v for k, v in fitted.meta.items() if k not in ("fingerprint_of", "backend", "dtype")}
    old = dataclasses.replace(fitted, meta={**meta, "fingerprint": fingerprint(hooked)})
    old.check_model(hooked)
    with pytest.raises(AdapterError, match="Load it on the backend it was fitted on, or refit"):
        old.check_model(bridge)
    fitted.check_model(bridge)  # the same adapter with today's fingerprint
    assert backend_of(hooked) == "hooked" and backend_of(bridge) == "bridge"
