"""Head-set selectors of the frontier (:mod:`sitelens.lenses.frontier`): for each budget k, a set
S_k of k heads chosen on the train and valid splits only (the test split stays unseen). Each is
one entry of :data:`sitelens.lenses.registry.SELECTOR_REGISTRY`, which names its function here
(``alpha_sets``, ..., ``sparse_sets``); :func:`select` runs one by name.

- ``alpha``, ``alpha-sparse``, ``alpha-grad``, ``atp``, ``effect``: the top-k of a lens
  (:func:`~sitelens.lenses.registry.get_lens`). ``alpha`` is the full SITE fit's α (λ = 0);
  ``alpha-sparse`` refits α with the sparsity λ of :attr:`FrontierConfig.sparsity_grid` on the
  same embedding and keeps the λ whose top-k sets (α = 1) score best on valid, on average over the
  budgets.
- ``greedy``: forward selection on valid. Each step scores every candidate head added to the set
  chosen so far, all candidates in batched rows on one prefix KV cache
  (:func:`~sitelens.patching.engine.run_rows`; on a HookedTransformer each candidate's rows start
  at its own layer from the chosen set's residual, :mod:`sitelens.lenses.greedy_rows`, about half
  the layers per row), and keeps the best by (valid first-token
  accuracy, then mean answer probability). It stops when the set reaches full SITE's valid
  accuracy or :attr:`FrontierConfig.greedy_max_k` heads; budgets above that are not reached
  (``None``), never guessed. :attr:`FrontierConfig.greedy_pool` prunes the candidates to the
  top-P heads of ``alpha-grad`` (a fast lens); its effect is measured on the first step (the
  unpruned best head, whether the pool holds it, both valid accuracies: ``meta["pruning"]``).
- ``sparse``: a learned k-sparse α: logits ``a`` trained on train with a straight-through top-k:
  the forward pass injects α = 1 into exactly the k heads of largest ``a`` (the patching
  convention), the backward pass treats the mask as ``sigmoid(a)``. One fit per budget; S_k is the
  top-k of the kept ``a`` (best valid loss, as SITE's own fit). All budgets are fitted at once
  (:func:`~sitelens.lenses.joint_fit.fit_many`), as are ``alpha-sparse``'s λ and the frontier's
  refits: one pass of R × 8 rows instead of R passes of 8 (the same fits up to float rounding;
  no step caps, warm starts or early stops, so nothing about the fits themselves changed).

Costs are counted by hooks (:class:`~sitelens.patching.engine.ForwardPassCounter`,
:class:`~sitelens.patching.engine.BackwardPassCounter`) around each selector.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from sitelens.errors import LensError, TaskError
from sitelens.format import StageLog
from sitelens.heads import head_label, labels_line, mask_of, order, ranking
from sitelens.lenses.attribution import AttributionConfig
from sitelens.lenses.greedy_rows import branched_scores
from sitelens.lenses.joint_fit import fit_many
from sitelens.lenses.registry import DEFAULT_BUDGETS, LensInputs, get_lens, get_selector
from sitelens.models import is_bridge
from sitelens.patching.engine import BackwardPassCounter, ForwardPassCounter, row_grid, run_rows
from sitelens.site import FitConfig, SiteAdapter, fit_site
from sitelens.site.training import LastTokenSet, valid_items
from sitelens.tasks import DEFAULT_TEMPLATE, Task, Template

MIN_SPLIT = 2  # items each of train, valid and test need (one item selects or scores nothing)


@dataclass(frozen=True)
class FrontierConfig:
    """The knobs of :func:`sitelens.lenses.frontier.frontier` and its selectors."""

    fit: FitConfig = field(default_factory=FitConfig)  # full SITE, alpha-sparse, sparse, refit
    attribution: AttributionConfig = field(default_factory=AttributionConfig)  # alpha-grad, atp, effect
    n_prompts: int = 50  # stage 1 (the task embedding)
    n_shots: int = 10
    template: Template = DEFAULT_TEMPLATE  # of every prompt and answer token (the fit's)
    sparsity_grid: tuple[float, ...] = (1.0, 5.0)  # alpha-sparse's λ, chosen on valid
    n_valid: int = 64  # valid items of greedy, of alpha-sparse's λ choice and of k*'s choice
    greedy_max_k: int | None = None  # None: the largest budget
    greedy_pool: int | None = None  # prune greedy's candidates to the top-P of alpha-grad
    greedy_stop: bool = True  # stop greedy once it reaches full SITE's valid accuracy
    greedy_branch: bool = True  # score each candidate from its own layer up (greedy_rows; hooked only)
    refit: FitConfig | None = None  # the refit injection's fit (None: ``fit``)
    test_limit: int | None = None  # the first test items only
    exact_match: bool = True  # also generate under each set (slow)
    n_bootstrap: int = 0  # resamples of the selection items for the stability
    batch_size: int = 512  # rows per forward pass (bounded by the prefix-cache copy budget)

    def __post_init__(self):
        """The ranges of the command line's options (:mod:`sitelens.cli.configs`): counts >= 1
        (None where allowed), ``n_bootstrap`` >= 0, each λ of ``sparsity_grid`` finite and >= 0
        (a negative one rewards large α); :class:`LensError` naming the field otherwise."""
        def whole(v) -> bool:
            return isinstance(v, (int, np.integer)) and not isinstance(v, bool)

        for name in ("n_prompts", "n_shots", "n_valid", "batch_size", "greedy_max_k", "greedy_pool",
                     "test_limit"):
            v = getattr(self, name)
            if v is not None and not (whole(v) and v >= 1):
                raise LensError(f"FrontierConfig.{name} must be a whole number >= 1, got {v!r}.")
        if not (whole(self.n_bootstrap) and self.n_bootstrap >= 0):
            raise LensError(f"FrontierConfig.n_bootstrap must be a whole number >= 0, got "
                            f"{self.n_bootstrap!r}.")
        bad = [lam for lam in self.sparsity_grid if not (math.isfinite(lam) and lam >= 0)]
        if bad or not self.sparsity_grid:
            raise LensError(f"FrontierConfig.sparsity_grid must hold finite λ >= 0 (a negative λ "
                            f"rewards large α), got {self.sparsity_grid!r}.")


def check_budgets(budgets: Sequence[int], n_heads_total: int) -> list[int]:
    """Budgets sorted, without repeats; each must lie in [1, the model's head count]."""
    try:
        ks = sorted({int(k) for k in budgets})
    except (TypeError, ValueError):
        raise LensError(f"Budgets must be whole numbers, got {list(budgets)!r}.") from None
    if not ks:
        raise LensError(f"No budget given; use e.g. {','.join(map(str, DEFAULT_BUDGETS))}.")
    bad = [k for k in ks if not 1 <= k <= n_heads_total]
    if bad:
        raise LensError(f"Budget {bad[0]} is outside [1, {n_heads_total}] (the model's "
                        f"n_layers × n_heads = {n_heads_total} heads); lower it.")
    return ks


def check_task_splits(task: Task) -> None:
    """A frontier selects on train and valid and scores on test: each needs :data:`MIN_SPLIT` items."""
    small = {s: len(task.split(s)) for s in ("train", "valid", "test") if len(task.split(s)) < MIN_SPLIT}
    if small:
        raise TaskError(f"Task {task.name!r} is too small to split for a frontier: "
                        + ", ".join(f"{s} has {n} item(s)" for s, n in small.items())
                        + f"; each of train, valid and test needs at least {MIN_SPLIT}. Add items.")


def topk_mask(flat: Tensor, k: int) -> Tensor:
    """A 0/1 vector like ``flat`` (on its device) with ones at its ``k`` largest entries
    (:func:`sitelens.heads.order`: ties by index)."""
    return torch.zeros_like(flat).index_fill(0, order(flat)[:k], 1.0)


@dataclass
class SelectionContext:
    """What the selectors of one seed share: the full SITE fit (its embedding, its α) and the
    valid items."""

    model: object
    task: Task
    adapter: SiteAdapter
    config: FrontierConfig
    seed: int
    progress: bool = False
    log: StageLog | None = None  # the frontier's progress lines (None: none)
    _valid: LastTokenSet | None = None

    def say(self, text: str) -> None:
        """A progress line of the current stage (:class:`~sitelens.format.StageLog`), where
        there is a log."""
        if self.log is not None:
            self.log.write(f"{self.log.stage}: {text}" if self.log.stage else text)

    @property
    def shape(self) -> tuple[int, int]:
        return self.model.cfg.n_layers, self.model.cfg.n_heads

    @property
    def valid(self) -> LastTokenSet:
        if self._valid is None:
            items = valid_items(self.task, self.config.n_valid)
            self._valid = LastTokenSet.build(self.model, items, self.adapter.template)
        return self._valid

    def valid_scores(self, weights: Float[Tensor, "n_cond n_layers n_heads"]) -> tuple[Tensor, Tensor]:
        """Per condition: valid first-token accuracy and mean answer probability ``[n_cond]``."""
        v = self.valid
        n = len(v)
        item, cond = row_grid(weights.shape[0], n)
        correct, prob = run_rows(self.model, v.cache, v.last, v.answers, item, cond, weights,
                                 self.adapter.embedding, batch_size=self.config.batch_size)
        return (correct.reshape(-1, n).float().mean(1),
                prob.reshape(-1, n).float().mean(1))  # [n_cond] each


@dataclass
class Selection:
    """One selector's sets: ``sets[k]`` = the flat head indices of S_k (``None``: not reached);
    its counted cost and what it chose along the way (``meta``)."""

    selector: str
    seed: int
    sets: dict[int, list[int] | None]
    forward_passes: float = 0  # whole, but for a share of a joint fit (fit_site_counted_tasks)
    backward_passes: float = 0
    seconds: float = 0.0
    meta: dict = field(default_factory=dict)
    n_heads: int | None = None  # the model's n_heads: how a flat index reads as L{l}H{h}

    def labels(self, k: int) -> list[str] | None:
        """S_k as ``L{l}H{h}`` labels (flat indices where ``n_heads`` is unknown); None: not reached."""
        heads = self.sets.get(k)
        if heads is None:
            return None
        return [head_label(j, self.n_heads) if self.n_heads else str(j) for j in heads]

    def __repr__(self) -> str:
        """One line: the selector, seed, each budget's set as ``L{l}H{h}`` labels (long sets
        shortened) and the cost."""
        def one(k: int) -> str:
            labels = self.labels(k)
            return f"k={k}: " + ("not reached" if labels is None else labels_line(labels, 4))

        sets = "; ".join(one(k) for k in sorted(self.sets))
        return (f"Selection({self.selector}, seed {self.seed}, {sets}; forward {self.forward_passes:g}, "
                f"backward {self.backward_passes:g}, {self.seconds:.1f}s)")


def fit_site_counted(model, task: Task, config: FrontierConfig, seed: int, *, progress: bool = False
                     ) -> tuple[SiteAdapter, dict]:
    """Full SITE (both stages) with ``seed``, and its counted cost."""
    with ForwardPassCounter(model) as fwd, BackwardPassCounter(model) as bwd:
        adapter = fit_site(model, task, n_prompts=config.n_prompts, n_shots=config.n_shots,
                           config=replace(config.fit, seed=seed), template=config.template,
                           progress=progress)
    return adapter, {"forward_passes": fwd.count, "backward_passes": bwd.count, "seconds": fwd.seconds}


def fit_site_counted_tasks(model, tasks: Sequence[Task], config: FrontierConfig, seed: int, *,
                           progress: bool = False) -> list[tuple[SiteAdapter, dict]]:
    """:func:`fit_site_counted` for every task of ``tasks`` in one joint fit
    (:func:`sitelens.site.fit_site_tasks`: stage 1 pooled, stage 2 with every task's rows in each
    pass; each adapter equals its one-task fit up to float rounding). A joint pass serves every
    task, so each task's cost is an even share of the joint run's passes and seconds (its
    ``forward_passes`` need not be whole), and ``joint_tasks`` says how many shared it."""
    from sitelens.site import fit_site_tasks

    tasks = list(tasks)
    with ForwardPassCounter(model) as fwd, BackwardPassCounter(model) as bwd:
        adapters = fit_site_tasks(model, tasks, n_prompts=config.n_prompts, n_shots=config.n_shots,
                                  config=replace(config.fit, seed=seed), template=config.template,
                                  progress=progress)
    n = max(1, len(tasks))
    cost = {"forward_passes": fwd.count / n, "backward_passes": bwd.count / n, "seconds": fwd.seconds / n,
            "joint_tasks": len(tasks)}
    return [(a, dict(cost)) for a in adapters]


def _top_sets(ranked: list[int], budgets: Sequence[int]) -> dict[int, list[int]]:
    return {k: ranked[:k] for k in budgets}


def alpha_sets(ctx: SelectionContext, budgets) -> tuple[dict, dict]:
    return _top_sets(ranking(ctx.adapter.alpha), budgets), {}


def _lens_sets(ctx: SelectionContext, name: str, budgets) -> tuple[dict, dict]:
    att = replace(ctx.config.attribution, seed=ctx.seed, template=ctx.adapter.template)
    inputs = LensInputs(ctx.model, ctx.task, ctx.adapter.embedding, att, progress=ctx.progress)
    scores = get_lens(name).run(inputs).map()  # [n_layers, n_heads]
    return _top_sets(ranking(scores), budgets), {}


def alpha_grad_sets(ctx: SelectionContext, budgets) -> tuple[dict, dict]:
    return _lens_sets(ctx, "alpha-grad", budgets)


def atp_sets(ctx: SelectionContext, budgets) -> tuple[dict, dict]:
    return _lens_sets(ctx, "atp", budgets)


def effect_sets(ctx: SelectionContext, budgets) -> tuple[dict, dict]:
    return _lens_sets(ctx, "effect", budgets)


def alpha_sparse_sets(ctx: SelectionContext, budgets) -> tuple[dict, dict]:
    """One α fit per λ of the grid on the full fit's embedding, all λ at once
    (:func:`~sitelens.lenses.joint_fit.fit_many`: the same fits as
    :func:`sitelens.site.fit_alpha` with that sparsity, up to float rounding); the λ whose top-k
    sets score best on valid, on average over the budgets, is kept."""
    cfg, shape = ctx.config, ctx.shape
    fit = replace(cfg.fit, seed=ctx.seed)
    lams = torch.tensor([float(x) for x in cfg.sparsity_grid])  # [n_lambda]
    if fit.protocol == "default":
        kept = fit_many(ctx.model, ctx.task, ctx.adapter.embedding, fit, torch.sigmoid, len(lams),
                        template=ctx.adapter.template, what="sparse α",
                        penalty=lambda a: lams.to(a.device) * torch.sigmoid(a).mean(1),
                        max_rows=cfg.batch_size)
        alphas = list(torch.sigmoid(kept))  # n_lambda × [L, H]
    else:  # the official protocol's own batches and kept α: one fit_site per λ
        alphas = [fit_site(ctx.model, ctx.task, n_prompts=cfg.n_prompts, n_shots=cfg.n_shots,
                           config=replace(fit, sparsity=float(lam)), template=ctx.adapter.template,
                           embedding=ctx.adapter.embedding, progress=ctx.progress).alpha
                  for lam in cfg.sparsity_grid]
    orders, valid = [], []
    for alpha in alphas:
        order = ranking(alpha)
        w = torch.stack([mask_of(order[:k], shape) for k in budgets])  # [n_budgets, L, H]
        acc, _ = ctx.valid_scores(w)
        orders.append(order)
        valid.append(float(acc.mean()))
    best = int(np.argmax(valid))  # ties: the smallest λ (the grid's first)
    return (_top_sets(orders[best], budgets),
            {"sparsity": float(cfg.sparsity_grid[best]), "valid_acc_by_sparsity": valid})


def greedy_step_scores(ctx: SelectionContext, chosen: list[int], candidates: list[int]
                       ) -> tuple[Tensor, Tensor]:
    """Valid accuracy and mean answer probability ``[n_candidates]`` of ``chosen`` + each
    candidate (α = 1), every candidate in batched rows on one prefix cache."""
    L, H = ctx.shape
    if ctx.config.greedy_branch and not is_bridge(ctx.model):  # each candidate from its own layer up
        correct, prob = branched_scores(ctx.model, ctx.valid, mask_of(chosen, (L, H)), list(candidates),
                                        ctx.adapter.embedding, batch_size=ctx.config.batch_size)
        n = len(ctx.valid)
        return correct.reshape(-1, n).float().mean(1), prob.reshape(-1, n).mean(1)
    w = mask_of(chosen, (L, H)).flatten().repeat(len(candidates), 1)  # [n_cand, L * H]
    w[torch.arange(len(candidates)), torch.tensor(candidates)] = 1.0
    return ctx.valid_scores(w.reshape(-1, L, H))


def best_candidate(acc: Tensor, prob: Tensor) -> int:
    """The index of the best candidate: the highest accuracy, then the highest probability, then
    the first."""
    top = acc == acc.max()
    return int(torch.argmax(torch.where(top, prob, torch.full_like(prob, -1.0))))


def greedy_sets(ctx: SelectionContext, budgets) -> tuple[dict, dict]:
    cfg, (L, H) = ctx.config, ctx.shape
    max_k = min(cfg.greedy_max_k or max(budgets), L * H)
    acc_full, _ = ctx.valid_scores(ctx.adapter.alpha.float()[None])
    target = float(acc_full[0])
    pool, meta = list(range(L * H)), {}
    if cfg.greedy_pool:
        p = min(cfg.greedy_pool, L * H)
        pool = _lens_sets(ctx, "alpha-grad", [p])[0][p]
        acc, prob = greedy_step_scores(ctx, [], list(range(L * H)))  # the pruning's effect: step 1 unpruned
        best = best_candidate(acc, prob)
        in_pool = [acc[j] for j in pool]
        meta["pruning"] = {"pool": p, "unpruned_first_pick": best, "in_pool": best in pool,
                           "unpruned_first_valid_acc": float(acc[best]),
                           "pruned_first_valid_acc": float(max(in_pool))}
    chosen: list[int] = []
    accs: list[float] = []
    stop = "max_k"
    while len(chosen) < max_k:
        cands = [j for j in pool if j not in chosen]
        if not cands:
            stop = "pool exhausted"
            break
        acc, prob = greedy_step_scores(ctx, chosen, cands)
        b = best_candidate(acc, prob)
        chosen.append(cands[b])
        accs.append(float(acc[b]))
        if len(chosen) in budgets:
            ctx.say(f"budget k = {len(chosen)} reached, valid accuracy {accs[-1]:.3f} "
                    f"(target {target:.3f})")
        if cfg.greedy_stop and accs[-1] >= target:
            stop = "reached full SITE's valid accuracy"
            break
    sets = {k: (chosen[:k] if k <= len(chosen) else None) for k in budgets}
    return sets, {"valid_target": target, "valid_acc_by_step": accs, "stop": stop,
                  "max_k": max_k, "pool": len(pool), **meta}


def straight_through_topk(k: int) -> Callable[[Tensor], Tensor]:
    """Forward: the 0/1 top-k mask of ``a`` (exactly k heads at α = 1); backward: ``sigmoid(a)``'s
    gradient (the straight-through estimator)."""
    def fn(a: Tensor) -> Tensor:
        soft = torch.sigmoid(a)
        return topk_mask(a, k) + soft - soft.detach()
    return fn


def straight_through_topk_rows(ks: Sequence[int]) -> Callable[[Tensor], Tensor]:
    """:func:`straight_through_topk` per row: row ``r`` of ``a`` ``[R, n]`` keeps its ``ks[r]``
    largest entries."""
    def fn(a: Tensor) -> Tensor:
        soft = torch.sigmoid(a)
        hard = torch.stack([topk_mask(row, k) for row, k in zip(a, ks)])  # [R, n]
        return hard + soft - soft.detach()
    return fn


def sparse_sets(ctx: SelectionContext, budgets) -> tuple[dict, dict]:
    """One straight-through top-k fit per budget, every budget at once
    (:func:`~sitelens.lenses.joint_fit.fit_many`: the same fits as one ``fit_many`` per budget
    with :func:`straight_through_topk`, up to float rounding), all from the same seeded start."""
    cfg = replace(ctx.config.fit, seed=ctx.seed)
    gen = torch.Generator().manual_seed(ctx.seed)
    init = cfg.init + 1e-3 * torch.randn(ctx.shape[0] * ctx.shape[1], generator=gen)  # breaks ties
    ks = list(budgets)
    kept = fit_many(ctx.model, ctx.task, ctx.adapter.embedding, cfg, straight_through_topk_rows(ks),
                    len(ks), template=ctx.adapter.template, what="k-sparse α",
                    init=init.repeat(len(ks), 1), max_rows=ctx.config.batch_size)
    return {k: ranking(a)[:k] for k, a in zip(ks, kept)}, {}


def select(ctx: SelectionContext, selector: str, budgets: Sequence[int]) -> Selection:
    """Run one selector on one seed's context, its passes and seconds counted."""
    run = get_selector(selector).run
    with ForwardPassCounter(ctx.model) as fwd, BackwardPassCounter(ctx.model) as bwd:
        sets, meta = run(ctx, list(budgets))
    return Selection(selector, ctx.seed, sets, fwd.count, bwd.count, fwd.seconds, meta, n_heads=ctx.shape[1])


__all__ = [
    "FrontierConfig", "Selection", "SelectionContext", "alpha_grad_sets", "alpha_sets", "alpha_sparse_sets",
    "atp_sets", "best_candidate", "check_budgets", "check_task_splits", "effect_sets", "fit_site_counted",
    "fit_site_counted_tasks", "greedy_sets", "greedy_step_scores", "select", "sparse_sets",
    "straight_through_topk", "straight_through_topk_rows", "topk_mask",
]
