"""LoRA on the attention projections, as hooks (the model's weights are never touched).

For each layer and target t ∈ {q, k, v}: ``t ← t + s · (x A_t) B_t`` with ``x`` the attention input
(``blocks.{l}.ln1.hook_normalized``, or ``hook_resid_pre`` for a model without ln1),
``A_t: [d_model, r]`` (Kaiming-uniform), ``B_t: [r, n_heads_t · d_head]`` (zeros) and
``s = alpha / r``. The low-rank term acts at every position of every forward pass (decode steps
included; the keys/values it changes are what the KV cache stores). Trained with SITE's loss on the
same train batches, best validation loss kept.

Learning rate: 1e-3 by default. At 5e-3 (the default until the SmolLM2 benchmark) the validation
loss rose above the untrained adapter's within 10 steps on SmolLM2-135M (capitalize: 6.05 at step 0,
8.58 at step 10), so the best-validation checkpoint was the untrained adapter; at 1e-3 it was 0.32.
Pass a tuple (``LoRA(lr=(3e-4, 1e-3, 5e-3))``) to train once per rate and keep the run with the
lowest validation loss.

Trainable parameters: ``n_layers · Σ_t r · (d_model + n_heads_t · d_head)`` (``n_heads_t`` is
``n_key_value_heads`` for k and v on grouped-query models).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from sitelens.baselines.base import FitParts, Hook, TrainedMethod
from sitelens.models import act_name, position_wise
from sitelens.tasks import Task, Template

TARGETS = ("q", "k", "v")


def heads_of(model, target: str) -> int:
    """Heads seen by ``hook_{target}``: ``n_heads`` for q, ``n_key_value_heads`` for k/v (GQA)."""
    c = model.cfg
    ungrouped = getattr(c, "ungroup_grouped_query_attention", False)  # not on a bridge config
    if target == "q" or c.n_key_value_heads is None or ungrouped:
        return c.n_heads
    return c.n_key_value_heads


def input_hook_name(model, layer: int) -> str:
    name = act_name("ln1.normalized", layer)
    return name if name in model.hook_dict else act_name("resid_pre", layer)


def init_lora(
    model, rank: int = 8, targets: Sequence[str] = ("q", "v"), seed: int = 0
) -> dict[str, Tensor]:
    """``{"A_{t}": [n_layers, d_model, r], "B_{t}": [n_layers, r, n_heads_t·d_head]}`` with A
    Kaiming-uniform (as PEFT) and B zero: the update starts at exactly zero."""
    c = model.cfg
    gen = torch.Generator().manual_seed(seed)
    bound = 1.0 / math.sqrt(c.d_model)  # kaiming_uniform(a=√5) on a [r, d_model] weight
    params = {}
    for t in targets:
        if t not in TARGETS:
            raise ValueError(f"LoRA targets must be among {TARGETS}, got {t!r}")
        n_out = heads_of(model, t) * c.d_head
        params[f"A_{t}"] = (torch.rand(c.n_layers, c.d_model, rank, generator=gen) * 2 - 1) * bound
        params[f"B_{t}"] = torch.zeros(c.n_layers, rank, n_out)
    return params


def lora_hooks(model, params: dict[str, Tensor], scaling: float) -> list[Hook]:
    """Hooks adding the low-rank terms at every position (no prefill guard)."""
    targets = [k[2:] for k in params if k.startswith("A_")]
    hooks = []
    for layer in range(model.cfg.n_layers):
        store: dict[str, Tensor] = {}

        @position_wise  # shares ``store`` with the hook_q/k/v hooks below
        def grab(x, hook=None, store=store):
            store["x"] = x  # [batch, pos, d_model]
            return x

        hooks.append((input_hook_name(model, layer), grab))
        for t in targets:

            @position_wise
            def add(y, hook=None, store=store, t=t, layer=layer):
                A = params[f"A_{t}"][layer].to(y.device, y.dtype)  # [d_model, r]
                B = params[f"B_{t}"][layer].to(y.device, y.dtype)  # [r, n_heads_t * d_head]
                delta = (store["x"].to(y.dtype) @ A) @ B  # [batch, pos, n_heads_t * d_head]
                return y + scaling * delta.view(y.shape)  # [batch, pos, n_heads_t, d_head]

            hooks.append((act_name(t, layer), add))
    return hooks


@dataclass(kw_only=True)
class LoRA(TrainedMethod):
    """LoRA of ``rank`` on the ``targets`` projections, scaled by ``alpha / rank``; ``lr`` may
    be a tuple (one run each, the lowest validation loss kept)."""

    name: str = "lora"
    rank: int = 8
    alpha: float = 16.0
    targets: tuple[str, ...] = ("q", "v")
    lr: float | tuple[float, ...] = 1e-3

    def _fit(self, model, task: Task, seed: int, template: Template, progress: bool) -> FitParts:
        scaling = self.alpha / self.rank
        params = init_lora(model, self.rank, self.targets, seed)
        return self._train_hooks(
            model, task, params, lambda m, p: lora_hooks(m, p, scaling), seed=seed,
            template=template, progress=progress, state={"scaling": scaling},
            meta={"rank": self.rank, "targets": list(self.targets)},
        )
