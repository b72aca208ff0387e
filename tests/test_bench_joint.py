"""``run_bench(joint=K)``: the SITE cells of K tasks fitted in one joint run
(:meth:`sitelens.baselines.SITE.fit_tasks`, :func:`sitelens.site.joint.fit_site_tasks`) give the rows
of the one-task fits, keyed apart, resumed like any row, on a tiny random model, both backends.

Metrics: exact match and first-token accuracy are compared exactly (a joint fit's α differs from
the one-task α by at most ~5e-7, tests/test_joint_tasks.py, far from flipping a greedy token of 4
items); dNTP to ``DNTP_ATOL`` = 1e-4: a KL over the tiny model's vocabulary at one position, whose
inputs move by that α difference times an embedding of order 1 and stage 1's pooled batches
(another padding, ~1e-7 relative), so a few 1e-6 at most. Giving every task the first task's
adapter (the broken variant below) moves dNTP by more than 1e-2."""

from __future__ import annotations

import json

import pytest

from sitelens import FitConfig
from sitelens.baselines import SITE
from sitelens.errors import FitError
from sitelens.pipelines import bench

NAMES = ["antonym", "choose_first_of_3", "present_past"]
SMALL = SITE(n_prompts=4, n_shots=2, config=FitConfig(n_examples=80, n_valid=8, eval_every=5))
GRID = dict(limit=4, n_shots=2)
DNTP_ATOL = 1e-4  # see the module docstring


class Calls:
    """Counts SITE's one-task fits and joint fits (and passes them on)."""

    def __init__(self, monkeypatch):
        self.fit, self.joint = 0, []
        fit, fit_tasks = SITE.fit, SITE.fit_tasks

        def counted_fit(method, *a, **kw):
            self.fit += 1
            return fit(method, *a, **kw)

        def counted_joint(method, model, tasks, **kw):
            self.joint.append(len(tasks))
            return fit_tasks(method, model, tasks, **kw)

        monkeypatch.setattr(SITE, "fit", counted_fit)
        monkeypatch.setattr(SITE, "fit_tasks", counted_joint)


def site_rows(df):
    return df[df.method == "site"].set_index("task").loc[NAMES]


@pytest.fixture(scope="module")
def alone(tiny_mha, tmp_path_factory):
    out = tmp_path_factory.mktemp("alone") / "bench.csv"
    return bench.run_bench([tiny_mha], NAMES, ["zero-shot", SMALL], out, **GRID)


def test_joint_rows_equal_one_task_rows(tiny_mha, alone, tmp_path, monkeypatch):
    calls = Calls(monkeypatch)
    joint = bench.run_bench([tiny_mha], NAMES, ["zero-shot", SMALL], tmp_path / "b.csv", **GRID, joint=3)
    assert calls.joint == [3] and calls.fit == 0  # one joint run, no one-task fit
    assert not joint["error"].str.len().any()
    a, j = site_rows(alone), site_rows(joint)
    assert (a.exact_match.to_numpy() == j.exact_match.to_numpy()).all()
    assert (a.first_token_acc.to_numpy() == j.first_token_acc.to_numpy()).all()
    assert j.dntp.to_numpy() == pytest.approx(a.dntp.to_numpy(), rel=0, abs=DNTP_ATOL)
    assert a.dntp.nunique() == 3  # three different fits: a mixed-up row could not pass
    # keyed apart: the joint rows say so, the zero-shot cells are the same cells
    assert all(json.loads(p).get("joint") is True for p in j.method_params)
    assert not any("joint" in json.loads(p) for p in a.method_params)
    assert set(a.key).isdisjoint(j.key)
    zs = lambda df: set(df[df.method == "zero-shot"].key)  # noqa: E731
    assert zs(alone) == zs(joint)
    assert j.fit_seconds.nunique() == 1  # an even share of the joint run each


def test_joint_groups_and_resume(tiny_mha, tmp_path, monkeypatch):
    calls = Calls(monkeypatch)
    out = tmp_path / "b.csv"
    first = bench.run_bench([tiny_mha], NAMES, [SMALL], out, **GRID, joint=2)
    assert calls.joint == [2, 1]  # groups of at most K tasks, in order
    again = bench.run_bench([tiny_mha], NAMES, [SMALL], out, **GRID, joint=3)
    assert calls.joint == [2, 1] and calls.fit == 0  # the group size is not in the key: all reused
    assert list(again.key) == list(first.key)


def test_mutation_one_adapter_for_every_task_is_caught(tiny_mha, alone, tmp_path, monkeypatch):
    fit_tasks = SITE.fit_tasks
    monkeypatch.setattr(SITE, "fit_tasks", lambda m, model, tasks, **kw: [fit_tasks(m, model, tasks, **kw)[0]]
                        * len(tasks))
    joint = bench.run_bench([tiny_mha], NAMES, [SMALL], tmp_path / "b.csv", **GRID, joint=3)
    moved = abs(site_rows(joint).dntp.to_numpy() - site_rows(alone).dntp.to_numpy()).max()
    assert moved > 100 * DNTP_ATOL  # the tolerance of the real test rejects it by two orders


def test_failed_joint_fit_fits_each_task_alone(tiny_mha, alone, tmp_path, monkeypatch):
    calls = Calls(monkeypatch)

    def fails(*a, **kw):
        calls.joint.append("failed")
        raise FitError("no joint fit here")

    monkeypatch.setattr(SITE, "fit_tasks", fails)
    with pytest.warns(UserWarning, match="joint fit of site on 3 tasks failed .*no joint fit here"):
        joint = bench.run_bench([tiny_mha], NAMES, [SMALL], tmp_path / "b.csv", **GRID, joint=3)
    assert calls.joint == ["failed"] and calls.fit == 3
    assert not joint["error"].str.len().any()
    assert (site_rows(joint).exact_match.to_numpy() == site_rows(alone).exact_match.to_numpy()).all()


def test_methods_that_do_not_fit_jointly_are_untouched(tiny_mha, tmp_path):
    df = bench.run_bench([tiny_mha], NAMES[:2], ["zero-shot"], tmp_path / "b.csv", **GRID, joint=2)
    plain = bench.run_bench([tiny_mha], NAMES[:2], ["zero-shot"], tmp_path / "c.csv", **GRID)
    assert list(df.key) == list(plain.key)  # no "joint" in their keys
