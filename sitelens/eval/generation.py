"""Greedy generation under an intervention: the hooks of an intervention for a prompt batch, the
KV-cached decoding loop, its stop tokens, and the logits at the last prompt position.

An intervention is ``None``, a :class:`~sitelens.site.injection.HeadMix` (pinned to the prompt
length, so it acts in the prefill and never on a one-position decode step) or a callable
``(model, seq_len) -> [(hook_name, fn)]`` such as :class:`sitelens.baselines.HookIntervention`.
"""

from __future__ import annotations

import torch
from jaxtyping import Float, Int
from torch import Tensor

from sitelens.models import Encoded, kv_forward, last_position_logits, new_kv_cache
from sitelens.site.injection import HeadMix, apply_hooks


def intervention_hooks(model, intervention, seq_len: int | None) -> list:
    """The ``(hook_name, fn)`` pairs of an intervention for a prompt batch of ``seq_len``
    positions: none for ``None``; a :class:`HeadMix` pinned to ``seq_len`` (so it acts in the
    prefill and never on a one-position decode step); else ``intervention(model, seq_len)`` (a
    :class:`sitelens.baselines.HookIntervention` or any such callable)."""
    if intervention is None:
        return []
    if isinstance(intervention, HeadMix):
        pinned = HeadMix(intervention.weights, intervention.targets, intervention.positions, seq_len,
                         _active=intervention._active)
        return pinned.hooks(model)
    return intervention(model, seq_len)  # a callable (model, seq_len) -> hooks


def last_logits(
    model, enc: Encoded, intervention=None
) -> Float[Tensor, "batch d_vocab"]:
    """Logits at the last prompt position, under an optional intervention (only that position is
    unembedded)."""
    with torch.no_grad(), apply_hooks(model, intervention_hooks(model, intervention, enc.tokens.shape[1])):
        return last_position_logits(model, enc)  # [batch, d_vocab]


def greedy_generate(
    model,
    enc: Encoded,
    *,
    intervention=None,
    max_new_tokens: int = 16,
    stop_at_newline: bool = True,
    min_new_tokens: int = 0,
) -> tuple[Int[Tensor, "batch new"], Float[Tensor, "batch d_vocab"]]:
    """Greedy decoding with a KV cache (:func:`sitelens.models.kv_forward`; full passes on a bridge).

    A :class:`HeadMix` is pinned to the prompt length, so it injects once in the prefill and never on
    a KV-cached decode step. Returns the generated token ids and the first-step logits (the
    next-token distribution at the answer position). Decoding also stops when the context is full
    (prompt + generated = ``model.cfg.n_ctx``), so a prompt that fits never overruns the positional
    tables; those outputs are cut short, like any generation that reaches ``max_new_tokens``.

    On the first ``min_new_tokens`` steps EOS is never chosen (Hugging Face's ``min_new_tokens``);
    the returned first-step logits are not masked. A row that has stopped keeps receiving tokens
    while others run: cut it at its EOS (:func:`cut_at_eos`) where that matters.
    """
    batch = enc.tokens.shape[0]
    # The prefill fills positions 0..P-1 and yields token 1; decode step s feeds position P+s-1.
    max_new_tokens = min(max_new_tokens, model.cfg.n_ctx - enc.tokens.shape[1] + 1)
    cache = new_kv_cache(model, batch)
    eos = model.tokenizer.eos_token_id
    out: list[Tensor] = []  # one [batch] per step, on the device the logits come out on
    done = None  # [batch], there too: one read per step (the stopping test), none per token
    hooks = intervention_hooks(model, intervention, enc.tokens.shape[1])
    # Hooks stay on for the decode steps: prefill-only interventions (HeadMix, last-token
    # injections) are pinned to the prompt length and skip them; every-position methods (LoRA,
    # (IA)3, I2CL) must act on them.
    with torch.no_grad(), apply_hooks(model, hooks):
        logits = kv_forward(model, enc.tokens, enc.attention_mask, cache,
                            last_only=True)  # [batch, 1, d_vocab]
        first_logits = logits[:, -1].float()  # [batch, d_vocab]
        step_logits = first_logits
        ones = torch.ones(batch, 1, dtype=enc.attention_mask.dtype, device=enc.tokens.device)
        for step in range(max_new_tokens):
            if step < min_new_tokens and eos is not None:
                step_logits = step_logits.clone()
                step_logits[:, eos] = float("-inf")  # [batch, d_vocab], EOS excluded
            nxt = step_logits.argmax(-1)  # [batch]
            out.append(nxt)
            stops = is_stop(model, nxt, newline=stop_at_newline)  # [batch]
            done = stops if done is None else done | stops
            if step == max_new_tokens - 1 or bool(done.all()):
                break
            logits = kv_forward(model, nxt[:, None].to(enc.tokens.device), ones,
                                cache)  # [batch, 1, d_vocab]
            step_logits = logits[:, -1].float()
    return torch.stack(out, dim=1).cpu(), first_logits


def is_stop(model, ids: Int[Tensor, " batch"], *, newline: bool = True) -> Tensor:
    """Whether each token of ``ids`` ends a generation (EOS, and with ``newline`` a token whose
    text contains a newline), as a bool tensor on their device: exactly ``torch.isin(ids,
    stop_ids(model, ...))``, but each id's text is read once per model when it is first generated
    (:func:`has_newline`), not the whole vocabulary's before the first step (262,144 decodes,
    seconds, on Gemma)."""
    eos = model.tokenizer.eos_token_id
    stops = [i == eos or (newline and has_newline(model, i)) for i in ids.tolist()]
    return torch.tensor(stops, dtype=torch.bool, device=ids.device)


def has_newline(model, token_id: int) -> bool:
    """Whether ``token_id`` is in :func:`newline_ids` (its text contains a newline), decided for
    that id alone and remembered per model (from :func:`newline_ids` when it has run)."""
    full = getattr(model, "_sitelens_newline_ids", None)
    if full is not None:
        return token_id in full
    memo = getattr(model, "_sitelens_newline_memo", None)
    if memo is None:
        memo = {"n_tokens": len(model.tokenizer)}
        model._sitelens_newline_memo = memo
    if token_id not in memo:
        tok = model.tokenizer.convert_ids_to_tokens(token_id) if 0 <= token_id < memo["n_tokens"] else None
        memo[token_id] = tok is not None and "\n" in model.tokenizer.convert_tokens_to_string([tok])
    return memo[token_id]


def stop_ids(model, device, *, newline: bool = True) -> Tensor:
    """The token ids that end a generation (EOS, and with ``newline`` every token containing a
    newline) as a tensor on ``device`` (cached per model and device)."""
    cache = getattr(model, "_sitelens_stop_ids", None)
    if cache is None:
        cache = {}
        model._sitelens_stop_ids = cache
    key = (str(device), newline)
    if key not in cache:
        eos = model.tokenizer.eos_token_id
        ids = sorted((newline_ids(model) if newline else set()) | ({eos} if eos is not None else set()))
        cache[key] = torch.tensor(ids, dtype=torch.long, device=device)  # [n_stop]
    return cache[key]


def newline_ids(model) -> set[int]:
    cached = getattr(model, "_sitelens_newline_ids", None)
    if cached is not None:
        return cached
    ids = set()
    vocab = model.tokenizer.convert_ids_to_tokens(list(range(len(model.tokenizer))))
    for i, tok in enumerate(vocab):
        if tok is None:
            continue
        text = model.tokenizer.convert_tokens_to_string([tok])
        if "\n" in text:
            ids.add(i)
    model._sitelens_newline_ids = ids
    return ids


def cut_at_eos(ids: list[int], eos: int | None) -> list[int]:
    """Generated ids up to (not including) the first EOS."""
    return ids[: ids.index(eos)] if eos is not None and eos in ids else ids


