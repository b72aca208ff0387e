"""One small exception hierarchy. Every message names the problem and the fix."""

from __future__ import annotations


class SitelensError(Exception):
    """Base class of every error sitelens raises on bad input."""


class ModelError(SitelensError, ValueError):
    """Unknown model name, missing model package, or a model sitelens cannot adapt."""


class TaskError(SitelensError, ValueError):
    """Unknown task, malformed task file, bad items, or too few items for the request."""


class PromptTooLongError(SitelensError, ValueError):
    """A prompt does not fit the model's context."""


class TokenizationError(SitelensError, ValueError):
    """An answer tokenizes to nothing."""


class AdapterError(SitelensError, ValueError):
    """An adapter that does not match the model/template, or a corrupted adapter file."""


class FitError(SitelensError, RuntimeError):
    """Fitting failed (e.g. a non-finite loss)."""


class OutputError(SitelensError, OSError):
    """An output location that cannot be written."""


class MethodError(SitelensError, ValueError):
    """An unknown method name (``sitelens.baselines.get_method``, the CLI's ``--methods``)."""


class LensError(SitelensError, ValueError):
    """An unknown lens name (``sitelens.lenses.get_lens``, the CLI's ``--lenses``)."""


class UsageError(SitelensError, ValueError):
    """A bad command-line option: missing, malformed or out of range."""


class ExecutorError(SitelensError, RuntimeError):
    """A sweep executor that cannot run: a bad ``--executor`` value, Ray not installed or not
    reachable, a cell whose worker kept dying (:mod:`sitelens.pipelines.executors`)."""
