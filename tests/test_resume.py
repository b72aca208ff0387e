"""A bench run killed with SIGKILL in the middle of a cell resumes without redoing or losing the
finished cells, and ends with the same table as an uninterrupted run (timing columns aside)."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pandas as pd
import torch

from sitelens.pipelines import bench

TIMING = ["fit_seconds", "seconds_per_item"]

CHILD = textwrap.dedent(
    """
    import os, sys, time
    import torch
    torch.set_num_threads(1)
    from sitelens.pipelines import bench
    from sitelens.baselines.site import SITE
    from sitelens.site import FitConfig

    out, marker = sys.argv[1], sys.argv[2]


    class PausingSITE(SITE):
        def fit(self, model, task, **kw):
            if os.environ.get("PAUSE_IN_FIT"):  # the parent kills us while we sit here
                open(marker, "w").close()
                time.sleep(120)
            return super().fit(model, task, **kw)


    site = PausingSITE(n_prompts=4, n_shots=2, config=FitConfig(n_examples=8, batch_size=4))
    bench.run_bench(["tiny-random"], ["antonym", "english_french"], ["zero-shot", "icl", site],
                    out, limit=4, n_shots=2)
    """
)


def _uninterrupted(out):
    """The same bench in this process, on one thread like the child."""
    from sitelens.baselines.site import SITE
    from sitelens.site import FitConfig

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        site = SITE(n_prompts=4, n_shots=2, config=FitConfig(n_examples=8, batch_size=4))
        bench.run_bench(["tiny-random"], ["antonym", "english_french"], ["zero-shot", "icl", site],
                        out, limit=4, n_shots=2)
    finally:
        torch.set_num_threads(threads)


def _start(tmp_path, out, **env):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    return subprocess.Popen(
        [sys.executable, str(script), str(out), str(tmp_path / "marker")],
        env=dict(os.environ, OMP_NUM_THREADS="1", **env),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def _rows(path):
    return path.read_text().splitlines()[1:] if path.exists() else []


def test_killed_bench_resumes_to_the_uninterrupted_result(tmp_path):
    killed, clean = tmp_path / "killed.csv", tmp_path / "clean.csv"
    victim = _start(tmp_path, killed, PAUSE_IN_FIT="1")
    _uninterrupted(clean)  # while the child starts up
    marker = tmp_path / "marker"
    deadline = time.monotonic() + 90
    while not marker.exists():  # the run is inside its third cell (SITE on antonym)
        assert victim.poll() is None, victim.communicate()[1]
        assert time.monotonic() < deadline, "the child never reached the SITE cell"
        time.sleep(0.05)
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait(timeout=30)
    assert victim.returncode == -signal.SIGKILL

    before = _rows(killed)
    methods = bench.read_results(killed)["method"].tolist()
    assert methods == ["zero-shot", "icl"]  # finished cells, no torn line

    resumed = _start(tmp_path, killed)  # same command, no pause: picks up where it died
    _, err = resumed.communicate(timeout=120)
    assert resumed.returncode == 0, err

    after = _rows(killed)
    assert after[:2] == before  # the finished cells were kept byte for byte, not redone
    assert len(after) == 6  # 2 tasks x 3 methods, each once
    got, want = bench.read_results(killed), bench.read_results(clean)
    assert not got["error"].str.len().any()
    # The child's SITE is a subclass (PausingSITE): its type name is part of the method's settings,
    # so method_params and the key differ; every measured value must be identical.
    differ = TIMING + ["method_params", "key"]
    pd.testing.assert_frame_equal(got.drop(columns=differ), want.drop(columns=differ), check_exact=True)
