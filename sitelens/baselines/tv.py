"""Task vectors (Hendel et al.): the mean residual-stream state at layer ℓ of the last token of
few-shot prompts replaces the zero-shot last-token state at ℓ.

Intervention: ``blocks.{ℓ}.hook_resid_pre[:, -1] ← tv[ℓ]`` (the state entering block ℓ), prefill
only; ℓ has the best validation first-token accuracy. Exactly one state is replaced.
Trainable parameters: 0 (a mean and a layer); ``d_model`` stored numbers.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor

from sitelens.baselines.base import (
    Fitted,
    HookIntervention,
    Method,
    acts_now,
    capture_last,
    resid_hook_name,
    select_layer,
    valid_items,
)
from sitelens.tasks import DEFAULT_TEMPLATE, Task, Template, embedding_prompts


def last_replace_hook(state: Float[Tensor, " d_model"], seq_len: int | None) -> Callable:
    """A hook replacing the last position's state with ``state`` (prefill only)."""

    def fn(x: Float[Tensor, "batch pos d_model"], hook=None):
        if not acts_now(x, seq_len):
            return x
        x = x.clone()
        x[:, -1] = state.to(x.dtype)  # [batch, d_model]
        return x

    return fn


def tv_intervention(state: Tensor, layer: int) -> HookIntervention:
    name = resid_hook_name(layer, "resid_pre")
    return HookIntervention(lambda model, seq_len: [(name, last_replace_hook(state, seq_len))])


def task_vectors(
    model, task: Task, *, n_prompts: int = 50, n_shots: int = 10, seed: int = 0,
    template: Template = DEFAULT_TEMPLATE,
) -> Float[Tensor, "n_layers d_model"]:
    """Mean ``hook_resid_pre`` of every layer at the last token of few-shot prompts."""
    prompts = embedding_prompts(task, n_prompts, n_shots, seed=seed, template=template)
    names = [resid_hook_name(layer) for layer in range(model.cfg.n_layers)]
    acts = capture_last(model, prompts, names)  # {name: [n_prompts, d_model]}
    return torch.stack([acts[n].mean(0) for n in names])  # [n_layers, d_model]


@dataclass(kw_only=True)
class TV(Method):
    name: str = "tv"
    n_prompts: int = 50
    n_shots: int = 10
    layers: Sequence[int] | None = None  # candidate layers (None: all)
    n_valid: int = 64

    def fit(
        self,
        model,
        task: Task,
        *,
        seed: int = 0,
        template: Template = DEFAULT_TEMPLATE,
        progress: bool = False,
    ) -> Fitted:
        t0 = time.perf_counter()
        states = task_vectors(
            model, task, n_prompts=self.n_prompts, n_shots=self.n_shots, seed=seed,
            template=template,
        ).to(model.cfg.device)  # [n_layers, d_model]
        layers = list(self.layers) if self.layers is not None else list(range(model.cfg.n_layers))
        layer, table = select_layer(
            model, valid_items(task, self.n_valid),
            lambda lay: tv_intervention(states[lay], lay)(model, None),
            layers, template=template,
        )
        return Fitted(
            self.name,
            intervention=tv_intervention(states[layer], layer),
            n_params=0,
            fit_seconds=time.perf_counter() - t0,
            state={"vector": states[layer], "layer": layer, "all_layers": states},
            meta={"stored_numbers": model.cfg.d_model, "layer_table": table},
        )
