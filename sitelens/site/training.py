"""The one training runner (SITE's stage 2 and the trained baselines) and the data it trains on.

- :class:`LastTokenSet`: prompts encoded once into a frozen prefix KV cache, plus their last
  tokens and the first token of each answer. An intervention that acts only at the last prompt
  token re-runs just that token (:meth:`LastTokenSet.logits`). SITE's stage 2, MTV, the baselines'
  layer selection and activation patching score items this way.
- :func:`training_batches` / :func:`iid_batches`: the seeded training batches (item indices);
  :class:`BatchRows` maps them onto a :class:`LastTokenSet` built once on the items they use;
  :class:`FitData` holds both with the validation items.
- :func:`run_training`: Adam on some parameters (the model frozen), one step per batch, the
  validation loss every ``eval_every`` steps, and the parameters kept by
  :attr:`RunConfig.keep`: the best on validation (``"best"``) or those of the last check
  (``"last_check"``, the official SITE protocol). A progress bar, a history of every step. It
  runs R fits ("conditions") at once, each with its own rows, loss, Adam state and kept
  parameters: one SITE fit or baseline is R = 1, the frontier's joint fits R > 1.

A method hands the runner only what is its own: an ``objective(batch, conds)`` (the loss of each
condition to minimize, e.g. SITE's first-token cross-entropy under the α-mix), a ``valid_loss()``
and a ``snapshot(r)`` of what condition ``r`` keeps.

Off the CPU the runner does not wait for the device on every step: the per-step numbers and the
finiteness checks stay on the device and are read at each validation check and at the end (a
non-finite loss still raises :class:`FitError` naming the first bad step). On the CPU, where
reading a number costs nothing, every step is checked at once (its loss before the optimizer
step, so a non-finite loss never moves the parameters).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor

from sitelens.errors import FitError, TaskError
from sitelens.format import progress_bar
from sitelens.models import encode, last_token_forward, prefix_cache, select_cache
from sitelens.site.injection import apply_hooks
from sitelens.tasks import DEFAULT_TEMPLATE, Example, Task, Template, answer_token_ids, zero_shot_prompts

Hook = tuple[str, Callable]
T = TypeVar("T")

# ----------------------------------------------------------------------------------------------
# the data: last-token sets


@dataclass
class LastTokenSet:
    """Prompts as a frozen prefix KV cache (every position but the last) plus their last tokens
    and the first answer token of each: an intervention at the last prompt token re-runs only that
    token (:func:`sitelens.models.prefix_cache`)."""

    cache: Any
    last: Int[Tensor, "n 1"]
    answers: Int[Tensor, " n"]

    @classmethod
    def build(
        cls, model, items: Sequence[Example], template: Template = DEFAULT_TEMPLATE
    ) -> LastTokenSet:
        """The zero-shot prompts of ``items`` and the first tokens of their answers."""
        prompts = zero_shot_prompts(model, items, template)
        answers = answer_token_ids(model, [ex.output for ex in items], template)
        return cls.from_prompts(model, prompts, answers)

    @classmethod
    def from_prompts(
        cls, model, prompts: Sequence[str], answers: Sequence[int], *, batch_size: int = 64
    ) -> LastTokenSet:
        """Any prompts (e.g. corrupted few-shot ones) with the answer token id of each;
        ``batch_size`` bounds the rows of one prefix pass."""
        enc = encode(model, list(prompts))
        cache, last = prefix_cache(model, enc, batch_size=batch_size)  # last: [n, 1]
        return cls(cache, last, torch.tensor(answers, dtype=torch.long, device=last.device))

    def __len__(self) -> int:
        return len(self.answers)

    def select(self, rows: Int[Tensor, " rows"]) -> LastTokenSet:
        """Rows ``rows`` (repeats allowed) as a new set; the cache rows are copied."""
        return LastTokenSet(select_cache(self.cache, rows), self.last[rows], self.answers[rows])

    def logits(self, model, hooks: list[Hook]) -> Float[Tensor, "n d_vocab"]:
        """Logits at the last prompt token under ``hooks``, in float32 (float64 stays float64), on
        the device they come out on (the unembedding's); gradients flow if enabled."""
        with apply_hooks(model, hooks):
            out = last_token_forward(model, self.cache, self.last)  # [n, 1, d_vocab]
        return out[:, -1].to(torch.promote_types(out.dtype, torch.float32))

    def score(self, model, hooks: list[Hook]) -> tuple[float, float]:
        """``(first-token accuracy, mean cross-entropy)`` under ``hooks`` (no gradients)."""
        with torch.no_grad():
            logits = self.logits(model, hooks)  # [n, d_vocab]
        answers = self.answers.to(logits.device)  # [n]
        acc = float((logits.argmax(-1) == answers).float().mean())
        return acc, float(F.cross_entropy(logits, answers))


def valid_items(task: Task, n_valid: int) -> list[Example]:
    """The first ``n_valid`` validation items (train items when the task has no valid split)."""
    items = (task.valid or task.train)[:n_valid]
    if not items:
        raise TaskError(f"Task {task.name!r} has no items to validate on.")
    return list(items)


# ----------------------------------------------------------------------------------------------
# seeded batches


class BatchPlan(Protocol):
    """What the batch generators read (a :class:`sitelens.site.FitConfig` is one)."""

    steps: int
    batch_size: int
    seed: int


def training_batches(items: list, plan: BatchPlan) -> Iterator[list]:
    """``plan.steps`` batches of ``plan.batch_size`` items: shuffled passes over ``items``
    (``random.Random(plan.seed)``; a new shuffle whenever the pool runs out)."""
    rng = random.Random(plan.seed)
    pool: list = []
    for _ in range(plan.steps):
        batch = []
        while len(batch) < plan.batch_size:
            if not pool:
                pool = list(items)
                rng.shuffle(pool)
            batch.append(pool.pop())
        yield batch


def iid_batches(n_items: int, plan: BatchPlan) -> Iterator[list[int]]:
    """``plan.steps`` batches of item indices drawn i.i.d. with replacement (the official
    protocol; ``randrange(n)`` draws the same number as the reference's
    ``random.sample(range(n), 1)[0]``)."""
    rng = random.Random(plan.seed)
    for _ in range(plan.steps):
        yield [rng.randrange(n_items) for _ in range(plan.batch_size)]


class BatchRows:
    """The distinct items that ``batches`` use (``used``, sorted) and, for one batch, their rows in
    a set built on ``used`` only (each item's prefix is then encoded once)."""

    def __init__(self, batches: Sequence[Sequence[int]]):
        self.used = sorted({i for b in batches for i in b})
        self._row = {i: r for r, i in enumerate(self.used)}

    def __call__(self, batch: Sequence[int]) -> Int[Tensor, " batch"]:
        return torch.tensor([self._row[i] for i in batch])


@dataclass
class FitData:
    """What a last-token fit trains and validates on: the seeded ``batches`` (train item indices),
    the distinct items they use as one :class:`LastTokenSet` (``train``, each prefix encoded
    once; ``rows`` maps a batch onto it) and the validation items (``valid``)."""

    batches: list[list[int]]
    rows: BatchRows
    train: LastTokenSet
    valid: LastTokenSet

    @classmethod
    def build(cls, model, task: Task, batches: Sequence[Sequence[int]], *, n_valid: int,
              template: Template = DEFAULT_TEMPLATE) -> FitData:
        """``batches`` of ``task``'s train split and its first ``n_valid`` validation items
        (:func:`valid_items`)."""
        valid = LastTokenSet.build(model, valid_items(task, n_valid), template)
        rows = BatchRows(batches)
        train = LastTokenSet.build(model, [task.train[i] for i in rows.used], template)
        return cls([list(b) for b in batches], rows, train, valid)

    def batch(self, batch: Sequence[int]) -> LastTokenSet:
        """The items of ``batch`` (repeats kept) as a set of their own."""
        return self.train.select(self.rows(batch))


# ----------------------------------------------------------------------------------------------
# the runner

KEEP = ("best", "last_check")


def _read_every_step(params: Sequence[Tensor]) -> bool:
    """Whether :func:`run_training` reads each step's numbers back at once: when every parameter
    is on the CPU, where that costs nothing (elsewhere it would make the host wait for the device
    on every step)."""
    return all(p.device.type == "cpu" for p in params)


def _per_condition(x, n: int) -> list[float]:
    """``x`` (a number, a tensor of ``n`` numbers or a sequence of them) as ``n`` floats, each
    exactly the value given (a float32 number is not rounded again)."""
    if isinstance(x, Tensor):
        out = x.detach().reshape(-1).tolist()
    elif isinstance(x, (int, float)):
        out = [x]
    else:
        out = list(x)
    if len(out) != n:
        raise ValueError(f"Expected one number per condition ({n}), got {len(out)}.")
    return [float(v) for v in out]


def condition_groups(n_conditions: int, per_pass: int | None) -> list[range]:
    """Conditions ``0..n_conditions-1`` in consecutive groups of at most ``per_pass`` (``None``:
    one group): the conditions of each forward pass."""
    n = per_pass or n_conditions
    return [range(s, min(s + n, n_conditions)) for s in range(0, n_conditions, n)]


@dataclass
class RunConfig:
    """How :func:`run_training` runs.

    keep: ``"best"``: validate before training, every ``eval_every`` steps and after the last
        step, and keep the parameters with the lowest validation loss (the first on ties).
        ``"last_check"``: validate every ``eval_every`` steps only and keep the parameters of the
        last check (the final ones when no check happens) — the official SITE protocol
        (:class:`sitelens.site.OfficialFitConfig`). With several conditions, each condition
        keeps its own.
    metric: the name under which each step's number from ``objective`` enters the history.
    what, task: named in the progress bar (``fit {what} [{task}]``) and in errors.
    hint: the fix an error about a non-finite loss suggests.
    check_params: also fail when a step leaves non-finite parameters.
    conditions: how many fits run at once (R; see :func:`run_training`).
    per_pass: conditions per forward and backward pass (``None``: all); bounds the rows of a pass.
    patience: with ``keep="best"``, stop after this many validation checks in a row in which no
        condition's validation loss went below its kept one (0: run every batch). Each condition
        still keeps its best; the history ends at the step where training stopped.
    """

    lr: float
    seed: int = 0
    eval_every: int = 10
    keep: str = "best"
    metric: str = "train_loss"
    what: str = "parameters"
    task: str = ""
    hint: str = "Lower the learning rate (lr) or use a float32 model."
    check_params: bool = False
    progress: bool = False
    conditions: int = 1
    per_pass: int | None = None
    patience: int = 0

    def __post_init__(self):
        if self.keep not in KEEP:
            raise ValueError(f"RunConfig.keep must be one of {KEEP}, got {self.keep!r}.")
        if self.conditions < 1 or (self.per_pass is not None and self.per_pass < 1):
            raise ValueError("RunConfig.conditions and .per_pass must be at least 1.")
        if self.patience < 0:
            raise ValueError(f"RunConfig.patience must be >= 0, got {self.patience!r}.")

    def groups(self) -> list[range]:
        """The conditions of each pass (:func:`condition_groups`)."""
        return condition_groups(self.conditions, self.per_pass)


@dataclass
class TrainRun(Generic[T]):
    """What :func:`run_training` kept for one condition (``kept``: a ``snapshot(r)``), when
    (``best_step``; 0 = before training), its validation loss (NaN when never checked) and a
    record per step."""

    kept: T
    best_step: int
    valid_loss: float
    history: list[dict] = field(default_factory=list)


def run_training(
    params: Sequence[Tensor],
    batches: Sequence[Sequence[int]],
    objective: Callable[[Sequence[int], range], tuple[Tensor, Any]],
    valid_loss: Callable[[], Any],
    snapshot: Callable[[int], T],
    config: RunConfig,
) -> list[TrainRun[T]]:
    """Adam (``config.lr``) on ``params``, one step per batch, seeded with ``config.seed``, for
    R = ``config.conditions`` fits at once; returns one :class:`TrainRun` per condition.

    A condition is one fit: its own parameters (its rows of ``params``, or params of its own), its
    own loss on the batch, its own validation loss and its own kept snapshot. R = 1 is a single
    fit (:func:`sitelens.site.fit_alpha`, the baselines); R > 1 runs fits that share the model,
    the batches and the seed in the same passes (:func:`sitelens.lenses.joint_fit.fit_many`).

    ``objective(batch, conds)`` returns the loss of each condition in ``conds`` (a ``range``;
    ``[len(conds)]``, or a scalar for one condition) and a number per condition for the history
    (under ``config.metric``; floats or a tensor, read when the runner next synchronizes);
    ``valid_loss()`` scores the current parameters (a float, or ``[R]``); ``snapshot(r)`` copies
    what condition ``r`` keeps. Each step: ``zero_grad``; per group of :meth:`RunConfig.groups`
    the objective and ``backward`` of the sum of its losses (the group's graph is freed before the
    next is built); one ``step``; then the validation schedule of ``config.keep``, per condition.

    Why R fits at once are R fits: the summed loss gives each condition's parameters exactly the
    gradient of its own loss, provided condition r's loss reads only r's parameters (the caller's
    part), and Adam is elementwise, so each parameter's moments and step are its own, whichever
    tensor holds it. The numbers equal R separate runs up to the float rounding of a pass with more
    rows (``tests/test_training.py``).

    A non-finite loss (or, with ``check_params``, non-finite parameters after a step) raises
    :class:`FitError` naming the step: at once when every parameter is on the CPU, else at the
    next validation check or the end (the device is not waited for every step). Each history holds
    ``{"step", metric, "valid_loss"}`` per step (NaN where not checked) and, with
    ``keep="best"``, a step-0 record of the check before training."""
    cfg = config
    R, groups = cfg.conditions, cfg.groups()
    torch.manual_seed(cfg.seed)
    params = list(params)
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.Adam(params, lr=cfg.lr)
    eager = _read_every_step(params)
    history: list[list[dict]] = [[] for _ in range(R)]
    # steps not yet read back: (step, a record per condition, (conds, loss, value) per group, finite)
    pending: list[tuple[int, list[dict], list[tuple[range, Tensor, Any]], list[Tensor]]] = []
    kept: list[tuple[float, Any, int] | None] = [None] * R  # per condition (valid loss, snapshot, step)
    stale = 0  # validation checks in a row that improved no condition (for cfg.patience)

    def check() -> list[float]:
        return _per_condition(valid_loss(), R)

    if cfg.keep == "best":
        v = check()
        kept = [(v[r], snapshot(r), 0) for r in range(R)]
        for r in range(R):
            history[r].append({"step": 0, cfg.metric: float("nan"), "valid_loss": v[r]})

    def settle(bar) -> None:
        """Read the pending steps back: their numbers, and a FitError at the first bad one."""
        for step, recs, parts, finite in pending:
            for _, total, _ in parts:
                if not bool(torch.isfinite(total).all()):
                    raise FitError(f"Non-finite loss at step {step} while fitting {cfg.what} on "
                                   f"{cfg.task!r}. {cfg.hint}")
            if not all(bool(f) for f in finite):
                raise FitError(f"The parameters of {cfg.what} became non-finite at step {step} "
                               f"while fitting {cfg.task!r}. Lower the learning rate (lr).")
            for conds, _, value in parts:
                for r, x in zip(conds, _per_condition(value, len(conds))):
                    recs[r][cfg.metric] = x
        if pending:
            last = [rec[cfg.metric] for rec in pending[-1][1]]
            bar.set_postfix({cfg.metric: f"{sum(last) / len(last):.3f}"})
        pending.clear()

    with progress_bar(total=len(batches), desc=f"fit {cfg.what} [{cfg.task}]",
                      enabled=cfg.progress) as bar:
        for step, batch in enumerate(batches, start=1):
            recs = [{"step": step, cfg.metric: float("nan"), "valid_loss": float("nan")} for _ in range(R)]
            parts = []
            opt.zero_grad()
            for conds in groups:
                total, value = objective(batch, conds)
                if eager and not bool(torch.isfinite(total).all()):  # a bad loss never moves the params
                    pending.append((step, recs, [(conds, total.detach(), value)], []))
                    settle(bar)
                total.sum().backward()
                parts.append((conds, total.detach(), value))
            opt.step()
            finite = [torch.isfinite(p).all() for p in params] if cfg.check_params else []
            pending.append((step, recs, parts, finite))
            bar.update(1)
            checking = step % cfg.eval_every == 0 or (cfg.keep == "best" and step == len(batches))
            if eager or checking:
                settle(bar)
            if cfg.keep == "last_check":
                if step % cfg.eval_every == 0:  # every check replaces what is kept
                    v = check()
                    for r in range(R):
                        recs[r]["valid_loss"] = v[r]
                        kept[r] = (v[r], snapshot(r), step)
            elif checking:
                v = check()
                improved = False
                for r in range(R):
                    recs[r]["valid_loss"] = v[r]
                    if v[r] < kept[r][0]:  # strictly lower: ties keep the earlier
                        kept[r] = (v[r], snapshot(r), step)
                        improved = True
                stale = 0 if improved else stale + 1
            for r in range(R):
                history[r].append(recs[r])
            if cfg.keep == "best" and cfg.patience and stale >= cfg.patience:
                break  # early stop: the kept parameters are the best seen
        settle(bar)
    for p in params:
        p.requires_grad_(False)
    runs = []
    for r in range(R):  # "last_check" and no check happened: the final parameters
        loss, snap, step = kept[r] or (float("nan"), snapshot(r), len(batches))
        runs.append(TrainRun(kept=snap, best_step=step, valid_loss=loss, history=history[r]))
    return runs
