"""How and where a model loads: the backend, and :class:`LoadSpec`, the frozen load specification
(device, dtype, devices, device map, backend) that travels from the CLI or a Python caller through
the runners and executors to :func:`~sitelens.models.load.load_model`.

Backends (``backend=`` of :func:`~sitelens.models.load.load_model` /
:func:`sitelens.testing.tiny_model`, :attr:`LoadSpec.backend`):

- ``"hooked"``: a ``HookedTransformer`` (TransformerLens 3.9).
- ``"bridge"``: a ``TransformerBridge`` around the Hugging Face model (TransformerLens 3.9 and 4.x),
  raw HF numerics; ``enable_compatibility_mode()`` is never called implicitly. The per-head
  ``z`` hook is resolved by :func:`~sitelens.models.hooks.z_hook_name` and checked at run time
  (``[batch, pos, n_heads, d_head]``); :func:`~sitelens.models.hooks.self_check` verifies on load
  that it fires and changes the logits. KV caches fall back to full forward passes with the same
  results (:mod:`sitelens.models.kv`).

The default backend (:func:`default_backend`) is ``$SITELENS_BACKEND`` when set, else ``"hooked"``
where TransformerLens still has ``HookedTransformer`` (3.x), else ``"bridge"``. That variable is
the one setting sitelens reads from the environment besides the cache directory: a shell chooses
the backend of every model a run loads with it (the TransformerLens 4 CI job runs the unit tier with
``SITELENS_BACKEND=bridge``); sitelens never writes it. Device, dtype, devices and device map
come only from arguments.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sitelens.errors import ModelError

if TYPE_CHECKING:  # annotations only: LoadSpec is built before torch is imported (sitelens atlas)
    import torch

BACKENDS = ("hooked", "bridge")
BACKEND_ENV = "SITELENS_BACKEND"


def has_hooked_transformer() -> bool:
    """Whether the installed TransformerLens still has ``HookedTransformer`` (3.x; gone in 4.0)."""
    try:
        from transformer_lens import HookedTransformer  # noqa: F401
    except ImportError:
        return False
    return True


def default_backend() -> str:
    """``$SITELENS_BACKEND`` if set, else ``"hooked"`` on TransformerLens 3.x, else ``"bridge"``."""
    env = os.environ.get(BACKEND_ENV, "").strip().lower()
    if env:
        if env not in BACKENDS:
            raise ModelError(
                f"{BACKEND_ENV}={env!r} is not a backend; use one of {', '.join(BACKENDS)}."
            )
        return env
    return "hooked" if has_hooked_transformer() else "bridge"


def chosen_backend(backend: str | None) -> str:
    """``backend``, or the default backend read without importing TransformerLens (the command
    line records it in run.json before anything loads): ``$SITELENS_BACKEND`` if set, else
    ``"hooked"`` where the installed transformer-lens distribution is 3.x, else ``"bridge"``.
    It agrees with :func:`default_backend` wherever TransformerLens imports."""
    if backend is not None:
        return backend
    env = os.environ.get(BACKEND_ENV, "").strip().lower()
    if env:
        return env
    import importlib.metadata as md

    try:
        major = int(md.version("transformer-lens").split(".")[0])
    except (md.PackageNotFoundError, ValueError):
        return default_backend()
    return "hooked" if major < 4 else "bridge"


def resolve_backend(backend: str | None) -> str:
    """``backend``, or :func:`default_backend` for ``None``; :class:`ModelError` for an unknown
    backend or ``"hooked"`` on a TransformerLens without ``HookedTransformer``."""
    backend = default_backend() if backend is None else backend
    if backend not in BACKENDS:
        raise ModelError(f"Unknown backend {backend!r}; use one of {', '.join(BACKENDS)}.")
    if backend == "hooked" and not has_hooked_transformer():
        import importlib.metadata as md

        raise ModelError(
            "backend='hooked' needs HookedTransformer, which TransformerLens "
            f"{md.version('transformer-lens')} no longer has. Use backend='bridge' (or "
            f"{BACKEND_ENV}=bridge), or install 'transformer-lens>=3.9,<4'."
        )
    return backend


@dataclass(frozen=True)
class LoadSpec:
    """Where and how every model of a run loads: :func:`~sitelens.models.load.load_model`'s
    ``device``, ``dtype``, ``n_devices``, ``device_map`` and ``backend`` as one picklable value.

    ``None`` leaves a field to :func:`~sitelens.models.load.load_model`'s default (float32, where
    the model loads, one device, no device map). ``backend`` defaults to :func:`default_backend`,
    read when the spec is made, so a spec made in the driver carries its backend to every worker.
    The CLI makes one from ``--device``, ``--dtype``, ``--n-devices`` and ``--device-map``; the
    runners (``run_bench``, ``make_figures``, ``refit_atlas``) take it as ``load=`` and hand it to
    their cells, whose workers load with it (:func:`sitelens.pipelines.executors.cached_model`).
    """

    device: str | torch.device | None = None
    dtype: str | torch.dtype | None = None
    n_devices: int | None = None
    device_map: str | dict | None = None
    backend: str | None = field(default_factory=default_backend)

    def __hash__(self) -> int:  # a dict device_map is not hashable; its repr is
        return hash(repr(self))


__all__ = ["BACKENDS", "BACKEND_ENV", "LoadSpec", "chosen_backend", "default_backend",
           "has_hooked_transformer", "resolve_backend"]
