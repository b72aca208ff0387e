"""The answer is scored on its content, never on whitespace (:func:`sitelens.tasks.answer_parts`).

A tokenizer that splits digits (SmolLM2's, Gemma 3's, the tiny byte-level one) tokenizes " 150" as
' ', '1', '5', '0': the whitespace-only token moves to the prompt side and '1' is scored. A
tokenizer that merges " 150" into one token keeps it as the answer token and adds nothing to the
prompt. Every scored path (evaluate, the stage-2 items, the baselines' prompts, lenses' prompts)
builds its prompts through :func:`zero_shot_prompts` / ``few_shot_prompts(..., model=model)``.
"""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest
import torch

from sitelens.eval.evaluation import evaluate, summarize
from sitelens.site.training import LastTokenSet
from sitelens.tasks import (
    DEFAULT_TEMPLATE,
    Example,
    SharedAnswerTokenWarning,
    Template,
    answer_parts,
    answer_token_ids,
    few_shot_prompts,
    task_from_pairs,
    warn_shared_answer_token,
    zero_shot_prompts,
)

DOUBLES = [(str(n), str(2 * n)) for n in range(13, 73)]  # answers of 2 or 3 digits
SUCCESSORS = [(str(n), str(n + 1)) for n in range(13, 73)]  # SmolLM2 gets some right with 5 shots


def merging_tokenizer():
    """A byte-level BPE whose merges join a space with the digits after it (" 150" is one token,
    as in tokenizers that do not split digits), built in code."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<bos>": 1, "<eos>": 2}
    for ch in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[ch] = len(vocab)
    merges = [("Ġ", "1"), ("Ġ1", "5"), ("Ġ15", "0")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>",
                                   pad_token="<pad>")


def _is_space(model, token: int) -> bool:
    return not model.tokenizer.decode([token]).strip()


def test_digit_splitting_tokenizer_scores_the_first_digit(tiny_mha):
    tok = tiny_mha.tokenizer
    lead, token = answer_parts(tiny_mha, "150")
    assert lead == " "  # the template's answer prefix, split off as its own token
    assert tok.decode([token]) == "1"
    # words too: the byte-level tokenizer splits " hot" into ' ', 'h', 'o', 't'
    assert answer_parts(tiny_mha, "hot") == (" ", tok("h", add_special_tokens=False)["input_ids"][0])
    assert not any(_is_space(tiny_mha, t) for t in answer_token_ids(tiny_mha, [y for _, y in DOUBLES]))


def test_merging_tokenizer_keeps_its_answer_token():
    model = SimpleNamespace(tokenizer=merging_tokenizer())
    ids = model.tokenizer(" 150", add_special_tokens=False)["input_ids"]
    assert len(ids) == 1  # the fixture merges it
    assert answer_parts(model, "150") == ("", ids[0])
    assert zero_shot_prompts(model, [Example("75", "150")]) == ["Q: 75\nA:"]


def test_official_template_keeps_the_reference_token(tiny_mha):
    """bare_digits (the official protocol) writes "150" with no space, and a non-digit answer with
    its space as the reference code tokenizes it: nothing moves to the prompt."""
    official = Template(bare_digits=True)
    assert answer_parts(tiny_mha, "150", official)[0] == ""
    assert answer_parts(tiny_mha, "hot", official) == ("", tiny_mha.tokenizer(" hot")["input_ids"][0])


def test_whitespace_answer_is_refused(tiny_mha):
    with pytest.raises(ValueError, match="whitespace only"):
        answer_parts(tiny_mha, "  ")


def test_prompts_carry_the_lead_everywhere(tiny_mha):
    """The scored zero-shot and few-shot prompts end with the lead; the prompt's tokens followed by
    the answer token are the tokens of the prompt and the answer written out together."""
    task = task_from_pairs("doubles", DOUBLES)
    items = task.test[:6]
    zs = zero_shot_prompts(tiny_mha, items)
    icl = few_shot_prompts(task, items, 3, model=tiny_mha)
    tok = tiny_mha.tokenizer
    for ex, z, f in zip(items, zs, icl, strict=True):
        assert z == f"Q: {ex.input}\nA: " and f.endswith(z)
        whole = tok(DEFAULT_TEMPLATE.format_query(ex.input) + " " + ex.output)["input_ids"]
        mine = tok(z)["input_ids"]
        assert whole[: len(mine) + 1] == [*mine, answer_parts(tiny_mha, ex.output)[1]]
    # without a model, prompts are as the template writes them (token counting)
    assert few_shot_prompts(task, items, 3)[0].endswith("A:")
    # stage 2's items: answers never whitespace, prompts ending with the lead
    lts = LastTokenSet.build(tiny_mha, items)
    assert not any(_is_space(tiny_mha, int(t)) for t in lts.answers)
    space = tok(" ", add_special_tokens=False)["input_ids"][0]
    assert (lts.last[:, 0] == space).all()


def test_shared_first_token_warns(tiny_mha):
    same = [Example(str(i), f"1{i}") for i in range(10, 20)]  # every answer starts with '1'
    with pytest.warns(SharedAnswerTokenWarning, match="'shared'.*10 of 10"):
        share = warn_shared_answer_token(tiny_mha, "shared", [ex.output for ex in same])
    assert share == 1.0
    varied = [str(d) + "x" for d in range(10)]  # ten different first digits
    with warnings.catch_warnings():
        warnings.simplefilter("error", SharedAnswerTokenWarning)
        assert warn_shared_answer_token(tiny_mha, "varied", varied) == pytest.approx(0.1)


def _check_scored_on_digits(model, n_items: int = 10):
    """evaluate() on numbers and their successors: an item is first-token correct exactly when the
    generation (after the prompt's lead) starts with the answer's first digit — the scored token is
    a digit, never the space every generation of the old prompt started with."""
    task = task_from_pairs("successors", SUCCESSORS)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SharedAnswerTokenWarning)
        df = evaluate(model, task, methods=["zero-shot", "icl"], n_shots=5, limit=n_items)
    for r in df.itertuples():
        assert bool(r.first_token_correct) == r.prediction.startswith(r.target[0]), r
    s = summarize(df).set_index("method")
    assert (s.first_token_acc <= 1.0).all()
    return s


@pytest.mark.integration
def test_smollm2_scores_numbers_on_digits(smollm2):
    lead, token = answer_parts(smollm2, "150")
    assert lead == " " and smollm2.tokenizer.decode([token]) == "1"
    assert answer_parts(smollm2, "hot")[0] == ""  # " hot" is one token: nothing moves
    s = _check_scored_on_digits(smollm2)
    assert s.loc["icl", "exact_match"] > 0  # the check above saw real answers, not only misses


@pytest.mark.integration
def test_gemma_scores_numbers_on_digits(gemma):
    lead, token = answer_parts(gemma, "150")
    assert lead == " " and gemma.tokenizer.decode([token]) == "1"
    assert answer_parts(gemma, "hot")[0] == ""
    _check_scored_on_digits(gemma)


def test_first_token_is_not_the_space_in_training(tiny_mha):
    """A stage-2 batch of all-digit answers: the answer tokens are digits, so a model that always
    predicts a space gets no first-token credit (the bug this file guards against)."""
    task = task_from_pairs("doubles", DOUBLES)
    lts = LastTokenSet.build(tiny_mha, task.valid)
    space = tiny_mha.tokenizer(" ", add_special_tokens=False)["input_ids"][0]
    assert not bool((lts.answers == torch.tensor(space)).any())


def test_numerics_touches_follows_each_bumps_rule():
    """Version 3 touched only tasks with an answer whose first token is whitespace only: under a
    tokenizer that merges " 150" a task of such answers is untouched, one of words (" hot" splits
    into ' ', 'h', ...) is touched; a version with no rule (1) touches everything."""
    from sitelens.provenance import NUMERICS_VERSION
    from sitelens.tasks.numerics import numerics_touches

    model = SimpleNamespace(tokenizer=merging_tokenizer())
    merged = task_from_pairs("merged", [(str(n), "150") for n in range(12)])
    words = task_from_pairs("words", [(str(n), "hot") for n in range(12)])
    assert not numerics_touches(model, merged, since=2)
    assert numerics_touches(model, words, since=2)
    assert not numerics_touches(model, words, since=NUMERICS_VERSION)  # nothing since
    assert numerics_touches(model, merged, since=0)  # version 1: no rule, everything moved
