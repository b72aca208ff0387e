"""The frontier as a long run (issue 43, points 5, 6 and 9): plain progress lines naming each
seed, selector, budget and resample, never a silent minute, the printed seconds those of the
table; per-part resume (a rerun does no fitting or selecting for finished parts, ``force``
redoes them); the refit's cost as whole totals beside its fractional share per row.

On the pinned tiny model and planted task of ``tests/test_frontier_pin.py`` (one seed, budgets
1, 2, 5, every selector); exact match off where it is not what is tested (it only adds time).
"""

from __future__ import annotations

import io
import re
import sys
import warnings
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from test_frontier_pin import BUDGETS, CFG, planted

import sitelens.format as fmt
import sitelens.lenses.frontier as F
from sitelens import load_task, tiny_model
from sitelens.lenses.registry import SELECTORS

FAST = replace(CFG, exact_match=False, n_bootstrap=1)
SECONDS_PER_BLOCK = 4.0  # simulated time of each block call in the fake-clock run
LIMIT = 60.0  # the longest a log may stay silent (the issue: "at least one line a minute")


@pytest.fixture(scope="module")
def model_task():
    model = tiny_model(n_layers=3, n_heads=4, d_head=8, seed=1)
    return model, planted(model, load_task("antonym"))


class Stamped(io.StringIO):
    """stderr that records each written line with the fake clock's time (not a terminal)."""

    def __init__(self, clock):
        super().__init__()
        self.clock, self.lines = clock, []

    def write(self, text):
        for line in text.splitlines():
            if line.strip():
                self.lines.append((self.clock[0], line))
        return super().write(text)


def run_on_fake_clock(model, task, monkeypatch, config=FAST):
    """The frontier with progress on a fake clock that advances SECONDS_PER_BLOCK at each block
    call (the only model work a test can time without real waiting); returns the stamped lines
    and the total simulated time."""
    clock = [0.0]
    monkeypatch.setattr(fmt, "monotonic", lambda: clock[0])
    err = Stamped(clock)
    monkeypatch.setattr(sys, "stderr", err)

    def tick(*_):
        clock[0] += SECONDS_PER_BLOCK

    handles = [b.register_forward_pre_hook(tick) for b in model.blocks]  # before the heartbeat's
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the planted task's shared-token warning: not progress
            res = F.frontier(model, task, budgets=BUDGETS, config=config, progress=True)
    finally:
        for h in handles:
            h.remove()
    return res, err.lines, clock[0]


def longest_silence(lines, end: float) -> float:
    times = [0.0, *[t for t, _ in lines], end]
    return float(np.max(np.diff(times)))


def test_no_silent_minute_and_every_stage_named(model_task, monkeypatch):
    model, task = model_task
    _, lines, end = run_on_fake_clock(model, task, monkeypatch)
    assert end > 10 * LIMIT  # the run is long enough in simulated time for silences to show
    assert longest_silence(lines, end) <= LIMIT, max(zip(np.diff([0.0, *[t for t, _ in lines]]), lines))
    text = [line for _, line in lines]
    assert not any("\r" in t for t in text)  # plain lines, no redraws
    for sel in SELECTORS:  # every selector named as it starts and ends, for the seed and the resample
        for who in ("seed 0", "resample 1 of 1"):
            starts = [t for t in text if f"{who}: selector {sel} (" in t and "budgets 1,2,5" in t]
            assert len(starts) == 1, (who, sel)
            assert sum(f"{who}: selector {sel} done in" in t for t in text) == 1, (who, sel)
    assert any("budget k = 5 reached" in t for t in text)  # greedy names each budget it reaches
    assert any("still running" in t for t in text)  # the heartbeat filled the long steps
    assert sum(t.startswith("frontier [planted]: done in") for t in text) == 1  # not twice at 100%


def test_mutation_without_the_heartbeat_a_silent_minute_is_caught(model_task, monkeypatch):
    model, task = model_task
    monkeypatch.setattr(fmt.StageLog, "beat", lambda self: None)
    _, lines, end = run_on_fake_clock(model, task, monkeypatch)
    assert longest_silence(lines, end) > LIMIT


def test_printed_seconds_are_the_table_seconds(model_task, monkeypatch, capsys):
    """Each selector's "done in X s" line states the cost the table and the printed summary carry
    for it (the same counters; alpha's with the full SITE fit)."""
    model, task = model_task
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = F.frontier(model, task, budgets=BUDGETS, config=replace(FAST, n_bootstrap=0), progress=True)
    err = capsys.readouterr().err
    for sel, d in res.summary["selectors"].items():
        m = re.search(rf"seed 0: selector {sel} done in ([0-9.]+)s \(forward (\d+), backward (\d+)", err)
        assert m, (sel, err)
        assert m.group(1) == f"{d['seconds']:.1f}", (sel, m.group(0))
        assert (int(m.group(2)), int(m.group(3))) == (d["forward_passes"], d["backward_passes"]), sel
        # no second "done in" for a selector that times only a part of it (the lens's own bar)
        assert not re.search(rf"^{sel} \[planted\]: .*done in", err, re.M), sel


def test_refit_rows_share_a_whole_joint_refit(model_task):
    """summary["refit"]: the joint refit's whole passes and the number of sets it served; each refit
    row's cost is its selector's own plus that total over the sets (the fractional part)."""
    model, task = model_task
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = F.frontier(model, task, budgets=BUDGETS, config=replace(FAST, n_bootstrap=0))
    r = res.summary["refit"]["0"]
    # distinct head sets (a set may be written in another order by another selector)
    assert r["sets"] == len({frozenset(h.split(";")) for h in res.table.heads if h}) > 1
    assert isinstance(r["forward_passes"], int) and r["forward_passes"] > 0 and r["backward_passes"] > 0
    t = res.table[res.table.heads != ""]
    a1 = t[t.injection == "alpha1"].set_index(["selector", "k"])
    rf = t[t.injection == "refit"].set_index(["selector", "k"])
    for c in ("forward_passes", "backward_passes"):
        assert np.allclose(rf[c] - a1[c], r[c] / r["sets"]), c


# ----------------------------------------------------------------------------------------------
# resume


class Calls:
    """Counts the calls of ``F.name`` and keeps their arguments (the real function still runs)."""

    def __init__(self, monkeypatch, name):
        self.n, self.args, real = 0, [], getattr(F, name)

        def counted(*a, **kw):
            self.n += 1
            self.args.append(a)
            return real(*a, **kw)

        monkeypatch.setattr(F, name, counted)


def _run(model, task, tmp_path, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return F.frontier(model, task, budgets=BUDGETS, config=FAST, resume_dir=tmp_path / "cells", **kw)


def test_resume_skips_finished_parts_and_force_redoes_them(model_task, tmp_path, monkeypatch):
    model, task = model_task
    first = _run(model, task, tmp_path)
    n_sel = len(SELECTORS) * 2  # the seed and the resample

    fits, sels, scored = (Calls(monkeypatch, n) for n in ("fit_site_counted", "select", "_score_seed"))
    again = _run(model, task, tmp_path)
    assert (fits.n, sels.n, scored.n) == (0, 0, 0)  # nothing fitted, selected or scored again
    pd.testing.assert_frame_equal(again.table, first.table)  # the stored costs too
    assert again.summary == first.summary or _same_json(again.summary, first.summary)

    # interrupted after greedy's sets of seed 0 were lost and before scoring: only those redone
    cells = tmp_path / "cells"
    greedy = [p for p in cells.glob("select-*.json") if '"selector": "greedy", "seed": 0' in p.read_text()]
    assert len(greedy) == 2 * len(BUDGETS)  # per budget (greedy is budgetwise), seed and resample
    for p in [*greedy, *cells.glob("score-*.json")]:
        p.unlink()
    part = _run(model, task, tmp_path)
    assert (fits.n, sels.n, scored.n) == (0, 2, 1)  # the fits read back, not refitted
    # every set and accuracy as before; the costs are re-measured for the redone parts (greedy
    # now pays for the valid items' prefix cache, which alpha-sparse built in the first run)
    same = [c for c in first.table.columns if c not in F.COST]
    pd.testing.assert_frame_equal(part.table[same], first.table[same])

    _run(model, task, tmp_path, force=True)
    assert (fits.n, sels.n, scored.n) == (2, 2 + n_sel, 2)


def _same_json(a, b) -> bool:
    import json

    return json.dumps(F._json_safe(a), sort_keys=True) == json.dumps(F._json_safe(b), sort_keys=True)


def _budgets_run(model, task, root, budgets):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return F.frontier(model, task, budgets=budgets, config=FAST, resume_dir=root)


def test_resume_is_per_selector_and_budget(model_task, tmp_path, monkeypatch):
    """After a run with budgets 1, 2, 5: with budgets 1, 2 every budgetwise selector reads its
    sets and runs nothing; alpha-sparse (λ chosen over the budgets) and sparse (budgets fitted
    jointly) run again. With 1, 2, 5, 6 the budgetwise selectors run budget 6 only, and every set
    equals that of a fresh run with 1, 2, 5, 6."""
    from sitelens.lenses.registry import get_selector

    model, task = model_task
    _run(model, task, tmp_path)
    across = [n for n in SELECTORS if not get_selector(n).budgetwise]
    assert set(across) == {"alpha-sparse", "sparse"}
    sels = Calls(monkeypatch, "select")
    _budgets_run(model, task, tmp_path / "cells", (1, 2))
    assert sorted(a[1] for a in sels.args) == sorted(across * 2)  # the seed and the resample

    sels = Calls(monkeypatch, "select")
    more = _budgets_run(model, task, tmp_path / "cells", (1, 2, 5, 6))
    ran = {(a[1], tuple(a[2])) for a in sels.args}
    assert ran == {(n, (6,)) for n in SELECTORS if n not in across} | {(n, (1, 2, 5, 6)) for n in across}
    fresh = _budgets_run(model, task, tmp_path / "fresh", (1, 2, 5, 6))
    cols = ["selector", "k", "injection", "heads"]
    pd.testing.assert_frame_equal(more.table[cols], fresh.table[cols])


# ----------------------------------------------------------------------------------------------
# the command line: resume, and refusals that name the options


CLI = ["frontier", "--model", "tiny-random", "--task", "antonym", "--n-examples", "8",
       "--n-mean-prompts", "4", "--n-shots", "2", "--n-prompts", "4", "--limit", "6", "--n-boot", "20",
       "--test-limit", "4", "--budgets", "1,2", "--selectors", "alpha,atp", "--no-exact-match"]


def test_cli_frontier_resumes_and_refuses_other_settings_by_option(tmp_path, monkeypatch, capsys):
    import sitelens.models
    from sitelens.cli import main

    out = tmp_path / "fr"
    argv = [*CLI, "--out", str(out)]
    assert main(argv) == 0
    first = (out / "frontier.csv").read_text()
    capsys.readouterr()
    sels, fits = Calls(monkeypatch, "select"), Calls(monkeypatch, "fit_site_counted")
    assert main(argv) == 0  # the same command: resumed, nothing fitted or selected again
    assert (sels.n, fits.n) == (0, 0) and (out / "frontier.csv").read_text() == first
    assert "done in an earlier run, skipped" in capsys.readouterr().err

    def fail(*a, **kw):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(sitelens.models, "load_model", fail)
    for change, named in ((["--protocol", "official"], "(--protocol)"),
                          (["--budgets", "1"], "(--budgets)"), (["--lr", "0.1"], "(--lr)")):
        assert main([*argv, *change]) == 2
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1 and err.startswith("sitelens: error: "), err
        assert f"made with other settings {named}" in err and "--force" in err, err
        for field in ("batch_size", "config", "eval_every", "n_valid"):
            assert field not in err, err
    assert (out / "frontier.csv").read_text() == first
