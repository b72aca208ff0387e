"""The common interface of every baseline, and the helpers the baselines share.

A method is a small dataclass of hyperparameters with a ``name`` and
``fit(model, task, *, seed=0, template=DEFAULT_TEMPLATE, progress=False) -> Fitted``. Each method
file implements only ``_fit(model, task, seed, template, progress) -> FitParts`` (what it runs,
its parameter count, state and metadata); :meth:`Method.fit` times it and builds the
:class:`Fitted`. Trained methods run on :func:`sitelens.site.training.run_training`, SITE's runner.

Intervention semantics (``Fitted.scope``):

- ``"none"``: no hooks (zero-shot, ICL; ICL changes the prompt through ``Fitted.prompt_fn``).
- ``"prefill"``: the hooks act at the last prompt token, and only on a forward pass whose hooked
  tensor has exactly ``seq_len`` positions (the prompt). A KV-cached decode step (one position) is
  left alone, so the hooks may stay in place during generation. SITE, FV, TV, LTV, SV, MTV.
- ``"all"``: the hooks act at every position of every forward pass, decode steps included
  (like a weight change). I2CL, LoRA, (IA)3. Keys and values written to the KV cache during the
  prefill already carry the change; the decode steps must run with the hooks in place too.

``Fitted.intervention`` is what :func:`sitelens.eval.evaluation.evaluate` accepts: a :class:`HeadMix` or
a callable ``(model, seq_len) -> [(hook_name, fn)]``.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor

from sitelens.errors import FitError
from sitelens.eval.generation import intervention_hooks
from sitelens.models import (
    accumulation_dtype,
    act_name,
    encode,
    input_device,
    last_position_logits,
)
from sitelens.site import FitConfig
from sitelens.site.injection import HeadMix, apply_hooks
from sitelens.site.training import LastTokenSet, RunConfig, run_training, training_batches, valid_items
from sitelens.tasks import DEFAULT_TEMPLATE, Example, Task, Template, answer_token_ids, zero_shot_prompts

Hook = tuple[str, Callable]
SCOPES = ("none", "prefill", "all")


# ----------------------------------------------------------------------------------------------
# interface


@dataclass
class HookIntervention:
    """A callable intervention ``(model, seq_len) -> hooks`` with explicit semantics.

    ``build(model, seq_len)`` returns ``(hook_name, fn)`` pairs. With ``scope="prefill"`` the
    hooks act only when the hooked tensor has ``seq_len`` positions (``seq_len=None``: always,
    used by the last-token-only forward passes of fitting); with ``scope="all"`` they act at
    every position of every forward pass, ``seq_len`` is ignored.
    """

    build: Callable[[Any, int | None], list[Hook]]
    scope: str = "prefill"

    def __post_init__(self):
        if self.scope not in ("prefill", "all"):
            raise ValueError(f"scope must be 'prefill' or 'all', got {self.scope!r}")

    def __call__(self, model, seq_len: int | None = None) -> list[Hook]:
        return self.build(model, seq_len)


@dataclass
class Fitted:
    """A fitted method: what to run and what it cost.

    intervention: ``None``, a :class:`HeadMix` (prefill, last token) or a
        :class:`HookIntervention`.
    prompt_fn: ``(model, items) -> prompts`` when the method changes the prompt (ICL); ``None`` means
        zero-shot prompts.
    n_params: trainable parameters (gradient- or closed-form-fitted numbers; means of activations
        and a layer index chosen on valid are not counted, see ``meta["stored_numbers"]``).
    fit_seconds: wall time of ``fit``.
    state: the fitted tensors and choices (e.g. ``vector``, ``W``, ``layer``, ``params``).
    """

    method: str
    intervention: HeadMix | HookIntervention | None = None
    prompt_fn: Callable[[Any, Sequence[Example]], list[str]] | None = None
    n_params: int = 0
    fit_seconds: float = 0.0
    state: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def scope(self) -> str:
        """``"none"``, ``"prefill"`` or ``"all"`` (see the module docstring)."""
        if self.intervention is None:
            return "none"
        if isinstance(self.intervention, HeadMix):
            return "prefill"
        return getattr(self.intervention, "scope", "prefill")

    def __repr__(self) -> str:
        """One line: the method, its scope, parameter count and fit time, and what ``state``
        holds (tensors as their shapes, never their values)."""
        from sitelens.format import array_summary

        def short(v) -> str:
            r = array_summary(v)
            return r if len(r) <= 40 else r[:37] + "..."

        state = ", ".join(f"{k}={short(v)}" for k, v in list(self.state.items())[:6])
        more = len(self.state) - 6
        return (f"Fitted(method={self.method!r}, scope={self.scope}, n_params={self.n_params}, "
                f"fit_seconds={self.fit_seconds:.2f}, state: {state or 'none'}"
                + (f", … (+{more})" if more > 0 else "") + ")")

    @property
    def every_position(self) -> bool:
        """True when the hooks must stay active on KV-cached decode steps."""
        return self.scope == "all"

    def prompts(
        self, model, items: Sequence[Example], template: Template = DEFAULT_TEMPLATE
    ) -> list[str]:
        """The scored prompt of each item (its answer's prompt-side whitespace included,
        :func:`sitelens.tasks.answer_parts`)."""
        if self.prompt_fn is not None:
            return self.prompt_fn(model, items)
        return zero_shot_prompts(model, items, template)

    def hooks(self, model, seq_len: int | None) -> list[Hook]:
        """The hooks for a prompt batch of ``seq_len`` positions (a HeadMix is pinned to it;
        :func:`sitelens.eval.generation.intervention_hooks`)."""
        return intervention_hooks(model, self.intervention, seq_len)


@dataclass
class FitParts:
    """What :meth:`Method._fit` returns: the fields of :class:`Fitted` that are the method's own
    (:meth:`Method.fit` adds the name and the wall time)."""

    intervention: HeadMix | HookIntervention | None = None
    prompt_fn: Callable[[Any, Sequence[Example]], list[str]] | None = None
    n_params: int = 0
    state: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    def fitted(self, name: str, fit_seconds: float) -> Fitted:
        """These parts as the :class:`Fitted` of method ``name`` that took ``fit_seconds``."""
        return Fitted(name, intervention=self.intervention, prompt_fn=self.prompt_fn,
                      n_params=self.n_params, fit_seconds=fit_seconds, state=self.state, meta=self.meta)


@dataclass(kw_only=True)
class Method:
    """Base class: hyperparameters as fields, ``name`` overridable (``LoRA(rank=4,
    name="lora-r4")``). A method implements :meth:`_fit`; :meth:`fit` times it and wraps its
    parts as a :class:`Fitted`."""

    name: str = "method"

    def fit(
        self,
        model,
        task: Task,
        *,
        seed: int = 0,
        template: Template = DEFAULT_TEMPLATE,
        progress: bool = False,
    ) -> Fitted:
        """Fit on ``task`` (``seed`` seeds every draw; ``progress`` shows a bar where training
        runs). ``fit_seconds`` is the wall time of the whole call."""
        t0 = time.perf_counter()
        parts = self._fit(model, task, seed=seed, template=template, progress=progress)
        return parts.fitted(self.name, time.perf_counter() - t0)

    def _fit(self, model, task: Task, seed: int, template: Template, progress: bool) -> FitParts:
        """The method's own work: what it runs (intervention or prompts), its trainable-parameter
        count, fitted state and metadata."""
        raise NotImplementedError

    # True where :meth:`fit_tasks` fits several tasks in one joint run (SITE); runners that fit
    # many tasks (``run_bench(joint=K)``) call it for such methods only.
    fits_jointly: ClassVar[bool] = False

    def fit_tasks(
        self,
        model,
        tasks: Sequence[Task],
        *,
        seed: int = 0,
        template: Template = DEFAULT_TEMPLATE,
        progress: bool = False,
    ) -> list[Fitted]:
        """:meth:`fit` on each of ``tasks``, in order. A method with ``fits_jointly`` fits them in
        one joint run instead, each result equal to its :meth:`fit` up to float rounding."""
        return [self.fit(model, t, seed=seed, template=template, progress=progress) for t in tasks]


# ----------------------------------------------------------------------------------------------
# small shared helpers


@dataclass(kw_only=True)
class TrainedMethod(Method):
    """A method whose own parameters are trained by :func:`train_hook_params` on SITE's batches
    (LoRA, (IA)3, I2CL): the shared training hyperparameters and the call that uses them."""

    lr: float | tuple[float, ...] = 0.01
    n_examples: int = 400
    batch_size: int = 8
    eval_every: int = 10
    n_valid: int = 64

    def _train_hooks(
        self,
        model,
        task: Task,
        params: dict[str, Tensor],
        hooks_of: Callable[[Any, dict[str, Tensor]], list[Hook]],
        *,
        seed: int,
        template: Template,
        progress: bool,
        state: dict | None = None,
        meta: dict | None = None,
    ) -> FitParts:
        """Train ``params`` of the every-position hooks ``hooks_of(model, params)`` and keep the
        best ones (lowest validation loss) as an intervention with ``scope="all"``.

        ``self.lr`` may be a tuple of learning rates: each is trained from the same initial
        ``params`` and the run with the lowest validation loss is kept (a run whose loss turns
        non-finite counts as failed; :class:`FitError` only when all fail). The choice is in
        ``state["lr"]`` and every run's best validation loss in ``state["lr_search"]``."""
        lrs = check_lrs(self.lr, f"{type(self).__name__}.lr")
        runs, errors = [], []
        for lr in lrs:
            try:
                res = train_hook_params(
                    model, task, {k: v.clone() for k, v in params.items()},
                    lambda p: hooks_of(model, p), lr=lr, n_examples=self.n_examples,
                    batch_size=self.batch_size, eval_every=self.eval_every,
                    n_valid=self.n_valid, seed=seed, template=template, progress=progress,
                    what=f"{self.name} lr={lr:g}",
                )
            except FitError as e:
                if len(lrs) == 1:
                    raise
                errors.append(str(e))
                continue
            runs.append((res.best_valid_loss, lr, res))
        if not runs:
            raise FitError(f"Every learning rate in {lrs} diverged on {task.name!r}: " + "; ".join(errors))
        _, lr, res = min(runs, key=lambda r: (r[0], r[1]))  # ties: the smaller lr
        best = res.params
        return FitParts(
            intervention=HookIntervention(lambda m, seq_len: hooks_of(m, best), scope="all"),
            n_params=count_params(best),
            state={"params": best, "history": res.history, "best_step": res.best_step, "lr": lr,
                   "lr_search": [{"lr": r_lr, "valid_loss": vl, "best_step": r.best_step}
                                 for vl, r_lr, r in runs],
                   **(state or {})},
            meta={"stored_numbers": count_params(best), "lr": lr, **(meta or {})},
        )


def check_lrs(lr: float | Sequence[float], what: str = "lr") -> tuple[float, ...]:
    """``lr`` as a non-empty tuple of positive finite floats, or a :class:`FitError` naming the
    fix (as :class:`sitelens.site.FitConfig` does for SITE's lr)."""
    lrs = (lr,) if isinstance(lr, (int, float)) else tuple(lr)
    if not lrs or not all(isinstance(x, (int, float)) and math.isfinite(x) and x > 0 for x in lrs):
        raise FitError(
            f"{what} must be a positive finite number or a non-empty sequence of them (one fit "
            f"each, the lowest validation loss kept), got {lr!r}."
        )
    return tuple(float(x) for x in lrs)


def resid_hook_name(layer: int, point: str = "resid_pre") -> str:
    """``blocks.{layer}.hook_resid_pre`` / ``hook_resid_post``."""
    if point not in ("resid_pre", "resid_mid", "resid_post"):
        raise ValueError(f"point must be resid_pre, resid_mid or resid_post, got {point!r}")
    return act_name(point, layer)


def acts_now(x: Tensor, seq_len: int | None) -> bool:
    """The prefill guard: act when ``seq_len`` is None or the tensor has ``seq_len`` positions."""
    return seq_len is None or x.shape[1] == seq_len


def last_token_hook(
    update: Callable[[Float[Tensor, "batch d_model"]], Tensor], seq_len: int | None
) -> Callable:
    """A hook setting the last position's state ``h`` to ``update(h)`` (prefill only; the hooked
    tensor is copied, never written in place)."""

    def fn(x: Float[Tensor, "batch pos d_model"], hook=None):
        if not acts_now(x, seq_len):
            return x
        x = x.clone()
        x[:, -1] = update(x[:, -1])  # [batch, d_model]
        return x

    return fn


def last_add_hook(vector: Float[Tensor, " d_model"], seq_len: int | None) -> Callable:
    """A hook adding ``vector`` at the last position (prefill only)."""
    return last_token_hook(lambda h: h + vector.to(h.dtype), seq_len)


def sample_items(items: Sequence[Example], n: int, seed: int) -> list[Example]:
    """``min(n, len(items))`` items without replacement, seeded."""
    items = list(items)
    return random.Random(seed).sample(items, min(n, len(items)))


# ----------------------------------------------------------------------------------------------
# layer selection (interventions that touch only the last prompt token)


def select_layer(
    model,
    items: Sequence[Example],
    make_hooks: Callable[[int], list[Hook]],
    layers: Sequence[int],
    *,
    template: Template = DEFAULT_TEMPLATE,
) -> tuple[int, list[dict]]:
    """The layer with the best validation first-token accuracy (ties: lower loss, then the
    earlier layer). ``make_hooks(layer)`` must act at the last prompt token only (the hooks run
    on a one-position forward pass over a frozen prefix cache)."""
    data = LastTokenSet.build(model, items, template)
    table = []
    for layer in layers:
        acc, loss = data.score(model, make_hooks(layer))
        table.append({"layer": int(layer), "valid_acc": acc, "valid_loss": loss})
    best = min(table, key=lambda r: (-r["valid_acc"], r["valid_loss"], r["layer"]))
    return best["layer"], table


# ----------------------------------------------------------------------------------------------
# training of every-position interventions (I2CL, LoRA, (IA)3)


@dataclass
class TrainResult:
    params: dict[str, Tensor]
    history: list[dict]
    best_step: int
    seconds: float

    @property
    def best_valid_loss(self) -> float:
        return min(h["valid_loss"] for h in self.history if math.isfinite(h["valid_loss"]))


def train_hook_params(
    model,
    task: Task,
    params: dict[str, Tensor],
    make_hooks: Callable[[dict[str, Tensor]], list[Hook]],
    *,
    lr: float,
    n_examples: int = 400,
    batch_size: int = 8,
    eval_every: int = 10,
    n_valid: int = 64,
    seed: int = 0,
    template: Template = DEFAULT_TEMPLATE,
    progress: bool = False,
    what: str = "hooks",
) -> TrainResult:
    """Adam on ``params`` (the model frozen) with SITE's loss: the cross-entropy of the first answer
    token after zero-shot prompts, over the same training batches as :func:`sitelens.site.fit_alpha`
    with the same ``seed``/``n_examples``/``batch_size``, run by
    :func:`sitelens.site.training.run_training`. Full forward passes (the hooks act at every position).
    The parameters with the best validation loss are returned (detached); ``what`` names the run
    in the progress bar and in errors."""
    t0 = time.perf_counter()
    plan = FitConfig(lr=lr, n_examples=n_examples, batch_size=batch_size, eval_every=eval_every,
                     n_valid=n_valid, seed=seed)
    batches = list(training_batches(list(range(len(task.train))), plan))  # [steps][batch_size]
    # float32 parameters (whatever the model's dtype) on the model's input device, not copied
    # from the CPU on every hook call; the hooks move a layer's slice to a GPU further down
    params = {k: v.to(device=input_device(model), dtype=accumulation_dtype(v.dtype)).detach()
              for k, v in params.items()}

    def loss_on(items: Sequence[Example]) -> Tensor:
        enc = encode(model, zero_shot_prompts(model, items, template))
        ans = torch.tensor(answer_token_ids(model, [ex.output for ex in items], template))
        with apply_hooks(model, make_hooks(params)):
            logits = last_position_logits(model, enc)  # [batch, d_vocab]
        return F.cross_entropy(logits, ans.to(logits.device))

    valid = valid_items(task, n_valid)

    def valid_loss() -> float:
        with torch.no_grad():
            return float(sum(
                loss_on(valid[s : s + 32]) * len(valid[s : s + 32])
                for s in range(0, len(valid), 32)
            ) / len(valid))

    def objective(batch: list[int], conds: range) -> tuple[Tensor, Tensor]:  # one condition
        loss = loss_on([task.train[i] for i in batch])
        return loss, loss.detach()

    (run,) = run_training(
        list(params.values()), batches, objective, valid_loss,
        snapshot=lambda r: {k: v.detach().clone() for k, v in params.items()},
        config=RunConfig(lr=lr, seed=seed, eval_every=eval_every, what=what, task=task.name,
                         progress=progress),
    )
    return TrainResult(run.kept, run.history, run.best_step, time.perf_counter() - t0)


def count_params(params: dict[str, Tensor]) -> int:
    return int(sum(p.numel() for p in params.values()))
