"""(IA)3 (Liu et al.): learned rescaling of keys, values and MLP activations, as hooks.

``hook_k ← k ⊙ l_k[l]``, ``hook_v ← v ⊙ l_v[l]`` (``[n_kv_heads, d_head]`` per layer, before the
rotary embedding, as on ``k_proj``/``v_proj`` outputs) and ``mlp.hook_post ← a ⊙ l_ff[l]``
(``[d_mlp]``), all initialised to one (the model unchanged), at every position of every forward
pass (decode steps included). Trained with SITE's loss on the same train batches, best validation
loss kept.

Trainable parameters: ``n_layers · (2 · n_kv_heads · d_head + d_mlp)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from sitelens.baselines.base import FitParts, Hook, TrainedMethod
from sitelens.baselines.lora import heads_of
from sitelens.models import act_name
from sitelens.tasks import Task, Template


def init_ia3(model) -> dict[str, Tensor]:
    """``{"k": [L, n_kv, d_head], "v": [L, n_kv, d_head], "ff": [L, d_mlp]}``, all ones."""
    c = model.cfg
    return {
        "k": torch.ones(c.n_layers, heads_of(model, "k"), c.d_head),
        "v": torch.ones(c.n_layers, heads_of(model, "v"), c.d_head),
        "ff": torch.ones(c.n_layers, c.d_mlp),
    }


def ia3_hooks(model, params: dict[str, Tensor]) -> list[Hook]:
    """Hooks rescaling k, v and the MLP activations at every position (no prefill guard)."""
    hooks = []
    for layer in range(model.cfg.n_layers):
        for key, name in (("k", act_name("k", layer)),
                          ("v", act_name("v", layer)),
                          ("ff", act_name("mlp_post", layer))):

            def fn(x, hook=None, key=key, layer=layer):
                return x * params[key][layer].to(x.device, x.dtype)  # broadcast over batch, pos

            hooks.append((name, fn))
    return hooks


@dataclass(kw_only=True)
class IA3(TrainedMethod):
    """(IA)3: unit scales on k, v and the MLP activations, trained like every
    :class:`~sitelens.baselines.base.TrainedMethod` (``lr``, ``n_examples``, ...)."""

    name: str = "ia3"
    lr: float = 0.01

    def _fit(self, model, task: Task, seed: int, template: Template, progress: bool) -> FitParts:
        if model.cfg.d_mlp is None or model.cfg.attn_only:
            raise ValueError("(IA)3 needs a model with MLP blocks.")
        params = init_ia3(model)
        return self._train_hooks(
            model, task, params, ia3_hooks, seed=seed, template=template,
            progress=progress,
        )
