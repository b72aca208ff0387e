"""sitelens.tasks.shots: prompt lengths per shot count and the largest k that fits the context.

A stub tokenizer stands in for the bundled ones (no model is run: only token counts matter). It
splits words, and it splits a shot's closing ``"\\n\\n"`` in two when ``"Q"`` follows, as
SmolLM2's byte-level BPE does, so that a count made by adding the parts' lengths is wrong by one
token per demonstration unless the boundary is accounted for.
"""

from __future__ import annotations

import itertools
import re
from types import SimpleNamespace

import pytest

from sitelens.tasks import Example, Task, few_shot_prompt, few_shot_prompts
from sitelens.tasks.shots import (
    boundary_tokens,
    collection_shots,
    guaranteed_lengths,
    seeded_lengths,
    shots_that_fit,
)

_TOKEN = re.compile(r"\n\n|\n| ?[^\s]+| ")


class StubTokenizer:
    bos_token_id = 0

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict:
        ids = []
        for m in _TOKEN.finditer(text):
            piece = m.group(0)
            if piece == "\n\n" and text[m.end():m.end() + 1] == "Q":
                ids += [1, 1]  # split before "Q:" (SmolLM2's pre-tokenizer does this)
            else:
                ids.append(2 + len(piece))
        return {"input_ids": ids}


def stub_model(n_ctx: int = 2048, bos: bool = True):
    return SimpleNamespace(tokenizer=StubTokenizer(),
                           cfg=SimpleNamespace(n_ctx=n_ctx, default_prepend_bos=bos))


def n_tokens(model, prompt: str) -> int:
    return int(model.cfg.default_prepend_bos) + len(model.tokenizer(prompt)["input_ids"])


@pytest.fixture(scope="module")
def task():
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
    train = [Example(" ".join(words[: 1 + (3 * i) % 11]), words[i % 12]) for i in range(7)]
    test = [Example(" ".join(words[i: i + 2 + i % 4]), words[-i]) for i in range(5)]
    return Task("stub", train, [Example("mu nu", "xi")], test)


def test_the_stub_splits_the_boundary(task):
    assert boundary_tokens(stub_model(), task) == 1


def test_seeded_lengths_are_the_prompts_lengths(task):
    model = stub_model()
    got = seeded_lengths(model, task, 5, seed=3, n_checked=0)  # no self-check: compared here
    for k in range(6):
        prompts = few_shot_prompts(task, task.test, k, seed=3)
        assert got[k] == max(n_tokens(model, p) for p in prompts), k


def test_the_guaranteed_bound_is_the_longest_prompt_any_seed_builds(task):
    model = stub_model()
    bound = guaranteed_lengths(model, task, 3)
    queries = [*task.train, *task.valid, *task.test]
    for k in range(4):
        # every k demonstrations in every order, before every query (a query is never among its
        # own demonstrations in a real prompt; allowing it only raises the maximum)
        longest = max(n_tokens(model, few_shot_prompt(list(demos), q.input))
                      for demos in itertools.permutations(task.train, k) for q in queries)
        assert bound[k] == longest, k
    for seed in range(5):
        assert all(b >= s for b, s in zip(bound, seeded_lengths(model, task, 3, seed=seed)))


def test_shots_that_fit_is_the_largest_k_under_the_context(task):
    model = stub_model()
    lengths = guaranteed_lengths(model, task, 6)
    for n_ctx in (lengths[0] + 10, lengths[2] + 10, lengths[6] + 10):
        fit = shots_that_fit(model, task, n_ctx=n_ctx, reserve=10, max_shots=6)
        assert lengths[fit.k] + 10 <= n_ctx
        assert fit.k == 6 or lengths[fit.k + 1] + 10 > n_ctx
        assert fit.tokens_at_k == lengths[fit.k]
    assert shots_that_fit(model, task, n_ctx=lengths[0] + 9, reserve=10).k == -1
    short = Task("short", task.train[:2], task.valid, [Example("mu", "nu")])
    assert collection_shots(model, [task, short], n_ctx=lengths[3] + 10, reserve=10,
                            max_shots=6) == 1  # "short" has 2 training items: at most 1 shot
