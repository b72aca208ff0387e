"""Evaluation: greedy generation under an intervention, first-token and exact-match scoring, and
label ranking for tasks with a closed label set.

Methods: ``zero-shot``, ``icl`` (k-shot, demonstrations from train) and ``site`` (zero-shot prompt,
adapter injected once at the last prompt token during prefill). Results are per-item DataFrames.
Tasks with a closed label set (:func:`sitelens.eval.labels.label_set`: classification, multiple choice)
are also scored by ranking their labels under the same intervention (:mod:`sitelens.eval.labels`), with
the chance level beside each item.

Two protocols (:class:`Protocol`) decide how answers are formatted, generated and scored:
``default`` (sitelens's own) and ``official`` (the public SITE code's, for parity with the paper).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor

from sitelens.eval.labels import LABEL_COLUMNS, LabelSet, label_columns, label_set, nan_mean, score_labels
from sitelens.models import (
    Encoded,
    encode,
    kv_forward,
    last_position_logits,
    length_batches,
    new_kv_cache,
    token_ids,
)
from sitelens.site.injection import HeadMix, apply_hooks
from sitelens.tasks import (
    DEFAULT_TEMPLATE,
    Example,
    Task,
    Template,
    answer_token_ids,
    check_labels,
    few_shot_prompts,
    zero_shot_prompt,
)

# ----------------------------------------------------------------------------------------------
# protocols


@dataclass(frozen=True)
class Protocol:
    """How answers are formatted, generated and scored.

    ``default``: up to ``min(32, longest answer in tokens + 2)`` new tokens per batch, stopping at a
    newline or EOS; :func:`exact_match` (first line, lowercased unless the task is case-sensitive,
    prefix match); a space before every answer.

    ``official``: the paper's public code, github.com/SNU-DRL/Soft_Injection (commit 01bd5d6):
    ``eval_scripts/eval_site.sh`` runs ``eval.py --exact_match --max_token 20 --test_batch_size 1``;
    the ``generate`` of ``models.py`` is Hugging Face ``generate(max_new_tokens=20,
    min_new_tokens=1, top_k=1)``, greedy, so EOS cannot be the first token, a newline does not stop
    it and the text ends at EOS; ``eval.py`` scores it as :func:`official_exact_match`;
    ``preprocess.py`` puts no space before an all-digit answer
    (:attr:`sitelens.tasks.Template.bare_digits`). Its stage 2 is
    :meth:`sitelens.site.FitConfig.official`.

    Two details follow sitelens rather than the reference: the answer token is the first token of
    the (prefixed) answer tokenized alone, where the reference diffs the tokenizations of the prompt
    and prompt + answer (the same token on all 9,724 FV test items checked with SmolLM2's
    tokenizer, the first 200 per task); and EOS is the tokenizer's ``eos_token_id``, where
    ``generate`` uses the model's generation config.
    """

    name: str = "default"
    max_new_tokens: int | None = None  # None: min(32, longest answer in tokens + 2) per batch
    min_new_tokens: int = 0  # the first steps on which EOS cannot be chosen
    stop_at_newline: bool = True
    scoring: str = "default"  # "default": exact_match; "official": official_exact_match
    bare_digits: bool = False  # no space before an all-digit answer (demonstrations, answer token)

    def __post_init__(self):
        if self.scoring not in ("default", "official"):
            raise ValueError(f"Protocol.scoring must be 'default' or 'official', got {self.scoring!r}.")


PROTOCOLS = {
    "default": Protocol(),
    "official": Protocol("official", max_new_tokens=20, min_new_tokens=1, stop_at_newline=False,
                         scoring="official", bare_digits=True),
}


def get_protocol(spec: str | Protocol | None = None) -> Protocol:
    """A :class:`Protocol` from its name (``"default"``, ``"official"``); ``None`` is the default."""
    if isinstance(spec, Protocol):
        return spec
    name = spec or "default"
    if name not in PROTOCOLS:
        raise ValueError(f"Unknown protocol {name!r}; use one of {', '.join(PROTOCOLS)}.")
    return PROTOCOLS[name]


def intervention_hooks(model, intervention, seq_len: int | None) -> list:
    """The ``(hook_name, fn)`` pairs of an intervention for a prompt batch of ``seq_len``
    positions: none for ``None``; a :class:`HeadMix` pinned to ``seq_len`` (so it acts in the
    prefill and never on a one-position decode step); else ``intervention(model, seq_len)`` (a
    :class:`sitelens.baselines.HookIntervention` or any such callable)."""
    if intervention is None:
        return []
    if isinstance(intervention, HeadMix):
        pinned = HeadMix(intervention.weights, intervention.targets, intervention.positions, seq_len,
                         _active=intervention._active)
        return pinned.hooks(model)
    return intervention(model, seq_len)  # a callable (model, seq_len) -> hooks


def last_logits(
    model, enc: Encoded, intervention=None
) -> Float[Tensor, "batch d_vocab"]:
    """Logits at the last prompt position, under an optional intervention (only that position is
    unembedded)."""
    with torch.no_grad(), apply_hooks(model, intervention_hooks(model, intervention, enc.tokens.shape[1])):
        return last_position_logits(model, enc)  # [batch, d_vocab]


def greedy_generate(
    model,
    enc: Encoded,
    *,
    intervention=None,
    max_new_tokens: int = 16,
    stop_at_newline: bool = True,
    min_new_tokens: int = 0,
) -> tuple[Int[Tensor, "batch new"], Float[Tensor, "batch d_vocab"]]:
    """Greedy decoding with a KV cache (:func:`sitelens.models.kv_forward`; full passes on a bridge).

    A :class:`HeadMix` is pinned to the prompt length, so it injects once in the prefill and never on
    a KV-cached decode step. Returns the generated token ids and the first-step logits (the
    next-token distribution at the answer position). Decoding also stops when the context is full
    (prompt + generated = ``model.cfg.n_ctx``), so a prompt that fits never overruns the positional
    tables; those outputs are cut short, like any generation that reaches ``max_new_tokens``.

    On the first ``min_new_tokens`` steps EOS is never chosen (Hugging Face's ``min_new_tokens``);
    the returned first-step logits are not masked. A row that has stopped keeps receiving tokens
    while others run: cut it at its EOS (:func:`cut_at_eos`) where that matters.
    """
    batch = enc.tokens.shape[0]
    # The prefill fills positions 0..P-1 and yields token 1; decode step s feeds position P+s-1.
    max_new_tokens = min(max_new_tokens, model.cfg.n_ctx - enc.tokens.shape[1] + 1)
    cache = new_kv_cache(model, batch)
    eos = model.tokenizer.eos_token_id
    out: list[Tensor] = []  # one [batch] per step, on the device the logits come out on
    done = None  # [batch], there too: one read per step (the stopping test), none per token
    hooks = intervention_hooks(model, intervention, enc.tokens.shape[1])
    # Hooks stay on for the decode steps: prefill-only interventions (HeadMix, last-token
    # injections) are pinned to the prompt length and skip them; every-position methods (LoRA,
    # (IA)3, I2CL) must act on them.
    with torch.no_grad(), apply_hooks(model, hooks):
        logits = kv_forward(model, enc.tokens, enc.attention_mask, cache,
                            last_only=True)  # [batch, 1, d_vocab]
        first_logits = logits[:, -1].float()  # [batch, d_vocab]
        step_logits = first_logits
        ones = torch.ones(batch, 1, dtype=enc.attention_mask.dtype, device=enc.tokens.device)
        for step in range(max_new_tokens):
            if step < min_new_tokens and eos is not None:
                step_logits = step_logits.clone()
                step_logits[:, eos] = float("-inf")  # [batch, d_vocab], EOS excluded
            nxt = step_logits.argmax(-1)  # [batch]
            out.append(nxt)
            stops = torch.isin(nxt, stop_ids(model, nxt.device, newline=stop_at_newline))  # [batch]
            done = stops if done is None else done | stops
            if step == max_new_tokens - 1 or bool(done.all()):
                break
            logits = kv_forward(model, nxt[:, None].to(enc.tokens.device), ones,
                                cache)  # [batch, 1, d_vocab]
            step_logits = logits[:, -1].float()
    return torch.stack(out, dim=1).cpu(), first_logits


def stop_ids(model, device, *, newline: bool = True) -> Tensor:
    """The token ids that end a generation (EOS, and with ``newline`` every token containing a
    newline) as a tensor on ``device`` (cached per model and device)."""
    cache = getattr(model, "_sitelens_stop_ids", None)
    if cache is None:
        cache = {}
        model._sitelens_stop_ids = cache
    key = (str(device), newline)
    if key not in cache:
        eos = model.tokenizer.eos_token_id
        ids = sorted((newline_ids(model) if newline else set()) | ({eos} if eos is not None else set()))
        cache[key] = torch.tensor(ids, dtype=torch.long, device=device)  # [n_stop]
    return cache[key]


def newline_ids(model) -> set[int]:
    cached = getattr(model, "_sitelens_newline_ids", None)
    if cached is not None:
        return cached
    ids = set()
    vocab = model.tokenizer.convert_ids_to_tokens(list(range(len(model.tokenizer))))
    for i, tok in enumerate(vocab):
        if tok is None:
            continue
        text = model.tokenizer.convert_tokens_to_string([tok])
        if "\n" in text:
            ids.add(i)
    model._sitelens_newline_ids = ids
    return ids


# ----------------------------------------------------------------------------------------------
# scoring


def exact_match(prediction: str, target: str, *, case_sensitive: bool = False) -> bool:
    """The reference's criterion: the first generated line (stripped), lowercased unless the task
    is case-sensitive, counts if it starts with the target."""
    line = prediction.strip().split("\n")[0].strip()
    target = target.strip()
    if not case_sensitive:
        line, target = line.lower(), target.lower()
    return line.startswith(target)


def official_exact_match(prediction: str, target: str, task_name: str) -> bool:
    """The exact match of the public SITE code (``eval.py`` of SNU-DRL/Soft_Injection, its
    ``--exact_match`` branch): ``St.`` becomes ``Saint`` in the prediction and the target, both are
    cut at the first ``(``, the prediction also at its first newline (after stripping); both are
    lowercased unless the task's name contains ``capitalize`` or ``lowercase`` (``uppercase``
    tasks are lowercased too); the prediction counts if it starts with the target (so an empty
    target, e.g. one that starts with ``(``, always counts)."""
    target = target.replace("St.", "Saint").split("(")[0].strip()
    line = prediction.strip().replace("St.", "Saint").split("\n")[0].split("(")[0].strip()
    if "capitalize" not in task_name.lower() and "lowercase" not in task_name.lower():
        target, line = target.lower(), line.lower()
    return line[: len(target)] == target


def cut_at_eos(ids: list[int], eos: int | None) -> list[int]:
    """Generated ids up to (not including) the first EOS."""
    return ids[: ids.index(eos)] if eos is not None and eos in ids else ids


def run_method(
    model,
    task: Task,
    items: Sequence[Example],
    method: str,
    *,
    prompts: list[str],
    intervention=None,
    batch_size: int = 16,
    template: Template = DEFAULT_TEMPLATE,
    max_new_tokens: int | None = None,
    protocol: str | Protocol | None = None,
    labels: LabelSet | None = None,
) -> pd.DataFrame:
    """Generate for each prompt and score it. One row per item. ``protocol`` sets the generation
    length and the scoring (the caller builds ``prompts`` and ``template`` for it). With
    ``labels``, each item is also scored by ranking its labels under the same intervention
    (:data:`sitelens.eval.labels.LABEL_COLUMNS`; ``label_seconds_per_item`` is their cost, apart from
    ``seconds_per_item``, the generation's)."""
    proto = get_protocol(protocol)
    official = proto.scoring == "official"
    answers = answer_token_ids(model, [ex.output for ex in items], template)
    n_tok = [len(token_ids(model, template.prefix_for(ex.output) + ex.output)) for ex in items]
    eos = model.tokenizer.eos_token_id
    rows: dict[int, dict] = {}
    t0 = time.perf_counter()
    for idx in length_batches(model, prompts, batch_size):  # memory-bounded for long prompts
        enc = encode(model, [prompts[i] for i in idx])
        limit = max_new_tokens or proto.max_new_tokens or min(32, max(n_tok[i] for i in idx) + 2)
        gen, first = greedy_generate(
            model, enc, intervention=intervention, max_new_tokens=limit,
            stop_at_newline=proto.stop_at_newline, min_new_tokens=proto.min_new_tokens,
        )
        top = first.argmax(-1)
        for j, i in enumerate(idx):
            ids = gen[j].tolist()
            if official:  # the reference generates one prompt at a time: its text ends at EOS
                ids = cut_at_eos(ids, eos)
            text = model.tokenizer.decode(ids, skip_special_tokens=True)
            if official:
                correct = official_exact_match(text, items[i].output, task.name)
            else:
                correct = exact_match(text, items[i].output, case_sensitive=task.case_sensitive)
            rows[i] = {
                "task": task.name,
                "method": method,
                "input": items[i].input,
                "target": items[i].output,
                "prediction": text.strip().split("\n")[0].strip(),
                "first_token_correct": bool(int(top[j]) == answers[i]),
                "correct": correct,
            }
    seconds = time.perf_counter() - t0
    df = pd.DataFrame([rows[i] for i in range(len(items))])
    df["seconds_per_item"] = seconds / max(1, len(items))
    if labels is not None:
        t0 = time.perf_counter()
        cols = rank_labels(model, items, prompts, labels, intervention=intervention,
                           template=template, batch_size=batch_size)
        for c in LABEL_COLUMNS:
            df[c] = [row[c] for row in cols]
        df["label_seconds_per_item"] = (time.perf_counter() - t0) / max(1, len(items))
    return df


def rank_labels(
    model, items: Sequence[Example], prompts: list[str], labels: LabelSet, *, intervention=None,
    template: Template = DEFAULT_TEMPLATE, batch_size: int = 16,
) -> list[dict]:
    """Per item, the label-ranking columns (:func:`sitelens.eval.labels.label_columns`) of its prompt
    under ``intervention``, pinned to each prompt batch as in generation
    (:func:`intervention_hooks`)."""
    sets = [labels.for_item(ex) for ex in items]
    scores = score_labels(model, prompts, sets, template=template, batch_size=batch_size,
                          hooks_for=lambda seq_len: intervention_hooks(model, intervention, seq_len))
    return [label_columns(s, ex.output) for s, ex in zip(scores, items)]


def resolve_labels(task: Task, labels) -> LabelSet | None:
    """``labels`` of :func:`evaluate` as a :class:`~sitelens.eval.labels.LabelSet`: ``"auto"`` detects
    the task's (:func:`sitelens.eval.labels.label_set`; None for an open-ended task), None / False
    switches label ranking off, a sequence of strings is the label set itself."""
    if labels is None or labels is False:
        return None
    if isinstance(labels, LabelSet):
        return labels
    if isinstance(labels, str):
        if labels != "auto":
            raise ValueError(f"labels must be 'auto', None, a LabelSet or a list of labels, got {labels!r}.")
        return label_set(task)
    return LabelSet(check_labels(list(labels), "evaluate(labels=...)"), source="given")


METHODS = ("zero-shot", "icl", "site")


def evaluate(
    model,
    task: Task,
    *,
    methods: Sequence[str] = METHODS,
    adapter=None,
    split: str = "test",
    limit: int | None = None,
    n_shots: int = 10,
    seed: int = 0,
    batch_size: int = 16,
    template: Template | None = None,
    interventions: dict | None = None,
    protocol: str | Protocol | None = None,
    labels: str | LabelSet | Sequence[str] | None = "auto",
) -> pd.DataFrame:
    """Evaluate methods on a split. ``interventions`` maps extra method names to interventions
    applied on zero-shot prompts (a :class:`HeadMix` or a ``(model, seq_len) -> hooks`` callable).
    ``protocol``: ``"default"``, ``"official"`` or a :class:`Protocol`; ``None`` takes the
    adapter's (``adapter.meta["protocol"]``, written by an official fit), else the default. It also
    sets the template's digit formatting (demonstrations, answer tokens).
    ``labels``: ``"auto"`` (default) ranks the labels of a task with a closed label set
    (:func:`sitelens.eval.labels.label_set`), None skips it, a list gives the labels (:func:`resolve_labels`).
    Returns the per-item DataFrame (columns: task, method, input, target, prediction,
    first_token_correct, correct, seconds_per_item; with labels also n_labels, chance,
    label_pred, label_rank_first, label_rank_full, label_rank_full_norm, label_seconds_per_item)."""
    if protocol is None and adapter is not None:
        protocol = adapter.meta.get("protocol")
    proto = get_protocol(protocol)
    template = template or (adapter.template if adapter is not None else DEFAULT_TEMPLATE)
    template = replace(template, bare_digits=proto.bare_digits)
    items = task.split(split)[:limit] if limit else task.split(split)
    label_space = resolve_labels(task, labels)
    zs = [zero_shot_prompt(ex.input, template) for ex in items]
    frames = []
    extra = dict(interventions or {})
    for method in methods:
        if method in extra:  # caller-supplied interventions win over built-in names
            prompts, inter = zs, extra[method]
        elif method == "zero-shot":
            prompts, inter = zs, None
        elif method == "icl":
            prompts = few_shot_prompts(task, list(items), n_shots, seed=seed, template=template)
            inter = None
        elif method == "site":
            if adapter is None:
                raise ValueError("method 'site' needs an adapter (fit one with fit_site).")
            # the digit formatting follows the protocol; the rest must be the adapter's
            adapter.check_model(model, replace(template, bare_digits=adapter.template.bare_digits))
            prompts, inter = zs, adapter.mix().placed(model)  # rows on their layers' devices
        else:
            raise ValueError(
                f"Unknown method {method!r}; use zero-shot, icl, site"
                + (", " + ", ".join(extra) if extra else "")
            )
        frames.append(
            run_method(model, task, items, method, prompts=prompts, intervention=inter,
                       batch_size=batch_size, template=template, protocol=proto, labels=label_space)
        )
    return pd.concat(frames, ignore_index=True)


def summarize(df: pd.DataFrame) -> pd.DataFrame:
    """Per (task,) method: first_token_acc, exact_match, n, seconds_per_item; where the rows carry
    label ranks, also label_acc_first (over the items where it is defined), label_acc_full,
    label_acc_full_norm and chance (the mean of 1 / n_labels)."""
    keys = [k for k in ("model", "task", "method") if k in df.columns]
    g = df.groupby(keys, sort=False)
    aggs = dict(
        first_token_acc=("first_token_correct", "mean"),
        exact_match=("correct", "mean"),
        n=("correct", "size"),
        seconds_per_item=("seconds_per_item", "first"),
    )
    if "label_rank_full" in df.columns:
        aggs.update(
            label_acc_first=("label_rank_first", nan_mean),
            label_acc_full=("label_rank_full", nan_mean),
            label_acc_full_norm=("label_rank_full_norm", nan_mean),
            chance=("chance", nan_mean),
        )
    return g.agg(**aggs).reset_index()


def first_token_accuracy(model, prompts: list[str], answers: list[int], intervention=None,
                         batch_size: int = 32) -> float:
    """Fraction of prompts whose argmax next token is the answer's first token (no generation)."""
    hits = 0
    for s in range(0, len(prompts), batch_size):
        enc = encode(model, prompts[s : s + batch_size])
        top = last_logits(model, enc, intervention).argmax(-1)  # [batch]
        hits += int((top == torch.tensor(answers[s : s + batch_size], device=top.device)).sum())
    return hits / max(1, len(prompts))
