"""Stage 2 for K tasks at once: the α fits of a sweep in one joint pass.

A sweep fits SITE on many tasks (bench, the atlas, the FV benchmark); one by one, every fit runs
its own 8-row forward and backward passes, which on any machine read all the model's weights for
very little arithmetic. :func:`fit_alpha_tasks` runs the K fits as the K conditions of
:func:`sitelens.site.training.run_training`: task ``k`` keeps its own embedding (the mix target),
its own logits ``a_k`` (α_k = sigmoid(a_k)), its own seeded batches (exactly those that
:func:`sitelens.site.alpha.fit_alpha` draws for it with the same config), its own Adam moments, its
own validation loss and its own kept α, while every pass carries the rows of many tasks.

How the rows of different tasks share a pass: each task's prompt prefixes are encoded once into
its own frozen KV cache (:class:`~sitelens.site.training.FitData`, as in the one-task fit); for a
pass, the step's rows of each task are selected and the caches joined
(:func:`sitelens.models.concat_caches`: left-padded to the widest prefix with zero keys and values
and 0 in the attention mask, the layout of one left-padded batch). Row ``i`` of task ``k`` is mixed
with α_k toward t_k (per-row weights and targets of :class:`~sitelens.site.injection.HeadMix`), and
task k's loss is the mean first-token cross-entropy of its own rows (+ λ·mean(α_k)), which reads
only a_k: the summed loss gives every a_k exactly its own gradient, and Adam is elementwise.

What differs from K separate fits is float rounding only: a row's attention runs over a wider,
padded prefix (the padded columns get exactly zero weight, but the softmax and the matrix products
sum in another order) and a matmul over more rows may block its sums differently. So α, the kept
step and the history equal the one-by-one fits' to within float32 rounding, except where two
validation checks of a task tie to within that rounding (``tests/test_joint_tasks.py``).

Passes are bounded: tasks are ordered by prefix width (so a pass joins similar widths and pads
little) and grouped so that a pass has at most ``max_rows`` rows and its joined cache at most
``budget_bytes``; validation is batched across tasks under the same bounds. The prefix caches of
all tasks held at once are bounded by ``memory_bytes``: past it, the tasks run in consecutive
chunks, each one joint run (a pass's autograd also keeps its joined cache, and a grouped-query
model's attention may expand it per query head, so a pass costs a few times ``budget_bytes``).
Every task must use the same :class:`~sitelens.site.config.FitConfig` (the same steps and checks),
as in a sweep.

:func:`task_embeddings` is stage 1 for many tasks (their prompts pooled into shared length-sorted
batches) and :func:`fit_site_tasks` both stages, returning one :class:`SiteAdapter` per task.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor

from sitelens.errors import FitError
from sitelens.models import SELECT_BUDGET_BYTES, concat_caches, layer_devices, place_layer_rows
from sitelens.site.adapter import SiteAdapter, adapter_of
from sitelens.site.alpha import FitResult, data_used, site_mix, warn_stalled
from sitelens.site.config import FitConfig
from sitelens.site.embedding import last_token_z
from sitelens.site.training import (
    FitData,
    LastTokenSet,
    RunConfig,
    iid_batches,
    run_training,
    training_batches,
)
from sitelens.tasks import DEFAULT_TEMPLATE, Task, Template, embedding_prompts, warn_shared_answer_token


def cache_width(cache) -> int:
    """Prefix positions held by a frozen prefix cache (any backend)."""
    mask = getattr(cache, "attention_mask", None)
    if mask is None:
        mask = cache.previous_attention_mask
    return int(mask.shape[1])


def position_bytes(cache) -> int:
    """Bytes one row of ``cache`` holds per prefix position (every layer's K and V; 0 for a
    :class:`~sitelens.models.RecomputeCache`, which holds token ids only)."""
    if hasattr(cache, "kv"):
        pairs = cache.kv()
    elif hasattr(cache, "entries"):
        pairs = [(e.past_keys, e.past_values) for e in cache.entries]
    else:
        return 0
    width = max(1, cache_width(cache))
    return sum(k[:1].numel() * k.element_size() + v[:1].numel() * v.element_size()
               for k, v in pairs) // width


def pass_groups(widths: Sequence[int], rows: Sequence[int], per_position: int, *, max_rows: int,
                budget_bytes: int) -> list[range]:
    """Consecutive groups of tasks (ordered by width, ascending) for one pass each: at most
    ``max_rows`` rows, and the joined cache (rows × the group's widest prefix × ``per_position``
    bytes) at most ``budget_bytes``; a task alone in its group is always allowed."""
    groups, start, n = [], 0, 0
    for k, (w, r) in enumerate(zip(widths, rows)):
        if k > start and (n + r > max_rows or (n + r) * max(w, 1) * per_position > budget_bytes):
            groups.append(range(start, k))
            start, n = k, 0
        n += r
    groups.append(range(start, len(widths)))
    return groups


def held_bytes(data: FitData) -> int:
    """Bytes of the prefix caches ``data`` holds (its train and validation sets)."""
    return sum(position_bytes(s.cache) * cache_width(s.cache) * len(s)
               for s in (data.train, data.valid))


def _fit_chunk(model, chunk: list[tuple[int, FitData]], embeddings, cfg: FitConfig, runs: list, *,
               official: bool, progress: bool, max_rows: int, budget_bytes: int) -> None:
    """One joint run over the tasks of ``chunk`` (``(index, its FitData)`` pairs); writes
    ``runs[index] = (TrainRun, FitData, tasks in the run)``."""
    # conditions: the tasks ordered by training prefix width (similar widths share a pass)
    chunk = sorted(chunk, key=lambda kd: (cache_width(kd[1].train.cache), kd[0]))
    order, data = [k for k, _ in chunk], [d for _, d in chunk]
    K, B = len(order), cfg.batch_size
    per_position = max(position_bytes(d.train.cache) for d in data)
    train_groups = pass_groups([cache_width(d.train.cache) for d in data], [B] * K, per_position,
                               max_rows=max_rows, budget_bytes=budget_bytes)
    valid_order = sorted(range(K), key=lambda r: (cache_width(data[r].valid.cache), r))
    valid_groups = [[valid_order[i] for i in g] for g in pass_groups(
        [cache_width(data[r].valid.cache) for r in valid_order],
        [len(data[r].valid) for r in valid_order], per_position,
        max_rows=max_rows, budget_bytes=budget_bytes)]

    devs = layer_devices(model)
    a = [torch.full((K, model.cfg.n_heads), float(cfg.init), dtype=torch.float32, device=d)
         for d in devs]  # L × [K, n_heads]: row r is condition r's logits
    targets = [torch.stack(rows) for rows in zip(*(
        place_layer_rows(embeddings[k], model, dtype=torch.float32) for k in order))]  # L × [K, H, d_head]

    def losses(sets: list[LastTokenSet], conds: Sequence[int], alpha: list[Tensor]) -> Tensor:
        """Mean first-token cross-entropy of each condition on its own rows ``[len(conds)]``."""
        owner = torch.cat([torch.full((len(s),), r, dtype=torch.long) for s, r in zip(sets, conds)])
        joined = LastTokenSet(concat_caches([s.cache for s in sets]),
                              torch.cat([s.last for s in sets]), torch.cat([s.answers for s in sets]))
        mix = site_mix([w[owner.to(w.device)] for w in alpha],
                       [t[owner.to(t.device)] for t in targets])  # per row: its task's α and t
        logits = joined.logits(model, mix.hooks(model))  # [rows, d_vocab]
        ce = F.cross_entropy(logits, joined.answers.to(logits.device), reduction="none")  # [rows]
        sizes = torch.tensor([len(s) for s in sets], device=ce.device)
        sums = torch.zeros(len(sets), dtype=ce.dtype, device=ce.device).index_add_(
            0, torch.repeat_interleave(torch.arange(len(sets), device=ce.device), sizes), ce)
        return sums / sizes

    def objective(step: list[int], conds: range) -> tuple[Tensor, Tensor]:
        alpha = [torch.sigmoid(r) for r in a]  # L × [K, n_heads]
        sets = [data[r].batch(data[r].batches[step[0]]) for r in conds]
        ce = losses(sets, conds, alpha)  # [len(conds)]
        mean_alpha = torch.stack([w[conds.start:conds.stop].to(ce.device) for w in alpha]).mean((0, 2))
        return ce + cfg.sparsity * mean_alpha, ce.detach()

    def valid_loss() -> Tensor:
        out = torch.empty(K)
        with torch.no_grad():
            alpha = [torch.sigmoid(r.detach()) for r in a]
            for conds in valid_groups:
                out[conds] = losses([data[r].valid for r in conds], conds, alpha).cpu()
        return out  # [K]

    out = run_training(
        a, [[s] for s in range(len(data[0].batches))], objective, valid_loss,
        snapshot=lambda r: torch.stack([w[r].detach().to(devs[0]) for w in a]).cpu(),
        config=_TaskGroups(
            lr=cfg.lr, seed=cfg.seed, eval_every=cfg.eval_every,
            keep="last_check" if official else "best", what="α", task=f"{K} tasks",
            progress=progress, check_params=True, conditions=K,
            hint="Lower the learning rate (lr), check the model dtype (float32 is safest), or "
                 "the embeddings.", pass_groups=tuple(train_groups),
        ),
    )
    for r, k in enumerate(order):
        runs[k] = (out[r], data[r], K)


@dataclass
class _TaskGroups(RunConfig):
    """A :class:`RunConfig` whose passes are the given groups of conditions (tasks)."""

    pass_groups: tuple[range, ...] = ()

    def groups(self) -> list[range]:
        return list(self.pass_groups)


def fit_alpha_tasks(
    model,
    tasks: Sequence[Task],
    embeddings: Sequence[Float[Tensor, "n_layers n_heads d_head"]],
    config: FitConfig | None = None,
    *,
    template: Template = DEFAULT_TEMPLATE,
    progress: bool = False,
    max_rows: int = 512,
    budget_bytes: int = SELECT_BUDGET_BYTES,
    memory_bytes: int = 4 * SELECT_BUDGET_BYTES,
) -> list[FitResult]:
    """Stage 2 for every task of ``tasks`` in one joint run (see the module docstring): one
    :class:`FitResult` per task, in order, each equal to ``fit_alpha(model, task, embedding,
    config, template=template)`` up to float rounding, with the same warnings
    (:class:`StalledFitWarning`, a shared first answer token) and errors (a non-finite embedding).

    ``max_rows``: rows per forward pass (training and validation); ``budget_bytes``: bytes of one
    pass's joined prefix cache; ``memory_bytes``: bytes of the prefix caches held at once (every
    task's train and validation items): the tasks run in consecutive chunks (in the order given)
    whose caches fit, each chunk one joint run (a task over the bound runs alone).
    ``FitResult.seconds``: this call's wall time divided evenly over the tasks (they share every
    pass, so no task has a time of its own); ``FitResult.joint_tasks``: how many tasks shared its
    joint run. Works on both backends (the TransformerBridge's caches join as well,
    :func:`sitelens.models.concat_caches`)."""
    cfg = config or FitConfig()
    tasks, embeddings = list(tasks), list(embeddings)
    if len(tasks) != len(embeddings):
        raise ValueError(f"fit_alpha_tasks needs one embedding per task, got {len(tasks)} tasks "
                         f"and {len(embeddings)} embeddings.")
    if not tasks:
        return []
    official = cfg.protocol == "official"
    if official:
        template = replace(template, bare_digits=True)
    t0 = time.perf_counter()
    for task, emb in zip(tasks, embeddings):
        if not torch.isfinite(emb).all():
            bad = int((~torch.isfinite(emb)).sum())
            raise FitError(
                f"The task embedding of {task.name!r} has {bad} non-finite value(s) (inf/nan), so "
                "the loss would be non-finite. Recompute it in float32 (task_embedding) or refit."
            )
        warn_shared_answer_token(model, task.name, [ex.output for ex in task.train], template)

    def batches_of(task: Task) -> list[list[int]]:  # exactly fit_alpha's draw
        if official:
            return list(iid_batches(len(task.train), cfg))
        return list(training_batches(list(range(len(task.train))), cfg))

    runs: list = [None] * len(tasks)
    chunk: list[tuple[int, FitData]] = []
    held = 0
    for k, task in enumerate(tasks):
        d = FitData.build(model, task, batches_of(task), n_valid=cfg.n_valid, template=template)
        size = held_bytes(d)
        if chunk and held + size > memory_bytes:  # run what is held, then start a new chunk
            _fit_chunk(model, chunk, embeddings, cfg, runs, official=official, progress=progress,
                       max_rows=max_rows, budget_bytes=budget_bytes)
            chunk, held = [], 0
        chunk.append((k, d))
        held += size
    _fit_chunk(model, chunk, embeddings, cfg, runs, official=official, progress=progress,
               max_rows=max_rows, budget_bytes=budget_bytes)
    K = len(tasks)
    seconds = (time.perf_counter() - t0) / K
    results = []
    for task, (run, d, n) in zip(tasks, runs):
        kept = run.kept  # [n_layers, n_heads], float32, CPU
        if run.best_step == 0 and not official:
            warn_stalled(task, cfg)
        results.append(FitResult(
            alpha=torch.sigmoid(kept), logits=kept, history=run.history, best_step=run.best_step,
            seconds=seconds, data=data_used(task, len(d.valid), d.batches, len(d.rows.used)),
            joint_tasks=n,
        ))
    return results


def task_embeddings(
    model, tasks: Sequence[Task], *, n_prompts: int = 50, n_shots: int = 10, batch_size: int = 8,
    seed: int = 0, template: Template = DEFAULT_TEMPLATE, progress: bool = False,
) -> list[Float[Tensor, "n_layers n_heads d_head"]]:
    """Stage 1 for every task of ``tasks``: :func:`sitelens.site.task_embedding` of each (the same
    prompts), with the prompts of all tasks pooled into length-sorted batches of ``batch_size``
    (:func:`sitelens.site.last_token_z`), so that prompts of similar length share a batch whatever
    their task. Each embedding equals its one-task value up to the float rounding of another
    batch (other padding)."""
    prompts = [embedding_prompts(t, n_prompts, n_shots, seed=seed, template=template, model=model)
               for t in tasks]
    z = last_token_z(model, [p for ps in prompts for p in ps], batch_size=batch_size, reduce="none",
                     progress=progress, desc=f"task embedding [{len(tasks)} tasks]")  # [N, L, H, d]
    out, start = [], 0
    for ps in prompts:
        out.append(z[start:start + len(ps)].mean(0))  # [n_layers, n_heads, d_head]
        start += len(ps)
    return out


def fit_site_tasks(
    model, tasks: Sequence[Task], *, n_prompts: int = 50, n_shots: int = 10,
    config: FitConfig | None = None, template: Template = DEFAULT_TEMPLATE, batch_size: int = 8,
    progress: bool = False, **bounds,
) -> list[SiteAdapter]:
    """:func:`sitelens.site.fit_site` for every task of ``tasks``, stage 1 pooled
    (:func:`task_embeddings`) and stage 2 joint (:func:`fit_alpha_tasks`; ``bounds``: its
    ``max_rows``, ``budget_bytes``, ``memory_bytes``). Each adapter equals its one-task fit up to
    float rounding; ``meta["stage1_seconds"]`` and ``meta["stage2_seconds"]`` are each stage's
    wall time divided evenly over the tasks, and ``meta["joint_tasks"]`` says how many shared it."""
    cfg = config or FitConfig()
    if cfg.protocol == "official":
        template = replace(template, bare_digits=True)
    tasks = list(tasks)
    t0 = time.perf_counter()
    embs = task_embeddings(model, tasks, n_prompts=n_prompts, n_shots=n_shots,
                           batch_size=batch_size, seed=cfg.seed, template=template, progress=progress)
    stage1 = (time.perf_counter() - t0) / max(1, len(tasks))
    fits = fit_alpha_tasks(model, tasks, embs, cfg, template=template, progress=progress, **bounds)
    return [adapter_of(model, t, e, r, cfg, template=template, n_prompts=n_prompts, n_shots=n_shots,
                       stage1_seconds=stage1) for t, e, r in zip(tasks, embs, fits)]


__all__ = ["cache_width", "fit_alpha_tasks", "fit_site_tasks", "pass_groups", "position_bytes",
           "task_embeddings"]
