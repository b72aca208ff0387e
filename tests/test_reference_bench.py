"""The pure parts of benchmarks/reference.py: the CPU patches of the SITE reference code (on small
fixtures, and on the real files when the offline mirror of the reference is on this machine), and
the summary and report built from a small table of per-item texts. Running the reference itself
is the benchmark's job, never a test's."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import pandas as pd
import pytest
from bench_util import bench_module

rb = bench_module("reference")  # benchmarks/reference.py

MIRRORS = Path("/work/.mirror")
SITE_MIRROR = MIRRORS / "SNU-DRL+Soft_Injection" / "repo"
BAUKIT_MIRROR = MIRRORS / "davidbau+baukit" / "repo"


def _show(repo: Path, path: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "show", f"HEAD:{path}"], capture_output=True,
                          text=True, check=True).stdout


def test_cuda_strings_become_cpu_and_cuda_calls_stay():
    src = "x = y.to('cuda')\np = torch.full(s, 0.0, device=\"cuda\")\ntorch.cuda.empty_cache()\n"
    out = rb.patch_cuda(src)
    assert out == "x = y.to('cpu')\np = torch.full(s, 0.0, device=\"cpu\")\ntorch.cuda.empty_cache()\n"
    with pytest.raises(ValueError, match="no 'cuda' device string"):
        rb.patch_cuda("torch.cuda.empty_cache()\n")


def test_bitsandbytes_becomes_optional():
    out = rb.patch_bitsandbytes("import torch\nimport bitsandbytes as bnb\nx = 1\n")
    ns: dict = {}
    exec(compile(out, "utils.py", "exec"), ns)  # no bitsandbytes here: the import must not fail
    assert ns["x"] == 1 and "bnb" in ns
    with pytest.raises(ValueError, match="bitsandbytes"):
        rb.patch_bitsandbytes("import torch\n")


LOAD_MODEL = '''def load_model(model_name, cur_dataset, lr):

    """
    Loads a hub model.
    """

    if model_name.lower() == "meta-llama/Llama-3.1-8b".lower():
        return "hub"
    return None
'''


def test_load_model_takes_a_local_folder_first(tmp_path):
    out = rb.patch_load_model(LOAD_MODEL)
    assert out.index("_os.path.isdir(model_name)") < out.index('"meta-llama/Llama-3.1-8b"')

    class Stub:
        @staticmethod
        def from_pretrained(name, **kw):
            return (name, kw)

    ns = dict(LlamaForCausalLM=Stub, AutoTokenizer=Stub, torch=__import__("torch"),
              LlamaHelper=lambda m, t, d, lr: ("helper", m, t, d, lr))
    exec(compile(out, "utils.py", "exec"), ns)
    helper = ns["load_model"](str(tmp_path), "icl", 0.2)
    assert helper[0] == "helper" and helper[1][0] == str(tmp_path)
    assert helper[1][1]["dtype"] is ns["torch"].float32  # float32 on the CPU, no device_map
    assert ns["load_model"]("meta-llama/Llama-3.1-8b", "icl", 0.2) == "hub"
    with pytest.raises(ValueError, match="load_model"):
        rb.patch_load_model("def other():\n    pass\n")


def test_baukit_init_keeps_only_nethook():
    src = ("from .labwidget import Model\nfrom .nethook import Trace, TraceDict\n"
           "from . import show\nfrom .nethook import get_module\n")
    assert rb.patch_baukit_init(src) == "from .nethook import Trace, TraceDict\n" \
                                        "from .nethook import get_module\n"
    with pytest.raises(ValueError, match="nethook"):
        rb.patch_baukit_init("from . import show\n")


@pytest.mark.skipif(not SITE_MIRROR.exists(), reason="the offline mirror of the SITE code is absent")
def test_the_patches_apply_to_the_real_reference():
    for name, patches in rb.PATCHES.items():
        src = _show(SITE_MIRROR, name)
        for p in patches:
            src = p(src)
        ast.parse(src)
        assert "'cuda'" not in src and '"cuda"' not in src, name
    utils = src  # the last one patched: utils.py
    assert "try:\n    import bitsandbytes as bnb" in utils
    body = utils[utils.index(rb.LOAD_MODEL):]
    hub = body.index("LlamaForCausalLM.from_pretrained(model_name, device_map")
    assert body.index("_os.path.isdir(model_name)") < hub


@pytest.mark.skipif(not BAUKIT_MIRROR.exists(), reason="the offline mirror of baukit is absent")
def test_the_baukit_patch_applies_to_the_real_init():
    out = rb.patch_baukit_init(_show(BAUKIT_MIRROR, "baukit/__init__.py"))
    assert "TraceDict" in out and "get_module" in out and "labwidget" not in out


def _items():
    """Four items; the reference right on 0 and 1, sitelens on 1, 2 and 3; item 1 is right only by
    the reference's criterion for the reference's text (``St.`` read as Saint)."""
    inputs = ["a", "b", "c", "d"]
    targets = ["Paris", "Saint Helier", "Rome", "Oslo"]
    ref = ["Paris, France", "St. Helier", "Madrid", "Bergen"]
    ours = ["London", "Saint Helier", "rome", "Oslo\nmore"]
    rows = [dict(side=s, input=i, target=t, prediction=p)
            for s, preds in (("reference", ref), ("sitelens default", ours))
            for i, t, p in zip(inputs, targets, preds)]
    return rb.score(pd.DataFrame(rows), "country-capital")


def test_both_criteria_on_each_item():
    it = _items()
    ref = it[it.side == "reference"]
    assert ref.correct.tolist() == [True, False, False, False]
    assert ref.correct_official.tolist() == [True, True, False, False]


def test_summary_pairs_items_and_report_reads_the_csv(tmp_path):
    it = _items()
    common = dict(model="m", task="country-capital", n_items=4, seed=0, threads=2, host="h", cpus=2,
                  tiny=False, commit="c0ffee", baukit_commit="ba0c17", versions="torch==x",
                  command="cmd", load_s=float("nan"))
    df = pd.DataFrame([dict(side="reference", wall_s=300.0, load_avg_1min=1.5, stage1_s=10.0,
                            stage2_s=200.0, eval_s=50.0, reported_exact_match=0.5, **common),
                       dict(side="sitelens default", wall_s=20.0, load_avg_1min=1.0, stage1_s=5.0,
                            stage2_s=8.0, eval_s=2.0, reported_exact_match=0.75,
                            **(common | dict(load_s=3.0)))])
    # the sitelens side in another item order: pairing is by input and target
    it = pd.concat([it[it.side == "reference"], it[it.side != "reference"].iloc[::-1]])
    s = rb.summarize(df, it).set_index("side")
    assert s.loc["reference", "exact_match"] == 0.25
    assert s.loc["sitelens default", "exact_match"] == 0.75
    assert s.loc["sitelens default", "diff"] == pytest.approx(0.5)  # (3 − 1) / 4 items
    assert (s.loc["sitelens default", "only_side"], s.loc["sitelens default", "only_reference"]) == (3, 1)
    # exact McNemar, 4 discordant items split 3 : 1: 2 · (C(4,0) + C(4,1)) / 2⁴
    assert s.loc["sitelens default", "mcnemar_p"] == pytest.approx(0.625)
    assert s.loc["sitelens default", "diff_official"] == pytest.approx(0.25)  # 3 vs 2 of 4
    s.reset_index().to_csv(tmp_path / "reference.csv", index=False)
    md = rb.report(tmp_path)
    assert "| sitelens default | 20.0 | 15.0 | 1.00 | 3.0 | 5.0 | 8.0 | 2.0 | 0.750 | 0.750 |" in md
    assert "| reference | 300.0 | 1.0 | 1.50 | – | 10.0 | 200.0 | 50.0 | 0.250 | 0.500 | 0.500 |" in md
    assert "+0.500 [" in md and "3 / 1 | 0.625" in md and "c0ffee" in md
    assert (tmp_path / "reference.md").read_text() == md

    with pytest.raises(ValueError, match="other items"):
        rb.summarize(df, it[(it.side == "reference") | (it.input != "d")])
