"""SITE evaluated on K tasks at once: the test items of many tasks in the same generation batches.

:func:`evaluate_site_tasks` gives, for each task and its adapter, the rows that
``evaluate(model, task, methods=["site"], adapter=adapter, ...)`` gives, with the items of all
tasks pooled into length-sorted batches. Each row of a batch is injected with its own task's α and
embedding (per-row weights and targets of :class:`~sitelens.site.injection.HeadMix`), and each item
is scored by its own task's rules (answer token, exact match, case sensitivity, protocol).

What equals the one-task evaluation: every item generates greedily for exactly the number of new
tokens its one-task batch would allow (the one-task batches of ``task_batch_size`` items are
formed, as :func:`~sitelens.eval.scoring.score_items` forms them, only to read that number; a pooled
batch generates for its longest and each row is cut to its own). What may differ: the float
rounding of a batch with other padding (a near-tie of two tokens may flip), and the tokens a row
generates after it stopped (at EOS, while other rows of its batch run), which already depend on a
row's batch in the one-task path; exact match reads the first line only, so those rarely matter.
Label ranking (:mod:`sitelens.eval.labels`) is not done here: use :func:`evaluate` for tasks with a
label set.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

import pandas as pd
import torch

from sitelens.eval.generation import cut_at_eos, greedy_generate
from sitelens.eval.scoring import answer_lengths, exact_match, get_protocol, official_exact_match
from sitelens.format import progress_bar
from sitelens.models import encode, length_batches
from sitelens.site.injection import HeadMix
from sitelens.tasks import ANSWER_ROOM, Task, answer_token_ids, warn_shared_answer_token, zero_shot_prompts


def evaluate_site_tasks(
    model,
    tasks: Sequence[Task],
    adapters: Sequence,
    *,
    split: str = "test",
    limit: int | None = None,
    batch_size: int = 64,
    task_batch_size: int = 16,
    protocol: str | None = None,
    progress: bool = False,
) -> pd.DataFrame:
    """SITE on ``split`` (the first ``limit`` items) of every task with its adapter, the items of
    all tasks generated in shared batches of up to ``batch_size`` (see the module docstring).
    ``task_batch_size``: the ``batch_size`` of the one-task :func:`evaluate` whose generation
    lengths are reproduced. ``protocol``: as in :func:`evaluate` (``None``: the adapters', which
    must agree). Returns the per-item DataFrame of :func:`evaluate` (method ``site``; no label
    columns), tasks in order; ``seconds_per_item`` is this call's wall time over all items."""
    tasks, adapters = list(tasks), list(adapters)
    if len(tasks) != len(adapters):
        raise ValueError(f"evaluate_site_tasks needs one adapter per task, got {len(tasks)} tasks "
                         f"and {len(adapters)} adapters.")
    if protocol is None:
        found = {a.meta.get("protocol") for a in adapters}
        if len(found) > 1:
            raise ValueError(f"The adapters were fitted under different protocols {sorted(map(str, found))}; "
                             "evaluate them apart or pass protocol=.")
        protocol = found.pop() if found else None
    proto = get_protocol(protocol)
    official = proto.scoring == "official"
    t0 = time.perf_counter()
    rows: list[tuple[int, int, str]] = []  # (task, item, prompt) per pooled row
    items, answers, limits = [], [], []
    for k, (task, adapter) in enumerate(zip(tasks, adapters)):
        template = replace(adapter.template, bare_digits=proto.bare_digits)
        adapter.check_model(model, replace(template, bare_digits=adapter.template.bare_digits))
        its = task.split(split)[:limit] if limit else task.split(split)
        warn_shared_answer_token(model, task.name, [ex.output for ex in its], template)
        prompts = zero_shot_prompts(model, its, template)
        n_tok = answer_lengths(model, its, template)
        lim = [0] * len(its)
        for idx in length_batches(model, prompts, task_batch_size):  # the one-task batches
            n = proto.max_new_tokens or min(ANSWER_ROOM, max(n_tok[i] for i in idx) + 2)
            for i in idx:
                lim[i] = n
        items.append(its)
        answers.append(answer_token_ids(model, [ex.output for ex in its], template))
        limits.append(lim)
        rows += [(k, i, p) for i, p in enumerate(prompts)]
    alpha = torch.stack([a.alpha.float() for a in adapters])  # [K, n_layers, n_heads]
    emb = torch.stack([a.embedding.float() for a in adapters])  # [K, n_layers, n_heads, d_head]
    eos = model.tokenizer.eos_token_id
    out: list[list[dict]] = [[{} for _ in its] for its in items]
    bar = progress_bar(total=len(rows), desc=f"eval site [{len(tasks)} tasks]", enabled=progress)
    for idx in length_batches(model, [p for _, _, p in rows], batch_size):
        enc = encode(model, [rows[j][2] for j in idx])
        owner = torch.tensor([rows[j][0] for j in idx])  # [batch]
        mix = HeadMix(alpha[owner], emb[owner]).placed(model)  # per row: its task's α and t
        gen, first = greedy_generate(
            model, enc, intervention=mix, max_new_tokens=max(limits[rows[j][0]][rows[j][1]] for j in idx),
            stop_at_newline=proto.stop_at_newline, min_new_tokens=proto.min_new_tokens,
        )  # [batch, new], [batch, d_vocab]
        top = first.argmax(-1).cpu()  # [batch]
        for b, j in enumerate(idx):
            k, i, _ = rows[j]
            task, ex = tasks[k], items[k][i]
            ids = gen[b, : limits[k][i]].tolist()
            if official:
                ids = cut_at_eos(ids, eos)
            text = model.tokenizer.decode(ids, skip_special_tokens=True)
            ok = (official_exact_match(text, ex.output, task.name) if official
                  else exact_match(text, ex.output, case_sensitive=task.case_sensitive))
            out[k][i] = {"task": task.name, "method": "site", "input": ex.input, "target": ex.output,
                         "prediction": text.strip().split("\n")[0].strip(),
                         "first_token_correct": int(top[b]) == answers[k][i], "correct": bool(ok)}
        bar.update(len(idx))
    bar.close()
    df = pd.DataFrame([r for per_task in out for r in per_task])
    df["seconds_per_item"] = (time.perf_counter() - t0) / max(1, len(rows))
    return df


__all__ = ["evaluate_site_tasks"]
