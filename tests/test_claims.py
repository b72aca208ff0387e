"""The claims check (scripts/check_claims.py, docs/claims.toml): every quoted number in README.md and
docs/*.md matches the committed results file it comes from, and the check fails on a number changed
by hand, on a new number quoted without a claim, and on a quote that does not link its source."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "check_claims.py"


@pytest.fixture(scope="module")
def cc():
    spec = importlib.util.spec_from_file_location("check_claims", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["check_claims"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_every_quoted_number_matches_its_source(cc):
    assert cc.check(ROOT) == []


def test_the_script_exits_0_on_the_repo_and_1_on_a_mismatch(tmp_path):
    assert subprocess.run([sys.executable, str(SCRIPT)], capture_output=True).returncode == 0
    claims = (ROOT / "docs" / "claims.toml").read_text(encoding="utf-8")
    bad = tmp_path / "claims.toml"
    head, tail = claims.split('id = "fv.smollm2.em.site"', 1)
    bad.write_text(head + 'id = "fv.smollm2.em.site"' + tail.replace("scale = 100", "scale = 101", 1))
    run = subprocess.run([sys.executable, str(SCRIPT), "--claims", str(bad)], capture_output=True, text=True)
    assert run.returncode == 1 and "fv.smollm2.em.site" in run.stdout


def test_a_number_changed_by_hand_fails(cc):
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    m = re.search(r"\*\*SITE (\d+\.\d)%\*\*, ahead of ICL", readme)  # the headline, whatever its value
    assert m, "the README's headline SITE number moved: update this test's pattern"
    shown, wrong = m.group(1), f"{float(m.group(1)) + 1:.1f}"
    errors = cc.check(ROOT, pages={"README.md": readme.replace(f"**SITE {shown}%**", f"**SITE {wrong}%**")})
    assert any(f"README.md: expected '**SITE {shown}%**, ahead of ICL'" in e and f"the page says {wrong}" in e
               for e in errors), errors
    # the same number changed on a docs page, in a table cell of a claim sourced from a CSV
    page = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    old = "| SmolLM2: dNTP | 7.26 |"
    assert old in page
    errors = cc.check(ROOT, pages={"docs/results.md": page.replace(old, "| SmolLM2: dNTP | 7.62 |")})
    assert any("cls.smollm2.zero-shot.dntp" in e for e in errors), errors


def test_a_new_number_in_a_checked_block_needs_a_claim(cc):
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    anchor = "with 2 threads\n"
    assert anchor in readme
    planted = readme.replace(anchor, "with 2 threads (a second run: 31.4 s)\n", 1)
    errors = cc.check(ROOT, pages={"README.md": planted})
    assert any("number '31.4' has no claim" in e for e in errors), errors
    # a linked paragraph anywhere in the docs is checked too, not only the listed sections
    page = (ROOT / "docs" / "troubleshooting.md").read_text(encoding="utf-8")
    linked = page + "\nA new finding: 42.7% ([site_fv.md](../benchmarks/results/site_fv.md)).\n"
    errors = cc.check(ROOT, pages={"docs/troubleshooting.md": linked})
    assert any("docs/troubleshooting.md" in e and "'42.7'" in e for e in errors), errors


def test_a_quote_must_link_its_source(cc):
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    link = "([fit_time.md](benchmarks/results/fit_time.md))"
    assert link in readme
    errors = cc.check(ROOT, pages={"README.md": readme.replace(link, "")})
    assert any("fit.smollm2.median" in e and "does not link" in e for e in errors), errors


def test_locators_and_rendering(cc, tmp_path):
    (tmp_path / "r.csv").write_text("model,task,x,y\nm,a,1,3\nm,b,2,2\nm,c,3,1\nn,a,9,9\n")
    (tmp_path / "r.md").write_text("# R\n\n## m\n\n| method | EM |\n|---|---|\n| site | 54.4 |\n\n"
                                   "median ratio 7.55.\n")
    (tmp_path / "r.json").write_text('{"a": {"b": [0.5, 0.25]}}')
    claims = {
        "mean": {"id": "mean", "source": "r.csv",
                 "csv": {"where": {"model": "m"}, "column": "x", "agg": "mean"}},
        "rho": {"id": "rho", "source": "r.csv",
                "csv": {"where": {"model": "m"}, "column": ["x", "y"], "agg": "spearman"}},
        "cell": {"id": "cell", "source": "r.md", "table": {"section": "m", "where": {"method": "site"},
                                                           "column": "EM"}},
        "rx": {"id": "rx", "source": "r.md", "regex": r"median ratio (\d+(?:\.\d+)?)"},
        "js": {"id": "js", "source": "r.json", "json": ["a", "b", 1]},
        "ratio": {"id": "ratio", "expr": "a / b", "args": {"a": "cell", "b": "mean"}},
    }
    src = cc.Sources(tmp_path)
    got = {k: cc.value_of(c, claims, src) for k, c in claims.items()}
    assert got == {"mean": 2.0, "rho": -1.0, "cell": 54.4, "rx": 7.55, "js": 0.25, "ratio": 27.2}
    with pytest.raises(ValueError, match="exactly one"):
        cc.value_of({"id": "x", "source": "r.csv", "csv": {"where": {"task": "a"}, "column": "x"}}, {}, src)
    assert cc.render(-0.0155, {"fmt": ".2f"}) == "\u22120.02"
    assert cc.render(-0.001, {"fmt": ".2f"}) == "0.00"
    assert cc.render(460800, {"fmt": ",.0f"}) == "460,800"
    assert cc.render(0.171, {"fmt": ".1f", "scale": 100}) == "17.1"


def test_an_unlinked_paragraph_quoting_a_result_fails(cc, tmp_path):
    # a paragraph on a page no [[coverage]] names, linking nothing: a result in it is still checked
    page = (ROOT / "docs" / "troubleshooting.md").read_text(encoding="utf-8")
    for planted, number in (("SITE reaches 61.2% here.", "61.2"), ("It runs 3.4× faster.", "3.4"),
                            ("A fit takes 12 s.", "12"), ("λ up to 5e5 helps.", "5e5")):
        errors = cc.check(ROOT, pages={"docs/troubleshooting.md": page + "\n" + planted + "\n"})
        assert any("docs/troubleshooting.md" in e and f"number '{number}' looks like a result" in e
                   for e in errors), (planted, errors)
    # a count or a setting without a unit is left to the linked blocks' full check
    assert cc.check(ROOT, pages={"docs/troubleshooting.md": page + "\nRun it on 8 tasks.\n"}) == []
    # an [[ignore]] entry names a setting that reads like a result
    lr = {"docs/troubleshooting.md": page + "\nUse lr 0.25.\n"}
    assert any("'0.25'" in e for e in cc.check(ROOT, pages=lr))
    claims = tmp_path / "claims.toml"
    ignore = '\n[[ignore]]\npage = "docs/troubleshooting.md"\ntexts = ["lr 0.25"]\n'
    claims.write_text((ROOT / "docs" / "claims.toml").read_text(encoding="utf-8") + ignore, encoding="utf-8")
    assert cc.check(ROOT, claims_path=claims, pages=lr) == []


def test_the_number_pattern_reads_exponents_and_thousands_whole(cc):
    def numbers(text):
        return [m.group() for m in cc.NUMBER.finditer(text)]

    got = numbers("λ in 0.05–5e5, lr 1e-3, within 1.26e-4 and 3.05e-05")
    assert got == ["0.05", "5e5", "1e-3", "1.26e-4", "3.05e-05"]
    assert numbers("its 262k-token embedding, 2,048 tokens, −0.31") == ["262k", "2,048", "−0.31"]
    # names are not numbers: models, heads, sizes, versions glued to words
    assert numbers("SmolLM2-135M, Gemma-3-270M, L14H1, top-10, Llama-3.1-8B, 1.7B, bf16") == []
    # a decimal is never read in part (the old pattern read '5' out of '5.1e-5x')
    assert numbers("5.1e-5x 7.5×") == ["7.5"]
    m = next(cc.NUMBER.finditer("took 59.9 s"))
    assert cc.looks_like_result("took 59.9 s", m)
    m = next(cc.NUMBER.finditer("on 8 tasks"))
    assert not cc.looks_like_result("on 8 tasks", m)


def _value(cc, tmp_path, spec: dict) -> float:
    """A csv claim's value on the small table below (independent of any committed file)."""
    (tmp_path / "r.csv").write_text(
        "task,rep,method,acc,ok\n"
        "a,0,x,0.2,True\na,1,x,0.4,False\nb,0,x,1.0,True\n"  # x: task a mean 0.3, task b 1.0
        "a,0,y,0.1,True\nb,0,y,0.5,True\nb,1,y,0.9,False\n")  # y: task a 0.1, task b mean 0.7
    claim = {"id": "t", "source": "r.csv", "csv": spec}
    return cc.value_of(claim, {"t": claim}, cc.Sources(tmp_path))


def test_csv_aggregations_over_groups_filters_and_contrasts(cc, tmp_path):
    x = {"method": "x"}
    # by: a mean over tasks of per-task means (0.3 and 1.0), not the mean over rows (0.533…)
    by_task = {"where": x, "column": "acc", "by": "task", "agg": "mean"}
    assert _value(cc, tmp_path, by_task) == pytest.approx(0.65)
    assert _value(cc, tmp_path, {"where": x, "column": "acc", "agg": "mean"}) == pytest.approx(1.6 / 3)
    # within: per-group sums (rep 0: 1.2, rep 1: 0.4), then their median
    assert _value(cc, tmp_path, {"where": x, "column": "acc", "by": "rep", "within": "sum",
                                 "agg": "median"}) == pytest.approx(0.8)
    # at_least / at_most keep the rows in the bounds (0.4 and 0.5 of 0.1 … 1.0)
    assert _value(cc, tmp_path, {"at_least": {"acc": 0.3}, "at_most": {"acc": 0.6}, "column": "acc",
                                 "agg": "count"}) == 2
    # True/False are 1/0: x holds 2 True of 3
    assert _value(cc, tmp_path, {"where": x, "column": "ok", "agg": "sum"}) == 2
    # contrast: y's per-task mean minus x's (0.4 − 0.65), and the ratio of the two medians (0.5 / 0.4)
    y_x = [{"method": "y"}, {"method": "x"}]
    d = _value(cc, tmp_path, {"column": "acc", "by": "task", "agg": "mean", "contrast": y_x,
                              "op": "difference"})
    assert d == pytest.approx(0.4 - 0.65)
    r = _value(cc, tmp_path, {"column": "acc", "agg": "median", "contrast": y_x, "op": "ratio"})
    assert r == pytest.approx(0.5 / 0.4)
    with pytest.raises(ValueError, match="op = 'difference' or 'ratio'"):
        _value(cc, tmp_path, {"column": "acc", "agg": "mean", "contrast": y_x})


def test_no_claim_reads_a_markdown_table_that_has_a_csv_beside_it(cc):
    """A number quoted from a report is read from the unrounded file the report was made from; the
    markdown tables left are the FV tables."""
    tomllib = cc.tomllib

    claims = tomllib.loads((ROOT / "docs" / "claims.toml").read_text(encoding="utf-8"))["claim"]
    left = {c["source"] for c in claims if "table" in c}
    assert left <= {"benchmarks/results/site_fv.md"}, left


def test_cited_numbers_are_read_from_the_cited_table(cc):
    """A number measured elsewhere lives in benchmarks/cited.csv with its source, model and setting."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from lib.cited import load

    table = load()
    assert {"issue33_fit_eval_site_s", "paper_top10_alpha"} <= set(table)
    assert all(c.source and c.model and c.setting for c in table.values())
    assert "0.573" not in (ROOT / "benchmarks" / "frontier_study.py").read_text(encoding="utf-8")
    run_time = (ROOT / "scripts" / "run_time.py").read_text(encoding="utf-8")
    assert "322" not in run_time and "36.3" not in run_time


def test_spearman_within_groups_is_the_mean_of_the_groups_rank_correlations(cc, tmp_path):
    # task a: ρ = 1, task b: ρ = −1, task c: 2 rows (no correlation), task d: y constant (none)
    rows = ["a,1,1", "a,2,2", "a,3,3", "b,1,3", "b,2,2", "b,3,1", "c,1,1", "c,2,2", "d,1,5", "d,2,5", "d,3,5"]
    (tmp_path / "r.csv").write_text("task,x,y\n" + "\n".join(rows) + "\n")
    def value(spec):
        claim = {"id": "t", "source": "r.csv", "csv": {"column": ["x", "y"], "agg": "spearman", **spec}}
        return cc.value_of(claim, {"t": claim}, cc.Sources(tmp_path))
    assert value({"by": "task"}) == pytest.approx(0.0)
    assert value({"by": "task", "where": {"task": ["a", "c", "d"]}}) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="no group"):
        value({"by": "task", "where": {"task": ["c", "d"]}})


def test_pair_is_the_pearson_r_of_a_column_between_two_row_sets_matched_on_a_key(cc, tmp_path):
    # model m's values by bin 0..3 against model n's (bins listed in another order, one bin only in m)
    rows = ["m,0,1", "m,1,2", "m,2,3", "m,3,4", "m,4,9", "n,3,10", "n,0,2", "n,2,7", "n,1,3"]
    (tmp_path / "r.csv").write_text("model,bin,e\n" + "\n".join(rows) + "\n")
    claim = {"id": "t", "source": "r.csv",
             "csv": {"column": "e", "pair": [{"model": "m"}, {"model": "n"}], "on": "bin"}}
    x, y = np.array([1, 2, 3, 4.0]), np.array([2, 3, 7, 10.0])  # matched bins 0..3
    expected = float(np.corrcoef(x, y)[0, 1])
    assert cc.value_of(claim, {"t": claim}, cc.Sources(tmp_path)) == pytest.approx(expected)


def test_claim_values_are_reused_only_while_claims_and_sources_stay(cc, tmp_path, monkeypatch):
    """check() computes the claims' values once per process (the pages are checked many times in
    this file) and again when a source file or a claim changes."""
    (tmp_path / "r.csv").write_text("model,x\nm,1\nm,3\n")
    claims = {"mean": {"id": "mean", "source": "r.csv", "csv": {"where": {"model": "m"}, "column": "x",
                                                                "agg": "mean"}}}
    computed = []
    real = cc.value_of

    def counting(claim, *a, **kw):
        computed.append(claim["id"])
        return real(claim, *a, **kw)

    monkeypatch.setattr(cc, "value_of", counting)
    assert cc.claim_values(tmp_path, claims) == {"mean": 2.0}
    assert cc.claim_values(tmp_path, claims) == {"mean": 2.0} and computed == ["mean"]
    (tmp_path / "r.csv").write_text("model,x\nm,1\nm,30\n")  # a new size: another file
    assert cc.claim_values(tmp_path, claims) == {"mean": 15.5}
    claims["mean"]["csv"]["agg"] = "max"
    assert cc.claim_values(tmp_path, claims) == {"mean": 30.0} and computed == ["mean"] * 3
    (tmp_path / "r.csv").unlink()
    assert isinstance(cc.claim_values(tmp_path, claims)["mean"], OSError)
