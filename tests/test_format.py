"""sitelens.format: the one rounding and formatting module (JSON numbers, table cells)."""

import math

import numpy as np
import pytest
import torch

from sitelens.format import fmt_float, fmt_int, round_or_none, round_sig_or_none, round_values


@pytest.mark.parametrize("x, want", [
    (0.123456, 0.1235), (np.float32(0.5), 0.5), (torch.tensor(0.25), 0.25), (3, 3.0),
    (float("nan"), None), (float("inf"), None), (-math.inf, None), (None, None), ("abc", "abc"),
])
def test_round_or_none(x, want):
    assert round_or_none(x) == want
    assert round_or_none(1.23456, 1) == 1.2


def test_round_values_keeps_keys_and_order():
    assert round_values({"b": 0.123456, "a": float("nan")}) == {"b": 0.1235, "a": None}
    assert list(round_values({"b": 1, "a": 2})) == ["b", "a"]


def test_round_sig_or_none():
    assert round_sig_or_none(123456.7) == 123500.0
    assert round_sig_or_none(0.000123456) == 0.0001235
    assert str(round_sig_or_none(-0.0)) == "0.0"  # no -0.0 in JSON
    assert round_sig_or_none(float("nan")) is None


def test_table_cells():
    assert fmt_float(0.5) == "0.500" and fmt_float(0.5, 1) == "0.5"
    assert fmt_float(None) == "–" and fmt_float(float("nan")) == "–"
    assert fmt_float(None, missing="—") == "—"
    assert fmt_int(12345.4) == "12,345" and fmt_int(None) == "–" and fmt_int(float("nan")) == "–"
