"""A tiny random model of a family (tests/hf_families.py) written into a Hugging Face hub cache
under a TransformerLens official model name, laid out as ``hf download NAME`` leaves it::

    HF_HUB_CACHE/models--ORG--NAME/refs/main               the commit hash
    HF_HUB_CACHE/models--ORG--NAME/blobs/<sha256>          the files' contents
    HF_HUB_CACHE/models--ORG--NAME/snapshots/<commit>/F    symlinks to ../../blobs/<sha256>

(plain copies where the file system has no symlinks, as on Windows without developer mode).

The names are official TransformerLens 3.9 names whose ``convert_hf_model_config`` reads sizes
from the cached ``config.json`` (the branches keyed on ``hf_config.architectures[0]``), so a tiny
model can stand in for them. Names it converts from hard-coded sizes cannot be faked tiny: every
name containing "llama" (``meta-llama/Llama-3.2-1B``: d_model 2048 is written in the code, no
config read), every Gemma (``google/gemma-*``: architecture and sizes from the name) and the
OLMo 1/2 checkpoints (``allenai/OLMo-2-0425-1B``: sizes by name).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from hf_families import save_family_dir

# official TransformerLens name -> family of tests/hf_families.py (config-read conversion branches)
CACHED_NAMES = {
    "gpt2": "gpt2",  # GPT2LMHeadModel
    "EleutherAI/pythia-14m": "pythia",  # GPTNeoXForCausalLM: partial rotary, parallel block
    "Qwen/Qwen2-0.5B": "qwen2",  # Qwen2ForCausalLM: GQA, QKV bias
    "mistralai/Mistral-7B-v0.1": "mistral",  # MistralForCausalLM: GQA, sliding window
}
# keys the real repositories' config.json carry that save_pretrained of today's config classes no
# longer writes, and that TransformerLens 3.9 reads (gpt2's config.json has "n_ctx": 1024)
REPO_CONFIG = {"gpt2": {"n_ctx": 128}}
COMMIT = "0123456789abcdef0123456789abcdef01234567"  # a 40-hex commit hash, as the Hub's


def repo_dir(cache: Path, name: str) -> Path:
    return Path(cache) / f"models--{name.replace('/', '--')}"


def write_cached_model(cache: Path, name: str, family: str | None = None, *, seed: int = 0,
                       drop: tuple[str, ...] = ()):
    """Write the tiny ``family`` model (default: ``CACHED_NAMES[name]``) into the hub cache
    directory ``cache`` (``HF_HUB_CACHE``) under ``name``, leaving out the files named in ``drop``
    (e.g. ``("model.safetensors",)``: a partial download). Returns the Hugging Face model."""
    family = family or CACHED_NAMES[name]
    repo = repo_dir(cache, name)
    stage = repo / ".stage"
    hf = save_family_dir(family, stage, seed)
    if name in REPO_CONFIG:
        path = stage / "config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **REPO_CONFIG[name]}))
    blobs, snap = repo / "blobs", repo / "snapshots" / COMMIT
    blobs.mkdir(parents=True, exist_ok=True)
    snap.mkdir(parents=True, exist_ok=True)
    for f in sorted(stage.iterdir()):
        if f.name in drop:
            continue
        digest = hashlib.sha256(f.read_bytes()).hexdigest()
        shutil.move(str(f), str(blobs / digest))
        try:
            os.symlink(Path("..") / ".." / "blobs" / digest, snap / f.name)
        except OSError:  # no symlinks here: a plain copy, as huggingface_hub itself falls back to
            shutil.copyfile(blobs / digest, snap / f.name)
    shutil.rmtree(stage)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(COMMIT)
    return hf


def point_hub_at(cache: Path, monkeypatch, env: dict | None = None) -> dict:
    """Point this process's huggingface_hub at the hub cache ``cache`` (its constants, read at
    import, and the environment of subprocesses) with offline mode and downloads NOT forced on: the
    loader must turn offline mode on by itself. Returns ``env`` (default: a copy of os.environ)
    updated for a subprocess (``HF_HOME`` whose ``hub`` is ``cache``)."""
    from huggingface_hub import constants

    cache = Path(cache)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    for var in ("SITELENS_ALLOW_DOWNLOAD", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE",
                "HF_HUB_CACHE", "HF_HOME", "TRANSFORMERS_CACHE"):
        monkeypatch.delenv(var, raising=False)
    env = dict(os.environ if env is None else env)
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "SITELENS_ALLOW_DOWNLOAD",
                "HF_HUB_CACHE", "TRANSFORMERS_CACHE"):
        env.pop(var, None)
    assert cache.name == "hub", "HF_HOME/hub is the hub cache a subprocess reads"
    env["HF_HOME"] = str(cache.parent)
    return env
