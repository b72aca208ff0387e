"""sitelens.models.compat: every workaround has an entry saying what lets it go, a workaround whose
release has become the project's floor fails here (delete it), and each shim adapts to both
layouts it stands between."""

from __future__ import annotations

import re
import types
from pathlib import Path

import pytest
import torch

import sitelens.models.compat as C

ROOT = Path(__file__).resolve().parents[1]


def _floor(dist: str) -> tuple[int, ...] | None:
    """The lower bound ``pyproject.toml`` puts on ``dist`` (``>=X.Y``), as a version tuple."""
    text = (ROOT / "pyproject.toml").read_text()
    m = re.search(rf'"{re.escape(dist)}\s*>=\s*([0-9.]+)', text)
    return tuple(int(x) for x in m.group(1).split(".")) if m else None


def _version(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split("."))


def test_every_workaround_has_one_entry_naming_what_lets_it_go():
    functions = {n for n in C.__all__ if n not in ("WORKAROUNDS", "Workaround")}
    names = [w.name for w in C.WORKAROUNDS]
    assert len(names) == len(set(names)) and set(names) == functions
    for w in C.WORKAROUNDS:
        assert callable(getattr(C, w.name)) and w.upstream and w.until
        assert w.drop_when is None or (_floor(w.drop_when[0]) is not None), w


def test_no_workaround_outlives_its_release():
    """A workaround whose ``drop_when`` release the project now requires is dead code: delete it
    (and its entry)."""
    dead = [f"{w.name} ({w.drop_when[0]} >= {w.drop_when[1]})" for w in C.WORKAROUNDS
            if w.drop_when and _floor(w.drop_when[0]) >= _version(w.drop_when[1])]
    assert dead == []


def test_floor_check_sees_a_raised_floor(monkeypatch, tmp_path):
    """The check above on a pyproject whose transformers floor is 5.25: it names the
    transformers 4.x shims."""
    (tmp_path / "pyproject.toml").write_text('dependencies = ["transformers>=5.25", '
                                             '"transformer-lens>=3.9,<4"]\n')
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    with pytest.raises(AssertionError, match="layer_kv .transformers >= 5.0."):
        test_no_workaround_outlives_its_release()


def test_layer_kv_reads_and_writes_both_cache_layouts():
    from transformers import DynamicCache

    k, v = torch.randn(2, 1, 3, 4), torch.randn(2, 1, 3, 4)  # [batch, n_kv_heads, pos, d_head]
    new = DynamicCache()  # transformers 5: .layers
    new.update(k, v, 0)
    old = types.SimpleNamespace(key_cache=[k], value_cache=[v])  # transformers 4.x
    for cache in (new, old):
        (got_k, got_v), = C.layer_kv(cache)
        assert torch.equal(got_k, k) and torch.equal(got_v, v)
        C.set_layer_kv(cache, [(v, k)])
        (got_k, got_v), = C.layer_kv(cache)
        assert got_k is v and got_v is k  # the tensors themselves


def test_cache_keyword_and_alias():
    assert C.cache_keyword({"input_ids", "cache", "use_cache"}) == "cache"
    assert C.cache_keyword({"input_ids", "past_key_values"}) == "past_key_values"
    seen = {}

    class Attn(torch.nn.Module):
        def forward(self, x, past_key_values=None, **kw):
            seen["cache"] = past_key_values
            return x

    attn = Attn()
    C.alias_cache_keyword(attn)
    C.alias_cache_keyword(attn)  # once per module
    assert len(attn._forward_pre_hooks) == 1
    attn(torch.zeros(1), cache="the cache")
    assert seen["cache"] == "the cache"


def test_rope_accessors_read_both_config_layouts():
    new = types.SimpleNamespace(rope_parameters={
        "full_attention": {"rope_theta": 1e6, "rope_type": "default"},
        "sliding_attention": {"rope_theta": 1e4, "rope_type": "default"},
    })
    assert C.rope_theta(new, "full_attention") == 1e6 and C.rope_theta(new, "sliding_attention") == 1e4
    old = types.SimpleNamespace(rope_theta=5e5, rope_local_base_freq=1e4, rope_scaling={"type": "linear"},
                                partial_rotary_factor=0.4)
    assert C.rope_theta(old) == 5e5 and C.rope_theta(old, "sliding_attention") == 1e4
    assert C.rope_scaling(old) == {"type": "linear"} and C.partial_rotary_factor(old) == 0.4
    assert C.rope_theta(types.SimpleNamespace()) == 10000.0
    half = types.SimpleNamespace(rope_parameters={"partial_rotary_factor": 0.5})
    assert C.partial_rotary_factor(half) == 0.5
    assert C.partial_rotary_factor(types.SimpleNamespace()) == 1.0
