"""Function vectors (Todd et al.): the summed mean outputs of the top causal heads, added to the
residual stream at the last prompt token.

1. head outputs: on few-shot prompts (SITE's stage-1 prompts), ``hook_z`` at the last token; its mean
   is SITE's task embedding ``mean_z``, and each head's mean write into the residual stream is
   ``out[l, h] = mean over prompts of z[l, h] @ W_O[l, h]``. Where the block normalizes the attention
   output before adding it to the residual stream (Gemma 2/3's ``ln1_post``), the write passes
   through that norm at the prompt's own scale: ``g ⊙ (z W_O) / rms(attn_out)``, so that the heads of
   a layer sum to its ``hook_attn_out`` (less ``b_O``).                     -> [n_layers, n_heads, d_model]
2. causal effects ``[n_layers, n_heads]``: :func:`sitelens.patching.head_causal_effects` with the
   mean z of step 1 (``n_effect_prompts`` corrupted prompts), or precomputed (``FV(effects=...)``).
3. FV = Σ over the top ``k`` heads of ``out[l, h]``                                  -> [d_model]
4. intervention: ``blocks.{ℓ}.hook_resid_pre`` (or ``resid_post``) += FV at the last prompt token,
   prefill only; ℓ has the best validation first-token accuracy.

Trainable parameters: 0 (a mean, k head choices and a layer); ``d_model`` stored numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor

from sitelens.baselines.base import (
    FitParts,
    HookIntervention,
    Method,
    last_add_hook,
    resid_hook_name,
    select_layer,
)
from sitelens.models import act_name, check_z_shape, layer_devices, stacked_weight, z_hook_name
from sitelens.patching import head_causal_effects
from sitelens.site import capture_last
from sitelens.site.training import valid_items
from sitelens.tasks import Task, Template, embedding_prompts


def _causal_effects(
    model, task: Task, mean_z: Float[Tensor, "n_layers n_heads d_head"], *, n_prompts: int,
    n_shots: int, seed: int, template: Template,
) -> Float[Tensor, "n_layers n_heads"]:
    """:func:`sitelens.patching.head_causal_effects` with our mean z, prompt count, shots, seed
    and template (float32, CPU)."""
    effects = head_causal_effects(model, task, n_prompts=n_prompts, n_shots=n_shots, seed=seed,
                                  template=template, embedding=mean_z)  # [n_layers, n_heads]
    return torch.as_tensor(effects, dtype=torch.float32).cpu()


def _post_attn_scale_name(layer: int) -> str:
    """The hook of block ``layer``'s post-attention norm scale (its per-position RMS)."""
    return act_name("ln1_post.scale", layer)


def _post_attn_norm_gain(model, layer: int) -> Tensor | None:
    """The per-dimension gain ``g`` of block ``layer``'s post-attention RMS norm (``ln1_post``), or
    None when the block adds the attention output unnormalized. Read by probing the norm module
    with a constant vector (``norm(c·1) = g·c / sqrt(c² + eps) ≈ g``), which holds whatever the
    parameterization (TransformerLens's ``w``, Hugging Face Gemma's ``1 + weight``)."""
    if _post_attn_scale_name(layer) not in model.hook_dict:
        return None
    norm = model.blocks[layer].ln1_post
    dev = layer_devices(model)[layer]  # the norm's own device (a model split over GPUs)
    probe = torch.full((1, 1, model.cfg.d_model), 1e3, device=dev)  # [1, 1, d_model]
    with torch.no_grad():
        return norm(probe)[0, 0].float().cpu()  # [d_model]


def head_outputs(
    model,
    prompts: Sequence[str],
    *,
    batch_size: int = 8,
) -> tuple[Float[Tensor, "n_layers n_heads d_head"], Float[Tensor, "n_layers n_heads d_model"]]:
    """``(mean_z, out)`` over ``prompts`` at the last token, in one forward pass per batch:
    ``mean_z`` is the mean ``hook_z`` (SITE's task embedding) and ``out[l, h]`` the mean of what
    head ``(l, h)`` writes into the residual stream — ``z @ W_O``, through the block's
    post-attention norm at each prompt's own scale where the block has one (module docstring)."""
    cfg = model.cfg
    L, H = cfg.n_layers, cfg.n_heads
    z_names = [z_hook_name(model, layer) for layer in range(L)]
    gains = [_post_attn_norm_gain(model, layer) for layer in range(L)]
    s_names = [_post_attn_scale_name(layer) for layer in range(L) if gains[layer] is not None]
    acts = capture_last(model, prompts, z_names + s_names, batch_size=batch_size)
    for name in z_names:
        check_z_shape(acts[name][:, None], H, cfg.d_head, name)
    z = torch.stack([acts[n] for n in z_names], dim=1)  # [n_prompts, n_layers, n_heads, d_head]
    W_O = stacked_weight(model, "W_O", torch.device("cpu")).float()  # [L, n_heads, d_head, d_model]
    out = torch.einsum("nlhd,lhdm->nlhm", z, W_O)  # [n_prompts, n_layers, n_heads, d_model]
    for layer, g in enumerate(gains):
        if g is not None:
            scale = acts[_post_attn_scale_name(layer)].reshape(-1, 1, 1)  # [n, 1, 1]
            out[:, layer] = out[:, layer] / scale * g  # [n_prompts, n_heads, d_model]
    return z.mean(0), out.mean(0)


def function_vector(
    outputs: Float[Tensor, "n_layers n_heads d_model"],
    heads: Sequence[tuple[int, int]],
) -> Float[Tensor, " d_model"]:
    """Σ over ``heads`` of the heads' mean residual-stream outputs (:func:`head_outputs`)."""
    vec = torch.zeros(outputs.shape[-1], dtype=outputs.dtype)  # [d_model]
    for layer, head in heads:
        vec = vec + outputs[layer, head]  # [d_model]
    return vec


def fv_intervention(vector: Tensor, layer: int, point: str = "resid_pre") -> HookIntervention:
    """Add ``vector`` to ``blocks.{layer}.hook_{point}`` at the last prompt token (prefill)."""
    name = resid_hook_name(layer, point)
    return HookIntervention(lambda model, seq_len: [(name, last_add_hook(vector, seq_len))])


@dataclass(kw_only=True)
class FV(Method):
    name: str = "fv"
    k: int = 10  # heads summed into the vector
    n_prompts: int = 50  # clean few-shot prompts for the mean z
    n_shots: int = 10
    n_effect_prompts: int = 16  # corrupted prompts for the causal effects
    effects: Tensor | None = None  # precomputed [n_layers, n_heads] causal effects
    layers: Sequence[int] | None = None  # candidate layers (None: all)
    point: str = "resid_pre"
    n_valid: int = 64

    def _fit(self, model, task: Task, seed: int, template: Template, progress: bool) -> FitParts:
        cfg = model.cfg
        prompts = embedding_prompts(task, self.n_prompts, self.n_shots, seed=seed,
                                    template=template, model=model)
        mean_z, outputs = head_outputs(model, prompts)  # [L, H, d_head], [L, H, d_model]
        if self.effects is not None:
            effects, source = torch.as_tensor(self.effects).float().cpu(), "given"
        else:
            effects = _causal_effects(
                model, task, mean_z, n_prompts=self.n_effect_prompts, n_shots=self.n_shots,
                seed=seed, template=template,
            )
            source = "sitelens.patching"
        if tuple(effects.shape) != (cfg.n_layers, cfg.n_heads):
            raise ValueError(
                f"causal effects must be [n_layers, n_heads] = [{cfg.n_layers}, {cfg.n_heads}], "
                f"got {list(effects.shape)}"
            )
        k = min(self.k, effects.numel())
        top = torch.argsort(effects.flatten(), descending=True, stable=True)[:k]
        heads = [(int(i) // cfg.n_heads, int(i) % cfg.n_heads) for i in top]
        vector = function_vector(outputs, heads).to(cfg.device)  # [d_model]
        layers = list(self.layers) if self.layers is not None else list(range(cfg.n_layers))
        layer, table = select_layer(
            model, valid_items(task, self.n_valid),
            lambda lay: fv_intervention(vector, lay, self.point)(model, None),
            layers, template=template,
        )
        return FitParts(
            intervention=fv_intervention(vector, layer, self.point),
            n_params=0,
            state={"vector": vector, "layer": layer, "heads": heads, "effects": effects,
                   "mean_z": mean_z, "head_outputs": outputs},
            meta={"stored_numbers": cfg.d_model, "effects_source": source,
                  "layer_table": table, "point": self.point},
        )
