"""Task vectors (Hendel et al.): the mean residual-stream state at layer ℓ of the last token of
few-shot prompts replaces the zero-shot last-token state at ℓ.

Intervention: ``blocks.{ℓ}.hook_resid_pre[:, -1] ← tv[ℓ]`` (the state entering block ℓ), prefill
only; ℓ has the best validation first-token accuracy. Exactly one state is replaced.
Trainable parameters: 0 (a mean and a layer); ``d_model`` stored numbers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor

from sitelens.baselines.base import FitParts, HookIntervention, Method, last_token_hook, select_layer
from sitelens.models import act_name
from sitelens.site import capture_last
from sitelens.site.training import valid_items
from sitelens.tasks import DEFAULT_TEMPLATE, Task, Template, embedding_prompts


def last_replace_hook(state: Float[Tensor, " d_model"], seq_len: int | None) -> Callable:
    """A hook replacing the last position's state with ``state`` (prefill only)."""
    return last_token_hook(lambda h: state.to(h.dtype), seq_len)  # broadcast over the batch


def tv_intervention(state: Tensor, layer: int) -> HookIntervention:
    name = act_name("resid_pre", layer)
    return HookIntervention(lambda model, seq_len: [(name, last_replace_hook(state, seq_len))])


def task_vectors(
    model, task: Task, *, n_prompts: int = 50, n_shots: int = 10, seed: int = 0,
    template: Template = DEFAULT_TEMPLATE,
) -> Float[Tensor, "n_layers d_model"]:
    """Mean ``hook_resid_pre`` of every layer at the last token of few-shot prompts."""
    prompts = embedding_prompts(task, n_prompts, n_shots, seed=seed, template=template, model=model)
    names = [act_name("resid_pre", layer) for layer in range(model.cfg.n_layers)]
    acts = capture_last(model, prompts, names)  # {name: [n_prompts, d_model]}
    return torch.stack([acts[n].mean(0) for n in names])  # [n_layers, d_model]


@dataclass(kw_only=True)
class TV(Method):
    name: str = "tv"
    n_prompts: int = 50
    n_shots: int = 10
    layers: Sequence[int] | None = None  # candidate layers (None: all)
    n_valid: int = 64

    def _fit(self, model, task: Task, seed: int, template: Template, progress: bool) -> FitParts:
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
        return FitParts(
            intervention=tv_intervention(states[layer], layer),
            n_params=0,
            state={"vector": states[layer], "layer": layer, "all_layers": states},
            meta={"stored_numbers": model.cfg.d_model, "layer_table": table},
        )
