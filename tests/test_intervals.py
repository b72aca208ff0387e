"""Output that knows its limits (issue 32, items 4 and 8): every accuracy with its 95% Wilson score
interval over items, a warning on few items, the data a fit actually used recorded in
``adapter.json`` and printed, label metrics only when asked (or declared), and per-item label
columns of one type."""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import math

import pandas as pd
import pytest
from scipy.stats import binomtest

from sitelens.cli import main as cli_main
from sitelens.cli.summary import few_items_warning, fit_data_lines, summary_json, summary_text
from sitelens.errors import TaskError
from sitelens.eval.evaluation import evaluate, summarize
from sitelens.eval.labels import LABEL_COLUMNS
from sitelens.site import FitConfig, SiteAdapter, fit_site
from sitelens.stats import wilson_interval
from sitelens.tasks import Task, Template, task_from_pairs

# the module itself: the package exports a function of the same name
EV = importlib.import_module("sitelens.eval.evaluation")

# 60 pairs with 6 distinct outputs: split 42 / 6 / 12, as the issue's country -> continent task
CONTINENTS = ("Africa", "Asia", "Europe", "North America", "South America", "Oceania")
PAIRS = [(f"c{i:02d}", CONTINENTS[i % 6]) for i in range(60)]
# no space before the answer: the byte tokenizer then gives the labels distinct first tokens
TEMPLATE = Template(shot="Q: {x}\nA: {y}\n\n", query="Q: {x}\nA: ", answer_prefix="")
# Wilson bounds from sitelens vs scipy's: the same closed form evaluated in another order, so
# they agree to float64 rounding of a few operations on numbers of order 1
WILSON_TOL = 1e-12


def _task() -> Task:
    return task_from_pairs("continents", PAIRS)


def _scipy_wilson(k: int, n: int) -> tuple[float, float]:
    ci = binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    return ci.low, ci.high


def _cli(argv, tmp_path, monkeypatch) -> tuple[int, str, str]:
    monkeypatch.chdir(tmp_path)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli_main(argv)
    return rc, out.getvalue(), err.getvalue()


# ----------------------------------------------------------------------------------------------
# the interval


@pytest.mark.parametrize("k, n", [(10, 12), (0, 12), (12, 12), (1, 6), (57, 100), (3, 1000)])
def test_wilson_interval_matches_an_independent_computation(k, n):
    lo, hi = wilson_interval(k, n)
    slo, shi = _scipy_wilson(k, n)
    assert abs(lo - slo) < WILSON_TOL and abs(hi - shi) < WILSON_TOL, ((lo, hi), (slo, shi))
    assert 0 <= lo <= k / n <= hi <= 1
    assert math.isnan(wilson_interval(0, 0)[0])


def test_the_issues_example_interval():
    lo, hi = wilson_interval(10, 12)
    assert f"{lo:.3f}, {hi:.3f}" == "0.552, 0.953"


# ----------------------------------------------------------------------------------------------
# a 12-item eval: summarize, the CLI's text and JSON


def _summary_checks(s: pd.DataFrame, df: pd.DataFrame) -> None:
    """Each accuracy's interval columns against scipy's Wilson interval of the item counts."""
    for (method, part), row in zip(df.groupby("method", sort=False), s.itertuples()):
        assert row.method == method and row.n == 12
        for metric, col in (("first_token_acc", "first_token_correct"), ("exact_match", "correct")):
            k = int(part[col].sum())
            slo, shi = _scipy_wilson(k, 12)
            lo, hi = getattr(row, f"{metric}_ci_low"), getattr(row, f"{metric}_ci_high")
            assert abs(lo - slo) < WILSON_TOL and abs(hi - shi) < WILSON_TOL, (method, metric)


def test_summarize_gives_wilson_intervals_on_a_12_item_eval(tiny_mha):
    task = _task()
    assert (len(task.train), len(task.valid), len(task.test)) == (42, 6, 12)
    df = evaluate(tiny_mha, task, methods=["zero-shot", "icl"], n_shots=2, template=TEMPLATE)
    df.loc[df.index[:5], "correct"] = True  # some hits, so the bounds are not all the 0-hit ones
    s = summarize(df)
    _summary_checks(s, df)
    text = summary_text(s)
    lo, hi = s.exact_match_ci_low.iloc[0], s.exact_match_ci_high.iloc[0]
    assert f"{s.exact_match.iloc[0]:.3f} [{lo:.3f}, {hi:.3f}]" in text
    assert "95% Wilson score interval" in text and "_ci_low" not in text
    obj = json.loads(summary_json(s))
    assert obj["zero-shot"]["exact_match_ci"] == [round(lo, 4), round(hi, 4)]
    assert few_items_warning(s).startswith("warning: few items: interval over 12 items")
    assert few_items_warning(s.assign(n=100)) is None


def test_a_broken_interval_is_caught(tiny_mha, monkeypatch):
    """Mutation: the normal-approximation (Wald) interval in place of Wilson's."""
    def wald(k, n, z=1.959963984540054):
        p = k / n
        h = z * math.sqrt(p * (1 - p) / n)
        return p - h, p + h

    task = _task()
    df = evaluate(tiny_mha, task, methods=["zero-shot"], template=TEMPLATE)
    df.loc[df.index[:5], "correct"] = True
    monkeypatch.setattr(EV, "wilson_interval", wald)
    with pytest.raises(AssertionError):
        _summary_checks(summarize(df), df)


def test_cli_eval_prints_intervals_and_warns_on_few_items(tmp_path, monkeypatch):
    f = tmp_path / "continents.json"
    f.write_text(json.dumps([{"input": x, "output": y} for x, y in PAIRS]))
    rc, out, err = _cli(["eval", "--model", "tiny-random", "--task", str(f), "--methods",
                         "zero-shot"], tmp_path, monkeypatch)
    assert rc == 0, err
    row = next(line for line in out.splitlines() if "zero-shot" in line)
    assert row.count("[") == 2 and " 12 " in row  # an interval in both accuracy cells, n = 12
    assert "warning: few items: interval over 12 items" in err
    assert "label_acc" not in out and "chance" not in out  # not asked
    rc, out, err = _cli(["eval", "--model", "tiny-random", "--task", str(f), "--methods",
                         "zero-shot", "--json"], tmp_path, monkeypatch)
    obj = json.loads(out)["zero-shot"]
    assert len(obj["first_token_acc_ci"]) == 2 and obj["n"] == 12 and "chance" not in obj


# ----------------------------------------------------------------------------------------------
# the data a fit used


def test_adapter_records_the_split_sizes_and_passes_actually_used(tiny_mha, tmp_path):
    task = _task()
    ad = fit_site(tiny_mha, task, n_prompts=4, n_shots=2,
                  config=FitConfig(n_examples=84, batch_size=4, eval_every=5))
    d = ad.meta["data"]
    assert (d["n_train"], d["n_valid"], d["n_test"]) == (42, 6, 12)
    assert d["valid_items_used"] == 6 and d["valid_split_used"] == "valid"  # not the setting, 64
    assert ad.meta["hyperparameters"]["n_valid"] == 64
    assert d["train_examples"] == 84 and d["train_items_used"] == 42 and d["passes"] == 2.0
    back = SiteAdapter.load(ad.save(tmp_path / "ad"))
    assert back.meta["data"] == d
    lines = fit_data_lines(back.meta)
    assert "42 train / 6 valid / 12 test" in lines[0] and "(2.0 passes)" in lines[0]
    assert lines[1].startswith("warning: only 6 validation items: early stopping")
    # a task without a valid split validates on train items, and says so
    no_valid = Task("nv", task.train, [], task.test)
    d2 = fit_site(tiny_mha, no_valid, n_prompts=4, n_shots=2,
                  config=FitConfig(n_examples=8, batch_size=4)).meta["data"]
    assert d2["valid_split_used"] == "train" and d2["valid_items_used"] == 42
    assert len(fit_data_lines({"data": d2})) == 1  # 42 items: no warning


def test_adapters_saved_before_the_data_record_still_load(tiny_mha, tmp_path):
    ad = fit_site(tiny_mha, _task(), n_prompts=4, n_shots=2,
                  config=FitConfig(n_examples=4, batch_size=4))
    old = SiteAdapter(ad.alpha, ad.embedding, {k: v for k, v in ad.meta.items() if k != "data"})
    back = SiteAdapter.load(old.save(tmp_path / "old"))
    assert "data" not in back.meta and fit_data_lines(back.meta) == []


def test_cli_fit_prints_the_data_and_warns_on_a_tiny_valid_set(tmp_path, monkeypatch):
    f = tmp_path / "continents.json"
    f.write_text(json.dumps([{"input": x, "output": y} for x, y in PAIRS]))
    rc, out, err = _cli(["fit", "--model", "tiny-random", "--task", str(f), "--out", "ad",
                         "--n-prompts", "4", "--n-shots", "2", "--n-examples", "16"],
                        tmp_path, monkeypatch)
    assert rc == 0, err
    assert "data: 42 train / 6 valid / 12 test items" in out and "16 training examples" in out
    assert "warning: only 6 validation items" in err
    meta = json.loads((tmp_path / "ad" / "adapter.json").read_text())
    assert meta["data"]["valid_items_used"] == 6


# ----------------------------------------------------------------------------------------------
# label metrics only when asked; one type per label column


def test_label_metrics_only_when_asked_or_declared(tiny_mha):
    task = _task()
    plain = evaluate(tiny_mha, task, methods=["zero-shot"], limit=4, template=TEMPLATE)
    assert not set(LABEL_COLUMNS) & set(plain.columns)
    assert "label_acc_full" not in summarize(plain).columns
    asked = evaluate(tiny_mha, task, methods=["zero-shot"], limit=4, template=TEMPLATE,
                     label_metrics=True)
    assert set(LABEL_COLUMNS) <= set(asked.columns) and (asked["chance"] == 1 / 6).all()
    s = summarize(asked)
    for m in ("label_acc_first", "label_acc_full", "label_acc_full_norm"):
        assert {m, f"{m}_ci_low", f"{m}_ci_high"} <= set(s.columns)
    declared = Task("d", task.train, task.valid, task.test, labels=CONTINENTS)
    assert "chance" in evaluate(tiny_mha, declared, methods=["zero-shot"], limit=2,
                                template=TEMPLATE).columns
    assert "chance" not in evaluate(tiny_mha, declared, methods=["zero-shot"], limit=2,
                                    template=TEMPLATE, label_metrics=False).columns
    words = task_from_pairs("rev", [(w, w[::-1]) for w in (f"w{i:02d}" for i in range(30))])
    with pytest.raises(TaskError, match="no closed label set"):
        evaluate(tiny_mha, words, methods=["zero-shot"], limit=2, label_metrics=True)


def test_label_columns_are_all_floats(tiny_mha, tmp_path):
    task = _task()
    df = evaluate(tiny_mha, task, methods=["zero-shot"], limit=6, template=Template(),
                  label_metrics=True)  # " Africa", " Asia": a shared first token, first is NaN
    cols = ["label_rank_first", "label_rank_full", "label_rank_full_norm"]
    assert all(df[c].dtype == "float64" for c in cols), df[cols].dtypes
    assert df["label_rank_first"].isna().all()
    assert set(df["label_rank_full"]) <= {0.0, 1.0} and set(df["label_rank_full_norm"]) <= {0.0, 1.0}
    df.to_csv(tmp_path / "items.csv", index=False)
    back = pd.read_csv(tmp_path / "items.csv")
    assert all(back[c].dtype == "float64" for c in cols)  # the per-item CSV reads back the same


def test_cli_label_metrics_flag(tmp_path, monkeypatch):
    f = tmp_path / "continents.json"
    f.write_text(json.dumps([{"input": x, "output": y} for x, y in PAIRS]))
    rc, out, err = _cli(["eval", "--model", "tiny-random", "--task", str(f), "--methods",
                         "zero-shot", "--label-metrics", "--json", "--limit", "3"], tmp_path, monkeypatch)
    assert rc == 0, err
    obj = json.loads(out)["zero-shot"]
    assert obj["chance"] == round(1 / 6, 4) and len(obj["label_acc_full_ci"]) == 2
    # an open-ended task: one line, exit 2, before the model loads (no "loaded" line)
    rc, out, err = _cli(["eval", "--model", "tiny-random", "--task", "antonym", "--methods",
                         "zero-shot", "--label-metrics"], tmp_path, monkeypatch)
    assert rc == 2 and out == "" and len(err.splitlines()) == 1
    assert err.startswith("sitelens: error: Task 'antonym' has no closed label set")


def test_bench_ranks_labels_only_with_label_metrics(tiny_mha, tmp_path):
    from sitelens.eval.labels import LABEL_METRICS
    from sitelens.pipelines import bench

    task = _task()
    off = bench.run_bench([tiny_mha], [task], ["zero-shot"], tmp_path / "off.csv", limit=2,
                          n_shots=2, template=TEMPLATE)
    assert off[LABEL_METRICS].isna().all().all()
    on = bench.run_bench([tiny_mha], [task], ["zero-shot"], tmp_path / "on.csv", limit=2,
                         n_shots=2, template=TEMPLATE, label_metrics=True)
    assert on["chance"].iloc[0] == 1 / 6 and 0 <= on["label_acc_full"].iloc[0] <= 1
    assert on["key"].tolist() == off["key"].tolist()  # not part of the key (as dntp)
