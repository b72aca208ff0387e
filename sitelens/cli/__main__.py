"""``python -m sitelens.cli``: the same as the ``sitelens`` console script."""

from sitelens.cli import entry

entry()
