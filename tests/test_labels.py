"""Closed label sets (sitelens.eval.labels): which tasks have one, the chance level, label ranking
batched vs a naive one-label-at-a-time loop under every kind of intervention, injection at the
prompt's last token only, and the evaluate / summarize columns; task collections."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
import torch
from tolerances import assert_within, logprob_tolerance

from sitelens.baselines import HookIntervention
from sitelens.baselines.base import last_add_hook
from sitelens.cli.validate import _expand_collections
from sitelens.errors import TaskError
from sitelens.eval.evaluation import evaluate, summarize
from sitelens.eval.generation import intervention_hooks
from sitelens.eval.labels import continuation_ids, label_set, score_labels
from sitelens.models import encode, kv_forward, new_kv_cache
from sitelens.provenance import task_hash
from sitelens.site.injection import HeadMix, apply_hooks
from sitelens.tasks import (
    Example,
    Task,
    Template,
    collection_dirs,
    load_collection,
    load_task,
    task_from_pairs,
)
from sitelens.testing import tiny_model

# No space before the answer, so that the byte-level tiny tokenizer gives the labels different
# first tokens (with the default " " prefix every label would start with the space token).
TEMPLATE = Template(shot="Q: {x}\nA: {y}\n\n", query="Q: {x}\nA: ", answer_prefix="")
LABELS = ("neg", "pos", "mid")
DATASETS = Path(__file__).resolve().parents[2] / "shared" / "datasets"


@pytest.fixture(scope="module")
def model(backend):
    return tiny_model(n_key_value_heads=2, backend=backend)


@pytest.fixture(scope="module")
def task():
    rng = random.Random(0)
    pairs = [("".join(rng.choice("abcdefgh") for _ in range(rng.randint(2, 7))), rng.choice(LABELS))
             for _ in range(80)]
    return task_from_pairs("cls", pairs, dedupe=True)


def _interventions(model):
    """One of each kind: none, SITE-like soft HeadMix, a prefill last-token hook (TV/FV-like), an
    every-position hook (I2CL/LoRA-like)."""
    L, H, d = model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_head
    g = torch.Generator().manual_seed(1)
    mix = HeadMix(torch.rand(L, H, generator=g), 3 * torch.randn(L, H, d, generator=g))
    vec = 2 * torch.randn(model.cfg.d_model, generator=g)
    add = HookIntervention(lambda m, n: [("blocks.0.hook_resid_pre", last_add_hook(vec, n))])
    every = HookIntervention(lambda m, n: [("blocks.1.hook_resid_pre", lambda x, hook=None: x + 0.5 * vec)],
                             scope="all")
    return {"none": None, "headmix": mix, "prefill-hook": add, "every-position": every}


def _naive(model, prompt: str, labels, intervention):
    """One prompt, one label at a time, one token at a time, like greedy decoding with the answer
    forced: prefill with the hooks pinned to the prompt, then each label token as a decode step.
    Returns (first-token log-probs, full log-likelihoods, largest |logit| seen)."""
    enc = encode(model, [prompt])
    firsts, fulls, scale = [], [], 0.0
    for ids in continuation_ids(model, labels, TEMPLATE):
        cache = new_kv_cache(model, 1)
        hooks = intervention_hooks(model, intervention, enc.tokens.shape[1])
        with torch.no_grad(), apply_hooks(model, hooks):
            logits = kv_forward(model, enc.tokens, enc.attention_mask, cache, last_only=True)[:, -1]
            total = 0.0
            for k, t in enumerate(ids):
                scale = max(scale, float(logits.abs().max()))
                lp = float(torch.log_softmax(logits.float(), -1)[0, t])
                firsts.append(lp) if k == 0 else None
                total += lp
                step = torch.tensor([[t]], device=enc.tokens.device)
                logits = kv_forward(model, step, torch.ones_like(step), cache)[:, -1]
        fulls.append(total)
    return torch.tensor(firsts), torch.tensor(fulls), scale


# ----------------------------------------------------------------------------------------------
# which labels, chance


def test_label_set_rules():
    def t(outs, labels=None):
        items = [Example(f"x{i}", o) for i, o in enumerate(outs)]
        return Task("t", items[:-2], items[-2:-1], items[-1:], labels=labels)

    ls = label_set(t(["b", "a", "b", "a", "c"]))
    assert ls.labels == ("a", "b", "c") and ls.source == "outputs" and ls.options is None
    assert math.isclose(ls.chance, 1 / 3)
    assert label_set(t([f"w{i}" for i in range(21)])) is None  # > 20 distinct: open-ended
    assert label_set(t([f"w{i % 20}" for i in range(40)])).labels[0] == "w0"  # 20: closed
    assert label_set(t(["2", "3", "17", "2", "3"])) is None  # counts are an open range
    assert label_set(t(["same"] * 4)) is None  # one output is no choice
    given = label_set(t(["a", "b", "a", "b"], labels=("b", "a", "z")))
    assert given.labels == ("b", "a", "z") and given.source == "task"


def test_options_listed_in_the_input_are_each_items_labels():
    bbh = [Example("Which?\nOptions:\n(A) red\n(B) blue", "(B)"),
           Example("Which?\nOptions:\n(A) x\n(B) y\n(C) z\n(D) w", "(D)"),
           Example("Pick\nOptions:\n(A) 1\n(B) 2\n(C) 3", "Monsters, Inc")]  # an upstream quirk
    ls = label_set(Task("bbh", bbh[:1], bbh[1:2], bbh[2:]))
    assert ls.options == "parenthesized"
    assert [ls.for_item(ex) for ex in bbh] == [("(A)", "(B)"), ("(A)", "(B)", "(C)", "(D)"),
                                                ("(A)", "(B)", "(C)")]
    mmlu = [Example("Q?\nA. one\nB. two\nC. three", "C"), Example("Q2?\nA. x\nB. y", "A"),
            Example("Q3 about A. Smith?\nA. p\nB. q\nC. r\nD. s", "D")]
    ls = label_set(Task("mmlu", mmlu[:1], mmlu[1:2], mmlu[2:]))
    assert ls.options == "dotted" and ls.for_item(mmlu[1]) == ("A", "B")
    assert ls.for_item(mmlu[2]) == ("A", "B", "C", "D")  # "A. Smith" mid-line is not an option


def test_chance_is_one_over_the_items_labels(model):
    items = [Example("Q\n(A) a\n(B) b", "(A)"), Example("Q\n(A) a\n(B) b\n(C) c\n(D) d", "(C)")]
    task = Task("mc", items * 3, items, items)
    df = evaluate(model, task, methods=["zero-shot"], template=TEMPLATE, limit=2, label_metrics=True)
    assert df["n_labels"].tolist() == [2, 4] and df["chance"].tolist() == [0.5, 0.25]
    assert math.isclose(summarize(df)["chance"].iloc[0], (0.5 + 0.25) / 2)


# ----------------------------------------------------------------------------------------------
# scoring: batched vs naive, injection at the prompt's last token only


@pytest.mark.parametrize("kind", ["none", "headmix", "prefill-hook", "every-position"])
def test_batched_label_scores_equal_a_naive_loop(model, task, kind):
    inter = _interventions(model)[kind]
    items = task.test[:6]
    prompts = [TEMPLATE.format_query(ex.input) for ex in items]  # different lengths: left padding
    scores = score_labels(model, prompts, [LABELS] * len(items), template=TEMPLATE, batch_size=4,
                          hooks_for=lambda n: intervention_hooks(model, inter, n))
    n_tok = max(len(c) for c in continuation_ids(model, LABELS, TEMPLATE))
    for p, s in zip(prompts, scores):
        first, full, scale = _naive(model, p, LABELS, inter)
        # each log-prob: a left-padded batch (and a multi-token continuation on a copied cache)
        # vs one row, one token at a time: logprob_tolerance at the logit scale seen; a sum of
        # n_tok log-probs adds up to n_tok of those
        bound = logprob_tolerance(model, scale=scale)
        assert_within(s.first, first, bound, what=f"first-token log-probs ({kind})", scale=scale)
        assert_within(s.full, full, n_tok * bound, what=f"full-label log-likelihoods ({kind})",
                      scale=scale)
        assert s.first_distinct and s.n_tokens.tolist() == [len(c) for c in
                                                           continuation_ids(model, LABELS, TEMPLATE)]


def test_full_label_scoring_injects_at_the_prompts_last_token_only(model):
    """A HeadMix pinned to the prompt: the same numbers as one joint forward over prompt + label
    with the mix at the prompt's last position only, and not those of a mix that also reaches
    the label tokens."""
    L, H, d = model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_head
    g = torch.Generator().manual_seed(2)
    w, t = torch.ones(L, H), 4 * torch.randn(L, H, d, generator=g)
    prompt, label = TEMPLATE.format_query("abcd"), "neutral"
    s = score_labels(model, [prompt], [(label,)], template=TEMPLATE,
                     hooks_for=lambda n: intervention_hooks(model, HeadMix(w, t), n))[0]
    P = encode(model, [prompt]).tokens.shape[1]
    ids = continuation_ids(model, [label], TEMPLATE)[0]

    def joint(positions):
        enc = encode(model, [prompt + label])  # the byte tokenizer splits at the boundary
        assert enc.tokens[0, P:].tolist() == ids
        with torch.no_grad(), apply_hooks(model, HeadMix(w, t, positions=positions).hooks(model)):
            logits = model(enc.tokens, attention_mask=enc.attention_mask)[0]  # [P + T, d_vocab]
        logp = torch.log_softmax(logits.float(), -1)
        return float(sum(logp[P - 1 + k, tok] for k, tok in enumerate(ids))), float(logits.abs().max())

    right, scale = joint((P - 1,))
    wrong, _ = joint(tuple(range(P - 1, P + len(ids))))  # also at every label token
    # KV-cached continuation vs one full pass: logprob_tolerance per token
    bound = len(ids) * logprob_tolerance(model, scale=scale)
    assert_within(s.full, torch.tensor([right]), bound, what="cached vs joint, last prompt token")
    assert abs(float(s.full[0]) - wrong) > 100 * bound  # injecting at label tokens is detectably wrong


def test_a_continuation_as_long_as_the_prompt_is_not_injected(model):
    """Prompt of P tokens and a label whose fed tokens are also P wide: the prefill-pinned mix
    must not fire on them (the batch is padded one column further)."""
    L, H, d = model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_head
    mix = HeadMix(torch.ones(L, H), 4 * torch.randn(L, H, d, generator=torch.Generator().manual_seed(3)))
    prompt = "ab"  # BOS + 2 bytes = 3 tokens
    P = encode(model, [prompt]).tokens.shape[1]
    label = "x" * (P + 1)  # P + 1 tokens: P of them are fed after the prefill
    s = score_labels(model, [prompt], [(label, "y")], template=TEMPLATE,
                     hooks_for=lambda n: intervention_hooks(model, mix, n))[0]
    first, full, scale = _naive(model, prompt, (label, "y"), mix)
    bound = (P + 1) * logprob_tolerance(model, scale=scale)
    assert_within(s.full, full, bound, what="continuation of prompt length", scale=scale)


def test_shared_first_tokens_leave_first_token_ranking_undefined(model, task):
    default = Template()  # " neg", " pos", " mid": all start with the space byte
    df = evaluate(model, task, methods=["zero-shot"], template=default, limit=4, label_metrics=True)
    assert df["label_rank_first"].isna().all() and df["label_rank_full"].notna().all()
    assert math.isnan(summarize(df)["label_acc_first"].iloc[0])


# ----------------------------------------------------------------------------------------------
# evaluate / summarize


def test_evaluate_adds_label_columns_only_for_closed_tasks(model, task):
    df = evaluate(model, task, methods=["zero-shot", "icl"], n_shots=2, limit=4, template=TEMPLATE,
                  label_metrics=True)
    for col in ("n_labels", "chance", "label_pred", "label_rank_first", "label_rank_full",
                "label_rank_full_norm", "label_seconds_per_item"):
        assert col in df.columns, col
    assert (df["chance"] == 1 / 3).all() and set(df["label_pred"]) <= set(LABELS)
    s = summarize(df)
    assert {"label_acc_first", "label_acc_full", "label_acc_full_norm", "chance"} <= set(s.columns)
    assert s["label_acc_full"].between(0, 1).all()
    off = evaluate(model, task, methods=["zero-shot"], limit=2, label_metrics=False, template=TEMPLATE)
    assert "chance" not in off.columns and "chance" not in summarize(off).columns
    words = task_from_pairs("rev", [(w, w[::-1]) for w in ("abc", "bcd", "cde", "def", "efg", "fgh",
                                                              "ghi", "hij", "ijk", "jkl", "klm", "lmn",
                                                              "mno", "nop", "opq", "pqr", "qrs", "rst",
                                                              "stu", "tuv", "uvw", "vwx")])
    assert "chance" not in evaluate(model, words, methods=["zero-shot"], limit=2,
                                    labels="auto").columns  # 22 outputs: none detected
    given = evaluate(model, task, methods=["zero-shot"], limit=2, labels=["neg", "pos"], template=TEMPLATE)
    assert (given["n_labels"] == 2).all()


def test_label_ranking_sees_the_intervention(model, task):
    inter = _interventions(model)["headmix"]
    df = evaluate(model, task, methods=["zero-shot", "mixed"], interventions={"mixed": inter},
                  limit=6, template=TEMPLATE, label_metrics=True)
    a, b = (df[df.method == m]["label_pred"].tolist() for m in ("zero-shot", "mixed"))
    items = task.test[:6]
    prompts = [TEMPLATE.format_query(ex.input) for ex in items]
    plain = score_labels(model, prompts, [LABELS] * 6, template=TEMPLATE)
    mixed = score_labels(model, prompts, [LABELS] * 6, template=TEMPLATE,
                         hooks_for=lambda n: intervention_hooks(model, inter, n))
    assert a == [s.predict("full") for s in plain] and b == [s.predict("full") for s in mixed]
    assert any(not torch.equal(p.full, m.full) for p, m in zip(plain, mixed))


# ----------------------------------------------------------------------------------------------
# tasks: labels.json, collections


def _write_task(d: Path, n=(6, 2, 3), labels=None):
    d.mkdir(parents=True)
    for s, k in zip(("train", "valid", "test"), n):
        (d / f"{s}.json").write_text(json.dumps([{"input": f"{d.name}{s}{i}", "output": "ab"[i % 2]}
                                                 for i in range(k)]))
    if labels is not None:
        (d / "labels.json").write_text(json.dumps(labels))


def test_labels_json_and_task_hash(tmp_path):
    _write_task(tmp_path / "plain")
    _write_task(tmp_path / "given", labels=["a", "b", "c"])
    plain, given = load_task(tmp_path / "plain"), load_task(tmp_path / "given")
    assert plain.labels is None and given.labels == ("a", "b", "c")
    assert label_set(given).labels == ("a", "b", "c") and label_set(plain).labels == ("a", "b")
    # a task without labels hashes as it did before labels existed; labels change the hash
    relabelled = Task("given", given.train, given.valid, given.test)
    assert task_hash(relabelled) != task_hash(given)
    _write_task(tmp_path / "bad", labels=["a", "a"])
    with pytest.raises(TaskError, match="distinct"):
        load_task(tmp_path / "bad")
    _write_task(tmp_path / "bad2", labels={"a": 1})
    with pytest.raises(TaskError, match="list of non-empty strings"):
        load_task(tmp_path / "bad2")


def test_collections(tmp_path):
    root = tmp_path / "coll"
    for name in ("b_task", "a_task"):
        _write_task(root / name)
    (root / "README.md").write_text("not a task")
    (root / "LICENSE").mkdir()  # a folder without train.json is skipped too
    assert [p.name for p in collection_dirs(root)] == ["a_task", "b_task"]
    assert [t.name for t in load_collection(root)] == ["a_task", "b_task"]
    with pytest.raises(TaskError, match="load_collection"):
        load_task(root)  # a collection is not one task: the message names the fix
    with pytest.raises(TaskError, match="holds no task folder"):
        load_collection(tmp_path / "coll" / "LICENSE")
    assert _expand_collections([str(root), "antonym", str(root / "a_task")]) == [
        str(root / "a_task"), str(root / "b_task"), "antonym", str(root / "a_task")]


@pytest.mark.skipif(not DATASETS.is_dir(), reason="../shared/datasets is not on this machine")
@pytest.mark.parametrize("name, n_tasks, labelled, options", [
    ("cls", 9, 9, 0), ("anli", 3, 3, 0), ("mmlu_pro", 14, 14, 14), ("bbh", 27, 23, 17)])
def test_shared_collections_are_flat_and_mostly_closed(name, n_tasks, labelled, options):
    """The four collections of the issue load as flat collections; their label sets follow the
    documented rule (BBH: all but the four free-form tasks; the 17 lettered-option tasks, and all
    of MMLU-Pro, ranked over each question's own options)."""
    tasks = load_collection(DATASETS / name, dedupe=True)
    assert len(tasks) == n_tasks  # one folder per task, the README / licences skipped
    sets = [label_set(t) for t in tasks]
    assert sum(s is not None for s in sets) == labelled
    assert sum(s is not None and s.options is not None for s in sets) == options


# ----------------------------------------------------------------------------------------------
# bench


def test_bench_rows_carry_label_metrics_and_chance(model, task, tmp_path):
    from sitelens.eval.labels import LABEL_METRICS
    from sitelens.pipelines import bench
    from sitelens.pipelines.bench_summary import summary_markdown

    words = task_from_pairs("rev", [(w, w[::-1]) for w in (
        "abc", "bcd", "cde", "def", "efg", "fgh", "ghi", "hij", "ijk", "jkl", "klm", "lmn",
        "mno", "nop", "opq", "pqr", "qrs", "rst", "stu", "tuv", "uvw", "vwx")])
    out = tmp_path / "b.csv"
    df = bench.run_bench([model], [task, words], ["zero-shot", "icl"], out, limit=3, n_shots=2,
                         template=TEMPLATE, label_metrics=True)
    closed, open_ = df[df.task == "cls"], df[df.task == "rev"]
    assert (closed["chance"] == 1 / 3).all() and closed["label_acc_full"].between(0, 1).all()
    assert open_[LABEL_METRICS].isna().all().all()
    # the bench's numbers are evaluate's label ranks under the same prompts
    ev = evaluate(model, task, methods=["zero-shot"], limit=3, template=TEMPLATE, label_metrics=True)
    assert closed[closed.method == "zero-shot"]["label_acc_full"].iloc[0] == ev["label_rank_full"].mean()
    md = summary_markdown(df)
    assert "Label ranking" in md and "| zero-shot | 1 |" in md


def test_bench_migrates_a_file_without_label_columns(model, task, tmp_path):
    from sitelens.pipelines import bench

    out = tmp_path / "old.csv"
    row = {c: "" for c in bench.UNLABELLED_COLUMNS} | {"model": "m", "task": "t", "method": "x",
                                                      "key": "k0", "exact_match": "0.5"}
    out.write_text(",".join(bench.UNLABELLED_COLUMNS) + "\n"
                   + ",".join(row[c] for c in bench.UNLABELLED_COLUMNS) + "\n")
    assert bench.read_results(out)["chance"].isna().all()
    bench.run_bench([model], [task], ["zero-shot"], out, limit=2, template=TEMPLATE, label_metrics=True)
    df = bench.read_results(out)
    assert out.read_text().splitlines()[0] == ",".join(bench.COLUMNS)
    assert df["key"].tolist()[0] == "k0" and df["exact_match"].iloc[0] == 0.5  # kept
    assert df["chance"].iloc[1] == 1 / 3


def test_cli_bench_takes_a_collection_and_eval_reports_label_accuracy(tmp_path, capsys):
    from sitelens.cli import main as cli_main

    root = tmp_path / "coll"
    for name in ("t1", "t2"):
        _write_task(root / name, n=(12, 3, 4))
    out = tmp_path / "r.csv"
    assert cli_main(["bench", "--models", "tiny-random", "--tasks", str(root), "--methods",
                     "zero-shot", "--out", str(out), "--limit", "2", "--label-metrics"]) == 0
    from sitelens.pipelines.bench import read_results

    df = read_results(out)
    assert df["task"].tolist() == ["t1", "t2"] and (df["chance"] == 0.5).all()
    assert "Label ranking" in capsys.readouterr().out
    assert cli_main(["eval", "--model", "tiny-random", "--task", str(root / "t1"), "--methods",
                     "zero-shot", "--limit", "2", "--json", "--label-metrics"]) == 0
    got = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["zero-shot"]
    assert got["chance"] == 0.5 and 0 <= got["label_acc_full"] <= 1
