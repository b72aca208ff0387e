"""The patching engine: many (item, head-mix) rows on one frozen prefix KV cache.

Every intervention of :mod:`sitelens.patching` and :mod:`sitelens.lenses` acts at the last prompt
token only, so each prompt's prefix is encoded once into a frozen KV cache
(:func:`prefix_rows`) and only the last token is re-run per condition; many conditions share one
forward pass through per-row :class:`~sitelens.site.HeadMix` weights ``[rows, n_layers, n_heads]``
(:func:`run_rows`). Intra/inter-task patching, the per-head causal effects and every lens build on
these, as TransformerLens builds its patching variants on one ``generic_activation_patch``.
:class:`ForwardPassCounter` counts the model calls that a result reports as its cost,
:class:`RowCounter` the (prompt, condition) rows those calls ran.
"""

from __future__ import annotations

import time

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from sitelens.eval.generation import last_logits
from sitelens.format import progress_bar
from sitelens.models import (
    SELECT_BUDGET_BYTES,
    cache_rows_per_batch,
    encode,
    last_token_forward,
    memory_budget,
    place_layer_rows,
    prefix_cache,
    select_cache,
)
from sitelens.site.injection import HeadMix, apply_hooks
from sitelens.site.training import LastTokenSet


def prefix_rows(model, prompts: list[str], answers: list[int], *, batch_size: int = 64):
    data = LastTokenSet.from_prompts(model, prompts, answers, batch_size=batch_size)
    return data.cache, data.last, data.answers  # last: [n, 1], answers: [n]


def run_rows(
    model,
    cache,
    last: Int[Tensor, "n 1"],
    answers: Int[Tensor, " n"],
    item_idx: Int[Tensor, " rows"],
    cond_idx: Int[Tensor, " rows"],
    cond_weights: Float[Tensor, "n_cond n_layers n_heads"],
    targets: Float[Tensor, "... n_layers n_heads d_head"],
    *,
    batch_size: int = 128,
    progress: bool = False,
    desc: str = "patched rows",
) -> tuple[Bool[Tensor, " rows"], Float[Tensor, " rows"]]:
    """Row ``r`` runs item ``item_idx[r]``'s last token with the mix ``cond_weights[cond_idx[r]]``
    toward ``targets`` (shared ``[L, H, d_head]`` or per condition ``[n_cond, L, H, d_head]``).
    Returns per row: is the argmax the answer's first token, and that token's probability (float32,
    CPU; read back once, after the last batch). ``progress``: a bar over the rows named ``desc``."""
    dev = model.cfg.device
    correct: list[Tensor] = []  # per batch [b], on the logits' device
    prob: list[Tensor] = []  # per batch [b]
    cond_weights = cond_weights.to(dev)
    per_cond_targets = targets.dim() == 4
    if per_cond_targets:
        targets = targets.to(dev)  # [n_cond, n_layers, n_heads, d_head]
    else:
        targets = place_layer_rows(targets, model)  # L × [n_heads, d_head], on their layers
    batch_size = cache_rows_per_batch(  # bounded copy of long prefixes: 1 GiB on the CPU
        cache, batch_size, budget_bytes=memory_budget(model, SELECT_BUDGET_BYTES))
    bar = progress_bar(total=len(item_idx), desc=desc, enabled=progress)
    for s in range(0, len(item_idx), batch_size):
        items = item_idx[s : s + batch_size]
        conds = cond_idx[s : s + batch_size].to(dev)
        w = cond_weights[conds]  # [b, n_layers, n_heads]
        t = targets[conds] if per_cond_targets else targets  # [(b,) n_layers, n_heads, d_head]
        mix = HeadMix(weights=w, targets=t, positions=(-1,))
        sub = select_cache(cache, items)
        with torch.no_grad(), apply_hooks(model, mix.hooks(model)):
            logits = last_token_forward(model, sub, last[items])[:, -1].float()  # [b, d_vocab]
        RowCounter.ran(model, logits.shape[0])
        ans = answers[items.to(answers.device)].to(logits.device)  # [b]
        logp = torch.log_softmax(logits, dim=-1).gather(1, ans[:, None])[:, 0]  # [b]
        correct.append(logits.argmax(-1) == ans)
        prob.append(logp.exp())
        bar.update(len(items))
    bar.close()
    return torch.cat(correct).cpu(), torch.cat(prob).float().cpu()


def row_grid(n_cond: int, n_items: int) -> tuple[Tensor, Tensor]:
    """Condition-major rows: (cond 0, item 0..n-1), (cond 1, item 0..n-1), ..."""
    cond = torch.arange(n_cond).repeat_interleave(n_items)  # [n_cond * n_items]
    item = torch.arange(n_items).repeat(n_cond)  # [n_cond * n_items]
    return item, cond


def patched_last_logits(
    model,
    prompts: list[str],
    weights: Float[Tensor, "... n_layers n_heads"] | None = None,
    targets: Float[Tensor, "... n_layers n_heads d_head"] | None = None,
    *,
    use_cache: bool = True,
) -> Float[Tensor, "batch d_vocab"]:
    """Logits at the last prompt position with ``z[:, -1, h] ← (1 − w)·z + w·t`` at every head.

    ``weights`` is ``[n_layers, n_heads]`` (all prompts) or ``[batch, n_layers, n_heads]`` (one row
    per prompt); ``None`` runs the model unpatched. ``use_cache=True`` runs only the last token on a
    frozen prefix KV cache (what the experiments use); ``False`` runs the full prompt."""
    dev = model.cfg.device
    mix = None
    if weights is not None:
        if targets is None:
            raise ValueError("patched_last_logits: weights need targets.")
        mix = HeadMix(weights=weights.to(dev), targets=targets.to(dev), positions=(-1,))
        if weights.dim() == 2 and targets.dim() == 3:
            mix = mix.placed(model)  # one row per layer, on that layer's device
    enc = encode(model, prompts)
    if not use_cache:
        return last_logits(model, enc, mix).cpu()  # [batch, d_vocab]
    cache, last = prefix_cache(model, enc)
    hooks = mix.hooks(model) if mix is not None else []
    with torch.no_grad(), apply_hooks(model, hooks):
        return last_token_forward(model, cache, last)[:, -1].float().cpu()  # [batch, d_vocab]



class ForwardPassCounter:
    """Counts the calls of ``model`` (a forward pre-hook on it: every ``model(...)``, including
    passes that stop early, e.g. :func:`sitelens.models.forward_until`) and the passes that run its
    blocks one by one and say so (:meth:`ran`), and times the block. ``.count`` and ``.seconds``
    are set on exit."""

    _open: list[ForwardPassCounter] = []  # the open counters, of every model

    def __init__(self, model):
        self.model, self.count, self.seconds = model, 0, 0.0

    @classmethod
    def ran(cls, model, n_passes: int = 1) -> None:
        """Add ``n_passes`` passes that ran ``model``'s blocks without calling ``model`` (e.g.
        greedy's waves, :mod:`sitelens.lenses.greedy_rows`) to every open counter of ``model``."""
        for c in cls._open:
            if c.model is model:
                c.count += int(n_passes)

    def _pre(self, module, args) -> None:
        self.count += 1

    def __enter__(self):
        self._handle = self.model.register_forward_pre_hook(self._pre)
        ForwardPassCounter._open.append(self)
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.seconds = time.perf_counter() - self._t0
        self._handle.remove()
        ForwardPassCounter._open.remove(self)


class RowCounter:
    """Counts the (prompt, condition) rows run through ``model`` while the block is open: each
    single-token row of :func:`run_rows`'s last-token passes, and each whole-prompt row of
    :func:`serial_answer_probs`'s full passes (the serial reference runs the same rows, one condition
    per pass). Counted from the logits each pass returned, so a row that is not run is not counted.
    Counters of one model nest: every open one counts. ``.count`` grows as rows run."""

    _open: list[RowCounter] = []  # the open counters, of every model

    def __init__(self, model):
        self.model, self.count = model, 0

    @classmethod
    def ran(cls, model, n_rows: int) -> None:
        """Add ``n_rows`` rows run through ``model`` to every open counter of ``model``."""
        for c in cls._open:
            if c.model is model:
                c.count += int(n_rows)

    def __enter__(self):
        RowCounter._open.append(self)
        return self

    def __exit__(self, *exc) -> None:
        RowCounter._open.remove(self)


def _grad_output(out) -> Tensor | None:
    """The first output of a model call that gradients flow back through: the logits tensor, the
    first such tensor of a tuple, or an output object's ``.logits``."""
    if isinstance(out, Tensor):
        return out if out.requires_grad else None
    if isinstance(out, (tuple, list)):
        return next((t for t in map(_grad_output, out) if t is not None), None)
    logits = getattr(out, "logits", None)
    return _grad_output(logits) if logits is not None else None


class BackwardPassCounter:
    """Counts the backward passes through ``model``'s calls: a forward hook on ``model`` puts a
    gradient hook on each call's output that carries gradients, and every backward pass (through
    ``Tensor.backward`` or ``torch.autograd.grad``) that reaches that output counts once. Calls under
    ``torch.no_grad`` are not counted. ``.count`` and ``.seconds`` are set on exit."""

    def __init__(self, model):
        self.model, self.count, self.seconds = model, 0, 0.0

    def _grad(self, grad: Tensor) -> None:
        self.count += 1

    def _post(self, module, args, out) -> None:
        t = _grad_output(out)
        if t is not None:
            t.register_hook(self._grad)

    def __enter__(self):
        self._handle = self.model.register_forward_hook(self._post)
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.seconds = time.perf_counter() - self._t0
        self._handle.remove()




def batched_answer_probs(
    model, prompts: list[str], answers: list[int], onehots: Float[Tensor, "N n_layers n_heads"],
    embedding: Float[Tensor, "n_layers n_heads d_head"], batch_size: int, *,
    progress: bool = False, desc: str = "patched rows",
) -> tuple[Float[Tensor, " n_prompts"], Float[Tensor, "n_prompts N"]]:
    """Each prompt's prefix encoded once into a frozen KV cache; then one row per (prompt,
    condition) re-runs only the last token: condition 0 unpatched, condition 1 + j head j.
    ``progress``: a bar over the rows named ``desc``."""
    # imported here, not at the top: sitelens.patching re-exports this module's names

    n, N = len(prompts), onehots.shape[0]
    L, H = onehots.shape[1:]
    cache, last, ans = prefix_rows(model, prompts, answers)
    weights = torch.cat([torch.zeros(1, L, H), onehots])  # [N + 1, n_layers, n_heads]
    item_idx = torch.arange(n).repeat_interleave(N + 1)  # [n * (N + 1)], prompt-major
    cond_idx = torch.arange(N + 1).repeat(n)  # [n * (N + 1)]
    _, prob = run_rows(
        model, cache, last, ans, item_idx, cond_idx, weights, embedding, batch_size=batch_size,
        progress=progress, desc=desc,
    )
    prob = prob.reshape(n, N + 1)  # [n_prompts, N + 1]
    return prob[:, 0], prob[:, 1:]  # [n_prompts], [n_prompts, N]


def serial_answer_probs(
    model, prompts: list[str], answers: list[int], onehots: Float[Tensor, "N n_layers n_heads"],
    embedding: Float[Tensor, "n_layers n_heads d_head"], batch_size: int, *,
    progress: bool = False, desc: str = "patched heads",
) -> tuple[Float[Tensor, " n_prompts"], Float[Tensor, "n_prompts N"]]:
    """The reference: one full forward pass over all prompts (in chunks of ``batch_size``)
    unpatched, then one per head. ``progress``: a bar over the heads named ``desc``."""
    device = model.cfg.device
    chunks = [
        (encode(model, prompts[s : s + batch_size]),
         torch.tensor(answers[s : s + batch_size], device=device))
        for s in range(0, len(prompts), batch_size)
    ]

    def probs(mix) -> Tensor:
        out = []
        for enc, ans in chunks:
            logits = last_logits(model, enc, mix)  # [b, d_vocab]
            RowCounter.ran(model, logits.shape[0])
            ans = ans.to(logits.device)  # [b]
            logp = torch.log_softmax(logits, -1).gather(1, ans[:, None])[:, 0]  # [b]
            out.append(logp.exp().cpu())
        return torch.cat(out)  # [n_prompts]

    base = probs(None)  # [n_prompts]
    patched = torch.stack(
        [probs(HeadMix(weights=onehots[j].to(device), targets=embedding))
         for j in progress_bar(range(onehots.shape[0]), desc=desc, enabled=progress)],
        dim=1,
    )  # [n_prompts, N]
    return base, patched


__all__ = [
    "prefix_rows", "run_rows", "row_grid", "patched_last_logits", "ForwardPassCounter", "BackwardPassCounter",
    "RowCounter",
    "batched_answer_probs", "serial_answer_probs",
]
