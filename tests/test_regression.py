"""In-context regression tasks: seeded generation, the text format, targets that follow the drawn
function exactly, and the MSE scorer's parsing and fallback (no model needed)."""

from __future__ import annotations

import math
import re

import pytest

from sitelens.errors import TaskError
from sitelens.tasks.regression import (
    format_number,
    parse_number,
    parse_point,
    regression_mse,
    regression_task,
    task_function,
    train_mean,
)

FIXED_2 = re.compile(r"^-?\d+\.\d{2}$")  # the documented format: fixed point, two decimals


def _pairs(task):
    return [(ex.input, ex.output) for split in (task.train, task.valid, task.test) for ex in split]


@pytest.mark.parametrize("kind", ["linear", "relu"])
def test_same_seed_same_task_and_sizes(kind):
    a = regression_task(kind, n_train=20, n_valid=5, n_test=7, dim=3, seed=4)
    b = regression_task(kind, n_train=20, n_valid=5, n_test=7, dim=3, seed=4)
    assert _pairs(a) == _pairs(b) and a.name == b.name
    assert (len(a.train), len(a.valid), len(a.test)) == (20, 5, 7)


@pytest.mark.parametrize("kind", ["linear", "relu"])
def test_different_seeds_differ(kind):
    a = regression_task(kind, n_train=20, n_valid=5, n_test=7, dim=3, seed=0)
    b = regression_task(kind, n_train=20, n_valid=5, n_test=7, dim=3, seed=1)
    assert _pairs(a) != _pairs(b) and a.name != b.name
    assert task_function(kind, dim=3, seed=0) != task_function(kind, dim=3, seed=1)


@pytest.mark.parametrize("kind", ["linear", "relu"])
def test_targets_follow_the_generating_function_exactly(kind):
    task = regression_task(kind, n_train=40, n_valid=10, n_test=20, dim=4, seed=7)
    f = task_function(kind, dim=4, seed=7)
    for x, y in _pairs(task):
        point = parse_point(x)
        assert len(point) == 4 and all(-1.0 <= v <= 1.0 for v in point)
        assert y == format_number(f(point), 2)  # the rounded point is the one f is applied to


def test_linear_function_is_linear_and_relu_is_not():
    f = task_function("linear", dim=3, seed=2)
    x, z = [0.1, -0.4, 0.7], [-0.3, 0.2, 0.5]
    assert math.isclose(f([a + b for a, b in zip(x, z)]), f(x) + f(z), abs_tol=1e-12)
    assert math.isclose(f([2 * a for a in x]), 2 * f(x), abs_tol=1e-12)
    g = task_function("relu", dim=3, seed=2)
    assert g([0.0, 0.0, 0.0]) == 0.0
    # positively homogeneous (ReLU(c·t) = c·ReLU(t) for c > 0) but not odd: f(−x) ≠ −f(x) somewhere
    assert math.isclose(g([2 * a for a in x]), 2 * g(x), abs_tol=1e-12)
    points = [[0.1 * i - 0.5, 0.3 - 0.05 * i, 0.02 * i] for i in range(10)]
    assert any(not math.isclose(g([-a for a in p]), -g(p), abs_tol=1e-9) for p in points)


def test_text_format_and_distinct_inputs():
    task = regression_task("linear", n_train=60, n_valid=10, n_test=30, dim=2, seed=0)
    inputs = [x for x, _ in _pairs(task)]
    assert len(set(inputs)) == len(inputs)  # no test input is also a demonstration
    for x, y in _pairs(task):
        assert all(FIXED_2.match(c) for c in x.split(", ")) and FIXED_2.match(y), (x, y)
        assert y != "-0.00" and "-0.00" not in x.split(", ")
    assert format_number(-0.004) == "0.00" and format_number(-0.006) == "-0.01"
    assert format_number(1.5, 0) == "2" and format_number(0.125, 3) == "0.125"


def test_bad_arguments_name_the_fix():
    with pytest.raises(TaskError, match="linear, relu"):
        regression_task("quadratic")
    with pytest.raises(TaskError, match="n_test must be an integer >= 1"):
        regression_task("linear", n_test=0)
    with pytest.raises(TaskError, match="larger dim or more decimals"):
        regression_task("linear", n_train=200, n_valid=10, n_test=10, dim=1, decimals=1)


@pytest.mark.parametrize("text, value", [
    (" -0.31", -0.31), ("0.42\nQ: 1, 2", 0.42), ("\n\n  1.50 apples", 1.5), ("about 2", 2.0),
    ("+.5", 0.5), ("3.", 3.0), ("\u22120.25", -0.25), ("1e9", 1.0), ("x = -12.125;", -12.125),
])
def test_parse_number(text, value):
    assert parse_number(text) == value


@pytest.mark.parametrize("text", ["", "   ", "n/a", "-", ".", "\nnone\n0.5"])
def test_parse_number_without_a_number(text):
    assert parse_number(text) is None  # "\nnone\n0.5": only the first non-empty line counts


def test_mse_with_unparseable_answers_uses_the_fallback():
    score = regression_mse([" 0.50", "no idea", "-1.00\n2"], ["0.25", "1.00", "-0.50"], fallback=0.5)
    # (0.5 − 0.25)² + (0.5 − 1)² [fallback] + (−1 + 0.5)², over 3
    assert math.isclose(score.mse, (0.0625 + 0.25 + 0.25) / 3, rel_tol=1e-15)
    assert (score.n, score.n_unparsed, score.fallback) == (3, 1, 0.5)
    assert math.isclose(score.parse_rate, 2 / 3)


def test_mse_fallback_is_the_train_mean_baseline():
    task = regression_task("linear", n_train=30, n_valid=5, n_test=10, dim=3, seed=3)
    mean = train_mean(task)
    targets = [ex.output for ex in task.test]
    refused = regression_mse(["?"] * len(targets), targets, fallback=mean)
    constant = regression_mse([f"{mean:.17f}"] * len(targets), targets, fallback=0.0)
    assert refused.n_unparsed == len(targets) and constant.n_unparsed == 0
    assert math.isclose(refused.mse, constant.mse, rel_tol=1e-12)  # refusing = the constant baseline


def test_mse_checks_its_input():
    with pytest.raises(TaskError, match="one prediction per target"):
        regression_mse(["1"], ["1", "2"], fallback=0.0)
    with pytest.raises(TaskError, match="finite"):
        regression_mse(["1"], ["1"], fallback=float("nan"))
    empty = regression_mse([], [], fallback=0.0)
    assert empty.n == 0 and math.isnan(empty.mse)


def test_evaluate_then_mse_on_a_tiny_model():
    """The tasks run through evaluate() like any other (numbers are an open range: no label
    ranking), and its predictions score with regression_mse. The tiny random model writes no number
    (its answers score as the fallback), so answers as a model that writes numbers would give them
    are scored next to its own: each counts as the first number of its first line, one as the
    fallback."""
    from sitelens.eval.evaluation import evaluate
    from sitelens.testing import tiny_model

    task = regression_task("relu", n_train=12, n_valid=3, n_test=4, dim=2, seed=0)
    df = evaluate(tiny_model(), task, methods=["zero-shot", "icl"], n_shots=3, limit=4)
    assert "chance" not in df.columns and len(df) == 8
    fallback = train_mean(task)
    written = [" 0.40\nQ: 0.1, 0.2", "about \u22120.25 or so", "\n 0.5, 0.41", "no idea"]
    read = [0.40, -0.25, 0.5, fallback]  # by hand: first number of the first non-empty line
    for _, g in df.groupby("method"):
        targets = [float(t) for t in g["target"]]
        values = [parse_number(p) for p in g["prediction"]]
        score = regression_mse(g["prediction"].tolist(), g["target"].tolist(), fallback=fallback)
        want = math.fsum(((fallback if v is None else v) - t) ** 2 for v, t in zip(values, targets)) / 4
        assert score.n == 4 and score.n_unparsed == sum(v is None for v in values)
        assert math.isclose(score.mse, want, rel_tol=1e-12), "the model's MSE vs the sum by hand"
        score = regression_mse(written, g["target"].tolist(), fallback=fallback)
        assert (score.n, score.n_unparsed) == (4, 1)
        want = math.fsum((v - t) ** 2 for v, t in zip(read, targets)) / 4
        assert math.isclose(score.mse, want, rel_tol=1e-12), (
            "the written answers' MSE vs the numbers read by hand")
