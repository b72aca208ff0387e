"""Tasks: input/output pairs in seeded train/valid/test splits, prompt building, answer tokens.

A task comes from the built-in suite (``sitelens/data/tasks/*.json``), from an FV-layout directory
``TASK/{train,valid,test}.json``, or from one JSON file of pairs (:func:`load_task`), or from a
list of pairs in Python (:func:`task_from_pairs`); the suite, files and lists are split 70/10/20
with a seed, FV-layout directories keep their own splits. A collection — a directory of FV-layout
task folders such as ``../shared/datasets/cls`` — loads with :func:`load_collection`. An FV-layout
directory may also hold ``labels.json``, the task's closed label set (:mod:`sitelens.eval.labels`).

Prompts: :func:`zero_shot_prompt` (the query alone), :func:`few_shot_prompts` (demonstrations from
the train split, never the query itself), :func:`embedding_prompts` (stage 1's few-shot prompts),
all through a :class:`Template`. :func:`answer_parts` splits an answer into its prompt-side
whitespace and its first scored token; :func:`zero_shot_prompts` and ``few_shot_prompts(...,
model=model)`` end each query with that whitespace, so the answer is scored on its content.
"""

from __future__ import annotations

import difflib
import json
import random
import re
import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from sitelens.errors import TaskError, TokenizationError

SPLIT_FRACTIONS = (0.7, 0.1, 0.2)  # train, valid, test (the FV splits are about 70/9/21)
CASE_SENSITIVE_MARKERS = ("capitalize", "lowercase", "uppercase")
# The most new tokens a default-protocol generation takes after a prompt (it takes
# min(ANSWER_ROOM, longest answer in tokens + 2) per batch); shot counts keep this room free in the
# context, so every answer that fits it can be generated.
ANSWER_ROOM = 32


@dataclass(frozen=True)
class Example:
    """One input/output pair of a task."""

    input: str
    output: str


@dataclass(frozen=True)
class Template:
    """Prompt template. The reference: ``"Q: {x}\\nA: {y}\\n\\n"`` per shot, ending ``"Q: {x}\\nA:"``;
    answers are scored with a leading space (``answer_prefix``).

    ``bare_digits=True`` is the public SITE code's answer formatting (its ``preprocess.py``,
    ``word_pairs_to_prompt_data``): an all-digit answer (``str.isdigit``) gets no space, neither in
    a demonstration (``"A:5"``) nor in the answer token (``"5"``, not ``" 5"``). Only a template
    with ``bare_digits`` lists it in :meth:`to_dict`, so default templates keep their form."""

    shot: str = "Q: {x}\nA: {y}\n\n"
    query: str = "Q: {x}\nA:"
    answer_prefix: str = " "
    bare_digits: bool = False

    def __post_init__(self):
        for part, need in ((self.shot, ("{x}", "{y}")), (self.query, ("{x}",))):
            for n in need:
                if n not in part:
                    raise TaskError(f"Template part {part!r} must contain {n}.")

    def to_dict(self) -> dict:
        d = {"shot": self.shot, "query": self.query, "answer_prefix": self.answer_prefix}
        if self.bare_digits:
            d["bare_digits"] = True
        return d

    def prefix_for(self, y: str) -> str:
        """What precedes the answer ``y``: ``answer_prefix``, or nothing for an all-digit ``y``
        under ``bare_digits``."""
        return "" if self.bare_digits and y.isdigit() else self.answer_prefix

    def format_shot(self, ex: Example) -> str:
        shot = self.shot
        if self.prefix_for(ex.output) != self.answer_prefix and self.answer_prefix:
            shot = shot.replace(self.answer_prefix + "{y}", "{y}")  # "A: {y}" -> "A:{y}"
        return _fill(shot, ex.input, ex.output)

    def format_query(self, x: str) -> str:
        return self.query.replace("{x}", x)


def _fill(part: str, x: str, y: str) -> str:
    """``{x}``/``{y}`` filled in one pass: braces inside the input or output stay literal."""
    return re.sub(r"\{x\}|\{y\}", lambda m: x if m.group(0) == "{x}" else y, part)


DEFAULT_TEMPLATE = Template()


@dataclass
class Task:
    """A named task with train/valid/test lists of :class:`Example`.

    ``case_sensitive`` makes exact-match scoring compare case; it is switched on for tasks whose
    name contains ``capitalize``, ``lowercase`` or ``uppercase``. ``labels``: the task's closed
    label set, when it defines one (``labels.json`` in an FV-layout directory); otherwise
    :func:`sitelens.eval.labels.label_set` detects one from the outputs."""

    name: str
    train: list[Example]
    valid: list[Example]
    test: list[Example]
    source: str = ""
    case_sensitive: bool = field(default=False)
    labels: tuple[str, ...] | None = None

    def __post_init__(self):
        if not self.case_sensitive:
            self.case_sensitive = any(m in self.name.lower() for m in CASE_SENSITIVE_MARKERS)
        if self.labels is not None:
            self.labels = check_labels(self.labels, self.name)

    def split(self, name: str) -> list[Example]:
        if name not in ("train", "valid", "test"):
            raise TaskError(f"Unknown split {name!r}; use 'train', 'valid' or 'test'.")
        return getattr(self, name)

    def __repr__(self) -> str:
        return (
            f"Task({self.name!r}, train={len(self.train)}, valid={len(self.valid)}, "
            f"test={len(self.test)})"
        )


def check_labels(labels, where: str) -> tuple[str, ...]:
    """``labels`` as a tuple of at least two distinct non-empty strings, or a :class:`TaskError`."""
    if not isinstance(labels, (list, tuple)) or not all(isinstance(x, str) and x.strip() for x in labels):
        raise TaskError(f"{where}: labels must be a list of non-empty strings, got {labels!r}.")
    labels = tuple(labels)
    if len(set(labels)) != len(labels) or len(labels) < 2:
        raise TaskError(f"{where}: labels must be at least two distinct strings, got {list(labels)}; "
                        "remove the repeats, or drop labels.json to detect them from the outputs.")
    return labels


# ----------------------------------------------------------------------------------------------
# loading


def builtin_tasks() -> list[str]:
    """Names of the built-in task suite."""
    root = resources.files("sitelens") / "data" / "tasks"
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".json"))


def _parse_items(raw, where: str, *, dedupe: bool) -> list[Example]:
    if not isinstance(raw, list):
        raise TaskError(f"{where}: expected a JSON list of {{'input': ..., 'output': ...}} objects.")
    out: list[Example] = []
    seen: set[tuple[str, str]] = set()
    dups: list[tuple[str, str]] = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict) or "input" not in item or "output" not in item:
            raise TaskError(
                f"{where}: item {i} must be an object with 'input' and 'output' keys, got {item!r}."
            )
        vals = []
        for key in ("input", "output"):
            v = item[key]
            if isinstance(v, bool) or not isinstance(v, (str, int, float)):
                raise TaskError(
                    f"{where}: item {i} has a non-string {key!r} ({v!r}); use strings "
                    "(numbers are converted to strings)."
                )
            v = str(v)
            if not v.strip():
                raise TaskError(f"{where}: item {i} has an empty {key!r}.")
            vals.append(v)
        pair = (vals[0], vals[1])
        if pair in seen:
            dups.append(pair)
            continue
        seen.add(pair)
        out.append(Example(*pair))
    if dups and not dedupe:
        raise TaskError(
            f"{where}: {len(dups)} duplicate item(s), first {dups[0]!r}. Remove them, or pass "
            "dedupe=True (CLI: --dedupe) to keep the first of each."
        )
    if not out:
        raise TaskError(f"{where}: the task has no items.")
    return out


def _read_json(path: Path):
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise TaskError(f"{path}: not UTF-8 text; save the task file as UTF-8 JSON.") from e
    if not text.strip():
        raise TaskError(
            f"{path} is empty; a task file holds a JSON list of {{'input': ..., 'output': ...}} "
            "objects."
        )
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise TaskError(f"{path}: not valid JSON ({e.msg} at line {e.lineno}); fix the file.") from e


def split_sizes(n: int, fractions=SPLIT_FRACTIONS) -> tuple[int, int, int]:
    """``(train, valid, test)`` sizes of :func:`split_examples` on ``n`` items: valid and test
    ``fractions`` of ``n``, rounded, at least 1 each; train the rest."""
    n_valid = max(1, round(n * fractions[1]))
    n_test = max(1, round(n * fractions[2]))
    return n - n_valid - n_test, n_valid, n_test


def items_needed(n_train: int, fractions=SPLIT_FRACTIONS, *, n_valid: int = 1, n_test: int = 1) -> int:
    """The fewest items whose split (:func:`split_sizes`) has at least ``n_train`` training,
    ``n_valid`` validation and ``n_test`` test items. No split shrinks as items are added, so
    every larger task has them too."""
    n = max(3, n_train + n_valid + n_test)
    while any(have < want for have, want in zip(split_sizes(n, fractions), (n_train, n_valid, n_test),
                                                strict=True)):
        n += 1
    return n


def split_examples(
    items: list[Example], *, seed: int = 0, fractions=SPLIT_FRACTIONS
) -> tuple[list[Example], list[Example], list[Example]]:
    """Seeded shuffle and split into train/valid/test (each non-empty when ≥ 3 items)."""
    if len(items) < 3:
        raise TaskError(f"A task needs at least 3 items to split, got {len(items)}.")
    items = list(items)
    random.Random(seed).shuffle(items)
    n_train, n_valid, _ = split_sizes(len(items), fractions)
    return items[:n_train], items[n_train : n_train + n_valid], items[n_train + n_valid :]


def task_from_pairs(
    name: str, pairs, *, seed: int = 0, dedupe: bool = False, source: str = "pairs"
) -> Task:
    """A task from a list of ``{"input", "output"}`` dicts or ``(input, output)`` tuples."""
    raw = [p if isinstance(p, dict) else {"input": p[0], "output": p[1]} for p in pairs]
    items = _parse_items(raw, name, dedupe=dedupe)
    train, valid, test = split_examples(items, seed=seed)
    return Task(name, train, valid, test, source=source)


def load_task(spec: str | Path, *, seed: int = 0, dedupe: bool = False) -> Task:
    """Load a task from a built-in name, an FV-layout directory, or a JSON file of pairs.

    Built-in tasks and single files are split 70/10/20 with ``seed``; FV-layout directories keep
    their own splits. Numbers are converted to strings; duplicates raise unless ``dedupe``.
    """
    path = Path(spec).expanduser()
    if path.is_dir():
        splits = {}
        for s in ("train", "valid", "test"):
            f = path / f"{s}.json"
            if not f.exists() and (tasks := collection_dirs(path)):
                raise TaskError(
                    f"{path} is a collection of {len(tasks)} tasks ({tasks[0].name}, ...), not one "
                    f"task; load them all with load_collection({str(path)!r}) (command line: "
                    f"--tasks-dir {path}), or give one of its folders."
                )
            if not f.exists():
                raise TaskError(
                    f"{path} is not an FV-layout task directory: missing {s}.json (expected "
                    "train.json, valid.json, test.json)."
                )
            splits[s] = _parse_items(_read_json(f), str(f), dedupe=dedupe)
        labels_file = path / "labels.json"
        labels = check_labels(_read_json(labels_file), str(labels_file)) if labels_file.exists() else None
        return Task(path.name, splits["train"], splits["valid"], splits["test"], source=str(path),
                    labels=labels)
    if path.suffix == ".json" and path.is_file():
        items = _parse_items(_read_json(path), str(path), dedupe=dedupe)
        train, valid, test = split_examples(items, seed=seed)
        return Task(path.stem, train, valid, test, source=str(path))
    name = str(spec)
    names = builtin_tasks()
    if name in names:
        f = resources.files("sitelens") / "data" / "tasks" / f"{name}.json"
        items = _parse_items(json.loads(f.read_text(encoding="utf-8")), name, dedupe=dedupe)
        train, valid, test = split_examples(items, seed=seed)
        return Task(name, train, valid, test, source="builtin")
    close = difflib.get_close_matches(name.replace("-", "_"), names, n=4, cutoff=0.5)
    raise TaskError(
        f"Unknown task {name!r}: not a built-in task, an FV-layout directory or a .json file."
        + (f" Did you mean: {', '.join(close)}?" if close else "")
        + f" Built-in tasks: {', '.join(names)}."
    )


def collection_dirs(root: str | Path) -> list[Path]:
    """The FV-layout task folders directly under ``root`` (those holding a ``train.json``),
    sorted by name: the tasks of a collection such as ``../shared/datasets/cls`` (README and
    licence files beside them are skipped)."""
    root = Path(root).expanduser()
    if not root.is_dir():
        return []
    return sorted((p for p in root.iterdir() if (p / "train.json").is_file()), key=lambda p: p.name)


def load_collection(root: str | Path, *, dedupe: bool = False) -> list[Task]:
    """Every task of a collection directory (:func:`collection_dirs`), each loaded by
    :func:`load_task` with its own splits and, where the folder has one, its ``labels.json``."""
    dirs = collection_dirs(root)
    if not dirs:
        raise TaskError(
            f"{root} holds no task folder (TASK/train.json, TASK/valid.json, TASK/test.json); "
            "give the directory that holds one FV-layout folder per task, e.g. "
            "../shared/datasets/cls."
        )
    return [load_task(d, dedupe=dedupe) for d in dirs]


# ----------------------------------------------------------------------------------------------
# prompts


def zero_shot_prompt(x: str, template: Template = DEFAULT_TEMPLATE) -> str:
    """The query of ``x`` as the template writes it; the scored prompt of an item also carries its
    answer's prompt-side whitespace (:func:`zero_shot_prompts`)."""
    return template.format_query(x)


def sample_demos(
    pool: list[Example], k: int, rng: random.Random, *, exclude: str | None = None
) -> list[Example]:
    """``k`` demonstrations from ``pool`` without replacement, never with input ``exclude``."""
    candidates = [ex for ex in pool if ex.input != exclude] if exclude is not None else pool
    if k > len(candidates):
        raise TaskError(
            f"Asked for {k} demonstrations but only {len(candidates)} training items are "
            "available; use fewer shots (n_shots) or a task with more training items."
        )
    return rng.sample(candidates, k)


def few_shot_prompt(
    demos: list[Example], x: str, template: Template = DEFAULT_TEMPLATE, lead: str = ""
) -> str:
    """The demonstrations, then the query of ``x`` and ``lead`` (:func:`answer_parts`)."""
    return "".join(template.format_shot(d) for d in demos) + template.format_query(x) + lead


def few_shot_prompts(
    task: Task,
    queries: list[Example],
    n_shots: int,
    *,
    seed: int = 0,
    template: Template = DEFAULT_TEMPLATE,
    shuffle_labels: bool = False,
    model=None,
) -> list[str]:
    """One ``n_shots``-shot prompt per query, demonstrations from ``task.train`` only, never the
    query (by input). With ``model``, each query is followed by its answer's prompt-side
    whitespace (:func:`answer_parts`), as in :func:`zero_shot_prompts`: pass it for every prompt
    that is scored or injected; without it, the prompts are as the template writes them.

    ``shuffle_labels`` permutes the demonstration outputs, never leaving all in place (corrupted
    prompts for causal effects).
    """
    rng = random.Random(seed)
    perm_rng = random.Random(seed + 1_000_003)  # separate stream: same demos as the clean prompts
    leads = answer_leads(model, [q.output for q in queries], template)
    prompts = []
    for q, lead in zip(queries, leads, strict=True):
        demos = sample_demos(task.train, n_shots, rng, exclude=q.input)
        if shuffle_labels and len(demos) > 1:
            outs = [d.output for d in demos]
            perm = list(range(len(outs)))
            while perm == list(range(len(outs))):
                perm_rng.shuffle(perm)
            demos = [Example(d.input, outs[j]) for d, j in zip(demos, perm, strict=True)]
        prompts.append(few_shot_prompt(demos, q.input, template, lead))
    return prompts


def embedding_prompts(
    task: Task,
    n_prompts: int = 50,
    n_shots: int = 10,
    *,
    seed: int = 0,
    template: Template = DEFAULT_TEMPLATE,
    model=None,
) -> list[str]:
    """``n_prompts`` few-shot prompts whose queries and demonstrations come from ``task.train``
    (the query is never among its own demonstrations); ``model``: as in :func:`few_shot_prompts`
    (stage 1 reads the last token, which must be the position stage 2 injects at)."""
    if len(task.train) < n_shots + 1:
        raise TaskError(
            f"Task {task.name!r} has {len(task.train)} training items; {n_shots}-shot prompts need "
            f"at least {n_shots + 1}. Use fewer shots."
        )
    rng = random.Random(seed)
    queries = [task.train[rng.randrange(len(task.train))] for _ in range(n_prompts)]
    return few_shot_prompts(task, queries, n_shots, seed=seed + 1, template=template, model=model)


def answer_parts(model, output: str, template: Template = DEFAULT_TEMPLATE) -> tuple[str, int]:
    """``(lead, token)``: the answer as the model sees it (``template.prefix_for(output) + output``
    tokenized alone) split into ``lead``, the whitespace its leading whitespace-only tokens cover,
    and ``token``, the first token that carries the answer.

    Rule: the answer is scored on its content, never on whitespace. A tokenizer that splits digits
    (SmolLM2's, Gemma 3's) tokenizes ``" 150"`` as ``' ', '1', '5', '0'``: the bare space would be
    the scored token of every all-digit answer, so first-token accuracy, the stage-2 objective and
    every lens would measure how well the model predicts a space. Such whitespace belongs to the
    prompt side instead (:func:`zero_shot_prompts` appends ``lead``), the way the public SITE code writes
    an all-digit answer with no space. A template with ``bare_digits`` (the official protocol)
    keeps the reference's answer token, the first token of the answer whatever it is: ``lead`` is
    then always empty."""
    text = template.prefix_for(output) + output
    tok = model.tokenizer
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=getattr(tok, "is_fast", False))
    ids = enc["input_ids"]
    if not ids:
        raise TokenizationError(
            f"The answer {output!r} tokenizes to nothing; give a non-empty answer."
        )
    if template.bare_digits:
        return "", ids[0]
    n = 0
    while n < len(ids) and not tok.decode(ids[n : n + 1]).strip():
        n += 1
    if n == len(ids):
        raise TokenizationError(
            f"The answer {output!r} is whitespace only; give an answer with visible text."
        )
    if n == 0:
        return "", ids[0]
    if "offset_mapping" in enc:  # the characters the whitespace tokens cover
        lead = text[: enc["offset_mapping"][n - 1][1]]
    else:  # a slow tokenizer: its decode may drop a leading space, so take the text's own
        lead = text[: len(text) - len(text.lstrip())]
    return lead, ids[n]


def answer_token_id(model, output: str, template: Template = DEFAULT_TEMPLATE) -> int:
    """The first token that carries the answer (:func:`answer_parts`)."""
    return answer_parts(model, output, template)[1]


def answer_token_ids(model, outputs: list[str], template: Template = DEFAULT_TEMPLATE) -> list[int]:
    return [answer_parts(model, o, template)[1] for o in outputs]


def answer_leads(model, outputs: Sequence[str], template: Template = DEFAULT_TEMPLATE) -> list[str]:
    """The prompt-side whitespace of each answer (:func:`answer_parts`); all ``""`` without a
    model (prompts as the template writes them, e.g. for counting demonstrations' tokens)."""
    if model is None:
        return [""] * len(outputs)
    return [answer_parts(model, o, template)[0] for o in outputs]


def zero_shot_prompts(model, items: Sequence[Example], template: Template = DEFAULT_TEMPLATE) -> list[str]:
    """The scored zero-shot prompt of each item: its query followed by its answer's prompt-side
    whitespace (:func:`answer_parts`), so the next token is the answer's first scored token."""
    leads = answer_leads(model, [ex.output for ex in items], template)
    return [zero_shot_prompt(ex.input, template) + lead for ex, lead in zip(items, leads, strict=True)]


class SharedAnswerTokenWarning(UserWarning):
    """Most of a task's answers share their first scored token: first-token accuracy (and the
    stage-2 objective) then reward predicting that one token, and exact match says more."""


SHARED_TOKEN_SHARE = 0.5  # above this share of items, one first token dominates the task


def warn_shared_answer_token(model, task_name: str, outputs: Sequence[str],
                             template: Template = DEFAULT_TEMPLATE) -> float:
    """Warn (:class:`SharedAnswerTokenWarning`) when more than :data:`SHARED_TOKEN_SHARE` of
    ``outputs`` share their first scored token; returns that largest share (0.0 for no outputs)."""
    if not outputs:
        return 0.0
    ids = answer_token_ids(model, list(outputs), template)
    token, count = Counter(ids).most_common(1)[0]
    share = count / len(ids)
    if share > SHARED_TOKEN_SHARE and len(ids) > 1:
        warnings.warn(
            f"Task {task_name!r}: {count} of {len(ids)} answers start with the same scored token "
            f"{model.tokenizer.decode([token])!r}, so first-token accuracy mostly measures that one "
            "token; read exact match (or label metrics) for this task.",
            SharedAnswerTokenWarning, stacklevel=3,
        )
    return share
