"""Loading what users have (issue 35, item 2): a TransformerLens official model name whose files are
in the local Hugging Face cache loads on both backends with no network, with the Hugging Face
model's own logits; ``sitelens fit --model NAME`` runs end to end from that cache; a cache entry
without its weights is a typed error, exit 2 on the CLI, nothing written.

The cache is real in layout (tests/hf_cache.py: ``models--ORG--NAME/refs/main``, ``blobs``,
``snapshots/<commit>`` symlinks, as ``hf download`` leaves it), tiny in content: a random model of
the name's family (tests/hf_families.py) under a name whose TransformerLens 3.9 conversion reads
its sizes from the cached ``config.json``."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hf_cache import CACHED_NAMES, COMMIT, point_hub_at, repo_dir, write_cached_model
from tolerances import assert_logits_close

from sitelens.errors import ModelError
from sitelens.models import check_model_available, encode, has_hooked_transformer, load_model

PROMPT = "The quick brown fox jumps over the lazy dog"  # 43 byte tokens: past Mistral's window 8
_NO_HOOKED = "HookedTransformer only (TL 3.x): the hooked backend"
BACKENDS = [pytest.param("hooked", marks=pytest.mark.skipif(not has_hooked_transformer(),
                                                            reason=_NO_HOOKED)), "bridge"]
FIT = ["--n-prompts", "2", "--n-shots", "2", "--n-examples", "4", "--batch-size", "2"]


class NetworkTouched(Exception):
    pass


@pytest.fixture
def no_network(monkeypatch):
    """Every HTTP request of this process is recorded and refused at the client's ``send``:
    huggingface_hub 2.x sends through ``httpx2`` (a fork of httpx), older releases and
    transformers' helpers through ``httpx`` or ``requests``. Returns the list of attempted URLs.
    NetworkTouched is no transport error, so the Hub's retry-with-backoff does not retry it."""
    import importlib

    tried = []

    def refuse(self, request, *a, **k):
        tried.append(str(getattr(request, "url", request)))
        raise NetworkTouched(tried[-1])

    patched = []
    for module, cls in [("httpx2", "Client"), ("httpx2", "AsyncClient"), ("httpx", "Client"),
                        ("httpx", "AsyncClient"), ("requests", "Session")]:
        try:
            target = getattr(importlib.import_module(module), cls)
        except (ImportError, AttributeError):
            continue
        monkeypatch.setattr(target, "send", refuse)
        patched.append(module)
    assert "httpx2" in patched or "httpx" in patched, patched
    return tried


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """An empty hub cache at tmp_path/hf/hub that this process reads; returns (cache, env of a
    subprocess reading it)."""
    cache = tmp_path / "hf" / "hub"
    cache.mkdir(parents=True)
    return cache, point_hub_at(cache, monkeypatch)


def test_the_helper_writes_what_the_hub_library_reads(hub):
    from huggingface_hub import hf_hub_download, try_to_load_from_cache

    cache, _ = hub
    write_cached_model(cache, "EleutherAI/pythia-14m")
    repo = repo_dir(cache, "EleutherAI/pythia-14m")
    assert repo.name == "models--EleutherAI--pythia-14m"
    assert (repo / "refs" / "main").read_text() == COMMIT
    snap = repo / "snapshots" / COMMIT
    names = {f.name for f in snap.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= names, names
    for f in snap.iterdir():  # every snapshot file resolves to a blob named by its sha256
        assert f.resolve().parent == (repo / "blobs").resolve(), f
    for file in ("config.json", "model.safetensors"):
        got = hf_hub_download("EleutherAI/pythia-14m", file, local_files_only=True)
        assert Path(got) == snap / file and try_to_load_from_cache("EleutherAI/pythia-14m", file)
    check_model_available("EleutherAI/pythia-14m")  # the pre-load check finds it


def _logits_agree(model, hf, what: str) -> None:
    """``model``'s logits equal ``hf``'s own forward on one unpadded prompt: two float32
    computations of the same function (LayerNorm folded and weights re-laid by TransformerLens,
    fused attention on the hooked side; the bridge runs HF's own modules), so they differ by
    rounding only: ``logit_tolerance`` at their scale and depth (tests/tolerances.py; measured
    ~2e-6 at a logit scale ~3 on these models, 0 on the bridge). Centring the unembedding, as
    TransformerLens's defaults do, moves every logit by ~0.1 and fails this."""
    toks = encode(model, [PROMPT]).tokens
    with torch.no_grad():
        ours, ref = model(toks), hf(toks).logits
    assert ours.shape == ref.shape
    assert_logits_close(ours, ref, model, what=what)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(CACHED_NAMES))
def test_a_cached_official_name_loads_offline(name, backend, hub, no_network):
    cache, _ = hub
    hf = write_cached_model(cache, name)
    model = load_model(name, backend=backend)
    assert no_network == [], no_network
    assert model.cfg.model_name == name
    # capped at the model's own context (128 in these configs; GPT-2's learned positions can hold
    # no more), except that TransformerLens 3.9 gives every Mistral n_ctx 2048 whatever its config
    # says (rotary: no weight depends on it), which the default 2048 then equals
    own = 2048 if (name.startswith("mistralai/") and backend == "hooked") else 128
    assert model.cfg.n_ctx == own
    _logits_agree(model, hf, f"{name} ({backend}) from the HF cache vs HF")


@pytest.mark.parametrize("backend", BACKENDS)
def test_offline_mode_is_what_keeps_it_off_the_network(backend, hub, no_network, monkeypatch):
    """Mutation: the loader without its Hub offline mode asks the Hub whether the cached snapshot
    is current (and here meets the refused network)."""
    import sitelens.models.hf as hfmod

    cache, _ = hub
    write_cached_model(cache, "gpt2")
    monkeypatch.setattr(hfmod, "_hub_offline", lambda enabled=True: contextlib.nullcontext())
    with contextlib.suppress(Exception):
        load_model("gpt2", backend=backend)
    assert no_network, "a load without offline mode made no request: the test proves nothing"


@pytest.mark.skipif(not has_hooked_transformer(), reason=_NO_HOOKED)
def test_gpt2_needs_the_context_cap(hub, monkeypatch):
    """Mutation: without the cap at the model's own context, GPT-2's learned position embeddings
    (128 rows here, 1024 in the real model) do not fit the default n_ctx of 2048."""
    import sitelens.models.hf as hfmod

    cache, _ = hub
    write_cached_model(cache, "gpt2")
    monkeypatch.setattr(hfmod, "_capped_n_ctx", lambda name, n_ctx: n_ctx)
    with pytest.raises(RuntimeError, match="pos_embed"):
        load_model("gpt2", backend="hooked")


def _pairs(tmp_path) -> str:
    pairs = [{"input": a, "output": b} for a, b in [
        ("hot", "cold"), ("big", "small"), ("up", "down"), ("good", "bad"), ("fast", "slow"),
        ("old", "new"), ("dark", "light"), ("high", "low"), ("rich", "poor"), ("hard", "soft"),
        ("wet", "dry"), ("open", "shut"), ("long", "short"), ("full", "empty"), ("early", "late"),
        ("loud", "quiet"), ("thick", "thin"), ("near", "far"), ("win", "lose"), ("in", "out")]]
    (tmp_path / "pairs.json").write_text(json.dumps(pairs))
    return str(tmp_path / "pairs.json")


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_cache_entry_without_weights_is_refused(backend, hub, tmp_path, monkeypatch):
    from sitelens.cli import main

    cache, _ = hub
    write_cached_model(cache, "gpt2", drop=("model.safetensors",))
    with pytest.raises(ModelError, match="only partly in the local Hugging Face cache"):
        load_model("gpt2", backend=backend)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        rc = main(["fit", "--model", "gpt2", "--task", _pairs(tmp_path), "--out", "ad",
                   "--backend", backend, *FIT])
    lines = err.getvalue().strip().splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("sitelens: error: "), err.getvalue()
    assert "only partly in the local Hugging Face cache" in lines[0]
    assert "hf download gpt2" in lines[0]
    assert os.listdir(work) == [], os.listdir(work)  # nothing written


@pytest.mark.parametrize("name, backend", [
    pytest.param("gpt2", "hooked", marks=pytest.mark.skipif(not has_hooked_transformer(),
                                                            reason=_NO_HOOKED)),
    ("Qwen/Qwen2-0.5B", "bridge"),
])
def test_sitelens_fit_from_the_cache_in_a_subprocess(name, backend, hub, tmp_path):
    """The real command in a fresh process that finds the cache through ``HF_HOME`` alone, with
    offline mode not set in its environment (the loader sets it) and any request sent to a dead
    proxy, so that a network attempt fails instead of reaching the Hub."""
    cache, env = hub
    write_cached_model(cache, name)
    root = str(Path(__file__).resolve().parents[1])
    env.update(OMP_NUM_THREADS="1", HTTP_PROXY="http://127.0.0.1:9",
               HTTPS_PROXY="http://127.0.0.1:9", NO_PROXY="",
               PYTHONPATH=os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p))
    proc = subprocess.run(
        [sys.executable, "-m", "sitelens.cli", "fit", "--model", name, "--task", _pairs(tmp_path),
         "--out", "ad", "--backend", backend, *FIT],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    adapter = json.loads((tmp_path / "ad" / "adapter.json").read_text())
    assert name in json.dumps(adapter), adapter.keys()
