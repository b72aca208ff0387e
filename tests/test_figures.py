"""The figures pipeline and the patch / figures CLI on the tiny random model (fast)."""

from __future__ import annotations

import json
import sys

import numpy as np
import pandas as pd
import pytest
import torch

from sitelens.cli import main
from sitelens.pipelines import figures as F

torch.set_num_threads(1)

TASKS = ("english_french", "english_german", "first_letter", "last_letter", "antonym")
SMALL = dict(
    models=("tiny-random",), tasks=TASKS, intra_tasks=("antonym", "first_letter"),
    effect_tasks=("antonym",), heatmap_task="antonym", limit=4, sparsity=(0.0, 2.0),
    n_examples=16, n_prompts=2, n_shots=2, effect_prompts=2, n_random_seeds=2, n_boot=20,
    formats=("html",), progress=False,
)
FIGS = ("alpha_heatmap_antonym", "alpha_facets", "effect_vs_alpha_antonym", "patching_curves",
        "patching_curves_tasks_lam0", "patching_curves_tasks_lam2", "inter_accuracy",
        "inter_accuracy_topk", "alpha_similarity")


def _cells(root):
    return {p: p.stat().st_mtime_ns for p in (root / ".runs").rglob("*") if p.is_file()
            and p.name != "timings.json"}


def test_make_figures_end_to_end_and_resumable(tmp_path):
    res = F.make_figures(tmp_path, **SMALL)
    d = tmp_path / "tiny-random"
    for name in FIGS:
        assert (d / f"{name}.html").exists(), name
        assert (d / f"{name}.csv").exists(), name
        assert not (d / f"{name}.png").exists()
    assert (d / "patching_gaps.csv").exists() and (d / "patching_gaps_paired.csv").exists()
    s = json.loads((tmp_path / "summary.json").read_text())
    m = s["models"][0]
    assert m["model"] == "tiny-random" and m["n_heads_total"] == 8
    assert set(m["intra"]) == {"0", "2"}
    assert m["intra"]["2"]["k=5%"]["k"] == 1 and m["intra"]["2"]["k=10"]["k"] == 8
    g = m["intra"]["2"]["k=10"]  # the gap's interval is over the tasks' paired differences
    assert g["gap_ci_low"] - 1e-4 <= g["gap"] <= g["gap_ci_high"] + 1e-4  # rounded to 4 places
    assert {"within", "between", "gap"} <= set(m["transfer"]["alpha"])
    assert "rho" in m["similarity_transfer_spearman"]["spearman"]
    assert "rho_alpha_lam2" in m["effects"]["antonym"]
    rows = pd.read_csv(tmp_path / "summary.csv")
    assert {"model", "metric", "value"} == set(rows.columns) and len(rows) > 20
    assert set(res.figures["tiny-random"]) == set(FIGS)
    # 2 intra tasks × 2 λ + 3 more tasks at the main λ
    assert len(list((tmp_path / ".runs" / "tiny-random" / "adapters").iterdir())) == 7

    # restart: every cell is reused (nothing rewritten), the results are identical
    before = _cells(tmp_path)
    res2 = F.make_figures(tmp_path, **SMALL)
    assert _cells(tmp_path) == before
    assert res2.summary["models"] == res.summary["models"]

    # a lost cell is recomputed alone
    lost = next((tmp_path / ".runs" / "tiny-random" / "intra").glob("antonym_lam2_*.csv"))
    lost.unlink()
    F.make_figures(tmp_path, **SMALL)
    after = _cells(tmp_path)
    assert lost in after
    assert all(after[p] == t for p, t in before.items() if p != lost)


def test_changed_parameters_are_not_reused(tmp_path):
    F.make_figures(tmp_path, **SMALL)
    n_before = len(list((tmp_path / ".runs" / "tiny-random" / "adapters").iterdir()))
    F.make_figures(tmp_path, **dict(SMALL, n_examples=8, tasks=TASKS[:3],
                                    intra_tasks=("first_letter",), effect_tasks=("first_letter",)))
    n_after = len(list((tmp_path / ".runs" / "tiny-random" / "adapters").iterdir()))
    assert n_after == n_before + 4  # 3 tasks at λ = 2, first_letter at λ = 0


def _intra_frame():
    rows = []
    for task, top, bottom in (("a", 0.8, 0.0), ("b", 0.4, 0.2)):
        for sel, acc in (("top", top), ("bottom", bottom), ("random", 0.1), ("zero_shot", 0.0),
                         ("site", 0.9)):
            for seed in ((0, 1) if sel == "random" else (None,)):
                rows.append({"model": "m", "task": task, "k": 10 if sel != "zero_shot" else 0,
                             "selection": sel, "seed": seed, "accuracy": acc,
                             "ci_low": max(0, acc - 0.1), "ci_high": min(1, acc + 0.1),
                             "answer_prob": acc / 2, "n": 10, "sparsity": 0.0})
    return pd.DataFrame(rows)


def test_intra_mean_and_gaps():
    df = _intra_frame()
    mean = F.intra_mean(df)
    top = mean[mean.selection == "top"].iloc[0]
    # Here and below: float64 means and differences of decimal fixtures (0.1, 0.8, ... are not
    # binary fractions), a few ulp (~1e-16 relative) off the decimal answer; approx's default
    # rel 1e-6 absorbs that, while a wrong formula moves these values by >= 0.01.
    assert top.accuracy == pytest.approx(0.6) and top.n == 20 and top.n_tasks == 2
    assert top.ci_high - top.accuracy == pytest.approx(np.sqrt(0.1**2 + 0.1**2) / 2)
    assert len(mean[mean.selection == "random"]) == 2  # one row per seed
    gaps = F.intra_gaps(df, [10])
    g = gaps[gaps.task == "mean"].iloc[0]
    assert g.top == pytest.approx(0.6) and g.bottom == pytest.approx(0.1)
    assert g.gap == pytest.approx(0.5) and g.site == pytest.approx(0.9)
    assert gaps[gaps.task == "a"].iloc[0].gap == pytest.approx(0.8)


def test_gap_k():
    assert F.gap_k("5%", 270) == 14 and F.gap_k("5%", 72) == 4 and F.gap_k("5%", 8) == 1
    assert F.gap_k(10, 270) == 10 and F.gap_k(10, 8) == 8
    assert F.intra_ks(72, F.FigureConfig()) == [1, 2, 4, 8, 10, 16, 32, 64, 72]


def test_writer_falls_back_to_html_without_kaleido(tmp_path, monkeypatch):
    import plotly.graph_objects as go

    monkeypatch.setitem(sys.modules, "kaleido", None)  # import kaleido -> ImportError
    w = F.FigureWriter(("png", "html"))
    assert w.png_error and "kaleido" in w.png_error
    out = w.write(go.Figure(), pd.DataFrame({"x": [1]}), tmp_path / "f")
    assert out == ["f.csv", "f.html"]


# ----------------------------------------------------------------------------------------------
# CLI


FIT = ["--n-examples", "8", "--n-prompts", "2", "--n-shots", "2"]


def _json(capsys):
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_cli_patch_intra_json(capsys, tmp_path):
    rc = main(["patch", "intra", "--model", "tiny-random", "--task", "antonym", *FIT,
               "--limit", "4", "--n-boot", "10", "--json", "--out", str(tmp_path / "i.csv")])
    assert rc == 0
    obj = _json(capsys)
    assert [r["k"] for r in obj["rows"]] == [1, 2, 4, 8]
    assert set(obj["rows"][0]) == {"k", "top", "bottom", "random"}
    assert obj["task"] == "antonym" and obj["n"] == 4 and 0 <= obj["site"] <= 1
    assert len(pd.read_csv(tmp_path / "i.csv")) > 4


def test_cli_patch_intra_with_saved_adapter(capsys, tmp_path):
    assert main(["fit", "--model", "tiny-random", "--task", "antonym", *FIT,
                 "--out", str(tmp_path / "ad")]) == 0
    capsys.readouterr()
    assert main(["patch", "intra", "--model", "tiny-random", "--task", "antonym",
                 "--adapter", str(tmp_path / "ad"), "--ks", "1,3", "--limit", "3", "--json"]) == 0
    assert [r["k"] for r in _json(capsys)["rows"]] == [1, 3]


def test_cli_patch_inter_json(capsys):
    rc = main(["patch", "inter", "--model", "tiny-random", "--tasks",
               "antonym,english_french,english_german", *FIT, "--k", "2", "--limit", "3",
               "--n-boot", "10", "--json"])
    assert rc == 0
    obj = _json(capsys)
    assert obj["tasks"] == ["antonym", "english_french", "english_german"]
    assert set(obj["alpha"]["antonym"]) == set(obj["tasks"])
    assert {"within", "between", "gap"} <= set(obj["within_between"])
    assert "rho" in obj["similarity_transfer_spearman"]


def test_cli_patch_effects_json(capsys):
    rc = main(["patch", "effects", "--model", "tiny-random", "--task", "antonym",
               "--n-prompts", "2", "--n-shots", "2", "--n-mean-prompts", "2", "--top", "3",
               "--json"])
    assert rc == 0
    obj = _json(capsys)
    assert len(obj["top_heads"]) == 3 and obj["top_heads"][0]["head"].startswith("L")
    assert obj["mode"] == "batched"


def test_cli_patch_errors_are_clean(capsys):
    assert main(["patch", "inter", "--model", "tiny-random", "--tasks", "antonym"]) == 2
    assert "at least two tasks" in capsys.readouterr().err


def test_cli_figures(capsys, tmp_path):
    rc = main(["figures", "--out", str(tmp_path), "--models", "tiny-random", "--tasks",
               ",".join(TASKS), "--intra-tasks", "antonym", "--effect-tasks", "antonym",
               "--limit", "3", "--sparsity", "0,2", "--n-examples", "8", "--n-prompts", "2",
               "--n-shots", "2", "--effect-prompts", "2", "--n-boot", "10", "--no-png",
               "--quiet"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "tiny-random" in out and "transfer within" in out
    assert (tmp_path / "tiny-random" / "patching_curves.html").exists()
    assert json.loads((tmp_path / "summary.json").read_text())["png"] is False


def test_target_centred_and_by_family():
    names = ["a1", "a2", "b1"]
    M = pd.DataFrame([[1.0, 0.6, 0.2], [0.5, 1.0, 0.4], [0.1, 0.2, 1.0]], index=names, columns=names)
    C = F.target_centred(M)
    assert np.isnan(np.diag(C.to_numpy())).all()
    # float64 arithmetic on decimal fixtures: a few ulp off, approx's default rel 1e-6 (and abs
    # 1e-12 near 0); a wrong centring moves these by >= 0.05
    assert C.loc["a2", "a1"] == pytest.approx(0.5 - 0.3) and C.loc["a1", "b1"] == pytest.approx(-0.1)
    fam = {"a1": "A", "a2": "A", "b1": "B"}
    out = F.by_target_family(M, fam)
    assert set(out) == {"A"}  # B has one task
    assert out["A"]["from_same_family"] == pytest.approx(0.55)
    assert out["A"]["from_other_families"] == pytest.approx(0.15)


JOINT_ATOL = 1e-5  # as tests/test_joint_tasks.py: a joint pass sums the same float32 terms in another order


def test_fit_jointly_saves_the_one_task_fits(tmp_path, monkeypatch):
    from sitelens.models import load_model

    model = load_model("tiny-random")
    keys = ("tasks", "intra_tasks", "effect_tasks", "heatmap_task", "limit", "sparsity", "n_examples",
            "n_prompts", "n_shots")
    cfg = F.FigureConfig(**{k: SMALL[k] for k in keys}, joint=True).resolved()
    cells = F.figure_cells(cfg)
    fits = [c for c in cells if c.kind == "fit"]
    assert F.fit_jointly(model, tmp_path / "joint", cfg) == len(fits) == 7  # 2 tasks at λ=0, 5 at λ=2
    assert F.fit_jointly(model, tmp_path / "joint", cfg) == 0  # saved: nothing left to fit
    tasks = {n: F.load_task(n) for n in cfg.tasks}
    store_j = F._cell_store(model, tmp_path / "joint", lambda m: None)
    store_a = F._cell_store(model, tmp_path / "alone", lambda m: None)
    alone = {(c.task, c.sparsity): F.fit_cell(model, tasks[c.task], c.sparsity, cfg, store_a) for c in fits}
    monkeypatch.setattr(F, "fit_site", lambda *a, **k: pytest.fail("refitted a jointly fitted cell"))
    moved = 0
    for c in fits:
        j = F.fit_cell(model, tasks[c.task], c.sparsity, cfg, store_j)  # found, not refitted
        a = alone[(c.task, c.sparsity)]
        assert j.meta["joint_tasks"] > 1 and "joint_tasks" not in a.meta
        assert torch.allclose(j.alpha, a.alpha, rtol=0, atol=JOINT_ATOL), c
        assert j.meta["best_step"] == a.meta["best_step"], c
        moved += a.meta["best_step"] > 0
    assert moved >= 3  # fits that moved from their start: not a comparison of initial α
