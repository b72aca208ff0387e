"""Lens ``dla``: what each head's injected write does to the answer logit, directly.

SITE changes head (l, h)'s last-token output by ``Δz = α[l, h] · (t[l, h] − z[l, h])`` (``z`` the
head's own value in the injected run, before the mix). The head writes ``Δz · W_O[l, h]`` into
the residual stream; its **direct logit attribution** follows that write straight to the answer
logit, through the final norm and the unembedding with every norm's scale frozen at its value in
the injected run (so the map is linear and the heads add up):

    dla[l, h] = mean over items of  (Δz · W_O[l, h]) ⊙ g_post / s_post · g_final / s_final · W_U[:, answer]

(``g`` a norm's weight, ``s`` its scale at the last token; ``g_post / s_post`` only on models that
normalize the attention output before the residual stream, like Gemma). Summed over heads this is
the total direct effect of the injection on the answer logit (tested). Logit soft-capping, where
a model has it, is not applied: the attribution is to the pre-cap logit.

:func:`head_logit_lens` shows what each head's injected vector *promotes*: ``t[l, h] · W_O[l, h]``
through the same norm weights and the unembedding (no item, no scale: a direction), and its
top tokens.
"""

from __future__ import annotations

import time

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from sitelens.errors import ModelError
from sitelens.lenses.scores import HeadScores
from sitelens.models import act_name, is_bridge, model_name, stacked_weight, z_hook_name
from sitelens.patching.engine import ForwardPassCounter
from sitelens.site import SiteAdapter
from sitelens.site.training import LastTokenSet
from sitelens.stats import bootstrap_ci
from sitelens.tasks import Task


def _weights(model) -> tuple[Tensor, Tensor]:
    """``W_O`` ``[n_layers, n_heads, d_head, d_model]`` and ``W_U`` ``[d_model, d_vocab]``."""
    if is_bridge(model):
        raise ModelError(
            "Direct logit attribution reads W_O, W_U and the norms of a HookedTransformer; load "
            "the model with backend='hooked' (sitelens.load_model(name, backend='hooked'))."
        )
    # stacked on the unembedding's device (model.W_O would fail on a model split over GPUs)
    return stacked_weight(model, "W_O"), model.W_U.detach()


def _norm_weight(norm) -> Tensor | float:
    w = getattr(norm, "w", None)
    return 1.0 if w is None else w.detach()  # [d_model] or 1 (folded into the next weights)


def _post_norm(model, layer: int):
    return getattr(model.blocks[layer], "ln1_post", None)


def _capture_injected(model, data: LastTokenSet, adapter: SiteAdapter
                      ) -> tuple[dict[int, Tensor], dict[str, Tensor]]:
    """One injected forward pass at the last token: each layer's ``z`` before the mix
    (``{layer: [n, n_heads, d_head]}``) and the norm scales (``{"final" | "post{l}": [n, 1]}``)."""
    z_pre: dict[int, Tensor] = {}
    scales: dict[str, Tensor] = {}

    def grab_z(layer: int, mix_fn):
        def fn(z, hook=None):
            z_pre[layer] = z[:, -1].detach().float()  # [n, n_heads, d_head]
            return mix_fn(z, hook)
        return fn

    def grab_scale(name: str):
        def fn(x, hook=None):
            scales[name] = x[:, -1].detach().float()  # [n, 1]
        return fn

    mix = adapter.mix()
    L = model.cfg.n_layers
    hooks = [(z_hook_name(model, layer), grab_z(layer, mix.hook_fn(layer))) for layer in range(L)]
    hooks.append((act_name("ln_final.scale"), grab_scale("final")))
    hooks += [(act_name("ln1_post.scale", layer), grab_scale(f"post{layer}"))
              for layer in range(L) if _post_norm(model, layer) is not None]
    with torch.no_grad():
        data.logits(model, hooks)
    return z_pre, scales


def direct_logit_attribution(
    model,
    task: Task,
    adapter: SiteAdapter,
    *,
    split: str = "test",
    limit: int | None = 64,
    n_boot: int = 1000,
    seed: int = 0,
    return_per_item: bool = False,
):
    """Lens ``dla`` (see the module docstring) over the zero-shot prompts of ``split`` (first
    ``limit`` items), with a percentile bootstrap CI over items. One forward pass per batch
    captures every layer's pre-mix ``z`` and the norm scales at the last token.
    ``return_per_item=True`` also returns the ``[n, n_layers, n_heads]`` values."""
    W_O, W_U = _weights(model)
    cfg, dev = model.cfg, W_U.device  # every per-layer piece is brought to the unembedding
    L = cfg.n_layers
    items = task.split(split)[:limit]
    alpha = adapter.alpha.detach().float().to(dev)  # [n_layers, n_heads]
    t = adapter.embedding.detach().float().to(dev)  # [n_layers, n_heads, d_head]
    t0 = time.perf_counter()
    with ForwardPassCounter(model) as passes:
        data = LastTokenSet.build(model, items, adapter.template)
        z_pre, scales = _capture_injected(model, data, adapter)
    ans_dir = W_U[:, data.answers.to(dev)].T.float()  # [n, d_model]
    g_final = _norm_weight(model.ln_final)
    scales = {k: v.to(dev) for k, v in scales.items()}
    per_item = []
    for layer in range(L):
        dz = alpha[layer, :, None] * (t[layer][None] - z_pre[layer].to(dev))  # [n, n_heads, d_head]
        write = torch.einsum("nhd,hdm->nhm", dz, W_O[layer].float())  # [n, n_heads, d_model]
        post = _post_norm(model, layer)
        if post is not None:
            g_post = _norm_weight(post)
            g_post = g_post.to(dev) if isinstance(g_post, Tensor) else g_post
            write = write * g_post / scales[f"post{layer}"][:, None]  # [n, n_heads, d_model]
        write = write * g_final / scales["final"][:, None]  # [n, n_heads, d_model]
        per_item.append((write * ans_dir[:, None]).sum(-1))  # [n, n_heads]
    per_item = torch.stack(per_item, 1).cpu()  # [n, n_layers, n_heads]
    lo, hi = bootstrap_ci(per_item.permute(1, 2, 0).numpy(), n_boot=n_boot, seed=seed)
    scores = HeadScores.from_map(
        per_item.mean(0), ci_low=lo, ci_high=hi, model=model_name(model), task=task.name,
        lens="dla", forward_passes=passes.count, backward_passes=0,
        seconds=time.perf_counter() - t0,
        meta={"split": split, "n_items": len(items), "what": "alpha*(t - z) write, frozen norms"},
    )
    return (scores, per_item) if return_per_item else scores


def head_write_logits(model, embedding: Float[Tensor, "n_layers n_heads d_head"]
                      ) -> Float[Tensor, "n_layers n_heads d_vocab"]:
    """Logits that each head's vector ``t[l, h] · W_O[l, h]`` writes directly, through the norm
    weights (not their scales) and the unembedding: a logit lens per head."""
    W_O, W_U = _weights(model)
    t = embedding.detach().float().to(W_U.device)  # [n_layers, n_heads, d_head]
    write = torch.einsum("lhd,lhdm->lhm", t, W_O.float())  # [n_layers, n_heads, d_model]
    for layer in range(model.cfg.n_layers):
        post = _post_norm(model, layer)
        if post is not None:
            g_post = _norm_weight(post)
            write[layer] = write[layer] * (g_post.to(W_U.device) if isinstance(g_post, Tensor)
                                           else g_post)
    write = write * _norm_weight(model.ln_final)  # [n_layers, n_heads, d_model]
    return write @ W_U.float()  # [n_layers, n_heads, d_vocab]


def head_logit_lens(model, embedding: Float[Tensor, "n_layers n_heads d_head"], *, k: int = 10
                    ) -> pd.DataFrame:
    """The ``k`` tokens each head's injected vector promotes most: one row per (layer, head,
    rank) with ``token_id, token, logit`` (centred: minus the mean over the vocabulary)."""
    logits = head_write_logits(model, embedding)  # [n_layers, n_heads, d_vocab]
    logits = logits - logits.mean(-1, keepdim=True)  # [n_layers, n_heads, d_vocab]
    vals, ids = logits.topk(k, dim=-1)  # [n_layers, n_heads, k]
    L, H = vals.shape[:2]
    rows = []
    for layer in range(L):
        for h in range(H):
            for r in range(k):
                tid = int(ids[layer, h, r])
                rows.append((layer, h, r, tid, model.tokenizer.decode([tid]), float(vals[layer, h, r])))
    return pd.DataFrame(rows, columns=["layer", "head", "rank", "token_id", "token", "logit"])


def dla_lens(x) -> HeadScores:
    """Lens ``dla`` of the registry, on its shared inputs
    (:class:`~sitelens.lenses.registry.LensInputs`; the adapter's α)."""
    return direct_logit_attribution(x.model, x.task, x.adapter, seed=x.attribution.seed)
