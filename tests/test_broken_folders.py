"""A broken local Hugging Face folder is one line, ``sitelens: error: ...``, and exit status 2 on
each backend (issue 43): a tiny valid folder (tests/hf_families.py, saved as a user's is) broken in
one way per case, ``sitelens fit --model DIR`` run as a real process. Each message names the folder
and what is wrong; nothing is written to ``--out``. The cases whose files can be judged without
loading them are refused before any weight or tokenizer loads (:func:`check_hf_files`); a file that
passes those checks and still does not load (a garbled pickle) or does not fit its config.json (a
tensor of another shape, a missing tensor) is refused at the load, as one line naming the folder
(``sitelens.models.hf._folder_errors``, ``_check_loading_info``)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hf_families import save_family_dir

from sitelens.errors import ModelError
from sitelens.models import has_hooked_transformer
from sitelens.models.hf_arch import check_hf_files

ROOT = Path(__file__).resolve().parents[1]
HAS_BRIDGE = importlib.util.find_spec("transformer_lens.model_bridge") is not None
BACKENDS = [
    pytest.param("hooked", marks=pytest.mark.skipif(
        not has_hooked_transformer(), reason="HookedTransformer only (TransformerLens 3.x)")),
    pytest.param("bridge", marks=pytest.mark.skipif(
        not HAS_BRIDGE, reason="TransformerBridge is not in this TransformerLens")),
]


def _truncate(name: str, keep: float):
    def breaks(d: Path) -> None:
        data = (d / name).read_bytes()
        (d / name).write_bytes(data[: int(len(data) * keep)])
    return breaks


def _edit_config(**changes):
    def breaks(d: Path) -> None:
        cfg = json.loads((d / "config.json").read_text())
        (d / "config.json").write_text(json.dumps({**cfg, **changes}))
    return breaks


def _as_bin(d: Path) -> None:
    """The weights as pytorch_model.bin (a zip, as torch.save writes), not safetensors."""
    import torch
    from safetensors.torch import load_file

    torch.save(load_file(d / "model.safetensors"), d / "pytorch_model.bin")
    (d / "model.safetensors").unlink()


def _garbled_bin(d: Path) -> None:
    """A legacy pickle's first two bytes (0x80, protocol 2), then bytes that are no pickle: passes
    the header check, fails inside torch.load."""
    (d / "model.safetensors").unlink()
    (d / "pytorch_model.bin").write_bytes(b"\x80\x02" + bytes(range(256)) * 8)


def _drop_tensor(d: Path) -> None:
    """model.safetensors without one layer's MLP weight: a valid file the model cannot fill."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(d / "model.safetensors")
    key = next(k for k in sorted(tensors) if "mlp" in k)
    del tensors[key]
    save_file(tensors, d / "model.safetensors", metadata={"format": "pt"})


def _rm(*names: str):
    def breaks(d: Path) -> None:
        for n in names:
            (d / n).unlink()
    return breaks


# (how the folder is broken, words the one line must hold, refused before any load)
CASES = {
    "no-weights": (_rm("model.safetensors"), ["no weights file", "model.safetensors"], True),
    "safetensors-header-cut": (_truncate("model.safetensors", 0.0001),
                               ["model.safetensors is truncated"], True),
    "safetensors-half": (_truncate("model.safetensors", 0.5),
                         ["model.safetensors is truncated", "header describes"], True),
    "safetensors-not-json": (lambda d: (d / "model.safetensors").write_bytes(
        (20).to_bytes(8, "little") + b"{not json at all!!!}" + b"\0" * 64),
        ["model.safetensors has a corrupt header"], True),
    "bin-truncated": (lambda d: (_as_bin(d), _truncate("pytorch_model.bin", 0.5)(d)),
                      ["pytorch_model.bin is truncated"], True),
    "bin-garbled": (_garbled_bin, ["cannot load", "UnpicklingError"], False),
    "dtype-unknown": (_edit_config(dtype="float13"), ["'float13'", "not a floating-point"], True),
    "dtype-integer": (_edit_config(dtype="int8"), ["'int8'", "not a floating-point"], True),
    "no-tokenizer": (_rm("tokenizer.json", "tokenizer_config.json"), ["no tokenizer"], True),
    "tokenizer-config-only": (_rm("tokenizer.json"), ["no tokenizer"], True),
    "config-size-mismatch": (lambda d: _edit_config(intermediate_size=json.loads(
        (d / "config.json").read_text())["intermediate_size"] * 2)(d),
        ["does not match its config.json", "intermediate_size"], False),
    "weights-missing-tensor": (_drop_tensor, ["lacks 1 weight(s)", "mlp"], False),
    "config-not-json": (lambda d: (d / "config.json").write_text('{"model_type": "qwen2", '),
                        ["config.json is not valid JSON"], True),
    "config-not-object": (lambda d: (d / "config.json").write_text("[1, 2]"),
                          ["config.json is not a JSON object"], True),
}


@pytest.fixture(scope="module")
def valid_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("valid") / "qwen2"
    save_family_dir("qwen2", d)
    return d


def _broken(valid_dir: Path, case: str, tmp_path: Path) -> Path:
    d = tmp_path / f"broken-{case}"
    shutil.copytree(valid_dir, d)
    CASES[case][0](d)
    return d


def _pairs(tmp_path: Path) -> str:
    f = tmp_path / "pairs.json"
    f.write_text(json.dumps([{"input": f"w{i}", "output": f"v{i}"} for i in range(20)]))
    return str(f)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", list(CASES))
def test_a_broken_folder_is_one_line_and_exit_2(case, backend, valid_dir, tmp_path):
    model = _broken(valid_dir, case, tmp_path)
    out = tmp_path / "ad"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    r = subprocess.run(
        [sys.executable, "-m", "sitelens.cli", "fit", "--model", str(model), "--task", _pairs(tmp_path),
         "--out", str(out), "--backend", backend, "--n-prompts", "2", "--n-shots", "2",
         "--n-examples", "4", "--batch-size", "2"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert lines[0].startswith("sitelens: error: ") and str(model) in lines[0], lines[0]
    assert all(w in lines[0] for w in CASES[case][1]), lines[0]
    assert not out.exists()


@pytest.mark.parametrize("case", [c for c, (_, _, early) in CASES.items() if early])
def test_the_folder_checks_read_no_weights(case, valid_dir, tmp_path, monkeypatch):
    """The refusals before any load come from the files' names, sizes and headers alone: with
    every loader of transformers replaced by a failure, the same error."""
    import transformers

    def no_load(*a, **k):
        raise AssertionError("a load was attempted")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_load)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", no_load)
    model = _broken(valid_dir, case, tmp_path)
    with pytest.raises(ModelError) as e:
        check_hf_files(model)
    assert all(w in str(e.value) for w in CASES[case][1]), str(e.value)


def test_a_valid_folder_passes_the_checks(valid_dir, tmp_path):
    """The checks refuse only what is broken: the valid folder, its weights as a
    pytorch_model.bin, and a sharded safetensors save all pass."""
    check_hf_files(valid_dir)
    as_bin = _broken(valid_dir, "no-weights", tmp_path)  # then rebuilt as a .bin below
    shutil.copy(valid_dir / "model.safetensors", as_bin / "model.safetensors")
    _as_bin(as_bin)
    check_hf_files(as_bin)
    sharded = tmp_path / "sharded"
    hf = save_family_dir("qwen2", sharded)
    for f in ("model.safetensors",):
        (sharded / f).unlink()
    hf.save_pretrained(str(sharded), max_shard_size="50KB")
    assert (sharded / "model.safetensors.index.json").is_file()
    check_hf_files(sharded)
    shard = sorted(sharded.glob("model-*.safetensors"))[-1]
    shard.write_bytes(shard.read_bytes()[:-10])
    with pytest.raises(ModelError, match=f"{shard.name} is truncated"):
        check_hf_files(sharded)
