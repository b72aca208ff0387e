"""Invariant checks for the built-in in-context-learning task suite."""

import json
from pathlib import Path

import pytest

TASK_DIR = Path(__file__).parents[1] / "sitelens" / "data" / "tasks"
TASK_FILES = sorted(TASK_DIR.glob("*.json"))
TASK_NAMES = [p.stem for p in TASK_FILES]
MIN_ITEMS = {"animal_young": 30}
DEFAULT_MIN_ITEMS = 40

EXPECTED_TASKS = {
    "antonym",
    "synonym",
    "singular_plural",
    "present_past",
    "adjective_comparative",
    "country_capital",
    "country_currency",
    "landmark_country",
    "person_occupation",
    "country_language",
    "animal_young",
    "english_french",
    "english_german",
    "english_spanish",
    "english_italian",
    "capitalize",
    "lowercase_first_letter",
    "first_letter",
    "last_letter",
    "capitalize_first_letter",
    "word_length",
    "uppercase",
    "choose_first_of_3",
    "choose_last_of_3",
    "choose_middle_of_3",
    "alphabetically_first_3",
    "alphabetically_last_3",
    "next_item",
    "prev_item",
}


def load(name):
    with open(TASK_DIR / f"{name}.json", encoding="utf-8") as f:
        return json.load(f)


def pairs(name):
    return [(d["input"], d["output"]) for d in load(name)]


def test_enough_task_files():
    assert len(TASK_FILES) >= 24


def test_expected_tasks_present():
    missing = EXPECTED_TASKS - set(TASK_NAMES)
    assert not missing, f"missing tasks: {sorted(missing)}"


@pytest.mark.parametrize("name", TASK_NAMES)
def test_task_schema(name):
    data = load(name)
    assert isinstance(data, list)
    assert len(data) >= MIN_ITEMS.get(name, DEFAULT_MIN_ITEMS)
    seen = set()
    for item in data:
        assert isinstance(item, dict)
        assert set(item) == {"input", "output"}, item
        for key in ("input", "output"):
            value = item[key]
            assert isinstance(value, str), item
            assert value.strip(), item
            assert value == value.strip(), item
            assert "\n" not in value and "\r" not in value, item
        assert item["input"] not in seen, f"duplicate input {item['input']!r}"
        seen.add(item["input"])


STRING_RULES = {
    "capitalize": lambda s: s[:1].upper() + s[1:],
    "uppercase": str.upper,
    "first_letter": lambda s: s[0],
    "last_letter": lambda s: s[-1],
    "capitalize_first_letter": lambda s: s[0].upper(),
    "lowercase_first_letter": lambda s: s[0].lower(),
    "word_length": lambda s: str(len(s)),
}


@pytest.mark.parametrize("name", sorted(STRING_RULES))
def test_string_tasks(name):
    rule = STRING_RULES[name]
    for inp, out in pairs(name):
        assert out == rule(inp), (inp, out)


@pytest.mark.parametrize(
    "name",
    [
        "first_letter",
        "last_letter",
        "capitalize_first_letter",
        "word_length",
        "uppercase",
        "capitalize",
    ],
)
def test_string_task_inputs_are_lowercase_words(name):
    for inp, _ in pairs(name):
        assert inp.isalpha() and inp.islower() and len(inp) >= 3, inp


def test_lowercase_first_letter_inputs_capitalized():
    for inp, _ in pairs("lowercase_first_letter"):
        assert inp.isalpha() and inp[0].isupper() and len(inp) >= 3, inp


LIST_RULES = {
    "choose_first_of_3": lambda ws: ws[0],
    "choose_middle_of_3": lambda ws: ws[1],
    "choose_last_of_3": lambda ws: ws[2],
    "alphabetically_first_3": min,
    "alphabetically_last_3": max,
}


@pytest.mark.parametrize("name", sorted(LIST_RULES))
def test_list_tasks(name):
    rule = LIST_RULES[name]
    for inp, out in pairs(name):
        words = inp.split(", ")
        assert len(words) == 3, inp
        assert len(set(words)) == 3, inp
        assert out == rule(words), (inp, out)
        if name.startswith("alphabetically"):
            assert words.count(out) == 1


def test_next_prev_are_inverses():
    nxt = dict(pairs("next_item"))
    prv = dict(pairs("prev_item"))
    shared = 0
    for a, b in nxt.items():
        if b in prv:
            assert prv[b] == a, (a, b, prv[b])
            shared += 1
    for b, a in prv.items():
        if a in nxt:
            assert nxt[a] == b, (b, a, nxt[a])
    assert shared >= 40


def test_singular_plural_outputs_differ():
    for inp, out in pairs("singular_plural"):
        assert out != inp, inp


def test_translation_outputs_no_articles():
    articles = (
        "le ",
        "la ",
        "les ",
        "l'",
        "der ",
        "die ",
        "das ",
        "el ",
        "los ",
        "las ",
        "il ",
        "lo ",
        "gli ",
    )
    for lang in ("french", "german", "spanish", "italian"):
        for inp, out in pairs(f"english_{lang}"):
            assert not out.lower().startswith(articles), (lang, inp, out)
