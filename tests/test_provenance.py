"""Results keyed on everything that made them, nothing overwritten or lost (tiny models, fast).

- a resumed bench recomputes exactly the cells whose settings changed, one test per setting class,
  and keeps every earlier row;
- a resumed figures run likewise (numerics version, weights, one task's content);
- ``figures --models X`` merges into ``summary.json``;
- output paths of the wrong kind are refused before any work, with nothing written;
- two real processes appending to one results file lose no rows.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field, replace

import pytest
import torch

import sitelens.pipelines.bench as bench
from sitelens.baselines import ICL, ZeroShot
from sitelens.cli import main
from sitelens.errors import OutputError
from sitelens.io import check_output, sniff_kind
from sitelens.models import load_model
from sitelens.pipelines import figures as F
from sitelens.provenance import NUMERICS_VERSION, settings_hash, task_hash
from sitelens.tasks import Example, Template, load_task
from sitelens.testing import tiny_model

torch.set_num_threads(1)


@dataclass(kw_only=True)
class CountingZeroShot(ZeroShot):
    calls: list = field(default_factory=list, compare=False)  # bookkeeping, not a setting

    def fit(self, model, task, **kw):
        self.calls.append(task.name)
        return super().fit(model, task, **kw)


@dataclass(kw_only=True)
class CountingICL(ICL):
    calls: list = field(default_factory=list, compare=False)

    def fit(self, model, task, **kw):
        self.calls.append(task.name)
        return super().fit(model, task, **kw)


BASE = dict(limit=3, n_shots=2, seed=0, batch_size=16)


def _tasks():
    return [load_task("antonym"), load_task("english_french")]


def _with_new_test_item(task):
    return replace(task, test=[Example("sky", "ground"), *task.test[1:]])


# setting class -> (what to change, the cells that must be recomputed)
CHANGES = {
    "method hyperparameter": ("icl_n_shots", {("antonym", "icl"), ("english_french", "icl")}),
    "n_shots": ("n_shots", "all"),
    "limit": ("limit", "all"),
    "seed": ("seed", "all"),
    "batch_size": ("batch_size", "all"),
    "template": ("template", "all"),
    "n_ctx": ("n_ctx", "all"),
    "task content": ("task", {("antonym", "zero-shot"), ("antonym", "icl")}),
    "model weights": ("weights", "all"),
    "numerics version": ("numerics", "all"),
}
ALL = {(t, m) for t in ("antonym", "english_french") for m in ("zero-shot", "icl")}


@pytest.mark.parametrize("setting", list(CHANGES))
def test_bench_resume_recomputes_exactly_the_changed_cells(setting, tmp_path, monkeypatch):
    out = tmp_path / "r.csv"
    zs, icl = CountingZeroShot(), CountingICL(n_shots=2)
    tasks = _tasks()
    bench.run_bench(["tiny-random"], tasks, [zs, icl], out, **BASE)
    first = out.read_text()
    n_first = len(bench.read_results(out))
    assert n_first == 4
    # a plain rerun reuses everything
    bench.run_bench(["tiny-random"], tasks, [zs, icl], out, **BASE)
    assert out.read_text() == first and zs.calls == icl.calls == ["antonym", "english_french"]

    what, expect = CHANGES[setting]
    kw, models, methods = dict(BASE), ["tiny-random"], [zs, icl]
    if what == "icl_n_shots":
        methods = [zs, CountingICL(n_shots=3, calls=icl.calls)]
    elif what in ("n_shots", "limit", "seed", "batch_size"):
        kw[what] = {"n_shots": 3, "limit": 2, "seed": 1, "batch_size": 2}[what]
    elif what == "template":
        kw["template"] = Template(shot="Input: {x}\nOutput: {y}\n\n", query="Input: {x}\nOutput:")
    elif what == "n_ctx":
        kw["n_ctx"] = 128
    elif what == "task":
        tasks = [_with_new_test_item(tasks[0]), tasks[1]]
    elif what == "weights":
        models = [tiny_model(seed=1)]  # same name and shape, other weights
    elif what == "numerics":
        monkeypatch.setattr(bench, "NUMERICS_VERSION", NUMERICS_VERSION + 1)
    zs.calls.clear()
    icl.calls.clear()
    methods[1].calls.clear() if methods[1] is not icl else None
    df = bench.run_bench(models, tasks, methods, out, **kw)

    redone = {(t, "zero-shot") for t in zs.calls} | {(t, "icl") for t in methods[1].calls}
    assert redone == (ALL if expect == "all" else expect)
    assert len(zs.calls) + len(methods[1].calls) == len(redone)  # each once
    # nothing overwritten: the earlier rows are still there, byte for byte, plus the new ones
    text = out.read_text()
    assert text.startswith(first)
    assert len(bench.read_results(out)) == n_first + len(redone)
    # the returned table is this run's cells only, one per cell, each with its settings
    assert len(df) == 4 and df["key"].is_unique
    assert (df["numerics_version"].astype(int) == bench.NUMERICS_VERSION).all()
    assert set(bench.SETTINGS) <= set(df.columns)
    assert (df["n_shots"] == kw["n_shots"]).all()


def test_bench_reads_and_migrates_a_legacy_file(tmp_path):
    out = tmp_path / "old.csv"
    legacy = ",".join(bench.LEGACY_COLUMNS) + "\n" + \
        "tiny-random,antonym,zero-shot,0,3,0.0,0.0,1.5,0,0.1,0.2,\n"
    out.write_text(legacy)
    old = bench.read_results(out)
    assert len(old) == 1 and old["key"].iloc[0] == "" and old["dntp"].iloc[0] == 1.5
    zs = CountingZeroShot()
    bench.run_bench(["tiny-random"], _tasks()[:1], [zs], out, **BASE)
    assert zs.calls == ["antonym"]  # a legacy row has no key: recomputed, not reused
    df = bench.read_results(out)
    assert len(df) == 2 and df["dntp"].iloc[0] == 1.5  # the old row is kept, under the new header
    assert out.read_text().splitlines()[0] == ",".join(bench.COLUMNS)


def test_settings_hash_is_stable_and_sensitive():
    a = {"x": 1, "y": [1.0, "a"], "z": None}
    assert settings_hash(a) == settings_hash(dict(reversed(list(a.items()))))
    assert settings_hash(a) != settings_hash({**a, "x": 2})
    assert settings_hash(ICL(n_shots=2)) != settings_hash(ICL(n_shots=3))
    t = load_task("antonym")
    assert task_hash(t) == task_hash(load_task("antonym"))
    assert task_hash(t) != task_hash(_with_new_test_item(t))


# ----------------------------------------------------------------------------------------------
# figures

SMALL = dict(
    models=("tiny-random",), tasks=("antonym", "first_letter", "last_letter"),
    intra_tasks=("antonym",), effect_tasks=("antonym",), heatmap_task="antonym", limit=3,
    sparsity=(0.0,), n_examples=8, n_prompts=2, n_shots=2, effect_prompts=2, n_random_seeds=1,
    n_boot=10, formats=("html",), progress=False,
)


def _cells(root):
    return {p.relative_to(root / ".runs" / "tiny-random").as_posix(): p.stat().st_mtime_ns
            for p in (root / ".runs" / "tiny-random").rglob("*") if p.is_file() and p.name != "timings.json"}


def _changed(before, after):
    """Cells written by the second run (new files)."""
    return {p for p in after if p not in before}


@pytest.mark.parametrize("setting", ["numerics version", "model weights", "task content"])
def test_figures_resume_recomputes_exactly_the_changed_cells(setting, tmp_path, monkeypatch):
    F.make_figures(tmp_path, **SMALL)
    before = _cells(tmp_path)
    if setting == "numerics version":
        monkeypatch.setattr(F, "NUMERICS_VERSION", NUMERICS_VERSION + 1)
    elif setting == "model weights":
        import sitelens.models as M

        # make_figures imports load_model from sitelens.models when called
        monkeypatch.setattr(M, "load_model", lambda name, **kw: tiny_model(seed=7))
    else:
        orig = F.load_task

        def patched(name, **kw):
            t = orig(name, **kw)
            return _with_new_test_item(t) if name == "first_letter" else t

        monkeypatch.setattr(F, "load_task", patched)
    F.make_figures(tmp_path, **SMALL)
    after = _cells(tmp_path)
    new = _changed(before, after)
    assert all(after[p] == t for p, t in before.items())  # old cells untouched
    if setting == "task content":
        # first_letter's embedding and adapter, and the inter-task cell (it spans all tasks);
        # antonym's intra and effects cells and last_letter's cells are reused
        assert any(p.startswith("inter") for p in new), sorted(new)
        assert any(p.startswith("adapters/first_letter") for p in new)
        assert all(p.startswith("inter") or "first_letter" in p for p in new), sorted(new)
    else:
        # every cell was recomputed: as many new cell files as there were
        assert len(new) == len(before)


def test_figures_merge_summaries_across_models(tmp_path):
    F.make_figures(tmp_path, **SMALL)
    F.make_figures(tmp_path, **dict(SMALL, models=("tiny-random-gqa",)))
    s = json.loads((tmp_path / "summary.json").read_text())
    assert [m["model"] for m in s["models"]] == ["tiny-random", "tiny-random-gqa"]
    assert all(m["numerics_version"] == NUMERICS_VERSION and "config" in m for m in s["models"])
    # rerunning the first model replaces its entry in place, the other one stays
    F.make_figures(tmp_path, **dict(SMALL, limit=2))
    s2 = json.loads((tmp_path / "summary.json").read_text())
    assert [m["model"] for m in s2["models"]] == ["tiny-random", "tiny-random-gqa"]
    assert s2["models"][0]["config"]["limit"] == 2 and s2["models"][1] == s["models"][1]


def test_figures_migrates_a_summary_with_a_top_level_config(tmp_path):
    old = {"config": {"limit": 40}, "models": [{"model": "other", "intra": {}}], "png": True}
    (tmp_path / "summary.json").write_text(json.dumps(old))
    F.make_figures(tmp_path, **SMALL)
    s = json.loads((tmp_path / "summary.json").read_text())
    assert [m["model"] for m in s["models"]] == ["other", "tiny-random"]
    assert s["models"][0]["config"] == {"limit": 40} and s["models"][0]["numerics_version"] == 1


def test_figures_refuses_a_foreign_summary(tmp_path):
    (tmp_path / "summary.json").write_text("not json")
    with pytest.raises(OutputError, match="not a figures summary"):
        F.make_figures(tmp_path, **SMALL)
    assert (tmp_path / "summary.json").read_text() == "not json"


# ----------------------------------------------------------------------------------------------
# output paths


def test_check_output_kinds(tmp_path):
    check_output(tmp_path / "new.csv", "csv")
    with pytest.raises(OutputError, match="must be a csv file"):
        check_output(tmp_path / "r.md", "csv")
    md = tmp_path / "r.csv"
    md.write_text("# a markdown summary\n")
    assert sniff_kind(md) == "md"
    with pytest.raises(OutputError, match="already holds a md file"):
        check_output(md, "csv")
    (tmp_path / "d.csv").mkdir()
    with pytest.raises(OutputError, match="is a directory"):
        check_output(tmp_path / "d.csv", "csv")


def test_bench_out_of_the_wrong_kind_is_refused_and_nothing_written(tmp_path, capsys):
    md = tmp_path / "r.md"
    rc = main(["bench", "--models", "tiny-random", "--tasks", "antonym", "--methods",
               "zero-shot", "--limit", "2", "--out", str(md)])
    assert rc == 2 and not md.exists() and list(tmp_path.iterdir()) == []
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "must be a csv file" in err[0]
    # the summary's place holds a CSV: refused before any work, the file untouched
    (tmp_path / "r.md").write_text("a,b\n1,2\n")
    rc = main(["bench", "--models", "tiny-random", "--tasks", "antonym", "--methods",
               "zero-shot", "--limit", "2", "--out", str(tmp_path / "r.csv")])
    assert rc == 2 and not (tmp_path / "r.csv").exists()
    assert (tmp_path / "r.md").read_text() == "a,b\n1,2\n"


def test_bench_cli_writes_csv_md_and_html(tmp_path, capsys):
    out = tmp_path / "sub" / "r.csv"
    rc = main(["bench", "--models", "tiny-random", "--tasks", "antonym", "--methods",
               "zero-shot,icl", "--limit", "2", "--out", str(out)])
    assert rc == 0
    assert sniff_kind(out) == "csv" and sniff_kind(out.with_suffix(".md")) == "md"
    assert sniff_kind(out.with_suffix(".dntp.html")) == "html"
    assert sorted(p.name for p in out.parent.iterdir() if not p.name.startswith(".")) == [
        "plotly.min.js", "r.csv", "r.dntp.html", "r.md"]


APPENDER = textwrap.dedent(
    """
    import sys
    from sitelens.pipelines.bench import append_row
    out, who, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    for i in range(n):
        append_row(out, {"model": who, "task": f"t{i}", "method": "m", "seed": 0, "key": f"{who}{i}"})
    """
)


def test_two_processes_appending_lose_no_rows(tmp_path):
    out = tmp_path / "shared.csv"
    script = tmp_path / "append.py"
    script.write_text(APPENDER)
    n = 40
    procs = [subprocess.Popen([sys.executable, str(script), str(out), who, str(n)],
                              stderr=subprocess.PIPE, text=True) for who in ("a", "b")]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    df = bench.read_results(out)
    assert len(df) == 2 * n and df["key"].is_unique
    assert sorted(df["key"]) == sorted(f"{w}{i}" for w in "ab" for i in range(n))
    assert not [p for p in tmp_path.iterdir() if ".tmp" in p.name]  # no temp file left behind


def test_load_model_tiny_n_ctx():
    assert load_model("tiny-random", n_ctx=128).cfg.n_ctx == 128


def test_eval_items_rows_record_their_settings(tmp_path, capsys):
    items = tmp_path / "items.csv"
    rc = main(["eval", "--model", "tiny-random", "--task", "antonym", "--methods", "zero-shot,icl",
               "--limit", "3", "--n-shots", "2", "--seed", "1", "--items", str(items)])
    assert rc == 0
    import pandas as pd

    df = pd.read_csv(items)
    assert len(df) == 6
    for col in ("model", "fingerprint", "task_hash", "split", "n_shots", "seed", "protocol",
                "numerics_version", "method", "prediction"):
        assert col in df.columns, col
    assert (df["n_shots"] == 2).all() and (df["seed"] == 1).all()
    assert (df["protocol"] == "default").all() and (df["model"] == "tiny-random").all()
    assert (df["numerics_version"] == NUMERICS_VERSION).all()
    assert df["task_hash"].iloc[0] == task_hash(load_task("antonym", seed=1))
