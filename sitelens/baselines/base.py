"""The common interface of every baseline, and the helpers the baselines share.

A method is a small dataclass of hyperparameters with a ``name`` and
``fit(model, task, *, seed=0, template=DEFAULT_TEMPLATE, progress=False) -> Fitted``.

Intervention semantics (``Fitted.scope``):

- ``"none"``: no hooks (zero-shot, ICL; ICL changes the prompt through ``Fitted.prompt_fn``).
- ``"prefill"``: the hooks act at the last prompt token, and only on a forward pass whose hooked
  tensor has exactly ``seq_len`` positions (the prompt). A KV-cached decode step (one position) is
  left alone, so the hooks may stay in place during generation. SITE, FV, TV, LTV, MTV.
- ``"all"``: the hooks act at every position of every forward pass, decode steps included
  (like a weight change). I2CL, LoRA, (IA)3. Keys and values written to the KV cache during the
  prefill already carry the change; the decode steps must run with the hooks in place too.

``Fitted.intervention`` is what :func:`sitelens.evaluate.evaluate` accepts: a :class:`HeadMix` or
a callable ``(model, seq_len) -> [(hook_name, fn)]``.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from sitelens.errors import FitError, TaskError
from sitelens.injection import HeadMix, apply_hooks
from sitelens.models import (
    encode,
    forward_until,
    last_position_logits,
    last_token_forward,
    length_batches,
    prefix_cache,
)
from sitelens.site import FitConfig, training_batches
from sitelens.tasks import (
    DEFAULT_TEMPLATE,
    Example,
    Task,
    Template,
    answer_token_ids,
    zero_shot_prompt,
)

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
    prompt_fn: ``items -> prompts`` when the method changes the prompt (ICL); ``None`` means
        zero-shot prompts.
    n_params: trainable parameters (gradient- or closed-form-fitted numbers; means of activations
        and a layer index chosen on valid are not counted, see ``meta["stored_numbers"]``).
    fit_seconds: wall time of ``fit``.
    state: the fitted tensors and choices (e.g. ``vector``, ``W``, ``layer``, ``params``).
    """

    method: str
    intervention: HeadMix | HookIntervention | None = None
    prompt_fn: Callable[[Sequence[Example]], list[str]] | None = None
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

    @property
    def every_position(self) -> bool:
        """True when the hooks must stay active on KV-cached decode steps."""
        return self.scope == "all"

    def prompts(
        self, items: Sequence[Example], template: Template = DEFAULT_TEMPLATE
    ) -> list[str]:
        if self.prompt_fn is not None:
            return self.prompt_fn(items)
        return [zero_shot_prompt(ex.input, template) for ex in items]

    def hooks(self, model, seq_len: int | None) -> list[Hook]:
        """The hooks for a prompt batch of ``seq_len`` positions (a HeadMix is pinned to it)."""
        inter = self.intervention
        if inter is None:
            return []
        if isinstance(inter, HeadMix):
            return HeadMix(inter.weights, inter.targets, inter.positions, seq_len).hooks(model)
        return inter(model, seq_len)


@dataclass(kw_only=True)
class Method:
    """Base class: hyperparameters as fields, ``name`` overridable (``LoRA(rank=4,
    name="lora-r4")``)."""

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
        raise NotImplementedError


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

    def _fit_hooks(
        self,
        model,
        task: Task,
        params: dict[str, Tensor],
        hooks_of: Callable[[Any, dict[str, Tensor]], list[Hook]],
        *,
        t0: float,
        seed: int,
        template: Template,
        progress: bool,
        state: dict | None = None,
        meta: dict | None = None,
    ) -> Fitted:
        """Train ``params`` of the every-position hooks ``hooks_of(model, params)`` and wrap the
        best ones (lowest validation loss) as a :class:`Fitted` with ``scope="all"``.

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
                    desc=f"fit {self.name} lr={lr:g}",
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
        return Fitted(
            self.name,
            intervention=HookIntervention(lambda m, seq_len: hooks_of(m, best), scope="all"),
            n_params=count_params(best),
            fit_seconds=time.perf_counter() - t0,
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
    return f"blocks.{layer}.hook_{point}"


def acts_now(x: Tensor, seq_len: int | None) -> bool:
    """The prefill guard: act when ``seq_len`` is None or the tensor has ``seq_len`` positions."""
    return seq_len is None or x.shape[1] == seq_len


def last_add_hook(vector: Float[Tensor, " d_model"], seq_len: int | None) -> Callable:
    """A hook adding ``vector`` at the last position (prefill only)."""

    def fn(x: Float[Tensor, "batch pos d_model"], hook=None):
        if not acts_now(x, seq_len):
            return x
        x = x.clone()
        x[:, -1] = x[:, -1] + vector.to(x.dtype)  # [batch, d_model]
        return x

    return fn


def sample_items(items: Sequence[Example], n: int, seed: int) -> list[Example]:
    """``min(n, len(items))`` items without replacement, seeded."""
    items = list(items)
    return random.Random(seed).sample(items, min(n, len(items)))


def valid_items(task: Task, n_valid: int) -> list[Example]:
    """The first ``n_valid`` validation items (train items when the task has no valid split)."""
    items = (task.valid or task.train)[:n_valid]
    if not items:
        raise TaskError(f"Task {task.name!r} has no items to validate on.")
    return list(items)


def capture_last(
    model, prompts: Sequence[str], hook_names: Sequence[str], *, batch_size: int = 8
) -> dict[str, Tensor]:
    """The value of each hook at the last prompt token: ``{name: [n_prompts, ...]}`` (float32,
    CPU). Each pass ends as soon as every hook has fired (:func:`~sitelens.models.forward_until`)."""
    prompts = list(prompts)
    batches = length_batches(model, prompts, batch_size)  # similar lengths, bounded memory
    order = [i for idx in batches for i in idx]
    parts: dict[str, list[Tensor]] = {n: [] for n in hook_names}
    for idx in batches:
        enc = encode(model, [prompts[i] for i in idx])
        buf: dict[str, Tensor] = {}

        def grabber(name: str, buf=buf) -> Callable:
            # keyed by the requested name: on a TransformerBridge ``hook.name`` is the canonical
            # name behind an alias such as ``blocks.{l}.hook_resid_post``
            def grab(x, hook=None):
                buf[name] = x[:, -1].detach().float().cpu()  # [batch, ...]

            return grab

        with torch.no_grad():
            forward_until(model, [(n, grabber(n)) for n in hook_names], enc.tokens,
                          attention_mask=enc.attention_mask)
        for n in hook_names:
            parts[n].append(buf[n])
    inverse = torch.empty(len(order), dtype=torch.long)
    inverse[torch.tensor(order)] = torch.arange(len(order))
    return {n: torch.cat(parts[n])[inverse] for n in hook_names}


# ----------------------------------------------------------------------------------------------
# last-token scoring (interventions that touch only the last prompt token)


@dataclass
class LastTokenSet:
    """Zero-shot prompts of some items as a frozen prefix KV cache plus their last tokens and
    first-answer-token ids: an intervention at the last token re-runs only that token."""

    cache: Any
    last: Int[Tensor, "n 1"]
    answers: Int[Tensor, " n"]

    @classmethod
    def build(cls, model, items: Sequence[Example], template: Template = DEFAULT_TEMPLATE):
        enc = encode(model, [zero_shot_prompt(ex.input, template) for ex in items])
        cache, last = prefix_cache(model, enc)
        ans = torch.tensor(answer_token_ids(model, [ex.output for ex in items], template))
        return cls(cache, last, ans.to(model.cfg.device))

    def logits(self, model, hooks: list[Hook]) -> Float[Tensor, "n d_vocab"]:
        with apply_hooks(model, hooks):
            out = last_token_forward(model, self.cache, self.last)  # [n, 1, d_vocab]
        return out[:, -1].float()

    def score(self, model, hooks: list[Hook]) -> tuple[float, float]:
        """``(first-token accuracy, mean cross-entropy)`` under ``hooks`` (no gradients)."""
        with torch.no_grad():
            logits = self.logits(model, hooks)  # [n, d_vocab]
        acc = float((logits.argmax(-1) == self.answers).float().mean())
        return acc, float(F.cross_entropy(logits, self.answers))


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
    desc: str = "fit",
) -> TrainResult:
    """Adam on ``params`` (the model frozen) with SITE's loss: the cross-entropy of the first answer
    token after zero-shot prompts, over the same training batches as :func:`sitelens.site.fit_alpha`
    with the same ``seed``/``n_examples``/``batch_size``. Full forward passes (the hooks act at
    every position). The parameters with the best validation loss are returned (detached)."""
    t0 = time.perf_counter()
    torch.manual_seed(seed)
    cfg = FitConfig(lr=lr, n_examples=n_examples, batch_size=batch_size, eval_every=eval_every,
                    n_valid=n_valid, seed=seed)
    batches = list(training_batches(list(range(len(task.train))), cfg))  # [steps][batch_size]
    for p in params.values():
        p.requires_grad_(True)
    opt = torch.optim.Adam(list(params.values()), lr=lr)
    dev = model.cfg.device

    def loss_on(items: Sequence[Example]) -> Tensor:
        enc = encode(model, [zero_shot_prompt(ex.input, template) for ex in items])
        ans = torch.tensor(answer_token_ids(model, [ex.output for ex in items], template))
        with apply_hooks(model, make_hooks(params)):
            logits = last_position_logits(model, enc)  # [batch, d_vocab]
        return F.cross_entropy(logits, ans.to(dev))

    valid = valid_items(task, n_valid)

    def valid_loss() -> float:
        with torch.no_grad():
            return float(sum(
                loss_on(valid[s : s + 32]) * len(valid[s : s + 32])
                for s in range(0, len(valid), 32)
            ) / len(valid))

    def snapshot() -> dict[str, Tensor]:
        return {k: v.detach().clone() for k, v in params.items()}

    best = (valid_loss(), snapshot(), 0)
    history = [{"step": 0, "train_loss": float("nan"), "valid_loss": best[0]}]
    bar = tqdm(total=len(batches), desc=f"{desc} [{task.name}]", disable=not progress, leave=False)
    for step, batch in enumerate(batches, start=1):
        loss = loss_on([task.train[i] for i in batch])
        if not torch.isfinite(loss):
            raise FitError(
                f"Non-finite loss at step {step} while fitting {desc} on {task.name!r}. Lower the "
                "learning rate (lr) or use a float32 model."
            )
        opt.zero_grad()
        loss.backward()
        opt.step()
        bar.update(1)
        rec = {"step": step, "train_loss": loss.item(), "valid_loss": float("nan")}
        if step % eval_every == 0 or step == len(batches):
            vl = valid_loss()
            rec["valid_loss"] = vl
            if vl < best[0]:
                best = (vl, snapshot(), step)
        history.append(rec)
    bar.close()
    for p in params.values():
        p.requires_grad_(False)
    return TrainResult(best[1], history, best[2], time.perf_counter() - t0)


def count_params(params: dict[str, Tensor]) -> int:
    return int(sum(p.numel() for p in params.values()))
