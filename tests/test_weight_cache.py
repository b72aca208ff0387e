"""The processed-weight cache on a tiny model: a cached load is the same model as the one written
(bit-identical logits, the fast layout without a copy), a directory of another format is rebuilt
and never read, the tokenizer read straight from its file behaves like ``AutoTokenizer``'s, and
concurrent first loads convert once."""

from __future__ import annotations

import json
import threading
import time

import pytest
import torch

import sitelens.models.cache as C
import sitelens.models.load as L
from sitelens import ModelError, encode
from sitelens.models import has_hooked_transformer
from sitelens.models.prepare import FAST_LAYOUT, fast_layout, fast_memory, from_fast_memory, prepare_model
from sitelens.testing import tiny_model as _tiny

HOOKED = pytest.mark.skipif(not has_hooked_transformer(),
                            reason="HookedTransformer only: the processed-weight cache holds its weights")


def tiny_model(seed: int = 0):
    return _tiny(seed=seed, backend="hooked")

PROMPTS = ["Q: hot\nA:", "Q: a longer prompt\nA:"]


def _logits(model) -> torch.Tensor:
    enc = encode(model, PROMPTS)
    with torch.no_grad():
        return model(enc.tokens, attention_mask=enc.attention_mask)


def _plain(model):
    """``model`` with every parameter made contiguous: the layout a conversion hands to the cache."""
    for p in model.parameters():
        p.data = p.data.contiguous()
    return model


def _write_format_1(target) -> None:
    """A directory as format 1 wrote it: plain layout, no format in the metadata; with other
    weights (tiny_model seed 1), so reading it shows in the logits."""
    from safetensors.torch import save_file

    old = _plain(tiny_model(seed=1))
    target.mkdir()
    save_file({k: v.contiguous() for k, v in old.state_dict().items()}, str(target / C.WEIGHTS_FILE))
    (target / "config.json").write_text(json.dumps(
        {k: v for k, v in old.cfg.to_dict().items() if C._jsonable(v)}))
    old.tokenizer.save_pretrained(str(target / "tokenizer"))


@pytest.fixture
def fake_bundled(tmp_path, monkeypatch):
    """``_load_bundled("fake")`` with the cache directory in ``tmp_path`` and a conversion that
    returns tiny_model(seed=0) in the plain layout (a list counts the conversions)."""
    converted = []

    def convert(name, *, n_ctx):
        converted.append(name)
        model = _plain(tiny_model(seed=0))
        return model, model.tokenizer

    monkeypatch.setattr(L, "processed_dir", lambda name, n_ctx: tmp_path / f"{name}-{n_ctx}")
    monkeypatch.setattr(L, "_convert_bundled", convert)
    return tmp_path / "fake-256", converted


@HOOKED
def test_a_cached_load_is_the_written_model_bit_for_bit(fake_bundled):
    target, converted = fake_bundled
    ref = tiny_model(seed=0)  # finalized: the fast layout, as every load ends
    first = prepare_model(L._load_bundled("fake", n_ctx=256, use_cache=True))
    again = prepare_model(L._load_bundled("fake", n_ctx=256, use_cache=True))
    assert converted == ["fake"] and C.stored_format(target) == C.CACHE_FORMAT
    for model in (first, again):
        # the same values in the same strides run the same kernels: exact, no tolerance
        assert torch.equal(_logits(model), _logits(ref))
        params = dict(model.named_parameters())
        for name, p in ref.named_parameters():
            assert params[name].stride() == p.stride(), name
    # the weights arrive in the fast layout: finalizing again copies nothing
    ptrs = {n: p.data_ptr() for n, p in again.named_parameters()}
    fast_layout(again)
    assert {n: p.data_ptr() for n, p in again.named_parameters()} == ptrs
    assert any(n.rsplit(".", 1)[-1] in FAST_LAYOUT for n in ptrs)


@HOOKED
def test_a_cache_of_another_format_is_rebuilt_never_read(fake_bundled, monkeypatch):
    target, converted = fake_bundled
    _write_format_1(target)
    assert C.stored_format(target) is None
    with pytest.raises(ModelError, match="format None"):
        C.load_processed(target, "fake")
    model = prepare_model(L._load_bundled("fake", n_ctx=256, use_cache=True))
    assert converted == ["fake"] and C.stored_format(target) == C.CACHE_FORMAT
    assert torch.equal(_logits(model), _logits(tiny_model(seed=0)))
    # nothing left aside (the conversion's lock file, one_converter's, stays by design)
    assert sorted(p.name for p in target.parent.iterdir() if p.suffix != ".lock") == [target.name]


def test_the_cache_format_is_part_of_the_cache_key(tmp_path, monkeypatch):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"x" * 10)
    monkeypatch.setattr(C, "_gguf_path", lambda name: gguf)
    now = C.processed_dir("smollm2-135m-instruct", 2048)
    monkeypatch.setattr(C, "CACHE_FORMAT", C.CACHE_FORMAT - 1)
    assert C.processed_dir("smollm2-135m-instruct", 2048) != now


def test_fast_memory_round_trips_every_layout_rule():
    for leaf, (ndim, _) in FAST_LAYOUT.items():
        w = torch.randn(*(3, 4, 5)[:ndim])
        name = f"blocks.0.x.{leaf}"
        stored = fast_memory(name, w)
        assert stored.is_contiguous()
        back = from_fast_memory(name, stored)
        assert torch.equal(back, w) and back.data_ptr() == stored.data_ptr()
        assert back.permute(FAST_LAYOUT[leaf][1]).is_contiguous()  # TransformerLens's view
    other = torch.randn(3, 4)
    assert from_fast_memory("embed.W_E", fast_memory("embed.W_E", other)).stride() == (4, 1)


@HOOKED
def test_the_tokenizer_read_from_its_file_behaves_like_auto_tokenizer(tmp_path):
    from transformers import AutoTokenizer

    tiny_model().tokenizer.save_pretrained(str(tmp_path))
    (tmp_path / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")
    auto, fast = AutoTokenizer.from_pretrained(str(tmp_path)), C.load_tokenizer(tmp_path)
    for text in ["Q: hot\nA: cold", "  tabs\tand ünïcödé 🚀", "<bos>x<eos>", ""]:
        for special in (False, True):
            ids = auto(text, add_special_tokens=special)["input_ids"]
            assert fast(text, add_special_tokens=special)["input_ids"] == ids
            assert fast.decode(ids) == auto.decode(ids)
            assert fast.convert_ids_to_tokens(ids) == auto.convert_ids_to_tokens(ids)
    for attr in ("bos_token_id", "eos_token_id", "pad_token_id", "all_special_ids",
                 "special_tokens_map", "model_max_length", "chat_template"):
        assert getattr(fast, attr) == getattr(auto, attr), attr
    assert fast.chat_template == "{{ messages[0]['content'] }}"


@HOOKED
def test_mutation_a_loader_blind_to_the_format_misreads_an_old_cache(fake_bundled, monkeypatch):
    """The break the format checks exist for: with both checks gone, the old directory's weights
    (seed 1, plain layout, read as if in the fast layout) come back instead of a rebuilt model."""
    target, converted = fake_bundled
    _write_format_1(target)
    monkeypatch.setattr(L, "stored_format", lambda t: C.CACHE_FORMAT)
    monkeypatch.setattr(C, "stored_format", lambda t: C.CACHE_FORMAT)
    try:
        model = prepare_model(L._load_bundled("fake", n_ctx=256, use_cache=True))
    except RuntimeError:  # a transposed matrix of another shape: load_state_dict refuses it
        return
    assert not converted
    assert not torch.equal(_logits(model), _logits(tiny_model(seed=0)))


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
@pytest.mark.parametrize("tied", [False, True])
def test_a_dequantized_model_loads_back_exactly(tmp_path, arch, tied):
    """The bridge backend's cache: a model built without weight init and loaded from the file is
    the saved model (exact logits), its tied embeddings tied again (SmolLM2 and Gemma-3 tie)."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM

    tok = _tiny().tokenizer
    common = dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
                  tie_word_embeddings=tied, bos_token_id=tok.bos_token_id, pad_token_id=tok.pad_token_id)
    cls, cfg = ((LlamaForCausalLM, LlamaConfig(**common)) if arch == "llama"
                else (Gemma3ForCausalLM, Gemma3TextConfig(sliding_window=64, **common)))
    cfg.architectures = [cls.__name__]
    torch.manual_seed(0)
    hf = cls(cfg).eval()
    C.save_dequantized(tmp_path / "d", hf, tok)
    back, tok2 = C.load_dequantized(tmp_path / "d")
    ids = torch.tensor([tok(" Q: hot\nA:", add_special_tokens=False)["input_ids"]])
    with torch.no_grad():  # the same weights and buffers in the same model class: exact
        assert torch.equal(back(ids).logits, hf(ids).logits)
    emb, head = back.get_input_embeddings().weight, back.get_output_embeddings().weight
    assert (emb.data_ptr() == head.data_ptr()) == tied
    assert tok2("Q: hot")["input_ids"] == tok("Q: hot")["input_ids"]


def _tiny_llama(tok):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                      max_position_embeddings=64, bos_token_id=tok.bos_token_id,
                      pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval()


def _load_twice_at_once(load) -> list:
    """``load()`` in two threads that start together; their results."""
    start, out = threading.Barrier(2), []

    def run():
        start.wait()
        out.append(load())

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return out


def test_concurrent_first_loads_dequantize_once(tmp_path, monkeypatch):
    """Two loads of one bundled model on a cold cache at the same time (two pytest-xdist workers,
    two executor processes): one dequantizes and writes the cache directory, the other waits on
    its lock and loads what it wrote, with the same weights. The conversion here takes 1 s, so the
    second load asks while the first converts (a real one takes minutes)."""
    tok = _tiny().tokenizer
    calls = []

    def dequantize(name):
        calls.append(name)
        time.sleep(1.0)
        return _tiny_llama(tok), tok

    monkeypatch.setattr(L, "dequantized_dir", lambda name: tmp_path / "hf" / name)
    monkeypatch.setattr(L, "_dequantize_bundled", dequantize)
    monkeypatch.setattr(L, "bridge_from_hf", lambda hf, tokenizer, **kw: hf)  # the HF model itself
    out = _load_twice_at_once(lambda: L._load_bundled_bridge("smollm2-135m-instruct", n_ctx=64))
    assert calls == ["smollm2-135m-instruct"] and len(out) == 2
    assert C.is_cached(tmp_path / "hf" / "smollm2-135m-instruct")
    ref = _tiny_llama(tok).state_dict()
    for hf in out:  # the writer's own model and the waiter's load of the file: the same weights
        assert all(torch.equal(v, ref[k]) for k, v in hf.state_dict().items())


@HOOKED
def test_concurrent_first_loads_convert_once(fake_bundled, monkeypatch):
    """The same on the processed-weight cache (backend="hooked")."""
    target, converted = fake_bundled
    slow = L._convert_bundled

    def convert(name, *, n_ctx):
        time.sleep(1.0)
        return slow(name, n_ctx=n_ctx)

    monkeypatch.setattr(L, "_convert_bundled", convert)
    out = _load_twice_at_once(lambda: prepare_model(L._load_bundled("fake", n_ctx=256, use_cache=True)))
    assert converted == ["fake"] and len(out) == 2
    for model in out:
        assert torch.equal(_logits(model), _logits(tiny_model(seed=0)))
