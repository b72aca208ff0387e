import json

import pytest

from sitelens import TaskError, TokenizationError, answer_token_id, builtin_tasks, load_task
from sitelens.tasks import embedding_prompts, few_shot_prompts, task_from_pairs, zero_shot_prompt


def test_builtin_suite_has_at_least_24_tasks():
    names = builtin_tasks()
    assert len(names) >= 24
    assert {"antonym", "english_french", "english_german", "first_letter"} <= set(names)


def test_builtin_task_splits_are_disjoint_and_seeded():
    a, b = load_task("antonym", seed=0), load_task("antonym", seed=0)
    assert a.train == b.train and a.test == b.test
    assert load_task("antonym", seed=1).train != a.train
    tr, va, te = ({(e.input, e.output) for e in s} for s in (a.train, a.valid, a.test))
    assert not (tr & va) and not (tr & te) and not (va & te)
    assert len(a.train) > len(a.test) > 0 and len(a.valid) > 0


def test_fv_layout_directory(tmp_path):
    d = tmp_path / "mytask"
    d.mkdir()
    for s, n in (("train", 12), ("valid", 3), ("test", 4)):
        (d / f"{s}.json").write_text(json.dumps([{"input": f"{s}{i}", "output": i} for i in range(n)]))
    t = load_task(d)
    assert t.name == "mytask" and len(t.train) == 12 and t.test[1].output == "1"  # numbers -> str


def test_json_file_of_pairs(tmp_path):
    f = tmp_path / "pairs.json"
    f.write_text(json.dumps([{"input": f"w{i}", "output": f"o{i}"} for i in range(30)]))
    t = load_task(f, seed=3)
    assert len(t.train) + len(t.valid) + len(t.test) == 30


def test_unknown_task_suggests_close_names():
    with pytest.raises(TaskError, match="antonym"):
        load_task("antonymm")


@pytest.mark.parametrize(
    "content, match",
    [
        ("{not json", "not valid JSON"),
        ("[]", "no items"),
        ('{"input": "a"}', "JSON list"),
        ('[{"input": "a"}]', "'input' and 'output'"),
        ('[{"input": "a", "output": null}]', "non-string"),
        ('[{"input": "a", "output": ""}]', "empty"),
        ('[{"input": "a", "output": "b"}, {"input": "a", "output": "b"}, {"input": "c", "output": "d"}]',
         "duplicate"),
    ],
)
def test_malformed_task_files(tmp_path, content, match):
    f = tmp_path / "bad.json"
    f.write_text(content)
    with pytest.raises(TaskError, match=match):
        load_task(f)


def test_dedupe_keeps_first(tmp_path):
    items = [{"input": "a", "output": "b"}] * 2 + [{"input": f"x{i}", "output": "y"} for i in range(5)]
    f = tmp_path / "dups.json"
    f.write_text(json.dumps(items))
    t = load_task(f, dedupe=True)
    assert len(t.train) + len(t.valid) + len(t.test) == 6


def test_prompts_follow_the_reference_template():
    t = load_task("antonym")
    assert zero_shot_prompt("hot") == "Q: hot\nA:"
    p = few_shot_prompts(t, t.test[:1], 2, seed=0)[0]
    blocks = p.split("\n\n")
    assert len(blocks) == 3 and blocks[-1] == f"Q: {t.test[0].input}\nA:"
    for b in blocks[:2]:
        q, a = b.split("\n")
        assert q.startswith("Q: ") and a.startswith("A: ")
        assert any(e.input == q[3:] and e.output == a[3:] for e in t.train)  # demos from train


def test_query_never_among_its_demonstrations():
    t = task_from_pairs("tiny", [(f"x{i}", f"y{i}") for i in range(20)])
    for q, p in zip(t.train, few_shot_prompts(t, t.train, len(t.train) - 1, seed=0)):
        assert f"Q: {q.input}\nA: " not in p


def test_too_few_training_items_for_shots():
    t = task_from_pairs("tiny", [(f"x{i}", f"y{i}") for i in range(10)])
    with pytest.raises(TaskError, match="fewer shots"):
        few_shot_prompts(t, t.test, 50)
    with pytest.raises(TaskError, match="fewer shots"):
        embedding_prompts(t, 5, 50)


def test_shuffled_labels_permute_demo_outputs():
    t = load_task("antonym")
    clean = few_shot_prompts(t, t.test[:3], 5, seed=1)
    corrupt = few_shot_prompts(t, t.test[:3], 5, seed=1, shuffle_labels=True)
    assert clean != corrupt
    for c, d in zip(clean, corrupt, strict=True):
        c_lines, d_lines = c.split("\n"), d.split("\n")
        assert [x for x in c_lines if x.startswith("Q:")] == [x for x in d_lines if x.startswith("Q:")]
        c_ans = [x for x in c_lines if x.startswith("A: ")]
        d_ans = [x for x in d_lines if x.startswith("A: ")]
        assert sorted(c_ans) == sorted(d_ans) and c_ans != d_ans


def test_answer_token_has_leading_space(tiny_mha):
    tid = answer_token_id(tiny_mha, "cold")
    # the byte tokenizer splits " cold" into ' ', 'c', ...: the space goes to the prompt side and
    # the scored token is the first one that carries the answer
    assert tiny_mha.tokenizer.decode([tid]) == "c"
    with pytest.raises(TokenizationError):
        from sitelens.tasks import Template

        answer_token_id(tiny_mha, "", Template(answer_prefix=""))
