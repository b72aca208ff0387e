"""Stop tokens of greedy generation (issue 33 item 4, the largest non-compute cost of evaluation):
:func:`sitelens.eval.generation.is_stop` decides each generated id on its own, remembered per model,
instead of decoding the whole vocabulary first (262,144 decodes on Gemma). It must say exactly what
``torch.isin(ids, stop_ids(model))`` says, for every id of the vocabulary (ids past the tokenizer's
vocabulary included), and generation must give the same tokens without the vocabulary scan.
A planted bug (newline tokens never stopping) is caught.
"""

from __future__ import annotations

import pytest
import torch

from sitelens.eval import generation
from sitelens.models import encode, load_model


def _fresh(model):
    """``model`` with no remembered newline ids (neither the full set nor the per-id memo)."""
    for name in ("_sitelens_newline_ids", "_sitelens_newline_memo", "_sitelens_stop_ids"):
        model.__dict__.pop(name, None)
    return model


def _same_as_stop_ids(model) -> None:
    ids = torch.arange(model.cfg.d_vocab)  # every id the model can generate
    for newline in (True, False):
        got = generation.is_stop(_fresh(model), ids, newline=newline)  # per id, memo only
        want = torch.isin(ids, generation.stop_ids(_fresh(model), ids.device, newline=newline))
        assert got.dtype == torch.bool and torch.equal(got, want), newline
        assert generation.is_stop(model, ids, newline=newline).equal(want)  # from the full set too


def test_is_stop_equals_stop_ids_on_every_id(tiny_mha):
    assert generation.newline_ids(_fresh(tiny_mha))  # the tiny vocabulary has a newline token
    _same_as_stop_ids(tiny_mha)


def test_is_stop_check_catches_newlines_that_never_stop(monkeypatch, tiny_mha):
    monkeypatch.setattr(generation, "has_newline", lambda model, i: False)
    with pytest.raises(AssertionError):
        _same_as_stop_ids(tiny_mha)


def test_generation_scans_no_vocabulary_and_gives_the_same_tokens(monkeypatch, tiny_mha):
    enc = encode(tiny_mha, ["a b c", "hello", "x\ny"])
    generation.newline_ids(_fresh(tiny_mha))  # the full set: stops as before
    want = generation.greedy_generate(tiny_mha, enc, max_new_tokens=8)

    def no_scan(model):
        raise AssertionError("the whole vocabulary was decoded")

    monkeypatch.setattr(generation, "newline_ids", no_scan)
    got = generation.greedy_generate(_fresh(tiny_mha), enc, max_new_tokens=8)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.integration
def test_is_stop_equals_stop_ids_on_smollm2_vocabulary():
    _same_as_stop_ids(load_model("smollm2-135m-instruct"))
