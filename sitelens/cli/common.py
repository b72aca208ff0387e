"""Helpers the subcommands share: torch set-up, loading the task and model, the fit options as a
``FitConfig`` (and fitting SITE with them), and rounding numbers for ``--json`` output."""

from __future__ import annotations

import sys
import time

from sitelens.cli.options import given

# FitConfig fields that are options
STAGE2 = ("lr", "n_examples", "batch_size", "sparsity", "eval_every", "n_valid", "patience", "lr_rule")


def setup_torch(args) -> None:
    """The torch threads (``--threads``, else :func:`sitelens.threads.default_threads`: the cores
    not busy with other work) and the torch seed ``--seed``; nothing for ``sitelens atlas`` from the
    committed tables, which imports no torch."""
    if args.cmd == "atlas" and not args.refit:
        return
    import torch

    from sitelens.threads import default_threads

    if hasattr(args, "threads"):
        torch.set_num_threads(args.threads or default_threads())
    torch.manual_seed(args.seed)


def load_spec(args):
    """The :class:`~sitelens.models.LoadSpec` of ``--device``, ``--dtype``, ``--n-devices``,
    ``--device-map`` and ``--backend`` (None where a command has no such option): every model the
    command loads, in this process and in its workers, loads with it."""
    from sitelens.models import LoadSpec

    return LoadSpec(device=getattr(args, "device", None), dtype=getattr(args, "dtype", None),
                    n_devices=getattr(args, "n_devices", None),
                    device_map=getattr(args, "device_map", None),
                    backend=getattr(args, "backend", None))


def load_task_and_model(args, check=None):
    """The task (already loaded by :func:`sitelens.cli.validate.validate` when it ran) and the
    model; ``check(model)`` runs before anything is printed (checks that need the model, e.g.
    k <= its heads). Prints the load time on stderr."""
    from sitelens.models import load_model
    from sitelens.tasks import load_task

    task = getattr(args, "_task", None)
    if task is None:
        task = load_task(args.task, seed=args.seed, dedupe=getattr(args, "dedupe", False))
    t0 = time.perf_counter()
    model = load_model(args.model, spec=load_spec(args))
    if check is not None:
        check(model)
    print(f"loaded {args.model} in {time.perf_counter() - t0:.1f}s; task {task}", file=sys.stderr)
    return model, task


def fit_config_from_args(args):
    """The :class:`~sitelens.site.FitConfig` of the stage-2 options of ``args`` and ``--seed``;
    with ``--protocol official``, ``FitConfig.official`` with its own defaults for the options not
    typed on the command line (batch size 1, not 8). A command without these options gets the
    defaults."""
    from sitelens.site.config import FitConfig

    official = getattr(args, "protocol", None) == "official"
    typed = given(args)
    kw = {name: getattr(args, name) for name in STAGE2
          if hasattr(args, name) and (not official or name in typed)}
    return (FitConfig.official if official else FitConfig)(**kw, seed=args.seed)


def fit_from_args(model, task, args, progress=True):
    """:func:`sitelens.site.fit_site` with the fit options of ``args``
    (:func:`fit_config_from_args`; stage 1's ``--n-prompts`` and ``--n-shots`` where the command
    has them, else ``fit_site``'s defaults)."""
    from sitelens.site import fit_site

    stage1 = {name: getattr(args, name) for name in ("n_prompts", "n_shots") if hasattr(args, name)}
    return fit_site(model, task, config=fit_config_from_args(args), progress=progress, **stage1)


def adapter_or_fit(model, task, args):
    """The ``--adapter`` directory's adapter (checked against ``model``), or SITE fitted on
    ``task`` with the fit options, saved to ``--save-adapter DIR`` when given (right after the
    fit, before the work that uses it)."""
    from sitelens.site import SiteAdapter

    if getattr(args, "adapter", None):
        adapter = SiteAdapter.load(args.adapter)
        adapter.check_model(model)
        return adapter
    keep = getattr(args, "save_adapter", None)
    print(f"fitting SITE on {task.name}" + ("" if keep else
          " (not kept: pass --save-adapter DIR to keep it and reuse it with --adapter DIR)"),
          file=sys.stderr)
    adapter = fit_from_args(model, task, args)
    if keep:
        adapter.save(keep)
        print(f"saved the fitted adapter to {keep} (reuse it with --adapter {keep})", file=sys.stderr)
    return adapter


def saturation_notice(alpha, k: int, what: str | None = None) -> bool:
    """Print one line ``note: α is saturated: ...`` on stderr when more than ``k`` heads of
    ``alpha`` exceed 0.95 (:func:`sitelens.site.alpha_saturation`: the top-``k`` by α is then a
    pick among near-ties); returns whether it did."""
    from sitelens.site import alpha_saturation

    sat = alpha_saturation(alpha, k)
    if sat.saturated:
        print(f"note: {sat.message(what)}", file=sys.stderr)
    return sat.saturated


def top_heads_line(adapter, n: int = 8) -> str:
    """``L{l}H{h}=α, ...`` for the ``n`` highest-α heads of ``adapter``, after a one-line notice
    on stderr if α is saturated for a top-``n`` (:func:`saturation_notice`)."""
    saturation_notice(adapter.alpha, n)
    return ", ".join(f"L{layer}H{h}={a:.2f}" for layer, h, a in adapter.top_heads(n, warn=False))
