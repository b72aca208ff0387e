"""In-context regression tasks (linear and ReLU), generated from a seed, and their mean squared error.

The Linear Task Vector paper (dNTP) evaluates task vectors on in-context regression as well as on
classification, following Garg et al. (2022, "What can transformers learn in-context? A case study
of simple function classes"): each task is one function ``f: R^dim -> R`` drawn at random, and
every item is a point ``x`` with its value ``f(x)``. Here the points and values are written as
text so that the same :class:`~sitelens.tasks.Task` machinery (prompts, ICL, every method) runs
on them.

Generation (:func:`regression_task`), all from ``random.Random(seed)`` (Python's generator, whose
sequence is stable across Python versions; NumPy's ``Generator`` does not promise that):

- ``kind="linear"``: ``f(x) = w · x`` with ``w_i ~ N(0, 1/dim)`` (Garg et al.'s linear class,
  scaled so that ``Var f(x) = |w|²/3 ≈ 1/3`` whatever ``dim``);
- ``kind="relu"``: ``f(x) = Σ_k a_k · max(0, u_k · x)`` over ``hidden`` units with
  ``u_k,i ~ N(0, 1/dim)`` and ``a_k ~ N(0, 2/hidden)`` (Garg et al.'s two-layer ReLU networks,
  scaled the same way: the ReLU halves the second moment, the factor 2 restores it);
- points: ``x_i ~ U[-1, 1]``, rounded to ``decimals`` places *before* ``f`` is applied, so the
  text the model reads is exactly the point whose value is the target.

Text format (:func:`format_number`): every number with exactly ``decimals`` decimal places
(default 2), a leading ``-`` for negatives, never ``-0.00``; the input is the ``dim`` coordinates
joined by ``", "`` (``"0.42, -0.17, 0.88"``) and the output is ``f(x)`` rounded the same way
(``"-0.31"``). Why fixed decimals: every answer has the same shape (sign, integer digits, point,
``decimals`` digits), which a few demonstrations show the model; answers stay a few tokens long
for the small models; and the rounding error of a target is at most ``0.5 · 10^-decimals``
(0.005), far below any MSE worth reporting (the MSE of always answering 0 is about 1/3).

Scoring (:func:`parse_number`, :func:`regression_mse`): the first number in the first line of the
generated text; an answer without a number is counted (``n_unparsed``) and scored as if the model
had answered ``fallback`` — the benchmarks pass the mean of the task's training targets
(:func:`train_mean`), what a constant predictor fitted on the train split would answer — so an
answer without a number costs exactly what that constant baseline costs on the item: refusing to
answer never lowers the MSE (dropping such items would), and is not punished beyond the baseline.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from sitelens.errors import TaskError
from sitelens.tasks import Example, Task
from sitelens.tasks.core import sample_demos

KINDS = ("linear", "relu")
# a signed fixed-point number: "12", "-0.31", "+.5", "3." (no exponent: "1e9" parses as 1)
_NUMBER = re.compile(r"[-+\u2212]?(?:\d+(?:\.\d*)?|\.\d+)")


def format_number(value: float, decimals: int = 2) -> str:
    """``value`` with exactly ``decimals`` decimal places; a value that rounds to zero is written
    without a sign (``"0.00"``, never ``"-0.00"``)."""
    text = f"{value:.{decimals}f}"
    return text[1:] if text.startswith("-") and float(text) == 0 else text


@dataclass(frozen=True)
class RegressionFunction:
    """One drawn function: ``linear``: ``w · x``; ``relu``: ``Σ_k a_k · max(0, u_k · x)``.

    ``weights``: ``w`` (linear) or the rows ``u_k`` (relu); ``head``: ``a`` (relu; empty for
    linear)."""

    kind: str
    weights: tuple[tuple[float, ...], ...]
    head: tuple[float, ...] = field(default=())

    @property
    def dim(self) -> int:
        return len(self.weights[0])

    def __call__(self, x: Sequence[float]) -> float:
        if len(x) != self.dim:
            raise TaskError(f"A point of {len(x)} coordinates given to a {self.dim}-dimensional "
                            "regression function; give exactly dim coordinates.")
        dots = [math.fsum(w * xi for w, xi in zip(row, x)) for row in self.weights]
        if self.kind == "linear":
            return dots[0]
        return math.fsum(a * max(0.0, d) for a, d in zip(self.head, dots))


def regression_function(kind: str, dim: int, rng: random.Random, *, hidden: int = 8) -> RegressionFunction:
    """A random function of ``kind`` (module docstring: the distributions and their scaling)."""
    _check_kind(kind)
    if kind == "linear":
        return RegressionFunction("linear", (tuple(rng.gauss(0.0, 1 / math.sqrt(dim)) for _ in range(dim)),))
    rows = tuple(tuple(rng.gauss(0.0, 1 / math.sqrt(dim)) for _ in range(dim)) for _ in range(hidden))
    head = tuple(rng.gauss(0.0, math.sqrt(2 / hidden)) for _ in range(hidden))
    return RegressionFunction("relu", rows, head)


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise TaskError(f"Unknown regression kind {kind!r}; use one of {', '.join(KINDS)}.")


def _check_sizes(n_train: int, n_valid: int, n_test: int, dim: int, decimals: int, hidden: int) -> None:
    for what, n, least in (("n_train", n_train, 1), ("n_valid", n_valid, 0), ("n_test", n_test, 1),
                           ("dim", dim, 1), ("decimals", decimals, 0), ("hidden", hidden, 1)):
        if not isinstance(n, int) or isinstance(n, bool) or n < least:
            raise TaskError(f"regression_task: {what} must be an integer >= {least}, got {n!r}.")


def regression_task(
    kind: str = "linear",
    n_train: int = 256,
    n_valid: int = 64,
    n_test: int = 128,
    dim: int = 3,
    seed: int = 0,
    *,
    decimals: int = 2,
    hidden: int = 8,
) -> Task:
    """A seeded in-context regression :class:`~sitelens.tasks.Task` (module docstring: the
    function classes, the points and the text format). The same arguments give the same task;
    the function is drawn first, then ``n_train + n_valid + n_test`` distinct points (train, valid,
    test in that order; a repeated point is drawn again). The function itself:
    :func:`task_function` with the same arguments."""
    _check_kind(kind)
    _check_sizes(n_train, n_valid, n_test, dim, decimals, hidden)
    rng = random.Random(seed)
    f = regression_function(kind, dim, rng, hidden=hidden)
    items = _distinct_items(f, rng, n_train + n_valid + n_test, dim, decimals)
    train, valid, test = items[:n_train], items[n_train : n_train + n_valid], items[n_train + n_valid :]
    name = f"{kind}_regression_d{dim}_s{seed}"
    source = f"regression:kind={kind},dim={dim},seed={seed},decimals={decimals}" + (
        f",hidden={hidden}" if kind == "relu" else "")
    return Task(name, train, valid, test, source=source)


def task_function(
    kind: str = "linear", dim: int = 3, seed: int = 0, *, hidden: int = 8
) -> RegressionFunction:
    """The function behind ``regression_task(kind, ..., dim=dim, seed=seed, hidden=hidden)``."""
    return regression_function(kind, dim, random.Random(seed), hidden=hidden)


def _distinct_items(f: RegressionFunction, rng: random.Random, n: int, dim: int,
                    decimals: int) -> list[Example]:
    """``n`` items with distinct inputs (a repeated point is drawn again, so no test input is
    also a demonstration); a :class:`TaskError` when the rounded grid is too small for ``n``."""
    grid = (2 * 10**decimals + 1) ** dim  # rounded points in [-1, 1]^dim
    if n > grid // 2:
        raise TaskError(f"{n} distinct points asked for, but {dim} coordinate(s) with {decimals} "
                        f"decimals give only {grid} points; use a larger dim or more decimals, "
                        "or fewer items.")
    items: dict[str, Example] = {}
    while len(items) < n:
        ex = _item(f, rng, dim, decimals)
        items.setdefault(ex.input, ex)
    return list(items.values())


def _item(f: RegressionFunction, rng: random.Random, dim: int, decimals: int) -> Example:
    """One point, rounded to ``decimals`` places first, and the rounded value of ``f`` there."""
    coords = [format_number(rng.uniform(-1.0, 1.0), decimals) for _ in range(dim)]
    x = [float(c) for c in coords]
    return Example(", ".join(coords), format_number(f(x), decimals))


def parse_point(text: str) -> list[float]:
    """The coordinates of a regression input (``"0.42, -0.17"`` → ``[0.42, -0.17]``)."""
    return [float(part) for part in text.split(",")]


# ----------------------------------------------------------------------------------------------
# scoring


def parse_number(text: str) -> float | None:
    """The first number in the first non-empty line of ``text`` (fixed-point; a Unicode minus
    ``−`` counts as ``-``), or None when that line holds none. ``" -0.31\\n..."`` → -0.31,
    ``"about 2"`` → 2.0, ``"1e9"`` → 1.0 (no exponents), ``"n/a"`` → None."""
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    m = _NUMBER.search(line)
    if m is None:
        return None
    value = float(m.group(0).replace("\u2212", "-"))
    return value if math.isfinite(value) else None


@dataclass(frozen=True)
class RegressionScore:
    """Mean squared error over ``n`` answers, ``n_unparsed`` of which held no number and were
    scored as ``fallback``."""

    mse: float
    n: int
    n_unparsed: int
    fallback: float

    @property
    def parse_rate(self) -> float:
        return 1 - self.n_unparsed / self.n if self.n else float("nan")


def regression_mse(
    predictions: Sequence[str], targets: Sequence[str | float], *, fallback: float,
) -> RegressionScore:
    """MSE of generated answers against targets (module docstring: parsing and the fallback);
    ``fallback`` is the value an answer without a number is scored as (the benchmarks pass
    ``train_mean(task)``)."""
    if len(predictions) != len(targets):
        raise TaskError(f"{len(predictions)} predictions for {len(targets)} targets; give one "
                        "prediction per target.")
    if not math.isfinite(fallback):
        raise TaskError(f"fallback must be a finite number, got {fallback!r}.")
    errors, unparsed = [], 0
    for pred, target in zip(predictions, targets):
        value = parse_number(pred)
        if value is None:
            unparsed, value = unparsed + 1, fallback
        errors.append((value - float(target)) ** 2)
    mse = math.fsum(errors) / len(errors) if errors else float("nan")
    return RegressionScore(mse=mse, n=len(errors), n_unparsed=unparsed, fallback=float(fallback))


def train_mean(task: Task) -> float:
    """The mean of the task's training targets: the documented fallback of :func:`regression_mse`."""
    return math.fsum(float(ex.output) for ex in task.train) / len(task.train)


def squared_errors(predictions: Sequence[str], targets: Sequence[str | float],
                   fallback: float) -> tuple[list[float | None], np.ndarray]:
    """Per item: the parsed answer (None when it holds no number) and its squared error as
    :func:`regression_mse` scores it (an unparsed answer counts as ``fallback``)."""
    values = [parse_number(p) for p in predictions]
    err = np.array([((fallback if v is None else v) - float(t)) ** 2 for v, t in zip(values, targets)])
    return values, err


def reference_predictions(task: Task, items: Sequence[Example], method: str, n_shots: int,
                          seed: int) -> list[str]:
    """Answers of a model-free reference: ``"train-mean"``, the constant :func:`train_mean`;
    ``"ols-k"``, least squares with an intercept on the ``n_shots`` demonstrations the item's
    ICL prompt shows (the draw of ``ICL(n_shots=n_shots).fit(seed=seed)``; min-norm when they
    are fewer than ``1 + dim``)."""
    if method == "train-mean":
        return [repr(train_mean(task))] * len(items)
    if method != "ols-k":
        raise TaskError(f"unknown reference {method!r}; use 'train-mean' or 'ols-k'.")
    rng = random.Random(seed)
    out = []
    for q in items:
        demos = sample_demos(task.train, n_shots, rng, exclude=q.input)
        X = np.array([[1.0, *parse_point(d.input)] for d in demos])  # [k, 1 + dim]
        y = np.array([float(d.output) for d in demos])  # [k]
        coef, *_ = np.linalg.lstsq(X, y, rcond=None)
        out.append(repr(float(np.array([1.0, *parse_point(q.input)]) @ coef)))
    return out


__all__ = [
    "KINDS", "RegressionFunction", "RegressionScore", "format_number",
    "parse_number", "parse_point", "reference_predictions", "regression_function", "regression_mse",
    "regression_task", "squared_errors", "task_function", "train_mean",
]
