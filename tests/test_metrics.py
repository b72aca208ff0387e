"""dNTP, bootstrap CIs, accuracy, correlations, and the resumable bench (tiny model)."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pytest
import torch

import sitelens.pipelines.bench as bench
import sitelens.pipelines.bench_summary as bench_summary
from sitelens.baselines import ICL, Fitted, Method, ZeroShot
from sitelens.errors import ModelError, OutputError, TaskError
from sitelens.eval.metrics import accuracy, correlation, dntp, dntp_per_item
from sitelens.models import load_model, model_name
from sitelens.stats import bootstrap_ci
from sitelens.tasks import DEFAULT_TEMPLATE, task_from_pairs
from sitelens.testing import tiny_model

# ----------------------------------------------------------------------------------------------
# metrics


def test_dntp_of_identical_distributions_is_zero():
    logits = torch.randn(5, 50, generator=torch.Generator().manual_seed(0))
    assert dntp(logits, logits) == 0.0  # exact: log p − log q is exactly 0 for the same input
    # softmax is shift-invariant, but logits + 3.0 rounds each float32 logit by up to
    # u32·|x + 3| ≈ 4e-7 (|x| ≤ 3.4); KL is second order in that: ≲ ½·(4e-7)² ≈ 1e-13 (measured
    # 7.5e-15), so abs 1e-12
    assert dntp(logits, logits + 3.0) == pytest.approx(0.0, abs=1e-12)


def test_dntp_matches_a_manual_kl_in_the_right_direction():
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(4, 30, generator=g) * 2, torch.randn(4, 30, generator=g) * 2
    p = np.exp(a.double().numpy())
    p /= p.sum(1, keepdims=True)
    q = np.exp(b.double().numpy())
    q /= q.sum(1, keepdims=True)
    manual = (p * np.log(p / q)).sum(1)  # KL(P_icl ‖ P_method) per query
    # Both sides in float64 from the same float32 logits: 30-term sums, u64 = 1.1e-16, KL 2.6-7
    # with terms of both signs (Σ|terms| ≤ 1.2·KL here): ≲ 30·1.2·u64 ≈ 4e-15 relative (measured
    # 3.4e-16). rtol 1e-12 sits between that and a float32 computation (4.5e-9, which
    # test_mutations.py checks it catches).
    np.testing.assert_allclose(dntp_per_item(a, b).numpy(), manual, rtol=1e-12)
    assert dntp(a, b) == pytest.approx(manual.mean(), rel=1e-12), "dntp vs the float64 manual KL"
    reverse = (q * np.log(q / p)).sum(1).mean()
    assert abs(dntp(a, b) - reverse) > 1e-3  # not KL(P_method ‖ P_icl): the two differ by O(1)
    # log-probabilities are accepted as well as logits; float32 log-probs are rounded by up to
    # u32·|log p| (|log p| ≤ 11 here), which moves the mean KL (≥ 2.6) by ≲ 2·u32·11 ≈ 1.3e-6
    # absolute, 5e-7 relative (measured 1.1e-8): rel 1e-6
    assert dntp(torch.log_softmax(a, -1), b) == pytest.approx(manual.mean(), rel=1e-6)
    with pytest.raises(ValueError):
        dntp(a, b[:, :10])


def test_accuracy():
    assert accuracy([True, False, True, True]) == 0.75  # exact: 3/4 is a binary fraction
    # 2/3 is not: the mean of [1, 0, 1] and 2 / 3 may differ in the last ulp (approx: rel 1e-6)
    assert accuracy(torch.tensor([1, 2, 3]), torch.tensor([1, 0, 3])) == pytest.approx(2 / 3)
    assert np.isnan(accuracy([]))


def test_bootstrap_ci():
    assert bootstrap_ci([0.5] * 10, n_boot=200, seed=0) == (0.5, 0.5)
    x = np.random.default_rng(0).normal(size=200)
    lo, hi = bootstrap_ci(x, n_boot=500, seed=3)
    assert lo < x.mean() < hi
    assert (lo, hi) == bootstrap_ci(x, n_boot=500, seed=3)  # seeded
    lo2, hi2 = bootstrap_ci(x[:20], n_boot=500, seed=3)
    assert hi2 - lo2 > hi - lo  # fewer values, wider interval
    assert all(np.isnan(bootstrap_ci([float("nan")])))


def test_correlation():
    x = np.arange(10.0)
    # float64 correlations that are exactly ±1 in exact arithmetic: approx's default rel 1e-6
    assert correlation(x, -2 * x + 1) == pytest.approx(-1.0)
    assert correlation(x, np.exp(x), "spearman") == pytest.approx(1.0)
    assert np.isnan(correlation([1, 2], [3, 4]))
    assert np.isnan(correlation(x, np.ones(10)))


# ----------------------------------------------------------------------------------------------
# bench


@pytest.fixture(scope="module")
def model(backend):
    return tiny_model(n_key_value_heads=2, backend=backend)


def _task(name, fn, seed):
    rng = random.Random(seed)
    words = list(dict.fromkeys("".join(rng.choice("abcdefgh") for _ in range(3))
                               for _ in range(60)))
    return task_from_pairs(name, [(w, fn(w)) for w in words])


@pytest.fixture(scope="module")
def tasks():
    return [_task("reverse", lambda w: w[::-1], 0), _task("upper", str.upper, 1)]


@dataclass(kw_only=True)
class CountingICL(ICL):
    calls: list = field(default_factory=list, compare=False)  # bookkeeping, not a setting

    def fit(self, model, task, **kw):
        self.calls.append(task.name)
        return super().fit(model, task, **kw)


@dataclass(kw_only=True)
class CountingZeroShot(ZeroShot):
    calls: list = field(default_factory=list, compare=False)

    def fit(self, model, task, **kw):
        self.calls.append(task.name)
        return super().fit(model, task, **kw)


@dataclass(kw_only=True)
class Broken(Method):
    name: str = "broken"
    error: type = TaskError

    def fit(self, model, task, *, seed=0, template=DEFAULT_TEMPLATE, progress=False) -> Fitted:
        raise self.error("this task cannot be fitted")


def test_bench_writes_tidy_rows_and_resumes_without_refitting(model, tasks, tmp_path, monkeypatch):
    out = tmp_path / "res" / "bench.csv"
    icl, zs = CountingICL(n_shots=2), CountingZeroShot()
    df = bench.run_bench([model], tasks, [zs, icl, "tv"], out, limit=3, n_shots=2)
    assert list(df.columns) == bench.COLUMNS
    assert len(df) == 6 and not df["error"].str.len().any()
    assert set(df["model"]) == {model_name(model)}
    assert (df["n"] == 3).all()
    assert (df.loc[df.method == "icl", "dntp"] == 0).all()  # ICL is the reference
    assert (df.loc[df.method != "icl", "dntp"] > 0).all()
    assert (df.loc[df.method == "tv", "trainable_params"] == 0).all()
    assert icl.calls == zs.calls == ["reverse", "upper"]

    # a second call does no fitting (and computes no reference) and leaves the file as it was
    text = out.read_text()
    refs = []
    monkeypatch.setattr(bench, "reference_logits", lambda *a, **k: refs.append(1))
    df2 = bench.run_bench([model], tasks, [zs, icl, "tv"], out, limit=3, n_shots=2)
    assert icl.calls == zs.calls == ["reverse", "upper"] and refs == []
    assert out.read_text() == text and len(df2) == 6
    monkeypatch.undo()

    # a lost cell is redone, alone
    full = bench.read_results(out)
    full[~((full.task == "upper") & (full.method == "icl"))].to_csv(out, index=False)
    df3 = bench.run_bench([model], tasks, [zs, icl, "tv"], out, limit=3, n_shots=2)
    assert icl.calls == ["reverse", "upper", "upper"] and zs.calls == ["reverse", "upper"]
    assert len(df3) == 6

    md = bench_summary.summary_markdown(df3)
    assert f"## {model_name(model)}" in md
    for m in ("zero-shot", "icl", "tv"):
        assert f"| {m} |" in md
    assert "Pearson" in md


def test_bench_without_dntp_runs_no_reference_and_keeps_the_keys(model, tasks, tmp_path, monkeypatch):
    refs = []
    monkeypatch.setattr(bench, "reference_logits", lambda *a, **k: refs.append(1))
    df = bench.run_bench([model], tasks[:1], ["zero-shot"], tmp_path / "a.csv", limit=2, n_shots=2,
                         dntp=False)
    assert refs == [] and df["dntp"].isna().all() and df["error"].str.startswith("dntp: not computed").all()
    monkeypatch.undo()
    with_dntp = bench.run_bench([model], tasks[:1], ["zero-shot"], tmp_path / "b.csv", limit=2, n_shots=2)
    assert list(df["key"]) == list(with_dntp["key"]) and (with_dntp["dntp"] > 0).all()


def test_bench_keeps_finished_cells_when_a_run_dies(model, tasks, tmp_path):
    out = tmp_path / "bench.csv"
    zs = CountingZeroShot()
    with pytest.raises(RuntimeError):
        bench.run_bench([model], tasks, [zs, Broken(error=RuntimeError)], out, limit=2, n_shots=2)
    df = bench.read_results(out)
    assert list(df["method"]) == ["zero-shot"]  # the cell before the crash is kept
    # a SitelensError is recorded as a failed cell instead of stopping the run
    df = bench.run_bench([model], tasks, [zs, Broken()], out, limit=2, n_shots=2)
    assert zs.calls == ["reverse", "upper"]  # the kept cell is not redone
    broken = df[df.method == "broken"]
    assert len(broken) == 2 and broken["error"].str.contains("TaskError").all()
    assert broken["exact_match"].isna().all()
    assert "failed" in bench_summary.summary_markdown(df)


def test_bench_refuses_a_foreign_csv(model, tasks, tmp_path):
    out = tmp_path / "other.csv"
    out.write_text("a,b\n1,2\n")
    with pytest.raises(OutputError):
        bench.run_bench([model], tasks[:1], ["zero-shot"], out, limit=2, n_shots=2)
    with pytest.raises(ValueError, match="unique"):
        bench.run_bench([model], tasks[:1], ["zero-shot", ZeroShot()], tmp_path / "x.csv")


def test_summary_table_and_figure():
    df = pd.DataFrame({
        "model": ["m"] * 4, "task": ["a", "a", "b", "b"], "method": ["icl", "fv"] * 2,
        "seed": [0] * 4, "n": [3] * 4, "first_token_acc": [1.0, 0.5, 0.5, 0.0],
        "exact_match": [1.0, 0.5, 0.5, 0.0], "dntp": [0.0, 1.0, 0.0, 2.0],
        "trainable_params": [0, 0, 0, 0], "fit_seconds": [0.1] * 4,
        "seconds_per_item": [0.01] * 4, "error": [""] * 4,
    })
    t = bench_summary.summary_table(df)
    fv = t[t.method == "fv"].iloc[0]
    # exact: means of binary fractions (0.5, 0.0 -> 0.25; 1.0, 2.0 -> 1.5) round nothing
    assert fv.exact_match == 0.25 and fv.dntp == 1.5 and fv.n_tasks == 2
    # two tasks: no interval over tasks, in the table and in the report
    assert np.isnan(fv.exact_match_lo) and np.isnan(fv.exact_match_hi)
    md = bench_summary.summary_markdown(df)
    assert "| fv | 2 | 0.250 | 0.250 |" in md and "No interval over tasks" in md
    fig = bench_summary.dntp_accuracy_figure(df)
    assert len(fig.data) == 2


def test_summary_table_gives_a_task_interval_from_five_tasks(monkeypatch):
    """From MIN_TASKS_FOR_CI tasks on, exact match carries a bootstrap interval over tasks; below it
    none. A summary that bootstraps 3 tasks (the bug) fails the first half."""

    def table(n_tasks):
        em = [0.1, 0.9, 0.4, 0.6, 0.2, 0.8][:n_tasks]
        return pd.DataFrame({
            "model": "m", "task": [f"t{i}" for i in range(n_tasks)], "method": "fv",
            "first_token_acc": em, "exact_match": em, "dntp": 1.0, "trainable_params": 0,
            "fit_seconds": 0.1, "seconds_per_item": 0.01, "error": ""})

    assert bench_summary.MIN_TASKS_FOR_CI == 5
    three = bench_summary.summary_table(table(3)).iloc[0]
    assert three.n_tasks == 3 and np.isnan(three.exact_match_lo)
    assert "(" not in bench_summary.summary_markdown(table(3)).split("| fv | 3 |")[1].split("\n")[0]
    five = bench_summary.summary_table(table(5)).iloc[0]
    assert five.exact_match_lo < five.exact_match < five.exact_match_hi
    md5 = bench_summary.summary_markdown(table(5))
    assert "No interval over tasks" not in md5 and f"({five.exact_match_lo:.3f}–" in md5
    # the guard is what removes the interval: with it lowered, 3 tasks get one again
    monkeypatch.setattr(bench_summary, "MIN_TASKS_FOR_CI", 3)
    assert not np.isnan(bench_summary.summary_table(table(3)).iloc[0].exact_match_lo)


def test_mean_over_tasks_averages_each_task_first():
    from sitelens.eval.metrics import mean_over_tasks

    df = pd.DataFrame({"sel": ["top"] * 5 + ["bottom"], "task": ["a", "a", "a", "b", "c", "a"],
                       "accuracy": [1.0, 0.0, 0.5, 1.0, float("nan"), 0.25]})
    t = mean_over_tasks(df, ["sel"], n_boot=200).set_index("sel")
    assert list(t.index) == ["bottom", "top"]  # sorted groups
    assert t.loc["top", "accuracy"] == 0.75 and t.loc["top", "n_tasks"] == 3  # (0.5 + 1) / 2; c has no value
    assert (t.loc["top", "ci_low"], t.loc["top", "ci_high"]) == bootstrap_ci([0.5, 1.0], n_boot=200, seed=0)


def test_complete_tasks_and_gaps_to_reference():
    from sitelens.pipelines.bench_summary import complete_tasks, gaps_to_reference

    nan = float("nan")
    df = pd.DataFrame({
        "model": ["m"] * 5, "task": ["a", "a", "b", "b", "c"], "method": ["icl", "fv", "icl", "fv", "icl"],
        "n": [2] * 5, "exact_match": [1.0, 0.5, 0.5, nan, 0.0], "label_acc_full": [1.0, 0.5, nan, nan, nan],
        "chance": [0.5, 0.5, nan, nan, nan], "trainable_params": [0] * 5, "fit_seconds": [1.0] * 5,
        "seconds_per_item": [0.1] * 5,
    })
    assert list(complete_tasks(df).task) == ["a", "a"]  # b's fv failed, c has no fv
    assert set(complete_tasks(df, ["icl"]).task) == {"a", "b", "c"}
    g = gaps_to_reference(df, ["icl", "fv"]).set_index("method")
    assert g.loc["fv", "n_tasks"] == 1 and g.loc["fv", "em_gap"] == -0.5 and g.loc["icl", "em_gap"] == 0
    assert g.loc["fv", "label_gap"] == -0.5 and g.loc["fv", "chance"] == 0.5 and g.loc["fv", "n_items"] == 2


def test_dntp_accuracy_correlation_pooled_and_within_task():
    """Within each task a higher dNTP means lower accuracy (ρ = -1), but the easy task has the
    larger dNTPs, so pooled over tasks the sign flips: the within-task figure must not."""
    methods = ["icl", "m1", "m2", "m3"]
    rows = []
    for task, base in (("easy", 10.0), ("hard", 0.0)):
        for i, m in enumerate(methods):
            acc = 1.0 if m == "icl" else (0.9 if task == "easy" else 0.3) - 0.1 * i
            rows.append({"model": "x", "task": task, "method": m, "exact_match": acc,
                         "dntp": 0.0 if m == "icl" else base + i})
    c = bench_summary.dntp_accuracy_correlation(pd.DataFrame(rows))["x"]
    assert c["n_cells"] == 6 and c["n_tasks_within"] == 2
    assert c["within_task_spearman"] == pytest.approx(-1.0)  # a float64 rank correlation, ±1 exactly
    assert c["spearman"] > 0  # pooled: the easy task's cells have both higher dNTP and accuracy
    from sitelens.pipelines.bench_summary import correlation_rows

    t = correlation_rows(pd.DataFrame(rows), {"all but ICL": ("icl",)}).iloc[0]
    assert (t["model"], t["methods"], t["cells"]) == ("x", "all but ICL", 6)
    assert t["Spearman ρ within a task (mean)"] == "-1.00 (2 tasks)"


def test_cli_bench_takes_tasks_space_or_comma_separated(tmp_path, capsys):
    """``--tasks a/{x,y}`` (the shell's brace expansion: separate words) and ``--tasks x,y`` both
    work, also mixed."""
    from sitelens.cli import main as cli_main

    out = tmp_path / "b.csv"
    rc = cli_main(["bench", "--models", "tiny-random", "--tasks", "antonym", "first_letter,last_letter",
                   "--methods", "zero-shot", "--limit", "2", "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    df = pd.read_csv(out)
    assert sorted(df["task"]) == ["antonym", "first_letter", "last_letter"]
    assert (df["method"] == "zero-shot").all() and (df["n"] == 2).all()
    assert out.with_suffix(".md").exists()


def test_bench_n_ctx_reaches_models_loaded_by_name(tmp_path):
    # The antonym task's 10-shot prompts need ~150 tokens: at n_ctx 48 ICL (and the ICL reference
    # of dNTP) get a typed error row; at the default context the same cells score.
    short = bench.run_bench(["tiny-random"], ["antonym"], ["zero-shot", "icl"], tmp_path / "a.csv",
                            limit=2, n_ctx=48)
    icl = short[short.method == "icl"].iloc[0]
    assert icl.error.startswith("PromptTooLongError") and math.isnan(icl.exact_match)
    assert short[short.method == "zero-shot"].iloc[0].error.startswith("dntp: A prompt has")
    full = bench.run_bench(["tiny-random"], ["antonym"], ["zero-shot", "icl"], tmp_path / "b.csv",
                           limit=2)
    assert not full.error.fillna("").astype(bool).any() and full.exact_match.notna().all()


@pytest.mark.parametrize("bad", [0, -5, 2.5, True])
def test_load_model_rejects_a_bad_n_ctx(bad):
    with pytest.raises(ModelError, match="n_ctx must be a positive integer"):
        load_model("tiny-random", n_ctx=bad)
    assert load_model("tiny-random", n_ctx=64).cfg.n_ctx == 64
