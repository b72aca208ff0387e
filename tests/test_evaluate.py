import pandas as pd

from sitelens import FitConfig, exact_match, fit_site, load_task, summarize
from sitelens.eval.evaluation import evaluate


def test_exact_match_rules():
    assert exact_match(" Cold\nQ: next", "cold")
    assert exact_match("paris, france", "Paris")
    assert exact_match("\n cold\nhot", "cold")  # leading whitespace is stripped first
    assert not exact_match("warm\ncold", "cold")  # only the first line counts
    assert not exact_match("cold", "Cold", case_sensitive=True)
    assert exact_match("Cold stuff", "Cold", case_sensitive=True)


def test_case_sensitive_tasks():
    assert load_task("capitalize").case_sensitive
    assert not load_task("antonym").case_sensitive


def test_evaluate_returns_per_item_frame(tiny_mha):
    task = load_task("antonym")
    ad = fit_site(tiny_mha, task, n_prompts=4, n_shots=2,
                  config=FitConfig(n_examples=4, batch_size=4, eval_every=1))
    df = evaluate(tiny_mha, task, adapter=ad, limit=4, n_shots=2)
    assert isinstance(df, pd.DataFrame) and len(df) == 12
    assert {"input", "target", "prediction", "correct", "method", "first_token_correct",
            "seconds_per_item"} <= set(df.columns)
    assert df.groupby("method").input.apply(tuple).nunique() == 1  # same items for every method
    s = summarize(df)
    assert list(s.method) == ["zero-shot", "icl", "site"] and (s.n == 4).all()
