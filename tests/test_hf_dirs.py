"""Loading what users have (issue 35): a local Hugging Face directory of every architecture family
(tests/hf_families.py: a tiny random model from the family's own transformers config class, saved
with ``save_pretrained`` beside a tokenizer, as a user's folder is) loads with ``load_model(DIR)``
from the folder's own config, no edit, on each backend that supports the family, and gives the
Hugging Face model's own logits; ``sitelens fit --model DIR`` runs end to end; an architecture no
backend here can load is a typed error naming the family and what is missing, exit 2 on the CLI,
before any weight loads."""

from __future__ import annotations

import contextlib
import io
import json

import pytest
import torch
from hf_families import hf_family_model, save_family_dir
from tolerances import assert_logits_close

from sitelens.errors import ModelError
from sitelens.models import encode, has_hooked_transformer, load_model
from sitelens.models.families import FAMILIES, SUPPORTED_FAMILIES

# families the TransformerBridge of this TransformerLens cannot wrap, and why (checked below: the
# reason must still hold, so a TransformerLens that learns one fails here until it is removed)
BRIDGE_UNSUPPORTED: dict[str, str] = {}
PROMPT = "The quick brown fox jumps over the lazy dog"  # 43 byte tokens: past the 8-token windows

_NO_HOOKED = "HookedTransformer only (TL 3.x): the hooked backend"


def _logits_agree(model, hf, family: str) -> None:
    """``model``'s logits on one unpadded prompt equal ``hf``'s own forward: two float32
    computations of the same function (LayerNorm folded, weights re-laid, fused attention on the
    hooked side), so they differ by rounding only: ``logit_tolerance`` at their scale and depth
    (tests/tolerances.py; the measured gap is ~2e-6 at a logit scale ~3)."""
    toks = encode(model, [PROMPT]).tokens  # [1, pos]
    with torch.no_grad():
        ours, ref = model(toks), hf(toks).logits
    assert ours.shape == ref.shape
    assert_logits_close(ours, ref, model, what=f"{family}: logits of the loaded directory vs HF")


def test_every_family_record_is_complete():
    """A family is one record: a buildable one says how its config converts and what its tiny
    model is; one TransformerLens cannot build says why and nothing more; a ``model_type`` or an
    architecture names one family only; a config of its own ``model_type`` alone finds it."""
    from sitelens.models.families import BY_ARCHITECTURE, LLAMA, MODEL_TYPES, TRANSFORMER_LENS
    from sitelens.models.hf_arch import family_of

    types = [t for f in FAMILIES.values() for t in f.model_types]
    assert len(types) == len(set(types)) and len(BY_ARCHITECTURE) == len(FAMILIES)
    for f in FAMILIES.values():
        assert f.model_types and all(MODEL_TYPES[t] == f.architecture for t in f.model_types)
        assert all(family_of({"model_type": t}) is f for t in f.model_types)
        if f.supported:
            assert f.fields and (f.hooked_config in (TRANSFORMER_LENS, LLAMA) or callable(f.hooked_config))
        else:
            assert f.hooked_config is None and not f.fields and f.unsupported


@pytest.mark.skipif(not has_hooked_transformer(), reason=_NO_HOOKED)
@pytest.mark.parametrize("family", SUPPORTED_FAMILIES)
def test_a_family_directory_loads_as_a_hooked_transformer(family, tmp_path):
    hf = save_family_dir(family, tmp_path)
    model = load_model(str(tmp_path), backend="hooked")
    assert model.cfg.original_architecture == FAMILIES[family].architecture
    _logits_agree(model, hf, family)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_family_directory_loads_on_the_bridge(family, tmp_path):
    hf = save_family_dir(family, tmp_path)
    if family in BRIDGE_UNSUPPORTED:
        with pytest.raises(ModelError, match="TransformerBridge cannot wrap"):
            load_model(str(tmp_path), backend="bridge")
        return
    model = load_model(str(tmp_path), backend="bridge")
    _logits_agree(model, hf, family)


@pytest.mark.skipif(not has_hooked_transformer(), reason=_NO_HOOKED)
def test_a_model_type_only_config_still_maps(tmp_path):
    """A config.json without ``architectures`` is mapped by its ``model_type``."""
    hf = save_family_dir("qwen2", tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    del cfg["architectures"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    _logits_agree(load_model(str(tmp_path), backend="hooked"), hf, "qwen2 (model_type only)")


def _config_only(tmp_path, **config):
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


@pytest.mark.parametrize("config, words", [
    ({"architectures": ["FooForCausalLM"], "model_type": "foo"},
     ["FooForCausalLM", "missing: a HookedTransformer conversion", "qwen2"]),
    ({"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "num_local_experts": 8},
     ["mixture-of-experts", "num_local_experts", "dense families only"]),
    ({"architectures": ["FalconForCausalLM"], "model_type": "falcon"},
     ["family 'falcon'", "missing: TransformerLens 3.9 has no HookedTransformer conversion"]),
], ids=["unknown", "moe", "unsupported-family"])
def test_an_unsupported_directory_is_refused_before_any_load(config, words, tmp_path, monkeypatch):
    """No weights in the folder: the refusal comes from its config.json alone."""
    import transformers

    def no_load(*a, **k):
        raise AssertionError("a model load was attempted")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_load)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", no_load)
    from sitelens.models import check_model_available

    with pytest.raises(ModelError) as e:
        check_model_available(_config_only(tmp_path, **config), "hooked")
    assert all(w in str(e.value) for w in words), str(e.value)
    if has_hooked_transformer():
        with pytest.raises(ModelError, match=words[0]):
            load_model(str(tmp_path), backend="hooked")
    if "num_local_experts" in config:  # refused on either backend
        with pytest.raises(ModelError, match="mixture-of-experts"):
            load_model(str(tmp_path), backend="bridge")


# ----------------------------------------------------------------------------------------------
# the command line


def _cli(argv, tmp_path, monkeypatch) -> tuple[int, str]:
    from sitelens.cli import main

    monkeypatch.chdir(tmp_path)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(argv)
    return rc, err.getvalue()


def _pairs(tmp_path):
    pairs = [{"input": a, "output": b} for a, b in [
        ("hot", "cold"), ("big", "small"), ("up", "down"), ("good", "bad"), ("fast", "slow"),
        ("old", "new"), ("dark", "light"), ("high", "low"), ("rich", "poor"), ("hard", "soft"),
        ("wet", "dry"), ("open", "shut"), ("long", "short"), ("full", "empty"), ("early", "late"),
        ("loud", "quiet"), ("thick", "thin"), ("near", "far"), ("win", "lose"), ("in", "out")]]
    (tmp_path / "pairs.json").write_text(json.dumps(pairs))
    return str(tmp_path / "pairs.json")


FIT = ["--n-prompts", "2", "--n-shots", "2", "--n-examples", "4", "--batch-size", "2"]


@pytest.mark.parametrize("family, backend", [("qwen2", "hooked"), ("pythia", "hooked"),
                                             ("gemma2", "bridge")])
def test_sitelens_fit_runs_on_a_family_directory(family, backend, tmp_path, monkeypatch):
    if backend == "hooked" and not has_hooked_transformer():
        pytest.skip(_NO_HOOKED)
    save_family_dir(family, tmp_path / "m")
    rc, err = _cli(["fit", "--model", str(tmp_path / "m"), "--task", _pairs(tmp_path),
                    "--out", "ad", "--backend", backend, *FIT], tmp_path, monkeypatch)
    assert rc == 0, err
    assert (tmp_path / "ad" / "adapter.json").is_file()


def test_the_cli_refuses_an_unsupported_directory_with_exit_2(tmp_path, monkeypatch):
    model = _config_only(tmp_path, architectures=["MixtralForCausalLM"], num_local_experts=8)
    rc, err = _cli(["fit", "--model", model, "--task", _pairs(tmp_path), "--out", "ad", *FIT],
                   tmp_path, monkeypatch)
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("sitelens: error: "), err
    assert "mixture-of-experts" in lines[0] and not (tmp_path / "ad").exists()


# ----------------------------------------------------------------------------------------------
# mutations: a mapping that drops a family's feature fails the logits check


@pytest.mark.skipif(not has_hooked_transformer(), reason=_NO_HOOKED)
@pytest.mark.parametrize("family, field, wrong", [
    ("pythia", "parallel_attn_mlp", False),  # the parallel block run serially
    ("gemma2", "attn_scores_soft_cap", -1.0),  # the score soft-cap skipped
    ("phi", "rotary_dim", 16),  # the partial rotary fraction ignored
])
def test_a_dropped_feature_fails_the_logits_check(family, field, wrong, tmp_path, monkeypatch):
    import sitelens.models.hf_convert as hc

    real = hc.hooked_config_dict
    monkeypatch.setattr(hc, "hooked_config_dict", lambda c, a: {**real(c, a), field: wrong})
    hf = save_family_dir(family, tmp_path)
    caught = f"{family}: logits of the loaded directory vs HF: .* more than float rounding"
    with pytest.raises(AssertionError, match=caught):
        _logits_agree(load_model(str(tmp_path), backend="hooked"), hf, family)


def test_the_helper_builds_every_family():
    """tests/hf_families.py has a model for every family of the table (bridge rows included)."""
    for family in FAMILIES:
        hf, tok = hf_family_model(family)
        assert hf.config.architectures == [FAMILIES[family].architecture]
        assert hf.config.vocab_size == len(tok)
