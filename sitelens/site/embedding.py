"""Stage 1 of SITE: the task embedding, read from few-shot prompts.

For each layer ``l`` and head ``h``, the task embedding is the mean of the head's output before
``W_O`` (``blocks.{l}.attn.hook_z``) at the last token of ``n_prompts`` few-shot prompts p_1..p_N
built from the train split:

    t[l, h] = (1 / N) · Σ_i z_i[l, h, -1]                          -> [n_layers, n_heads, d_head]

:func:`capture_last` is the one capture primitive (any hooks, the last position only, float32 on
the CPU); :func:`last_token_z` reads every layer's ``hook_z`` with it; :func:`task_embedding`
builds the prompts and averages. The mean is taken in float32, so a bfloat16 model's activations
are never summed in bfloat16. Stage 2 lives in :mod:`sitelens.site.alpha`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from jaxtyping import Float
from torch import Tensor

from sitelens.format import progress_bar
from sitelens.models import check_z_shape, encode, forward_until, length_batches, z_hook_name
from sitelens.tasks import DEFAULT_TEMPLATE, Task, Template, embedding_prompts


def capture_last(
    model, prompts: Sequence[str], hook_names: Sequence[str], *, batch_size: int = 8,
    progress: bool = False, desc: str = "last-token activations",
) -> dict[str, Tensor]:
    """The value of each hook at the last prompt token: ``{name: [n_prompts, ...]}`` (float32,
    CPU, in the order of ``prompts``). Prompts of similar length share a batch; each pass ends as
    soon as every hook has fired (:func:`~sitelens.models.forward_until`), and only the last
    position of each hooked tensor is kept, converted to float32 where the hook fired (on its
    layer's device; a bfloat16 model's activations are never summed in bfloat16) and copied to
    the CPU once per hook, after the last batch. ``progress``: a bar over the prompts, named
    ``desc`` (:func:`sitelens.format.progress_bar`)."""
    prompts = list(prompts)
    batches = length_batches(model, prompts, batch_size)  # similar lengths, bounded memory
    order = [i for idx in batches for i in idx]
    parts: dict[str, list[Tensor]] = {n: [] for n in hook_names}
    bar = progress_bar(total=len(prompts), desc=desc, enabled=progress)
    for idx in batches:
        enc = encode(model, [prompts[i] for i in idx])
        buf: dict[str, Tensor] = {}

        def grabber(name: str, buf=buf) -> Callable:
            # keyed by the requested name: on a TransformerBridge ``hook.name`` is the canonical
            # name behind an alias such as ``blocks.{l}.hook_resid_post``
            def grab(x, hook=None):
                # a copy: x[:, -1] of a float32 x is a view, and .float() of float32 returns it as
                # is, so keeping it would keep every position of the batch alive until the end
                # (gigabytes over a pooled sweep's prompts, tests/test_embedding_memory.py)
                buf[name] = x[:, -1].detach().to(torch.float32, copy=True)  # [batch, ...]

            return grab

        with torch.no_grad():
            forward_until(model, [(n, grabber(n)) for n in hook_names], enc.tokens,
                          attention_mask=enc.attention_mask)
        for n in hook_names:
            parts[n].append(buf[n])
        bar.update(len(idx))
    bar.close()
    inverse = torch.empty(len(order), dtype=torch.long)
    inverse[torch.tensor(order)] = torch.arange(len(order))
    return {n: torch.cat(parts[n]).cpu()[inverse] for n in hook_names}


def last_token_z(
    model, prompts: list[str], *, batch_size: int = 8, reduce: str = "mean",
    progress: bool = False, desc: str = "last-token hook_z",
) -> Float[Tensor, "... n_layers n_heads d_head"]:
    """``hook_z`` of every layer at the last prompt token (:func:`capture_last`; each pass stops
    right after the last layer's ``hook_z``). ``reduce="mean"`` averages over prompts;
    ``"none"`` returns ``[n_prompts, n_layers, n_heads, d_head]``. ``progress``: a bar named
    ``desc`` over the prompts."""
    cfg = model.cfg
    names = [z_hook_name(model, layer) for layer in range(cfg.n_layers)]
    acts = capture_last(model, prompts, names, batch_size=batch_size, progress=progress,
                        desc=desc)  # {name: [n, H, d_head]}
    for name in names:
        check_z_shape(acts[name][:, None], cfg.n_heads, cfg.d_head, name)
    z = torch.stack([acts[n] for n in names], dim=1)  # [n_prompts, n_layers, n_heads, d_head]
    return z.mean(0) if reduce == "mean" else z


def task_embedding(
    model,
    task: Task,
    *,
    n_prompts: int = 50,
    n_shots: int = 10,
    batch_size: int = 8,
    seed: int = 0,
    template: Template = DEFAULT_TEMPLATE,
    progress: bool = False,
) -> Float[Tensor, "n_layers n_heads d_head"]:
    """Stage 1: the mean last-token ``hook_z`` over ``n_prompts`` ``n_shots``-shot prompts built
    from the train split. ``progress``: a bar ``task embedding [task]`` over the prompts."""
    prompts = embedding_prompts(task, n_prompts, n_shots, seed=seed, template=template, model=model)
    return last_token_z(model, prompts, batch_size=batch_size, progress=progress,
                        desc=f"task embedding [{task.name}]")  # [n_layers, n_heads, d_head]
