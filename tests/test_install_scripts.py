"""Getting started without this checkout's neighbours: the set-up and the demo need no browser,
the FV data's public layout loads as it is, and the benchmarks' datasets root can be moved."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_setup_and_demo_need_no_chromium_only_the_tests_do():
    """The demo's path (scripts/demo.sh → scripts/setup.sh) never looks for a browser; the test
    command sources scripts/chromium.sh, the one place that does."""
    for script in ("setup.sh", "demo.sh"):
        text = (ROOT / "scripts" / script).read_text(encoding="utf-8").lower()
        assert "chromium" not in text, f"scripts/{script} still requires a Chromium"
    assert ". scripts/chromium.sh" in (ROOT / "scripts" / "test.sh").read_text(encoding="utf-8")


def test_chromium_script_accepts_a_given_browser(tmp_path):
    """scripts/chromium.sh finds the browser named by $SITELENS_CHROMIUM and goes on (exit 0, no
    install attempt, the browser tier kept)."""
    browser = tmp_path / "chromium"
    browser.write_text("#!/bin/sh\nexit 0\n")
    browser.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "SITELENS_CHROMIUM": str(browser), "HOME": str(tmp_path)}
    out = subprocess.run(["bash", "-c", ". scripts/chromium.sh; echo skip=${SITELENS_SKIP_BROWSER:-}"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("skip=") and "apt-get" not in out.stdout


def test_the_site_repository_layout_loads_as_it_is(tmp_path):
    """SITE's public code keeps the FV tasks as ``dataset/TASK/{train,valid,test}.json`` (lists of
    ``{"input", "output"}``): a clone's folder is a collection and each task keeps its splits."""
    import sitelens as sl

    for task, n in (("antonym", 3), ("country-capital", 2)):
        d = tmp_path / "Soft_Injection" / "dataset" / task
        d.mkdir(parents=True)
        for split, m in (("train", 4 * n), ("valid", n), ("test", n)):
            items = [{"input": f"{task}-{split}-{i}", "output": f"out{i}"} for i in range(m)]
            (d / f"{split}.json").write_text(json.dumps(items, indent=2))
    t = sl.load_task(tmp_path / "Soft_Injection" / "dataset" / "antonym")
    assert (len(t.train), len(t.valid), len(t.test)) == (12, 3, 3)
    assert t.test[0].input == "antonym-test-0"  # the given split, not a re-split
    coll = sl.load_collection(tmp_path / "Soft_Injection" / "dataset")
    assert [x.name for x in coll] == ["antonym", "country-capital"]


def test_benchmarks_datasets_root_follows_the_environment(tmp_path):
    code = "from sitelens.pipelines.experiment import DATA_ROOT; print(DATA_ROOT)"
    env = {**os.environ, "SITELENS_DATA_ROOT": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(tmp_path)
