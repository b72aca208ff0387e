"""Sweeps on executors (sitelens.pipelines.executors): the same bench grid and the same figures run in this
process, on two worker processes and on a real Ray cluster started here on 127.0.0.1 give exactly
the same rows / summary; a worker SIGKILLed in the middle of a cell loses nothing and duplicates
nothing; bad executor values and a missing ray are typed errors.

The grid is the tiny random model (``tiny-random``) × 2 tasks × {zero-shot, tv}, 4 test items,
2 shots: seconds per cell. Every process computes with one torch thread, so the numbers are
bit-identical and compared exactly (timing columns aside). The Ray tests skip, with the reason,
only when ray is not installed (``pip install 'sitelens[ray]'``; ``.[dev]`` has it).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
from executor_util import CountLoads, KillOnce

from sitelens.errors import ExecutorError
from sitelens.pipelines import bench
from sitelens.pipelines import figures as F
from sitelens.pipelines.executors import (
    Cell,
    LocalExecutor,
    ProcessExecutor,
    RayExecutor,
    make_executor,
    parse_executor,
    ray_available,
)

torch.set_num_threads(1)  # as in every worker (threads=1): bit-identical numbers

TESTS = Path(__file__).resolve().parent
TASKS = ["antonym", "english_french"]
METHODS = ["zero-shot", "tv"]
GRID = dict(limit=4, n_shots=2)
TIMING = ["fit_seconds", "seconds_per_item"]  # wall times: differ between any two runs


def _sorted(df: pd.DataFrame) -> pd.DataFrame:
    return df.sort_values("key").reset_index(drop=True)


def _same_rows(got: pd.DataFrame, want: pd.DataFrame) -> None:
    """The same cells (keys) with the same settings and metrics, exactly (no tolerance: the same
    code on the same thread count gives the same bits in every process)."""
    assert not got["key"].duplicated().any()
    pd.testing.assert_frame_equal(_sorted(got).drop(columns=TIMING),
                                  _sorted(want).drop(columns=TIMING), check_exact=True)


@pytest.fixture(scope="module")
def local_rows(tmp_path_factory) -> pd.DataFrame:
    """The grid run in this process (the default executor): the reference."""
    out = tmp_path_factory.mktemp("local") / "bench.csv"
    df = bench.run_bench(["tiny-random"], TASKS, METHODS, out, **GRID)
    assert len(df) == 4 and not df["error"].str.len().any()
    # the cells differ from each other: a run that mixed up cells could not pass _same_rows
    assert df["dntp"].nunique() >= 2 and df["key"].nunique() == 4
    return bench.read_results(out)


# ----------------------------------------------------------------------------------------------
# the --executor value


@pytest.mark.parametrize("spec, want", [
    ("local", ("local", None)), ("processes:1", ("processes", 1)),
    ("processes:16", ("processes", 16)), ("ray", ("ray", None)), ("ray:auto", ("ray", "auto")),
    ("ray:127.0.0.1:6379", ("ray", "127.0.0.1:6379")),
    ("ray:head-0.cluster.local:10001", ("ray", "head-0.cluster.local:10001")),
])
def test_parse_executor(spec, want):
    assert parse_executor(spec) == want


@pytest.mark.parametrize("spec", [
    "gpu", "", "processes", "processes:", "processes:0", "processes:-1", "processes:1025",
    "processes:2.5", "processes:٣", "ray:", "ray:not-an-address", "ray:host:0", "ray:host:65536",
    "ray::6379", "ray:-host:1", "local:1", "Ray", " ray", "ray ",
])
def test_bad_executor_is_a_typed_error(spec):
    with pytest.raises(ExecutorError):
        parse_executor(spec)
    with pytest.raises(ExecutorError):
        make_executor(spec)


def test_make_executor():
    assert isinstance(make_executor(None), LocalExecutor)
    assert isinstance(make_executor("local"), LocalExecutor)
    ex = make_executor("processes:3", threads=2)
    assert isinstance(ex, ProcessExecutor) and (ex.n, ex.threads) == (3, 2)
    ray_ex = make_executor("ray:127.0.0.1:6379")  # nothing is imported or started yet
    assert isinstance(ray_ex, RayExecutor) and ray_ex.address == "127.0.0.1:6379"
    mine = LocalExecutor()
    assert make_executor(mine) is mine


def _square(x: int) -> int:
    return x * x


def test_local_executor_runs_cells_in_order():
    got = []
    cells = [Cell(f"k{i}", _square, (i,)) for i in range(4)]
    LocalExecutor().run(cells, lambda c, r: got.append((c.key, r)))
    assert got == [("k0", 0), ("k1", 1), ("k2", 4), ("k3", 9)]
    with pytest.raises(ValueError, match="share the key"):
        LocalExecutor().run([Cell("k", _square, (1,)), Cell("k", _square, (2,))], lambda c, r: None)


def test_append_row_is_idempotent(tmp_path):
    out = tmp_path / "r.csv"
    row = {"model": "m", "task": "t", "method": "x", "seed": 0, "key": "abc", "n": 3}
    assert bench.append_row(out, row) is True
    assert bench.append_row(out, dict(row, n=4)) is False  # same key: a rerun cell, not a new row
    df = bench.read_results(out)
    assert list(df["key"]) == ["abc"] and list(df["n"]) == [3]


def test_ray_missing_is_a_typed_error(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    assert not ray_available()
    with pytest.raises(ExecutorError, match=r"pip install 'sitelens\[ray\]'"):
        RayExecutor().run([Cell("k", _square, (1,))], lambda c, r: None)
    with pytest.raises(ExecutorError, match=r"ray package"):
        bench.run_bench(["tiny-random"], TASKS[:1], ["zero-shot"], tmp_path / "b.csv", **GRID,
                        executor="ray")
    assert not (tmp_path / "b.csv").exists()


def test_workers_need_model_names(tiny_mha, tmp_path):
    with pytest.raises(ExecutorError, match="model names"):
        bench.run_bench([tiny_mha], TASKS[:1], ["zero-shot"], tmp_path / "b.csv", **GRID,
                        executor="processes:2")
    assert not (tmp_path / "b.csv").exists()


# ----------------------------------------------------------------------------------------------
# worker processes


@pytest.fixture(scope="module")
def processes():
    with ProcessExecutor(2, threads=1) as ex:  # one pool for the module: workers keep the model
        yield ex


def test_processes_give_the_in_process_rows(processes, local_rows, tmp_path):
    out = tmp_path / "bench.csv"
    df = bench.run_bench(["tiny-random"], TASKS, METHODS, out, **GRID, executor=processes)
    _same_rows(bench.read_results(out), local_rows)
    assert list(df["key"]) == list(local_rows["key"])  # returned in models × tasks × methods order


def _killed_worker_run(executor, tmp_path, local_rows):
    """The grid plus a kill-once method in the middle: the first kill-once cell SIGKILLs its
    worker; the executor reruns it. Every cell ends up in the CSV exactly once."""
    marker = tmp_path / "killed.pid"
    killer = KillOnce(marker=str(marker), driver_pid=os.getpid())
    out = tmp_path / "bench.csv"
    bench.run_bench(["tiny-random"], TASKS, [METHODS[0], killer, METHODS[1]], out, **GRID,
                    executor=executor)
    pid = int(marker.read_text())  # a worker did die in a cell ...
    assert pid != os.getpid()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # ... and is gone
    got = bench.read_results(out)
    assert len(got) == 6 and not got["key"].duplicated().any()  # nothing lost, nothing twice
    assert not got["error"].str.len().any()
    _same_rows(got[got.method != "kill-once"], local_rows)
    assert len(out.read_text().splitlines()) == 7  # header + 6 rows: no duplicate line either


def test_processes_rerun_a_killed_workers_cell(processes, local_rows, tmp_path):
    _killed_worker_run(processes, tmp_path, local_rows)


def _count_cells(tmp_path, executor, *, forget: bool = False) -> list[tuple[int, int, int]]:
    """run_bench over 2 tasks x 2 CountLoads methods (4 cells of one model) on ``executor``:
    ``(pid, id(model), loads)`` of every cell (see executor_util.CountLoads)."""
    log = tmp_path / "loads.log"
    methods = [CountLoads(name=f"count-loads-{i}", log=str(log), forget=forget) for i in range(2)]
    bench.run_bench(["tiny-random"], TASKS, methods, tmp_path / "bench.csv", **GRID, executor=executor)
    rows = [tuple(map(int, line.split())) for line in log.read_text().splitlines()]
    assert len(rows) == 4
    return rows


def _one_model_per_process(rows) -> bool:
    """Every process used one model object and loaded none after its first cell."""
    pids = {p for p, _, _ in rows}
    return all(len({m for p, m, _ in rows if p == pid}) == 1 for pid in pids) and not any(n for *_, n in rows)


def test_processes_keep_one_model_per_worker(processes, tmp_path):
    """Cells of one model on two workers: each worker loads the model once, for its first cell."""
    rows = _count_cells(tmp_path, processes)
    assert len({p for p, _, _ in rows}) <= 2 and os.getpid() not in {p for p, _, _ in rows}
    assert _one_model_per_process(rows)


def test_one_model_per_worker_catches_a_worker_that_reloads(tmp_path):
    """Mutation: a worker that drops its model after each cell loads it again; the check sees it."""
    with ProcessExecutor(2, threads=1) as ex:
        rows = _count_cells(tmp_path, ex, forget=True)
    assert not _one_model_per_process(rows) and any(n > 0 for *_, n in rows)


@pytest.mark.parametrize("forget", [False, True], ids=["reused", "mutation-reloads"])
def test_in_process_cells_reuse_the_drivers_model(monkeypatch, tmp_path, forget):
    """In this process, run_bench loads the model once (for its fingerprint) and every cell uses
    that very model; the planted bug (the cached model dropped after a cell) is caught."""
    import sitelens.models as models

    loads, real = [], models.load_model

    def counted(*a, **kw):
        loads.append(a[0])
        return real(*a, **kw)

    monkeypatch.setattr(models, "load_model", counted)  # what cached_model calls
    monkeypatch.setattr(bench, "load_model", counted)  # the driver's load, for the fingerprint
    rows = [(p, m, 0) for p, m, _ in _count_cells(tmp_path, None, forget=forget)]
    assert {p for p, _, _ in rows} == {os.getpid()}
    if forget:
        assert len(loads) > 1
    else:
        assert loads == ["tiny-random"] and _one_model_per_process(rows)


def test_a_worker_with_other_weights_refuses_the_cell(tmp_path):
    """A cell keyed on weights the worker does not have is refused, not written under that key."""
    from sitelens.baselines import get_method
    from sitelens.tasks import load_task

    task, cfg = load_task("antonym"), bench.BenchConfig(limit=2, n_shots=2)
    job = bench.BenchJob("tiny-random", None, task, get_method("zero-shot"),
                         {"fingerprint": "0000000000000000"}, "k", cfg)
    with pytest.raises(ExecutorError, match="weight fingerprint"):
        bench.run_cell(job)
    fig = F.FigureJob("tiny-random", "0000000000000000", str(tmp_path), F.FigureConfig().resolved(),
                      "embedding", "antonym")
    with pytest.raises(ExecutorError, match="weight fingerprint"):
        F.run_figure_cell(fig)
    assert not any(tmp_path.iterdir())


def test_cached_model_loads_with_the_load_spec():
    """The worker's model loads with the cell's LoadSpec (not with the environment), and a
    different spec is a different model."""
    from sitelens.models import LoadSpec
    from sitelens.pipelines.executors import cached_model

    m16 = cached_model("tiny-random", None, LoadSpec(dtype="bfloat16"))
    assert m16.cfg.dtype == torch.bfloat16
    assert cached_model("tiny-random", None, LoadSpec(dtype="bfloat16")) is m16
    m32 = cached_model("tiny-random", None, LoadSpec())
    assert m32.cfg.dtype == torch.float32 and m32 is not m16


def test_run_bench_loads_with_its_load_spec(tmp_path):
    from sitelens.models import LoadSpec, fingerprint, load_model

    df = bench.run_bench(["tiny-random"], ["antonym"], ["zero-shot"], tmp_path / "b.csv", limit=2,
                         n_shots=2, load=LoadSpec(dtype="bfloat16"))
    assert df["fingerprint"].tolist() == [fingerprint(load_model("tiny-random", dtype="bfloat16"))]


def _hooked_default() -> bool:
    from sitelens.models import has_hooked_transformer, resolve_backend

    return has_hooked_transformer() and resolve_backend(None) == "hooked"


@pytest.mark.skipif(not _hooked_default(), reason="the atlas's DLA and logit lens need a "
                    "HookedTransformer (TransformerLens 3.x, the hooked backend)")
def test_atlas_fits_on_processes(processes, tmp_path):
    from sitelens.atlas import AtlasConfig, build_atlas_data
    from sitelens.models import load_model
    from sitelens.tasks import load_task

    model = load_model("tiny-random")
    tasks = [load_task(t) for t in ("antonym", "english_french", "present_past")]  # 3: correlations
    cfg = AtlasConfig(n_examples=16, n_prompts=4, n_shots=2, transfer_limit=3, n_perm=20,
                      fast_lenses=("alpha-grad",))
    local = build_atlas_data(model, tasks, cfg, cache_dir=tmp_path / "local")
    spread = build_atlas_data(model, tasks, cfg, cache_dir=tmp_path / "spread", executor=processes,
                              model_spec="tiny-random")

    def fits(root):
        return sorted(p.name for p in (root / "tiny-random" / "adapters").iterdir())

    assert fits(tmp_path / "spread") == fits(tmp_path / "local") and len(fits(tmp_path / "local")) == 3
    for table in ("alpha", "transfer", "lenses", "tokens"):  # the same fits, so the same tables
        pd.testing.assert_frame_equal(getattr(spread, table), getattr(local, table),
                                      check_exact=True)


# ----------------------------------------------------------------------------------------------
# a real Ray cluster: `ray start --head --block` on 127.0.0.1, two CPUs (two workers)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(proc: subprocess.Popen) -> None:
    """Stop the `ray start --block` process we started: SIGTERM makes it stop the Ray processes it
    started; if it hangs, SIGKILL its process group (its own session, made for it)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


@pytest.fixture(scope="module")
def ray_address(tmp_path_factory):
    """A Ray head on 127.0.0.1 with 2 CPUs, started by this test module and stopped after it.
    Its workers find tests/executor_util.py through PYTHONPATH. A start that times out (the
    raylet waits a fixed time for its Python agents, which a crowded machine can miss) is tried
    again on fresh ports, three times in all."""
    pytest.importorskip("ray", reason="ray is not installed: pip install 'sitelens[ray]'")
    ray_bin = Path(sys.executable).with_name("ray")
    env = dict(os.environ, OMP_NUM_THREADS="1", RAY_USAGE_STATS_ENABLED="0",
               PYTHONPATH=os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH"))
                                          if p))
    logs = tmp_path_factory.mktemp("ray")
    # Ray's own temp dir for this cluster (short: its unix sockets live there), so that the
    # machine's /tmp/ray/ray_current_cluster, which `ray.init()` reads, never names this cluster
    temp = Path(tempfile.mkdtemp(prefix="slray", dir="/tmp"))
    for attempt in range(3):
        port = _free_port()
        args = [str(ray_bin), "start", "--head", "--block", f"--port={port}", f"--temp-dir={temp}",
                "--node-ip-address=127.0.0.1", "--num-cpus=2", "--include-dashboard=false",
                "--disable-usage-stats", f"--dashboard-agent-listen-port={_free_port()}",
                f"--dashboard-agent-grpc-port={_free_port()}",
                f"--runtime-env-agent-port={_free_port()}", f"--metrics-export-port={_free_port()}",
                f"--node-manager-port={_free_port()}", f"--object-manager-port={_free_port()}",
                f"--dashboard-port={_free_port()}",
                "--object-store-memory=100000000"]  # every port free: two test runs side by side
        log = logs / f"ray_start_{attempt}.log"
        with open(log, "w") as f:
            proc = subprocess.Popen(args, stdout=f, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)
        deadline = time.monotonic() + 240
        while proc.poll() is None and time.monotonic() < deadline:
            if "Ray runtime started" in log.read_text():
                break
            time.sleep(0.5)
        if proc.poll() is None and "Ray runtime started" in log.read_text():
            break
        _stop(proc)
    else:
        shutil.rmtree(temp, ignore_errors=True)
        pytest.fail(f"`ray start --head` failed 3 times; the last log ends:\n"
                    f"{log.read_text()[-3000:]}")
    try:
        yield f"127.0.0.1:{port}"
    finally:
        import ray

        if ray.is_initialized():
            ray.shutdown()
        _stop(proc)
        shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture(scope="module")
def on_ray(ray_address):
    """One driver connection for the module (its workers keep the model between tests). The
    backend is set explicitly, so the workers get it the way a remote cluster's would: as a
    ``SITELENS_*`` variable of the job's runtime environment."""
    from sitelens.models import resolve_backend

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SITELENS_BACKEND", resolve_backend(None))
        with RayExecutor(ray_address, threads=1) as ex:
            yield ex


def test_ray_gives_the_in_process_rows(on_ray, local_rows, tmp_path):
    out = tmp_path / "bench.csv"
    df = bench.run_bench(["tiny-random"], TASKS, METHODS, out, **GRID, executor=on_ray)
    _same_rows(bench.read_results(out), local_rows)
    assert list(df["key"]) == list(local_rows["key"])


def test_ray_reruns_a_killed_workers_cell(on_ray, local_rows, tmp_path):
    _killed_worker_run(on_ray, tmp_path, local_rows)


FIG = dict(models=("tiny-random",), tasks=("english_french", "first_letter", "antonym"),
           intra_tasks=("antonym", "first_letter"), effect_tasks=("antonym",),
           heatmap_task="antonym", limit=4, sparsity=(0.0, 2.0), n_examples=16, n_prompts=2,
           n_shots=2, effect_prompts=2, n_random_seeds=2, n_boot=20, formats=("html",),
           progress=False, threads=1)


def _measured(summary: dict) -> dict:
    """The summary without its wall times (which differ between any two runs)."""
    s = json.loads(json.dumps(summary))
    s.pop("wall_seconds_this_run")
    for m in s["models"]:
        m.pop("compute_seconds")
        for e in m["effects"].values():
            e.pop("seconds")
    return s


def _cell_names(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in (root / ".runs").rglob("*")
            if p.is_file() and not p.name.startswith(".") and p.name != "timings.json"}


def test_ray_figures_write_the_same_summary(on_ray, tmp_path):
    local, distributed = tmp_path / "local", tmp_path / "ray"
    F.make_figures(local, **FIG)
    F.make_figures(distributed, executor=on_ray, **FIG)
    want = json.loads((local / "summary.json").read_text())
    got = json.loads((distributed / "summary.json").read_text())
    assert _measured(got) == _measured(want)
    cells = _cell_names(local)
    assert _cell_names(distributed) == cells  # the same cells, under the same keys
    for name in sorted(cells):
        if name.endswith(".csv"):  # written by a worker vs in this process: the same bytes ...
            a, b = (root / name for root in (distributed, local))
            if "/effects/" in name:  # ... but for the wall time of the effects pass
                pd.testing.assert_frame_equal(pd.read_csv(a).drop(columns="seconds"),
                                              pd.read_csv(b).drop(columns="seconds"))
            else:
                assert a.read_bytes() == b.read_bytes(), name
    for name in ("patching_gaps.csv", "inter_accuracy.csv", "alpha_similarity.csv"):
        # the figures' tables: a cell read back from its CSV has float columns where a cell just
        # computed has ints (8.0 vs 8), as on any resumed run; the values are the same
        pd.testing.assert_frame_equal(pd.read_csv(distributed / "tiny-random" / name),
                                      pd.read_csv(local / "tiny-random" / name), check_dtype=False,
                                      check_exact=True)
    # each worker recorded its cells' times in the one ledger, merged under a lock: none lost
    def ledger(root):
        return set(json.loads((root / ".runs" / "tiny-random" / "timings.json").read_text()))

    assert ledger(distributed) == ledger(local)
    assert sum(k.startswith("fit/") for k in ledger(local)) == 5  # 3 tasks at λ=2, 2 intra at λ=0


def test_cli_bench_on_ray(on_ray, ray_address, local_rows, tmp_path, capsys):
    from sitelens.cli import main

    out = tmp_path / "cli.csv"
    rc = main(["bench", "--models", "tiny-random", "--tasks", "antonym", "--methods", "zero-shot",
               "--limit", "2", "--threads", "1", "--out", str(out),
               "--executor", f"ray:{ray_address}"])
    assert rc == 0, capsys.readouterr().err
    ref = tmp_path / "ref.csv"
    assert main(["bench", "--models", "tiny-random", "--tasks", "antonym", "--methods",
                 "zero-shot", "--limit", "2", "--threads", "1", "--out", str(ref)]) == 0
    _same_rows(bench.read_results(out), bench.read_results(ref))
