"""Implicit in-context learning (I2CL, Li et al.): per-layer context vectors from the attention
and MLP outputs of demonstrations, injected at every token with two learned scalars per layer and
module.

1. context vectors: each of ``n_demos`` demonstrations (``template.shot`` text, trailing
   whitespace stripped) is run alone; ``blocks.{l}.hook_attn_out`` and ``hook_mlp_out`` at its
   last token are averaged over demonstrations       -> v_attn, v_mlp [n_layers, d_model]
2. injection at every position of every forward pass (decode steps included):
   ``out ← β[l, m] · out + λ[l, m] · v_m[l]`` for m ∈ {attn, mlp}; λ starts at ``lam_init``,
   β at ``beta_init``.
3. λ, β trained with SITE's loss (first-answer-token cross-entropy, same train batches), best
   validation loss kept.

Trainable parameters: ``4 · n_layers`` (λ and β per layer and module).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor

from sitelens.baselines.base import FitParts, Hook, TrainedMethod
from sitelens.models import act_name
from sitelens.site import capture_last
from sitelens.tasks import DEFAULT_TEMPLATE, Task, Template

MODULES = ("attn", "mlp")


def i2cl_hook_names(layer: int) -> tuple[str, str]:
    return act_name("attn_out", layer), act_name("mlp_out", layer)


def context_vectors(
    model, task: Task, *, n_demos: int = 10, seed: int = 0, template: Template = DEFAULT_TEMPLATE
) -> Float[Tensor, "2 n_layers d_model"]:
    """``[v_attn, v_mlp]``: mean attention / MLP outputs at the last token of demonstrations."""
    demos = random.Random(seed).sample(list(task.train), min(n_demos, len(task.train)))
    texts = [template.format_shot(d).rstrip() for d in demos]
    L = model.cfg.n_layers
    names = [i2cl_hook_names(layer) for layer in range(L)]
    acts = capture_last(model, texts, [n for pair in names for n in pair])
    return torch.stack([
        torch.stack([acts[names[layer][m]].mean(0) for layer in range(L)]) for m in range(2)
    ])  # [2, n_layers, d_model]


def init_i2cl(model, lam_init: float = 0.1, beta_init: float = 1.0) -> dict[str, Tensor]:
    """``lam`` and ``beta``: ``[n_layers, 2]`` each (column 0 attention, 1 MLP)."""
    L = model.cfg.n_layers
    return {
        "lam": torch.full((L, 2), float(lam_init)),  # [n_layers, 2]
        "beta": torch.full((L, 2), float(beta_init)),  # [n_layers, 2]
    }


def i2cl_hooks(model, vectors: Tensor, params: dict[str, Tensor]) -> list[Hook]:
    """Hooks injecting ``β · out + λ · v`` at every position (no prefill guard)."""
    hooks = []
    vecs = vectors.to(model.cfg.device)
    for layer in range(model.cfg.n_layers):
        for m, name in enumerate(i2cl_hook_names(layer)):

            def fn(x, hook=None, layer=layer, m=m):
                lam = params["lam"][layer, m].to(x.device, x.dtype)
                beta = params["beta"][layer, m].to(x.device, x.dtype)
                return beta * x + lam * vecs[m, layer].to(x.device, x.dtype)  # [batch, pos, d_model]

            hooks.append((name, fn))
    return hooks


@dataclass(kw_only=True)
class I2CL(TrainedMethod):
    """I2CL: context vectors from ``n_demos`` demonstrations; λ starts at ``lam_init`` and β at
    ``beta_init``, both trained (:class:`~sitelens.baselines.base.TrainedMethod` fields)."""

    name: str = "i2cl"
    n_demos: int = 10
    lam_init: float = 0.1
    beta_init: float = 1.0
    lr: float = 0.01

    def _fit(self, model, task: Task, seed: int, template: Template, progress: bool) -> FitParts:
        vectors = context_vectors(model, task, n_demos=self.n_demos, seed=seed,
                                  template=template)  # [2, n_layers, d_model]
        params = init_i2cl(model, self.lam_init, self.beta_init)
        return self._train_hooks(
            model, task, params, lambda m, p: i2cl_hooks(m, vectors, p), seed=seed,
            template=template, progress=progress, state={"vectors": vectors},
            meta={"stored_numbers": vectors.numel()},
        )
