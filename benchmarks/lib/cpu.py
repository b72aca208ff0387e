"""The kind of CPU a benchmark row ran on, for results whose speed depends on it."""

from __future__ import annotations


def cpu_bf16() -> str:
    """``native``: this CPU multiplies bfloat16 matrices in hardware (AVX-512 BF16 or AMX), so
    bfloat16 runs faster than float32; ``emulated``: it does not, and bfloat16 runs slower
    (:func:`sitelens.models.cpu_native_matmul`); ``unknown``: the probe cannot tell."""
    import torch

    from sitelens.models import cpu_native_matmul

    return {True: "native", False: "emulated", None: "unknown"}[cpu_native_matmul(torch.bfloat16)]
