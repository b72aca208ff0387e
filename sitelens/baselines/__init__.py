"""Baselines for SITE behind one interface: ``Method.fit(model, task, *, seed=0) -> Fitted``.

========== ======================================= ============ ===================================
name       what                                    scope        trainable parameters
========== ======================================= ============ ===================================
zero-shot  the query alone                         none         0
icl        k-shot prompt (``prompt_fn``)           none         0
site       α-mix toward the task embedding         prefill      n_layers · n_heads
fv         Σ top-10 causal heads' mean out → resid prefill      0 (d_model stored)
tv         mean few-shot state replaces layer ℓ    prefill      0 (d_model stored)
ltv        ridge W*: h ← h + W* h, final block     prefill      d_model²
ltv-valid  ltv, λ (Gram units) chosen on valid     prefill      d_model²
sv         state vector z → heads of first layers  prefill      0 (depth · n_heads · d_head stored)
mtv        REINFORCE binary head mask, mean z      prefill      n_layers · n_heads
i2cl       λ, β per layer × {attn, mlp}            all          4 · n_layers
lora       rank-r q/v updates                      all          n_layers · r · (2 d_model + …)
ia3        rescale k, v, MLP activations           all          n_layers · (2 n_kv d_head + d_mlp)
========== ======================================= ============ ===================================

``prefill``: the hooks act at the last prompt token on the forward pass that sees the whole prompt,
never on KV-cached decode steps. ``all``: every position of every forward pass, decode steps
included (see :mod:`sitelens.baselines.base`).
"""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING

from sitelens.errors import MethodError
from sitelens.lazy import lazy_names, resolve

if TYPE_CHECKING:  # for type checkers; at run time each name is imported on first access
    from sitelens.baselines.base import FitParts, Fitted, HookIntervention, Method
    from sitelens.baselines.fv import FV, function_vector, head_outputs
    from sitelens.baselines.i2cl import I2CL
    from sitelens.baselines.ia3 import IA3
    from sitelens.baselines.icl import ICL
    from sitelens.baselines.lora import LoRA
    from sitelens.baselines.ltv import LTV, ridge_closed_form
    from sitelens.baselines.ltv_valid import LTVValid
    from sitelens.baselines.mtv import MTV
    from sitelens.baselines.site import SITE
    from sitelens.baselines.sv import SV
    from sitelens.baselines.tv import TV
    from sitelens.baselines.zero_shot import ZeroShot

# The one list of methods: registry name -> its class as "package.module:Class", imported when the
# method is first asked for (so this list, and the command line's choices, import no tensor library)
METHOD_CLASSES: dict[str, str] = {
    "zero-shot": "sitelens.baselines.zero_shot:ZeroShot",
    "icl": "sitelens.baselines.icl:ICL",
    "site": "sitelens.baselines.site:SITE",
    "fv": "sitelens.baselines.fv:FV",
    "tv": "sitelens.baselines.tv:TV",
    "ltv": "sitelens.baselines.ltv:LTV",
    "ltv-valid": "sitelens.baselines.ltv_valid:LTVValid",
    "sv": "sitelens.baselines.sv:SV",
    "mtv": "sitelens.baselines.mtv:MTV",
    "i2cl": "sitelens.baselines.i2cl:I2CL",
    "lora": "sitelens.baselines.lora:LoRA",
    "ia3": "sitelens.baselines.ia3:IA3",
}


def available_methods() -> list[str]:
    return list(METHOD_CLASSES)


def get_method(method: str | Method, /, **kwargs) -> Method:
    """A method instance by registry name (``get_method("lora", rank=4, name="lora-r4")``);
    instances pass through."""
    from sitelens.baselines.base import Method

    if isinstance(method, Method):
        if kwargs:
            raise MethodError(
                f"Keyword arguments are only accepted with a method name, not with the instance "
                f"{method.name!r}; configure the instance itself."
            )
        return method
    try:
        ref = METHOD_CLASSES[method]
    except (KeyError, TypeError):  # TypeError: an unhashable "name"
        close = difflib.get_close_matches(str(method), list(METHOD_CLASSES), n=3, cutoff=0.5)
        raise MethodError(
            f"Unknown method {method!r}; available: {', '.join(METHOD_CLASSES)}."
            + (f" Did you mean: {', '.join(close)}?" if close else "")
        ) from None
    return resolve(ref)(**kwargs)


# name -> the module that defines it (PEP 562: imported when first used)
__getattr__, __dir__ = lazy_names(__name__, {
    "sitelens.baselines.base": ("FitParts", "Fitted", "HookIntervention", "Method"),
    "sitelens.baselines.fv": ("FV", "function_vector", "head_outputs"),
    "sitelens.baselines.i2cl": ("I2CL",),
    "sitelens.baselines.ia3": ("IA3",),
    "sitelens.baselines.icl": ("ICL",),
    "sitelens.baselines.lora": ("LoRA",),
    "sitelens.baselines.ltv": ("LTV", "ridge_closed_form"),
    "sitelens.baselines.ltv_valid": ("LTVValid",),
    "sitelens.baselines.mtv": ("MTV",),
    "sitelens.baselines.site": ("SITE",),
    "sitelens.baselines.sv": ("SV",),
    "sitelens.baselines.tv": ("TV",),
    "sitelens.baselines.zero_shot": ("ZeroShot",),
})

__all__ = [
    "FV", "I2CL", "IA3", "ICL", "LTV", "METHOD_CLASSES", "MTV", "SITE", "SV", "TV",
    "FitParts", "Fitted", "HookIntervention", "LTVValid", "LoRA", "Method", "ZeroShot", "available_methods",
    "function_vector", "get_method", "head_outputs", "ridge_closed_form",
]
