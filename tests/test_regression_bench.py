"""The regression benchmark's references and errors (sitelens.tasks.regression): ``ols-k`` fits the
very demonstrations each ICL prompt shows, and the per-item errors are regression_mse's (no model
needed)."""

from __future__ import annotations

import math

import numpy as np

from sitelens.baselines import ICL
from sitelens.tasks.regression import (
    parse_point,
    reference_predictions,
    regression_mse,
    regression_task,
    squared_errors,
    train_mean,
)


def test_ols_k_fits_the_icl_prompts_demonstrations():
    task = regression_task("relu", n_train=40, n_valid=4, n_test=6, dim=2, seed=3)
    items = task.test
    assert reference_predictions(task, items, "train-mean", 5, seed=3) == [repr(train_mean(task))] * 6
    preds = reference_predictions(task, items, "ols-k", 5, seed=3)
    prompts = ICL(n_shots=5).fit(None, task, seed=3).prompts(None, items)
    for prompt, q, pred in zip(prompts, items, preds):
        shots = prompt.split("\n\n")[:-1]  # "Q: x\nA: y" per demonstration, the query last
        X = np.array([[1.0, *parse_point(s.split("\n")[0][3:])] for s in shots])
        y = np.array([float(s.split("\n")[1][3:]) for s in shots])
        coef, *_ = np.linalg.lstsq(X, y, rcond=None)
        want = float(np.array([1.0, *parse_point(q.input)]) @ coef)
        assert len(shots) == 5 and math.isclose(float(pred), want, rel_tol=1e-12, abs_tol=1e-12)


def test_item_errors_are_regression_mse():
    preds, targets = [" 0.50", "none", "-1.00"], ["0.25", "1.00", "-0.50"]
    values, err = squared_errors(preds, targets, fallback=0.5)
    assert values == [0.5, None, -1.0]
    assert math.isclose(err.mean(), regression_mse(preds, targets, fallback=0.5).mse, rel_tol=1e-15)
