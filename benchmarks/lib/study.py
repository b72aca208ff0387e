"""The one-model, one-task studies' shared options and model: ``--model``, ``--task`` and
``--tiny`` (a tiny random model, for trying a study, never a benchmark)."""

from __future__ import annotations


def add_model_task_arguments(p) -> None:
    from sitelens.models import DEFAULT_MODEL

    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--task", default="antonym")
    p.add_argument("--tiny", action="store_true", help="tiny random model (not a benchmark)")


def study_model(args):
    """The model ``args`` name: a 2-layer, 4-head tiny random model under ``--tiny``."""
    from sitelens.models import load_model
    from sitelens.testing import tiny_model

    return tiny_model(n_layers=2, n_heads=4, d_head=8) if args.tiny else load_model(args.model)
