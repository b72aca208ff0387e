"""``sitelens run`` (issue 33, item 1): one model load, the files of ``fit`` and ``eval``, resumed.

On the tiny random model, a few items: the adapter ``run`` writes equals the one ``fit`` writes
with the same seed (α and the embedding bit for bit, the same hyperparameters), its ``eval.json``
and ``items.csv`` equal what ``eval --json`` prints and ``eval --items`` writes (all but the
timing columns); a second run refits nothing, evaluates nothing and loads no model; a part made
with other settings is refused before any model loads unless ``--force``, which redoes only that
part. Bad input is in tests/test_cli_bad_input.py and tests/test_light_imports.py.
"""

from __future__ import annotations

import importlib
import json

import pandas as pd
import pytest
import torch

import sitelens.models
import sitelens.site.adapter as adapter_module
from sitelens.cli import main
from sitelens.site import SiteAdapter

TINY = ["--model", "tiny-random", "--task", "antonym"]
FIT = ["--n-prompts", "2", "--n-shots", "2", "--n-examples", "8"]
RUN = ["run", *TINY, *FIT, "--limit", "6"]
evaluate_module = importlib.import_module("sitelens.eval.evaluation")  # the module, not the function
TIMING = "seconds_per_item"  # wall-clock: the one thing two runs may not share
ITEMS_TIMING = "method_seconds_per_item"  # the same in items.csv: the method's mean, not the item's


class Counter:
    """Counts the calls of ``module.name`` (the real function still runs)."""

    def __init__(self, monkeypatch, module, name):
        self.calls, real = 0, getattr(module, name)

        def counted(*a, **kw):
            self.calls += 1
            return real(*a, **kw)

        monkeypatch.setattr(module, name, counted)


def _no_load(monkeypatch):
    def fail(*a, **kw):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(sitelens.models, "load_model", fail)


def _without_timing(summary: dict) -> dict:
    return {m: {k: v for k, v in row.items() if k != TIMING} for m, row in summary.items()}


@pytest.fixture
def done(tmp_path, capsys):
    """A finished run in ``tmp_path/r`` (its stdout and stderr read)."""
    out = tmp_path / "r"
    assert main([*RUN, "--out", str(out)]) == 0
    capsys.readouterr()
    return out


def test_run_writes_what_fit_and_eval_write(done, tmp_path, capsys):
    fitted = tmp_path / "fit"
    assert main(["fit", *TINY, *FIT, "--out", str(fitted)]) == 0
    capsys.readouterr()
    items = tmp_path / "items.csv"
    assert main(["eval", *TINY, "--n-shots", "2", "--limit", "6", "--adapter", str(fitted),
                 "--json", "--items", str(items)]) == 0
    printed = json.loads(capsys.readouterr().out)
    a, b = SiteAdapter.load(done / "adapter"), SiteAdapter.load(fitted)
    assert torch.equal(a.alpha, b.alpha) and torch.equal(a.embedding, b.embedding)  # exact
    for key in ("hyperparameters", "model", "fingerprint", "task", "template", "best_step", "data",
                "final_valid_loss"):
        assert a.meta[key] == b.meta[key], key
    written = json.loads((done / "eval.json").read_text())
    assert list(written) == ["zero-shot", "icl", "site"]
    assert _without_timing(written) == _without_timing(printed)
    ours, theirs = pd.read_csv(done / "items.csv"), pd.read_csv(items)
    pd.testing.assert_frame_equal(ours.drop(columns=[ITEMS_TIMING]), theirs.drop(columns=[ITEMS_TIMING]))


def test_a_finished_run_is_reused_without_loading_a_model(done, monkeypatch, capsys):
    fits = Counter(monkeypatch, adapter_module, "fit_alpha")
    _no_load(monkeypatch)
    before = {p.name: p.stat().st_mtime_ns for p in done.iterdir()}
    assert main([*RUN, "--out", str(done), "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out) == json.loads((done / "eval.json").read_text())
    assert "nothing to redo" in err and fits.calls == 0
    assert {p.name: p.stat().st_mtime_ns for p in done.iterdir()} == before
    assert main([*RUN, "--out", str(done)]) == 0  # the table, from items.csv
    out = capsys.readouterr().out
    assert "[low, high]" in out and "top heads by α: L" in out


def test_run_json_and_the_adapter_record_the_backend_used(done, monkeypatch, capsys):
    """Without --backend: the default this TransformerLens gives (or $SITELENS_BACKEND), in run.json
    and adapter.json alike. A run.json from before the backend was recorded (``null``) still
    resumes: it ran on the same default."""
    from sitelens.models import default_backend

    rec = json.loads((done / "run.json").read_text())
    assert rec["base"]["load"]["backend"] == default_backend()
    assert SiteAdapter.load(done / "adapter").meta["backend"] == default_backend()
    rec["base"]["load"]["backend"] = None
    (done / "run.json").write_text(json.dumps(rec))
    _no_load(monkeypatch)
    assert main([*RUN, "--out", str(done)]) == 0
    assert "nothing to redo" in capsys.readouterr().err


def test_an_unfinished_evaluation_reuses_the_adapter(done, monkeypatch, capsys):
    """The evaluation lost (as if interrupted): the adapter is reused, only the evaluation runs."""
    (done / "eval.json").unlink()
    alpha = SiteAdapter.load(done / "adapter").alpha
    fits = Counter(monkeypatch, adapter_module, "fit_alpha")
    evals = Counter(monkeypatch, evaluate_module, "evaluate")
    assert main([*RUN, "--out", str(done)]) == 0
    assert (fits.calls, evals.calls) == (0, 1)
    assert "reused the adapter" in capsys.readouterr().err
    assert torch.equal(SiteAdapter.load(done / "adapter").alpha, alpha)
    assert (done / "eval.json").exists()


@pytest.mark.parametrize("change, needle", [
    (["--limit", "5"], "an evaluation made with other settings (--limit)"),
    (["--lr", "0.1"], "an adapter fitted with other settings (--lr)"),
    (["--seed", "1"], "an adapter fitted with other settings (--seed)"),
    # the options, never the fields behind them (batch_size, config, eval_every, n_valid): the
    # official protocol's own batch size and validation are what those options would set
    (["--protocol", "official"], "an adapter fitted with other settings (--protocol, --batch-size, "
                                 "--eval-every, --n-valid)"),
], ids=["limit", "lr", "seed", "protocol"])
def test_other_settings_are_refused_before_any_model_loads(done, monkeypatch, capsys, change,
                                                           needle):
    _no_load(monkeypatch)
    before = {p.name: p.stat().st_mtime_ns for p in done.iterdir()}
    assert main([*RUN, *change, "--out", str(done)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and err.startswith("sitelens: error: ")
    assert needle in err and "--force" in err
    assert {p.name: p.stat().st_mtime_ns for p in done.iterdir()} == before


def test_an_adapter_without_a_record_is_refused(tmp_path, monkeypatch, capsys):
    """An adapter put there by ``sitelens fit`` (no run.json: its task and load are unknown)."""
    assert main(["fit", *TINY, *FIT, "--out", str(tmp_path / "r" / "adapter")]) == 0
    _no_load(monkeypatch)
    assert main([*RUN, "--out", str(tmp_path / "r")]) == 2
    assert "no run.json" in capsys.readouterr().err


def test_force_redoes_only_the_part_that_differs(done, monkeypatch, capsys):
    fits = Counter(monkeypatch, adapter_module, "fit_alpha")
    assert main([*RUN[:-1], "5", "--out", str(done), "--force"]) == 0  # --limit 5: eval only
    assert fits.calls == 0 and json.loads((done / "eval.json").read_text())["site"]["n"] == 5
    assert main([*RUN, "--lr", "0.1", "--out", str(done), "--force"]) == 0  # a new fit
    assert fits.calls == 1
    assert SiteAdapter.load(done / "adapter").meta["hyperparameters"]["lr"] == 0.1
    assert json.loads((done / "run.json").read_text())["fit"]["lr"] == 0.1


def test_mutation_a_lost_record_is_seen_as_a_refit(done, monkeypatch, capsys):
    """Break: the record of the settings unread; the run then refits (the fit counter sees it),
    so the reuse tests above, which count no fit, can fail."""
    import sitelens.cli.run as run_module

    monkeypatch.setattr(run_module, "_record", lambda out: None)
    fits = Counter(monkeypatch, adapter_module, "fit_alpha")
    assert main([*RUN, "--out", str(done), "--force"]) == 0
    assert fits.calls == 1


def test_without_site_nothing_is_fitted(tmp_path, monkeypatch, capsys):
    fits = Counter(monkeypatch, adapter_module, "fit_alpha")
    out = tmp_path / "r"
    assert main(["run", *TINY, "--methods", "zero-shot", "--limit", "3", "--out", str(out)]) == 0
    assert fits.calls == 0 and not (out / "adapter").exists()
    assert list(json.loads((out / "eval.json").read_text())) == ["zero-shot"]
    assert main(["run", *TINY, "--methods", "zero-shot", "--lr", "0.1", "--out", str(out)]) == 2
    assert "--lr applies only to the fit of the site method" in capsys.readouterr().err


def test_default_out_is_runs_model_task(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["run", *TINY, "--methods", "zero-shot", "--limit", "2"]) == 0
    assert (tmp_path / "runs" / "tiny-random" / "antonym" / "eval.json").exists()


def test_items_record_the_items_scored_not_only_the_limit(tmp_path, capsys):
    """antonym's test split has 15 items: --limit 50 caps nothing, and items.csv says 15 were
    scored per method beside the 50 that was asked."""
    from sitelens import load_task

    n_test = len(load_task("antonym").test)
    out = tmp_path / "r50"
    assert main(["run", *TINY, "--limit", "50", "--methods", "zero-shot", "--out", str(out)]) == 0
    capsys.readouterr()
    items = pd.read_csv(out / "items.csv")
    assert n_test < 50 and len(items) == n_test
    assert (items["limit"] == 50).all() and (items["n_items"] == n_test).all()


def test_items_name_the_method_mean_time_as_the_methods(done):
    """items.csv (issue 43, point 9): the generation is timed per method, so no column presents
    its mean as each item's own ``seconds_per_item``; ``method_seconds_per_item`` is that mean,
    the one eval.json reports, the same on every row of a method."""
    items = pd.read_csv(done / "items.csv")
    assert TIMING not in items.columns and ITEMS_TIMING in items.columns
    per_method = items.groupby("method")[ITEMS_TIMING].agg(["nunique", "first"])
    assert (per_method["nunique"] == 1).all()
    written = json.loads((done / "eval.json").read_text())
    for method, row in per_method.iterrows():
        assert row["first"] == pytest.approx(written[method][TIMING], rel=1e-3, abs=1e-5), method
