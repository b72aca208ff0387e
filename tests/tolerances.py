"""Tolerances for comparing two floating-point computations of the same numbers, derived from the
dtype, the depth and the reduction sizes of the model, and assertion helpers that report the
measured difference next to its bound (issue 17, "Trust every number").

Why derived bounds
------------------
Two computations of the same quantity (TransformerLens's attention vs the fused SDPA path, a
KV-cached step vs a full pass, a left-padded batch vs single prompts, the bridge vs
HookedTransformer, sitelens vs Hugging Face) agree only up to float rounding, and rounding depends
on the summation order, which the SIMD path (AVX2 / AVX-512), the thread count and the kernel (a
blocked GEMM, SDPA, TransformerLens's materialized softmax) change. A tolerance tuned on one
machine fails on the next: ``<= 1e-4`` on Gemma's log-probs met 1.37e-4. The bounds below scale
with what sets the size of the rounding, so they transfer across machines and models, and stay
far below what a real bug does (tests/test_mutations.py checks that).

The error model (a rule of thumb in the sense of Higham, *Accuracy and Stability of Numerical
Algorithms*, 2nd ed., §2.8 and §4.2; an estimate of typical rounding, not a worst-case bound)
------------------------------------------------------------------------------------------------
``u = eps/2``, the unit roundoff of the dtype (float32: 5.96e-8).

1. One reduction. A length-``n`` dot product summed in blocks / SIMD lanes (GEMM, SDPA) has a
   relative error ~ ``log2(n)·u`` (pairwise-summation growth). The longest reduction of a block
   is ``n = max(d_model, d_mlp, n_heads·d_head)``: the MLP down-projection for both bundled models
   (Gemma-3-270M 2048, SmolLM2-135M 1536; the tiny test models 64).
2. One block. About four such reductions are chained into the residual stream per block
   (attention scores, the weighted sum of values, the output projection, the MLP); their errors
   add, and the norms keep them relative: ``K·log2(n)·u``. K is the model's one calibrated
   constant. K = 4 would put the largest ratio measured below (hook_z of one Gemma layer on the
   SSE kernels) at 0.39; K = 6 keeps every comparison at about a quarter of its bound or less,
   headroom for CPUs and kernels not measured here, at no cost in catching bugs.
3. Depth. Rounding errors of different blocks are independent with mean zero, so over ``L``
   blocks they add in quadrature: ``√L·K·log2(n)·u`` relative to the residual stream. (``L`` times
   instead of ``√L`` is the worst case where they all align; the measurements below sit well under
   the ``√L`` estimate, so the linear one would only loosen the bounds √L times: 1.4 for the tiny
   models, 4.2 for Gemma's 18 layers, 5.5 for SmolLM2's 30.)
4. Logits. The unembedding turns that relative error into an absolute one proportional to the
   logit scale ``S = max |logit|`` of the reference: ``e_logit = S·√L·K·log2(n)·u``. The same
   holds for an activation after ``depth`` blocks, with ``S`` its own largest magnitude.
5. Log-probs. ``log p = z − logsumexp(z)``. The log-sum-exp over the vocabulary ``V`` (262,144
   for Gemma, 49,152 for SmolLM2) adds ``log2(V)·u`` (after subtracting the max, every term is
   ≤ 1 and the sum ≥ 1; measured 8e-7 over 262,144 float32 logits), and the result is rounded at
   its own magnitude ``|log p| ≤ 2S``: ``e_logprob = e_logit + (2S + log2 V)·u``.
6. Comparison. Two computations, each within ``e`` of the exact value, differ by up to ``2e``:
   every bound returned here is ``2e``.

Probabilities: ``|Δp| = p·|exp(Δ log p) − 1| ≈ p·|Δ log p|``, so a probability moves by at most its
own size times the log-prob bound; a mean of probabilities by the mean probability times it
(``mean(p_i·|δ_i|) ≤ mean(p)·max|δ|``), and a difference of two (a causal effect, patched −
unpatched) by the sum of both. For the tiny models' answer tokens (p ~ 0.004) that is ~250 times
tighter than ``|Δp| ≤ |Δ log p|``.

Calibration: measured difference / bound, float32, K = 6; 2 threads and 1 thread under
``taskset -c 0`` (identical here except for padded batches) with this machine's AVX-512 kernels;
[ATen's and MKL's AVX2 kernels], {the generic SSE kernels} (``ATEN_CPU_CAPABILITY=avx2|default``,
``MKL_ENABLE_INSTRUCTIONS=AVX2|SSE4_2``):
  fused vs TransformerLens attention, log-probs: tiny models <= 0.14, SmolLM2 0.03 [0.03] {0.04},
  Gemma 0.13 [0.09] {0.09}; per-layer hook_z: tiny <= 0.07, SmolLM2 <= 0.13 [0.12] {0.19},
  Gemma <= 0.20 [0.17] {0.26};
  sitelens vs Hugging Face log-probs: SmolLM2 0.04 [0.04], Gemma 0.11 [0.08] {0.09};
  left-padded batch vs single prompts: <= 0.10; bridge vs HookedTransformer: tiny <= 0.17,
  SmolLM2 0.04; KV cache vs full pass: <= 0.09; probabilities and causal effects: <= 0.014.
  (Exact-rounding checks, such as a float64 solve returned in float32, use hard bounds, e.g.
  ``u·|x|`` for one round-to-nearest, and may sit closer: LTV's ridge solve at 0.78.)
The realistic bugs of tests/test_mutations.py exceed the bounds 300 to 30,000 times on the
bundled models (least: SmolLM2's log-probs move by 0.42 when one head of the last layer sees one
future token, bound 1.45e-3) and 500 to 10^5 times on the tiny ones.

``SITELENS_TOLERANCE_LOG=/tmp/margins.txt pytest ...`` appends every comparison (test, difference,
bound, ratio) to that file, to see the margins on a new machine.

Exact comparisons (``torch.equal``) are kept where the same float operations run in the same order
on the same inputs (a re-run, an identity intervention that returns ``z`` untouched, integer
tokens): CPU kernels are deterministic for a fixed shape and thread count.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch
from torch import Tensor

K_CHAINED = 6  # chained float32 reductions per block (item 2), with headroom for unmeasured kernels


def unit_roundoff(dtype: torch.dtype = torch.float32) -> float:
    """``eps/2`` of a floating dtype: float32 5.96e-8, float64 1.11e-16, bfloat16 3.9e-3."""
    return torch.finfo(dtype).eps / 2


@dataclass(frozen=True)
class Dims:
    """What sets the rounding of a forward pass: depth, the longest reduction, the vocabulary."""

    n_layers: int
    reduction: int  # max(d_model, d_mlp, n_heads * d_head)
    d_vocab: int
    dtype: torch.dtype


def dims(model) -> Dims:
    """:class:`Dims` of a HookedTransformer or a TransformerBridge (from ``model.cfg``)."""
    cfg = model.cfg
    d_mlp = getattr(cfg, "d_mlp", None) or 4 * cfg.d_model
    dtype = getattr(cfg, "dtype", None) or torch.float32
    return Dims(
        n_layers=int(cfg.n_layers),
        reduction=int(max(cfg.d_model, d_mlp, cfg.n_heads * cfg.d_head)),
        d_vocab=int(cfg.d_vocab),
        dtype=dtype if isinstance(dtype, torch.dtype) else torch.float32,
    )


def relative_error(model, depth: int | None = None, dtype: torch.dtype | None = None) -> float:
    """Items 1-3: the relative rounding error of one pass after ``depth`` blocks (default: all)."""
    d = dims(model)
    depth = d.n_layers if depth is None else depth
    u = unit_roundoff(dtype or d.dtype)
    return math.sqrt(max(depth, 1)) * K_CHAINED * math.log2(max(d.reduction, 2)) * u


def logit_tolerance(model, scale: float, *, depth: int | None = None,
                    dtype: torch.dtype | None = None) -> float:
    """Items 1-4, 6: how far two computations of the same logits (or of an activation after
    ``depth`` blocks) may differ, at logit / activation scale ``scale``."""
    return 2 * scale * relative_error(model, depth, dtype)


def activation_tolerance(model, scale: float, *, depth: int, dtype: torch.dtype | None = None) -> float:
    """:func:`logit_tolerance` of an activation after ``depth`` blocks (hook_z of layer ``l``:
    ``depth = l + 1``), at its own largest magnitude ``scale``."""
    return logit_tolerance(model, scale, depth=depth, dtype=dtype)


def logprob_tolerance(model, dtype: torch.dtype | None = None, *, scale: float) -> float:
    """Items 1-6: how far two computations of the same log-probs may differ, for logits whose
    largest magnitude is ``scale``."""
    d = dims(model)
    u = unit_roundoff(dtype or d.dtype)
    return logit_tolerance(model, scale, dtype=dtype) + 2 * (2 * scale + math.log2(d.d_vocab)) * u


def prob_tolerance(model, dtype: torch.dtype | None = None, *, scale: float, mass: float = 1.0) -> float:
    """Probabilities: ``|Δp| ≈ p·|Δ log p| ≤ mass ·`` :func:`logprob_tolerance`, where ``mass`` is
    the probability compared (a mean probability: its value; a difference of two probabilities:
    the sum of both; at most 1 per term). The factor 1.01 covers ``exp(δ) − 1 ≥ δ`` and the float32
    rounding of ``p`` itself (u32 relative)."""
    return 1.01 * mass * logprob_tolerance(model, dtype, scale=scale)


def reduction_tolerance(n: int, scale: float, dtype: torch.dtype = torch.float32) -> float:
    """Item 1 and 6 alone: two computations of one length-``n`` reduction (e.g. ``h @ Wᵀ`` inside
    a hook vs outside it, other kernels) whose result has magnitude up to ``scale``."""
    return 2 * scale * math.log2(max(n, 2)) * unit_roundoff(dtype)


# ----------------------------------------------------------------------------------------------
# a bfloat16 (or float16) model against its float32 twin (the error model of tests/test_devices.py)
#
# bfloat16 keeps 8 significant bits, ``u = 2**-8``. Its matrix products accumulate in float32 and
# round their output once, so each product adds one rounding ``u`` (the float32 summation inside,
# ~log2(n)·6e-8, is nothing next to it: the float32 model above does not apply). About four
# independent roundings reach a block's output (residual stream, norm, projection, attention sum),
# adding in quadrature: ``K_LOW = 2`` u per block, and ``√depth · K_LOW · u`` after ``depth``
# blocks. The float32 reference's own error (~1e-6) is negligible, so these bounds are one-sided;
# ``TAIL = 3`` covers the largest of many compared elements against a typical one (~3σ).

K_LOW = 2  # independent bfloat16 roundings per block, in quadrature
TAIL = 3  # the largest of many compared elements against a typical one


def low_rel(depth: int, dtype: torch.dtype = torch.bfloat16) -> float:
    """Relative error of a low-precision activation after ``depth`` blocks."""
    return math.sqrt(max(depth, 1)) * K_LOW * unit_roundoff(dtype)


def low_activation_bound(scale: float, depth: int, dtype: torch.dtype = torch.bfloat16) -> float:
    """An activation after ``depth`` blocks, at its own largest magnitude ``scale``. A gradient
    with respect to an activation of a block runs the backward pass through the blocks above it
    too: ``depth = 2·n_layers`` bounds every layer's."""
    return TAIL * scale * low_rel(depth, dtype)


def low_logprob_bound(scale: float, n_layers: int, dtype: torch.dtype = torch.bfloat16) -> float:
    """Log-probabilities at logit scale ``scale``: the logits carry the whole depth's relative
    error plus their own rounding, and ``log p = z − logsumexp(z)`` moves by up to twice that."""
    return TAIL * 2 * scale * (low_rel(n_layers, dtype) + unit_roundoff(dtype))


def low_prob_bound(scale: float, n_layers: int, mass: float, dtype: torch.dtype = torch.bfloat16) -> float:
    """Probabilities (their means, their differences): ``|Δp| ≈ p·|Δ log p|``, so ``mass`` (the
    probability compared; for a difference of two, the sum of both) times
    :func:`low_logprob_bound`, with the 1.01 of :func:`prob_tolerance`."""
    return 1.01 * mass * low_logprob_bound(scale, n_layers, dtype)


# ----------------------------------------------------------------------------------------------
# assertions


@dataclass(frozen=True)
class Check:
    """The outcome of one comparison: the largest difference, its bound and the scale used."""

    what: str
    max_diff: float
    bound: float
    scale: float

    @property
    def ratio(self) -> float:
        return self.max_diff / self.bound if self.bound > 0 else math.inf * bool(self.max_diff)

    def __str__(self) -> str:
        return (f"{self.what}: max |Δ| = {self.max_diff:.3g}, bound {self.bound:.3g} "
                f"(scale {self.scale:.3g}, ratio {self.ratio:.3g})")


def _rows(x: Tensor, mask: Tensor | None) -> Tensor:
    x = torch.as_tensor(x).detach().cpu()
    if mask is not None:
        x = x[torch.as_tensor(mask).bool().cpu()]
    return x


def _max_diff(actual: Tensor, expected: Tensor, what: str) -> float:
    if actual.shape != expected.shape:
        raise AssertionError(f"{what}: shapes differ, {list(actual.shape)} vs {list(expected.shape)}")
    if not bool(torch.isfinite(expected).all()):
        raise AssertionError(f"{what}: the reference has non-finite values")
    a, b = actual.double(), expected.double()
    if not bool(torch.isfinite(a).all()):
        raise AssertionError(f"{what}: {int((~torch.isfinite(a)).sum())} non-finite value(s) "
                             "where the reference is finite")
    return float((a - b).abs().max()) if a.numel() else 0.0


def assert_within(actual, expected, bound: float, *, what: str, scale: float = float("nan")) -> Check:
    """``max |actual − expected| ≤ bound`` (NaN/inf in ``actual`` fail), else AssertionError
    naming ``what``, the difference and the bound."""
    actual, expected = torch.as_tensor(actual), torch.as_tensor(expected)
    check = Check(what, _max_diff(actual, expected, what), float(bound), float(scale))
    log = os.environ.get("SITELENS_TOLERANCE_LOG")
    if log:  # e.g. SITELENS_TOLERANCE_LOG=/tmp/margins.txt pytest ...: every margin, one a line
        with open(log, "a", encoding="utf-8") as f:
            f.write(f"{os.environ.get('PYTEST_CURRENT_TEST', '').split(' ')[0]}\t{check}\n")
    if not check.max_diff <= check.bound:
        raise AssertionError(f"{check} — more than float rounding can explain")
    return check


def assert_logits_close(actual, expected, model, *, what: str, mask=None, depth: int | None = None) -> Check:
    """Two computations of the same logits ``[..., d_vocab]`` (``mask``: which leading positions
    to compare, e.g. the attention mask) agree within :func:`logit_tolerance` at the reference's
    logit scale."""
    a, b = _rows(actual, mask), _rows(expected, mask)
    scale = float(b.abs().max()) if b.numel() else 0.0
    return assert_within(a, b, logit_tolerance(model, scale, depth=depth), what=what, scale=scale)


def assert_logprobs_close(actual, expected, model, *, what: str, mask=None) -> Check:
    """Two computations of the same next-token distributions agree within
    :func:`logprob_tolerance`. ``actual``/``expected``: logits or log-probs ``[..., d_vocab]``
    (normalized here with ``log_softmax`` in their own dtype, as the library does; pass logits
    where you have them: the scale of log-probs, ``max |log p|``, is the logit spread, up to
    twice the logit scale). ``mask`` selects the leading positions to compare."""
    a, b = _rows(actual, mask), _rows(expected, mask)
    scale = float(b.abs().max()) if b.numel() else 0.0
    bound = logprob_tolerance(model, scale=scale)
    return assert_within(a.log_softmax(-1), b.log_softmax(-1), bound, what=what, scale=scale)


def assert_activations_close(actual, expected, model, *, what: str, depth: int | None = None,
                             layer_dim: int | None = None) -> Check:
    """Two computations of the same activations agree within :func:`activation_tolerance`.

    Either one activation after ``depth`` blocks, at its own largest magnitude, or
    (``layer_dim`` given) a stack of per-layer activations along that dimension, each slice ``l``
    compared at depth ``l + 1`` and at its own scale. Returns the slice with the largest
    difference relative to its bound."""
    a, b = torch.as_tensor(actual).detach().cpu(), torch.as_tensor(expected).detach().cpu()
    if layer_dim is None:
        if depth is None:
            raise TypeError("assert_activations_close needs depth or layer_dim")
        scale = float(b.abs().max()) if b.numel() else 0.0
        return assert_within(a, b, activation_tolerance(model, scale, depth=depth), what=what,
                             scale=scale)
    if a.shape != b.shape:
        raise AssertionError(f"{what}: shapes differ, {list(a.shape)} vs {list(b.shape)}")
    worst = None
    for layer in range(b.shape[layer_dim]):
        check = assert_activations_close(a.select(layer_dim, layer), b.select(layer_dim, layer),
                                         model, what=f"{what} (layer {layer})", depth=layer + 1)
        if worst is None or check.ratio > worst.ratio:
            worst = check
    return worst


def assert_probs_close(actual, expected, model, *, what: str, scale: float,
                       mass: float | None = None) -> Check:
    """Probabilities (or means of them) agree within :func:`prob_tolerance` at logit scale
    ``scale`` (see :func:`logit_scale`). ``mass``: the probability the compared values are made of
    (default: the largest of them, right for probabilities and their means); for a difference of
    two probabilities (a causal effect, patched − unpatched) pass the sum of both."""
    a = torch.as_tensor(actual, dtype=torch.float64)
    b = torch.as_tensor(expected, dtype=torch.float64)
    if mass is None:
        mass = float(torch.maximum(a.abs().max(), b.abs().max())) if b.numel() else 0.0
    bound = prob_tolerance(model, scale=scale, mass=mass)
    return assert_within(a, b, bound, what=what, scale=scale)


def logit_scale(model, prompts, interventions=(None,)) -> float:
    """The largest |logit| at the last prompt position of ``prompts``, unpatched or under any of
    ``interventions`` (the ``S`` of the error model), for comparisons of quantities derived from
    those logits (probabilities, causal effects)."""
    from sitelens.eval.generation import last_logits
    from sitelens.models import encode

    enc = encode(model, list(prompts))
    return max(float(last_logits(model, enc, inter).abs().max()) for inter in interventions)
