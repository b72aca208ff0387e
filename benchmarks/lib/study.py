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


def heads_total(model: str) -> int:
    """N = n_layers · n_heads of a study model (its bundled record, or the tiny smoke model's
    config), the population the chance level of a set overlap is taken over."""
    from sitelens.models.registry import BUNDLED, TINY_MODELS

    if model in BUNDLED:
        return BUNDLED[model].n_layers * BUNDLED[model].n_heads
    if model in TINY_MODELS:
        from sitelens.testing import tiny_model

        cfg = tiny_model(**TINY_MODELS[model]).cfg
        return cfg.n_layers * cfg.n_heads
    raise ValueError(f"{model!r} is not a study model ({', '.join(BUNDLED)} or a tiny test model)")
