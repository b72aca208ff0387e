"""The keyed results store (sitelens.pipelines.store) and the benchmark harness
(sitelens.pipelines.experiment) on tiny data: done keys are skipped, concurrent writers lose no
row, a failed write leaves the old file whole, and a toy experiment resumes and reports."""

from __future__ import annotations

import multiprocessing as mp

import pandas as pd
import pytest

from sitelens.errors import OutputError
from sitelens.pipelines.experiment import DATA_ROOT, Experiment, Job, main, md_table, pct, plan
from sitelens.pipelines.store import ObjectCache, ResultsStore, row_key

COLS = ["key", "x", "y"]


def _rows(keys):
    return [{"key": k, "x": i, "y": f"v{k}"} for i, k in enumerate(keys)]


def test_append_skips_done_keys_and_never_overwrites(tmp_path):
    s = ResultsStore(tmp_path / "r.csv", COLS)
    assert s.append(_rows(["a", "b"])) == 2
    # a rerun: "a" is done (kept as first written); "c" is new, and one call is one cell's rows
    # (two rows sharing its key are both written)
    assert s.append([{"key": "a", "x": 99, "y": "new"}, *_rows(["c", "c"])]) == 2
    assert s.append(_rows(["c"])) == 0
    df = s.read()
    assert df["key"].tolist() == ["a", "b", "c", "c"]
    assert df.loc[0, "x"] == 0 and df.loc[0, "y"] == "va"
    assert s.keys() == {"a", "b", "c"} and "b" in s and "z" not in s


def test_not_done_rows_are_retried(tmp_path):
    s = ResultsStore(tmp_path / "r.csv", ["key", "status"], done=lambda r: r["status"] == "ok")
    s.append([{"key": "a", "status": "failed"}])
    assert s.keys() == set()
    assert s.append([{"key": "a", "status": "ok"}]) == 1
    assert s.append([{"key": "a", "status": "ok"}]) == 0
    assert s.read()["status"].tolist() == ["failed", "ok"]


def test_other_header_is_refused(tmp_path):
    (tmp_path / "r.csv").write_text("key,other\n1,2\n")
    with pytest.raises(OutputError, match="move the old file away"):
        ResultsStore(tmp_path / "r.csv", COLS).append(_rows(["a"]))


def test_nan_is_an_empty_field(tmp_path):
    s = ResultsStore(tmp_path / "r.csv", COLS)
    s.append([{"key": "a", "x": float("nan")}])
    assert (tmp_path / "r.csv").read_text() == "key,x,y\na,,\n"


def _writer(path, worker, n):
    s = ResultsStore(path, COLS)
    for i in range(n):
        s.append([{"key": f"{worker}-{i}", "x": i, "y": worker}])


def test_concurrent_writers_lose_no_row(tmp_path):
    path = tmp_path / "r.csv"
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(path, w, 25)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
        assert p.exitcode == 0
    df = ResultsStore(path, COLS).read()
    assert len(df) == 100 and df["key"].nunique() == 100


def test_a_failed_write_leaves_the_old_file(tmp_path, monkeypatch):
    import sitelens.io as sio

    path = tmp_path / "r.csv"
    s = ResultsStore(path, COLS)
    s.append(_rows(["a", "b"]))
    before = path.read_bytes()

    def killed(fd):  # the process dies after the new bytes are written, before they are durable
        raise KeyboardInterrupt

    monkeypatch.setattr(sio.os, "fsync", killed)
    with pytest.raises(KeyboardInterrupt):
        s.append(_rows(["c"]))
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [".r.csv.lock", "r.csv"]


def test_row_key_is_the_settings_hash():
    from sitelens.provenance import settings_hash

    s = {"model": "m", "seed": 0, "limit": 50}
    assert row_key(s) == settings_hash(s, n=16) and len(row_key(s)) == 16


def test_object_cache_computes_once(tmp_path):
    import torch

    cache, calls = ObjectCache(tmp_path / "c"), []

    def compute():
        calls.append(1)
        return {"t": torch.arange(3)}

    a = cache.get("x", {"p": 1}, compute)
    b = cache.get("x", {"p": 1}, compute)
    cache.get("x", {"p": 2}, compute)
    assert len(calls) == 2 and torch.equal(a["t"], b["t"])


# ----------------------------------------------------------------------------------------------
# the harness on a toy experiment


class Squares(Experiment):
    name = "squares"
    title = "Squares"
    columns = ["key", "model", "task", "n", "value"]
    models = ("m1", "m2")
    tasks = ("t1",)
    limit = 3

    def cells(self, args):
        for m in args.models:
            for t in args.tasks:
                s = {"model": m, "task": t, "limit": args.limit}
                yield Job(row_key(s), f"{m}/{t}", s)

    def run(self, job):
        self.ran = getattr(self, "ran", []) + [job.label]
        return {"key": job.key, "model": job["model"], "task": job["task"], "n": job["limit"],
                "value": job["limit"] ** 2}

    def report(self, df):
        return md_table(df[["model", "task", "value"]])


def test_experiment_runs_resumes_and_reports(tmp_path, capsys):
    exp = Squares()
    assert main(exp, ["--out", str(tmp_path)], prog="benchmarks/squares.py") == 0
    assert exp.ran == ["m1/t1", "m2/t1"]
    md = (tmp_path / "squares.md").read_text()
    assert md.splitlines()[:3] == ["# Squares", "", "Made by `python benchmarks/squares.py --out "
                                   f"{tmp_path}`."]
    assert "| m2 | t1 | 9 |" in md
    # a rerun skips both cells; a third model runs only its own
    exp2 = Squares()
    main(exp2, ["--out", str(tmp_path), "--models", "m1,m2,m3"], prog="benchmarks/squares.py")
    assert exp2.ran == ["m3/t1"]
    assert len(pd.read_csv(tmp_path / "squares.csv")) == 3


def test_dry_run_runs_nothing_and_lists_the_rest(tmp_path, capsys):
    main(Squares(), ["--out", str(tmp_path), "--models", "m1"], prog="x")
    exp = Squares()
    main(exp, ["--out", str(tmp_path), "--models", "m1,m2", "--dry-run"], prog="x")
    out = capsys.readouterr().out
    assert "2 cell(s), 1 done, 1 to run" in out and "would run m2/t1" in out
    assert not hasattr(exp, "ran")
    assert len(pd.read_csv(tmp_path / "squares.csv")) == 1


class Cubes(Squares):
    """Unkeyed rows, a cell done when its model has a row; the report is the whole file."""

    name, title, key = "cubes", "", None

    def done_keys(self):
        return set(self.read()["model"])

    def cells(self, args):
        return [Job(m, m, {"model": m, "task": "t1", "limit": args.limit}) for m in args.models]

    def report(self, df):
        return f"# Cubes\n\n{len(df)} rows\n"


def test_done_keys_and_a_report_that_is_the_whole_file(tmp_path, capsys):
    main(Cubes(), ["--out", str(tmp_path), "--models", "m1"], prog="x")
    exp = Cubes()
    main(exp, ["--out", str(tmp_path), "--models", "m1,m2"], prog="x")
    assert exp.ran == ["m2"] and "2 cell(s), 1 done, 1 to run" in capsys.readouterr().out
    assert (tmp_path / "cubes.md").read_text() == "# Cubes\n\n2 rows\n"


def test_common_flags_and_defaults(tmp_path):
    exp = Squares()
    args = exp.parser().parse_args(["--tasks", "a,b", "--limit", "5", "--executor", "processes:2"])
    assert args.models == ["m1", "m2"] and args.tasks == ["a", "b"] and args.limit == 5
    assert args.data_root == DATA_ROOT and DATA_ROOT.parts[-2:] == ("shared", "datasets")
    args.out = tmp_path
    cells, todo = plan(exp, args)
    assert len(cells) == len(todo) == 4


def test_pct():
    assert pct(0.1234) == "12.3" and pct(float("nan")) == "–" and pct("") == "–"


def test_an_older_header_is_upgraded_with_its_rows_kept_as_written(tmp_path):
    # bench's results files from before the label metrics: the store reads them with the new
    # column blank and rewrites them with the full header on the first append, old text intact
    path = tmp_path / "r.csv"
    path.write_text("key,x\nk0,0.10000000000000001\n,7\n")  # a keyless legacy row, a long float
    store = ResultsStore(path, COLS, older=[["key", "x"]])
    assert store.keys() == {"k0"} and store.rows()[1] == {"key": "", "x": "7", "y": ""}
    assert store.append(_rows(["k0", "k1"])) == 1
    assert path.read_text() == "key,x,y\nk0,0.10000000000000001,\n,7,\nk1,1,vk1\n"
    with pytest.raises(OutputError, match="columns"):
        ResultsStore(path, ["key", "z"], older=[["key", "x"]]).rows()
