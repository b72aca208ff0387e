"""Property-based tests (hypothesis) for task loading and prompt building."""

import json
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sitelens.tasks import (
    Example,
    Template,
    embedding_prompts,
    few_shot_prompts,
    load_task,
    split_examples,
    task_from_pairs,
)

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Strings a task may hold: any non-blank text, no surrogates (not encodable as UTF-8 JSON).
text = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=12
).filter(lambda s: s.strip())
pairs = st.lists(st.tuples(text, text), min_size=3, max_size=40, unique=True)
# Inputs for prompt tests: anything but a newline (so the blocks of a prompt can be parsed back),
# template-like characters included ("{y}" inside an input must stay literal).
word = st.text(alphabet="abcxyzQA0 :{}-'é", min_size=1, max_size=8).filter(lambda s: s.strip())
unique_input_pairs = st.lists(st.tuples(word, word), min_size=4, max_size=30,
                              unique_by=lambda p: p[0])


def _items(task):
    return task.train + task.valid + task.test


@SETTINGS
@given(pairs, st.integers(0, 2**16))
def test_pairs_round_trip_through_task_from_pairs(ps, seed):
    task = task_from_pairs("t", ps, seed=seed)
    assert sorted((e.input, e.output) for e in _items(task)) == sorted(ps)
    dicts = task_from_pairs("t", [{"input": a, "output": b} for a, b in ps], seed=seed)
    assert (dicts.train, dicts.valid, dicts.test) == (task.train, task.valid, task.test)


@SETTINGS
@given(pairs, st.integers(0, 2**16))
def test_pairs_round_trip_through_a_json_file(ps, seed):
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "mytask.json"
        f.write_text(json.dumps([{"input": a, "output": b} for a, b in ps], ensure_ascii=False),
                     encoding="utf-8")
        task = load_task(f, seed=seed)
    assert task.name == "mytask"
    assert sorted((e.input, e.output) for e in _items(task)) == sorted(ps)
    same = task_from_pairs("mytask", ps, seed=seed)  # the file and the list split alike
    assert (task.train, task.valid, task.test) == (same.train, same.valid, same.test)


@SETTINGS
@given(pairs, st.integers(0, 2**16))
def test_splits_are_disjoint_cover_everything_and_are_seeded(ps, seed):
    items = [Example(a, b) for a, b in ps]
    train, valid, test = split_examples(items, seed=seed)
    assert train and valid and test
    assert len(train) + len(valid) + len(test) == len(items)
    assert set(train) | set(valid) | set(test) == set(items)
    assert not (set(train) & set(valid) or set(train) & set(test) or set(valid) & set(test))
    assert split_examples(list(items), seed=seed) == (train, valid, test)


@settings(max_examples=20, deadline=None)
@given(st.lists(st.tuples(word, word), min_size=12, max_size=30, unique_by=lambda p: p[0]))
def test_another_seed_gives_another_split(ps):
    items = [Example(a, b) for a, b in ps]
    splits = {tuple(map(tuple, split_examples(items, seed=s))) for s in range(5)}
    assert len(splits) > 1


def _demo_inputs(prompt: str, template: Template) -> list[str]:
    """The demonstration inputs of a default-template prompt, in order."""
    blocks = prompt.split("\n\n")
    return [b.split("\n")[0][len("Q: "):] for b in blocks[:-1]]


@SETTINGS
@given(unique_input_pairs, st.integers(0, 2**16), st.data())
def test_a_query_never_appears_among_its_own_demonstrations(ps, seed, data):
    task = task_from_pairs("t", ps, seed=seed)
    queries = task.train + task.test  # train queries are the hard case: they are in the pool
    n_shots = data.draw(st.integers(1, len(task.train) - 1))
    prompts = few_shot_prompts(task, queries, n_shots, seed=seed)
    template = Template()
    train_inputs = {e.input for e in task.train}
    for q, p in zip(queries, prompts, strict=True):
        demos = _demo_inputs(p, template)
        assert len(demos) == n_shots
        assert q.input not in demos
        assert len(set(demos)) == n_shots and set(demos) <= train_inputs  # from train, no repeats
        assert p.endswith(template.format_query(q.input))


@SETTINGS
@given(unique_input_pairs, st.integers(0, 2**16), st.data())
def test_embedding_prompts_never_show_their_query(ps, seed, data):
    task = task_from_pairs("t", ps, seed=seed)
    n_shots = data.draw(st.integers(1, len(task.train) - 1))
    for p in embedding_prompts(task, 8, n_shots, seed=seed):
        query = p.split("\n\n")[-1].split("\n")[0][len("Q: "):]
        assert query not in _demo_inputs(p, Template())


@SETTINGS
@given(unique_input_pairs, st.integers(0, 2**16))
def test_prompts_are_seeded(ps, seed):
    task = task_from_pairs("t", ps, seed=0)
    n = len(task.train) - 1
    a = few_shot_prompts(task, task.test, n, seed=seed)
    assert a == few_shot_prompts(task, task.test, n, seed=seed)
