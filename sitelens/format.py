"""Numbers for people and for JSON: the one place that rounds and formats them.

- :func:`round_or_none` / :func:`round_values`: a float rounded to a number of decimals for JSON
  summaries, payloads and ``--json`` output; ``None`` where the value is NaN or infinite, since
  JSON has neither (``json.dumps`` would write the non-standard ``NaN`` / ``Infinity``).
- :func:`round_sig_or_none`: the same to a number of *significant* digits, for values that span
  many scales (head-importance scores).
- :func:`fmt_float` / :func:`fmt_int`: a cell of a markdown or HTML table; a missing value (``None``
  or NaN) is one dash, so a column of numbers stays readable.

A leaf module: the standard library only, importable from anywhere in sitelens.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

MISSING = "–"  # an en dash: a missing value in a table


def round_or_none(x, digits: int = 4):
    """``x`` as a float rounded to ``digits`` decimals; ``None`` if it is NaN, infinite or
    ``None``; returned unchanged if it is not a number."""
    try:
        x = float(x)
    except (TypeError, ValueError):
        return x
    return None if not math.isfinite(x) else round(x, digits)


def round_values(numbers: Mapping, digits: int = 4) -> dict:
    """:func:`round_or_none` of every value of ``numbers``, keys and order kept."""
    return {k: round_or_none(v, digits) for k, v in numbers.items()}


def round_sig_or_none(x, digits: int = 4) -> float | None:
    """``x`` as a float to ``digits`` significant digits (``-0.0`` written as ``0.0``); ``None``
    if it is NaN or infinite."""
    x = float(x)
    return None if not math.isfinite(x) else float(f"{x:.{digits}g}") + 0.0


def fmt_float(x, digits: int = 3, missing: str = MISSING) -> str:
    """``x`` with ``digits`` decimals, or ``missing`` for ``None`` and NaN."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return missing
    return f"{x:.{digits}f}"


def fmt_int(x, missing: str = MISSING) -> str:
    """``x`` rounded to an integer with thousands separators (``12,345``), or ``missing`` for
    ``None`` and NaN."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return missing
    return f"{int(round(x)):,}"


__all__ = ["MISSING", "fmt_float", "fmt_int", "round_or_none", "round_sig_or_none", "round_values"]
