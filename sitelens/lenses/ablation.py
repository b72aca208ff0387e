"""Lens ``ablation-mean`` / ``ablation-zero``: which heads the in-context computation needs.

On clean ``n_shots``-shot prompts (the ICL computation SITE replaces), replace one head's
last-token ``z`` by a reference and measure the drop in probability of the answer's first token:
``score[l, h] = P(answer | clean) − P(answer | head (l, h) ablated)``, averaged over prompts
(higher = the head is needed). References:

- ``zero``: ``z ← 0`` (the head writes nothing);
- ``mean``: ``z ←`` the head's mean last-token ``z`` over the **zero-shot** prompts of the same
  queries, i.e. what the head writes without demonstrations: mean ablation removes what the
  demonstrations add to the head, not the head's task-independent output.

Batched exactly like :func:`sitelens.patching.effects.head_causal_effects`: each prompt's prefix is encoded
once into a frozen KV cache and every row of one forward pass re-runs the last token with one
head ablated (``(n_heads_total + 1) × n_prompts`` rows), so the numbers equal a serial loop of full
forward passes (tested).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, replace

import torch

from sitelens.errors import TaskError
from sitelens.lenses.scores import HeadScores
from sitelens.models import model_name
from sitelens.patching.engine import ForwardPassCounter, batched_answer_probs, serial_answer_probs
from sitelens.site import last_token_z
from sitelens.stats import bootstrap_ci
from sitelens.tasks import (
    DEFAULT_TEMPLATE,
    Task,
    Template,
    answer_token_ids,
    few_shot_prompts,
    zero_shot_prompts,
)

REFERENCES = ("mean", "zero")


@dataclass(frozen=True)
class AblationConfig:
    """The knobs of :func:`head_ablation`."""

    n_prompts: int = 16  # clean few-shot prompts
    n_shots: int = 10
    seed: int = 0  # draws the queries (from ``split``) and the demonstrations
    split: str = "train"
    batched: bool = True  # False: the reference loop, one full forward pass per head
    batch_size: int = 64  # rows (prompt, ablated head) per forward pass
    n_boot: int = 1000
    template: Template = DEFAULT_TEMPLATE


def ablation_prompts(model, task: Task, cfg: AblationConfig) -> tuple[list[str], list[str], list[int]]:
    """``(clean few-shot prompts, zero-shot prompts of the same queries, answer token ids)``."""
    pool = task.split(cfg.split)
    if not pool:
        raise TaskError(f"Task {task.name!r} has no items in its {cfg.split!r} split.")
    rng = random.Random(cfg.seed)
    queries = rng.sample(pool, cfg.n_prompts) if cfg.n_prompts <= len(pool) else rng.choices(
        pool, k=cfg.n_prompts)
    clean = few_shot_prompts(task, queries, cfg.n_shots, seed=cfg.seed + 1, template=cfg.template,
                             model=model)
    zs = zero_shot_prompts(model, queries, cfg.template)
    return clean, zs, answer_token_ids(model, [q.output for q in queries], cfg.template)


def head_ablation(
    model,
    task: Task,
    config: AblationConfig | None = None,
    *,
    reference: str = "mean",
    return_per_prompt: bool = False,
    progress: bool = False,
    **overrides,
):
    """Per-head ablation scores as :class:`HeadScores` (lens ``ablation-{reference}``), with a
    percentile bootstrap CI over prompts. ``return_per_prompt=True`` also returns the
    ``[n_prompts, n_layers, n_heads]`` drops. ``progress``: a bar ``ablation-{reference} [task]``."""
    if reference not in REFERENCES:
        raise ValueError(f"reference must be one of {REFERENCES}, got {reference!r}.")
    cfg = replace(config or AblationConfig(), **overrides)
    L, H, d_head = model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_head
    t0 = time.perf_counter()
    clean, zs, answers = ablation_prompts(model, task, cfg)
    N = L * H
    onehots = torch.eye(N).reshape(N, L, H)  # [N, n_layers, n_heads]: row j ablates head j
    answer_probs = batched_answer_probs if cfg.batched else serial_answer_probs
    with ForwardPassCounter(model) as passes:  # the zero-shot mean's passes included
        if reference == "mean":
            target = last_token_z(model, zs)  # [n_layers, n_heads, d_head]
        else:
            target = torch.zeros(L, H, d_head)  # [n_layers, n_heads, d_head]
        target = target.to(model.cfg.device)
        base, ablated = answer_probs(model, clean, answers, onehots, target, cfg.batch_size,
                                     progress=progress, desc=f"ablation-{reference} [{task.name}]")
    drop = (base[:, None] - ablated).reshape(len(clean), L, H)  # [n_prompts, n_layers, n_heads]
    lo, hi = bootstrap_ci(drop.permute(1, 2, 0).numpy(), n_boot=cfg.n_boot, seed=cfg.seed)
    scores = HeadScores.from_map(
        drop.mean(0), ci_low=lo, ci_high=hi, model=model_name(model), task=task.name,
        lens=f"ablation-{reference}", forward_passes=passes.count, backward_passes=0,
        seconds=time.perf_counter() - t0,
        meta={"reference": reference, "n_prompts": len(clean), "n_shots": cfg.n_shots,
              "seed": cfg.seed, "baseline_prob": float(base.mean()),
              "mode": "batched" if cfg.batched else "serial"},
    )
    return (scores, drop) if return_per_prompt else scores


def mean_ablation_lens(x) -> HeadScores:
    """Lens ``ablation-mean`` of the registry, on its shared inputs
    (:class:`~sitelens.lenses.registry.LensInputs`)."""
    return head_ablation(x.model, x.task, x.ablation, reference="mean", progress=x.progress)


def zero_ablation_lens(x) -> HeadScores:
    """Lens ``ablation-zero`` of the registry, on its shared inputs."""
    return head_ablation(x.model, x.task, x.ablation, reference="zero", progress=x.progress)
