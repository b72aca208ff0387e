"""State Vector (Li et al., NeurIPS 2024, "In-Context Learning State Vector with Inner and Momentum
Optimization", arXiv:2404.11225): the per-head attention outputs at the separator token of each
demonstration form a trajectory, like the parameters of a model trained by gradient descent one
demonstration at a time; the trajectory is averaged (inner optimization) and extrapolated with
momentum (momentum optimization), and the result replaces the heads' outputs of the first layers
at the last prompt token.

1. states: one ``n_shots``-shot prompt (demonstrations and a dummy query from the train split);
   at the *separator* of each demonstration — the last token of its query part, ``"Q: x\\nA:"``,
   the token after which the answer follows, the role of the paper's ``→`` — and at the dummy
   query's own last token, ``hook_z`` of every layer: ``V_0 .. V_{n_shots}``
   (``V_{n_shots}`` is the query's)                                   -> [n_shots+1, L, H, d_head]
   With ``n_prompts > 1`` the trajectories of several prompts are averaged position by position
   (the authors' code averages over dummy queries the same way).
2. inner optimization: the uniform average of the last ``inner_window`` states,
   ``V_in = mean(V_{n-w+1} .. V_n)`` — a model soup of the later steps of the trajectory
   (like tail averaging in SGD: the late states have seen most demonstrations).
3. momentum optimization: the differences of successive demonstration states are the
   "gradients", ``g_i = V_i − V_{i−1}`` (``i < n_shots``: the query's state is not a
   demonstration step); their momentum over the last ``momentum_steps`` of them, with the
   newest weighted most, ``m = Σ_j β^j g_{n−1−j} / Σ_j β^j`` (``j = 0 .. momentum_steps−1``),
   and ``V = V_in + step · m``.                                       -> [L, H, d_head]
4. intervention: ``z[l, h] ← V[l, h]`` for every head of the first ``depth`` layers, at the last
   prompt token, prefill only (a :class:`~sitelens.site.injection.HeadMix` with weight 1 on those
   layers); ``depth`` has the best validation first-token accuracy.

Exact identities (tested): ``step = 0`` gives the inner average; ``β = 0`` gives
``V_in + step · g_{n−1}`` (the newest gradient alone); ``β = 1`` gives the plain mean of the last
``momentum_steps`` gradients, which telescopes to ``(V_{n−1} − V_{n−1−k}) / k``;
``inner_window = 1, step = 0`` is the plain state vector ``V_n`` (the query's own state).

The choices, pinned to the paper and its released code (github.com/HITsz-TMG/ICL-State-Vector,
``state_vector_optimize.py`` and ``optimizer.py``, read for the method; nothing copied):

- **which activations**: the input of each layer's attention output projection, i.e. the
  concatenated per-head outputs before ``W_O`` (``hook_z`` here) — the paper's "state" lives in the
  attention activations, which it relates to the dual form of attention as gradient descent;
- **which position**: the separator token (module step 1); the paper reads the query's separator
  in a prompt with a dummy query and writes at the test query's separator, which under this
  template is the last prompt token;
- **which layers**: the first ``depth`` layers, every head; the paper fixes a per-task number of
  early layers (about the first 10-15 of Llama-2's 32), i.e. chosen per task — here on the
  validation split among ``depths`` (default: all ``1 .. n_layers``), as TV and FV choose theirs;
- **how it is injected**: replacement (the paper's ``add#0#1`` mode: 0 × the original + 1 × the
  state vector, projected by ``W_O``), the same as a weight-1 :class:`HeadMix`;
- **how many demonstrations**: ``n_shots = 10``, the paper's demonstration count, one prompt
  (``n_prompts = 1``) as in the paper's runs;
- **inner window** ``7`` and **momentum** over ``5`` gradients with ``β = 0.5``, ``step = 1``:
  the released configuration (``fix-one-step`` in ``optimizer.py``: the last 7 of the 11 states —
  the last 6 demonstrations' and the query's — are averaged; the 5 newest demonstration gradients
  are weighted 16 : 8 : 4 : 2 : 1, normalized — a geometric decay by 0.5 per step back, the
  newest weighted most — and added with step size 1).

Trainable parameters: 0 (an average of activations and a depth chosen on valid);
``depth · n_heads · d_head`` stored numbers.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor

from sitelens.baselines.base import FitParts, Method, select_layer
from sitelens.errors import FitError, TaskError, TokenizationError
from sitelens.models import encode, forward_until, length_batches, prepends_bos, token_ids, z_hook_name
from sitelens.site.injection import HeadMix
from sitelens.site.training import valid_items
from sitelens.tasks import Example, Task, Template, sample_demos

# ----------------------------------------------------------------------------------------------
# step 1: prompts, separator positions, states


@dataclass(frozen=True)
class DemoPrompt:
    """A few-shot prompt and the character offsets where each demonstration's query part ends
    (its separator) and where the prompt ends (the dummy query's separator)."""

    text: str
    boundaries: tuple[int, ...]


def demo_prompt(demos: Sequence[Example], query: Example, template: Template) -> DemoPrompt:
    """``demos`` as shots, then ``query``'s query part; the separators are the ends of each
    ``template.format_query(x)`` inside the prompt (a template whose shot does not begin with its
    query part has no such separator: :class:`TaskError`)."""
    parts, ends, offset = [], [], 0
    for d in demos:
        shot, head = template.format_shot(d), template.format_query(d.input)
        if not shot.startswith(head):
            raise TaskError(
                f"State Vector needs the template's shot to begin with its query part (the "
                f"separator is where the query part ends); shot {shot!r} does not begin with "
                f"{head!r}. Use a template whose shot is its query followed by the answer."
            )
        ends.append(offset + len(head))
        parts.append(shot)
        offset += len(shot)
    text = "".join(parts) + template.format_query(query.input)
    return DemoPrompt(text, (*ends, len(text)))


def demo_prompts(
    task: Task, n_prompts: int, n_shots: int, *, seed: int, template: Template
) -> list[DemoPrompt]:
    """``n_prompts`` prompts of ``n_shots`` demonstrations and a dummy query, all from
    ``task.train`` (the query never among its own demonstrations), seeded."""
    if len(task.train) < n_shots + 1:
        raise TaskError(
            f"Task {task.name!r} has {len(task.train)} training items; State Vector's "
            f"{n_shots}-shot prompts with a dummy query need at least {n_shots + 1}. Use fewer "
            "shots (n_shots)."
        )
    rng = random.Random(seed)
    prompts = []
    for _ in range(n_prompts):
        query = task.train[rng.randrange(len(task.train))]
        demos = sample_demos(task.train, n_shots, rng, exclude=query.input)
        prompts.append(demo_prompt(demos, query, template))
    return prompts


def separator_positions(model, prompt: DemoPrompt) -> list[int]:
    """The token index (in the encoded prompt, BOS included where the model adds it) of the last
    token of each ``prompt.text[:boundary]``. The prompt's tokens must begin with that prefix's
    tokens (a token spanning the separator has no position of its own: :class:`TokenizationError`)."""
    full = token_ids(model, prompt.text)
    bos = 1 if prepends_bos(model) else 0
    positions = []
    for end in prompt.boundaries:
        head = token_ids(model, prompt.text[:end])
        if not head or full[: len(head)] != head:
            raise TokenizationError(
                f"The prompt's tokens do not split at the separator ending {prompt.text[:end][-20:]!r}: "
                "a token spans it. Use a template whose query part ends with a character that "
                "begins no token with the answer (such as ':' before ' answer')."
            )
        positions.append(bos + len(head) - 1)
    return positions


def capture_states(
    model, prompts: Sequence[DemoPrompt], *, batch_size: int = 8
) -> Float[Tensor, "n_prompts n_states n_layers n_heads d_head"]:
    """``hook_z`` of every layer at each prompt's separators (float32, CPU); every prompt must
    have the same number of separators."""
    counts = {len(p.boundaries) for p in prompts}
    if len(counts) != 1:
        raise FitError(f"Every prompt needs the same number of separators, got {sorted(counts)}.")
    cfg = model.cfg
    names = [z_hook_name(model, layer) for layer in range(cfg.n_layers)]
    texts = [p.text for p in prompts]
    out = torch.zeros(len(prompts), counts.pop(), cfg.n_layers, cfg.n_heads, cfg.d_head)
    for idx in length_batches(model, texts, batch_size):  # similar lengths, bounded memory
        enc = encode(model, [texts[i] for i in idx])
        pad = enc.tokens.shape[1] - enc.attention_mask.sum(1).cpu()  # [batch] left padding per row
        pos = torch.tensor([separator_positions(model, prompts[i]) for i in idx])  # [batch, n_states]
        out[idx] = _z_at(model, names, enc, pos + pad[:, None])  # positions in padded columns
    return out  # [n_prompts, n_states, n_layers, n_heads, d_head]


def _z_at(
    model, names: Sequence[str], enc, pos: Int[Tensor, "batch n_states"]
) -> Float[Tensor, "batch n_states n_layers n_heads d_head"]:
    """``hook_z`` of the layers ``names`` at the (padded) columns ``pos`` of each row."""
    rows = torch.arange(pos.shape[0])[:, None]  # [batch, 1]
    got: dict[str, Tensor] = {}

    def grabber(name: str):
        def grab(z: Float[Tensor, "batch pos n_heads d_head"], hook=None):
            at = z[rows.to(z.device), pos.to(z.device)]  # [batch, n_states, n_heads, d_head]
            got[name] = at.detach().float().cpu()

        return grab

    with torch.no_grad():
        forward_until(model, [(n, grabber(n)) for n in names], enc.tokens,
                      attention_mask=enc.attention_mask)
    return torch.stack([got[n] for n in names], dim=2)  # [batch, n_states, L, H, d_head]


# ----------------------------------------------------------------------------------------------
# steps 2-3: inner and momentum optimization


def inner_average(
    states: Float[Tensor, "n_states n_layers n_heads d_head"], window: int
) -> Float[Tensor, "n_layers n_heads d_head"]:
    """The uniform average of the last ``window`` states (inner optimization)."""
    if not 1 <= window <= states.shape[0]:
        raise FitError(f"inner_window must be between 1 and the number of states "
                       f"({states.shape[0]} = n_shots + 1), got {window}.")
    return states[-window:].mean(0)  # [n_layers, n_heads, d_head]


def momentum(
    states: Float[Tensor, "n_states n_layers n_heads d_head"], beta: float, steps: int
) -> Float[Tensor, "n_layers n_heads d_head"]:
    """``Σ_j β^j g_{n−1−j} / Σ_j β^j`` over the ``steps`` newest demonstration gradients
    ``g_i = V_i − V_{i−1}`` (``i`` up to the last demonstration; the query's state, the last one,
    is not a step)."""
    demos = states[:-1]  # [n_shots, L, H, d_head]: the demonstrations' separators
    if not 1 <= steps <= demos.shape[0] - 1:
        raise FitError(f"momentum_steps must be between 1 and n_shots − 1 ({demos.shape[0] - 1}; "
                       f"{demos.shape[0]} demonstrations give that many differences), got {steps}.")
    if not 0.0 <= beta <= 1.0:
        raise FitError(f"beta (the momentum coefficient) must be in [0, 1], got {beta}.")
    grads = (demos[1:] - demos[:-1])[-steps:]  # [steps, L, H, d_head], oldest first
    weights = torch.tensor([beta**j for j in range(steps)][::-1], dtype=grads.dtype)  # [steps]
    return torch.einsum("s,slhd->lhd", weights / weights.sum(), grads)  # [L, H, d_head]


def state_vector(
    states: Float[Tensor, "n_states n_layers n_heads d_head"],
    *,
    inner_window: int = 7,
    momentum_steps: int = 5,
    beta: float = 0.5,
    step: float = 1.0,
) -> Float[Tensor, "n_layers n_heads d_head"]:
    """``V_in + step · m`` (module docstring, steps 2-3); ``step = 0`` skips the momentum."""
    inner = inner_average(states, inner_window)  # [L, H, d_head]
    if step == 0:
        return inner
    return inner + step * momentum(states, beta, momentum_steps)  # [L, H, d_head]


# ----------------------------------------------------------------------------------------------
# step 4: the intervention


def first_layers(n_layers: int, n_heads: int, depth: int) -> Float[Tensor, "n_layers n_heads"]:
    """Weight 1 on every head of layers ``0 .. depth−1``, 0 elsewhere."""
    if not 1 <= depth <= n_layers:
        raise FitError(f"depth must be between 1 and n_layers ({n_layers}), got {depth}.")
    w = torch.zeros(n_layers, n_heads)  # [n_layers, n_heads]
    w[:depth] = 1.0
    return w


def sv_mix(vector: Float[Tensor, "n_layers n_heads d_head"], depth: int) -> HeadMix:
    """Replace ``z`` by ``vector`` in every head of the first ``depth`` layers at the last prompt
    token (a weight-1 :class:`HeadMix`; pinned to the prefill by evaluation)."""
    L, H = vector.shape[0], vector.shape[1]
    return HeadMix(first_layers(L, H, depth).to(vector.device), vector)


@dataclass(kw_only=True)
class SV(Method):
    """State Vector with inner and momentum optimization (module docstring: every choice and its
    source). ``depths``: candidate numbers of first layers (None: ``1 .. n_layers``)."""

    name: str = "sv"
    n_shots: int = 10
    n_prompts: int = 1
    inner_window: int = 7
    momentum_steps: int = 5
    beta: float = 0.5
    step: float = 1.0
    depths: Sequence[int] | None = None
    n_valid: int = 64

    def _fit(self, model, task: Task, seed: int, template: Template, progress: bool) -> FitParts:
        cfg = model.cfg
        prompts = demo_prompts(task, self.n_prompts, self.n_shots, seed=seed, template=template)
        states = capture_states(model, prompts).mean(0)  # [n_shots+1, L, H, d_head]
        vector = state_vector(states, inner_window=self.inner_window,
                              momentum_steps=self.momentum_steps, beta=self.beta,
                              step=self.step).to(cfg.device)  # [L, H, d_head]
        depths = list(self.depths) if self.depths is not None else list(range(1, cfg.n_layers + 1))
        depth, table = select_layer(
            model, valid_items(task, self.n_valid), lambda d: sv_mix(vector, d).hooks(model),
            depths, template=template,
        )
        return FitParts(
            intervention=sv_mix(vector, depth),
            n_params=0,
            state={"vector": vector, "depth": depth, "states": states},
            meta={"stored_numbers": depth * cfg.n_heads * cfg.d_head,
                  "depth_table": [{"depth": r["layer"], "valid_acc": r["valid_acc"],
                                   "valid_loss": r["valid_loss"]} for r in table]},
        )


__all__ = [
    "SV", "DemoPrompt", "capture_states", "demo_prompt", "demo_prompts", "first_layers",
    "inner_average", "momentum", "separator_positions", "state_vector", "sv_mix",
]
