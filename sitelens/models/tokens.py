"""Tokens: the BOS convention, left-padded batches, and batches cut to an attention-memory budget.

Every prompt sitelens runs is encoded here: :func:`encode` prepends BOS where the model's
``cfg.default_prepend_bos`` says so (the decision per model is documented in
:mod:`sitelens.models.load`) and pads on the left, so the last prompt token of every row is the
last column.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Int
from torch import Tensor

from sitelens.errors import PromptTooLongError
from sitelens.models.devices import memory_budget


@dataclass
class Encoded:
    """Left-padded token batch. The last prompt token of every row is the last column."""

    tokens: Int[Tensor, "batch pos"]
    attention_mask: Int[Tensor, "batch pos"]

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def to(self, device) -> Encoded:
        return Encoded(self.tokens.to(device), self.attention_mask.to(device))


def prepends_bos(model) -> bool:
    return bool(model.cfg.default_prepend_bos)


def token_ids(model, text: str) -> list[int]:
    """Token ids of ``text`` without special tokens."""
    return model.tokenizer(text, add_special_tokens=False)["input_ids"]


def encode(model, texts: list[str], *, prepend_bos: bool | None = None) -> Encoded:
    """Tokenize prompts with the model's BOS convention and left padding."""
    tok = model.tokenizer
    bos = prepends_bos(model) if prepend_bos is None else prepend_bos
    ids = [token_ids(model, t) for t in texts]
    if bos:
        ids = [[tok.bos_token_id] + x for x in ids]
    n_ctx = model.cfg.n_ctx
    longest = max(len(x) for x in ids)
    if longest > n_ctx:
        raise PromptTooLongError(
            f"A prompt has {longest} tokens but the model's context (n_ctx) is {n_ctx}. "
            "Use fewer or shorter demonstrations (n_shots), or load the model with a larger n_ctx."
        )
    if any(len(x) == 0 for x in ids):
        raise PromptTooLongError("An empty prompt cannot be encoded; give at least one token.")
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    tokens = torch.full((len(ids), longest), pad, dtype=torch.long)  # [batch, pos]
    mask = torch.zeros((len(ids), longest), dtype=torch.long)  # [batch, pos]
    for i, x in enumerate(ids):
        tokens[i, longest - len(x) :] = torch.tensor(x, dtype=torch.long)
        mask[i, longest - len(x) :] = 1
    return Encoded(tokens.to(model.cfg.device), mask.to(model.cfg.device))


# The largest tensor of a long-prompt forward pass is the attention scores, batch × n_heads × pos²
# float32 (TransformerLens holds a few copies: scores, masked scores, pattern). Batches are cut so
# that one copy stays under this many bytes; a 3,000-token prompt on SmolLM2 (9 heads) is 324 MB
# per row, and 16 such rows OOM-killed a 24 GB machine. That is the CPU's budget; on a CUDA GPU
# it is a share of the free memory (:func:`sitelens.models.devices.memory_budget`).
ATTENTION_BUDGET_BYTES = 512 * 2**20


def budget_batches(
    lengths: Sequence[int], batch_size: int, n_heads: int, *,
    budget_bytes: int = ATTENTION_BUDGET_BYTES,
) -> list[list[int]]:
    """Indices ordered by ``lengths`` (tokens; similar lengths share a batch, so less padding),
    cut into batches of at most ``batch_size`` whose attention scores
    (``len(batch) × n_heads × max_length²`` float32) fit in ``budget_bytes``; one row always fits."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches: list[list[int]] = []
    cur: list[int] = []
    for i in order:  # ascending: the newest index has the batch's longest prompt
        row = 4 * n_heads * int(lengths[i]) ** 2
        if cur and (len(cur) >= batch_size or (len(cur) + 1) * row > budget_bytes):
            batches.append(cur)
            cur = []
        cur.append(i)
    if cur:
        batches.append(cur)
    return batches


def length_batches(
    model, prompts: Sequence[str], batch_size: int, *, budget_bytes: int | None = None
) -> list[list[int]]:
    """:func:`budget_batches` over the prompts' token counts (with BOS where the model adds it).
    ``budget_bytes`` (default): :data:`ATTENTION_BUDGET_BYTES` on the CPU, a share of the free
    memory on a CUDA GPU (:func:`sitelens.models.devices.memory_budget`)."""
    if budget_bytes is None:
        budget_bytes = memory_budget(model, ATTENTION_BUDGET_BYTES)
    extra = 1 if prepends_bos(model) else 0
    lengths = [len(token_ids(model, p)) + extra for p in prompts]
    return budget_batches(lengths, batch_size, model.cfg.n_heads, budget_bytes=budget_bytes)


__all__ = [
    "ATTENTION_BUDGET_BYTES", "Encoded", "budget_batches", "encode", "length_batches",
    "prepends_bos", "token_ids",
]
