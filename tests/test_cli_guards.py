"""No silent surprises (issue 32, items 3 and 5): a saturated α is said, an option the command would
ignore is refused, an earlier result is replaced only with ``--force``, ``heads --adapter`` reads
the adapter's α instead of refitting, and ``patch intra --save-adapter`` keeps the adapter it fits.

The saturation checks use constructed α (no fit). The refusals of ignored options and of earlier
results are also cases of tests/test_cli_bad_input.py (one line, exit 2, nothing written); here
they are run with the model loader broken, to show they come before any model loads. Each check
whose break is cheap to plant has a mutation case: the same check, run on a broken path, fails.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch

import sitelens.site.adapter as adapter_module
from sitelens.cli import build_parser, check_outputs, main, validate
from sitelens.lenses import HeadScores, head_scores
from sitelens.site import (
    SATURATION_THRESHOLD,
    AlphaSaturationWarning,
    SiteAdapter,
    alpha_saturation,
)

TINY = ["--model", "tiny-random", "--task", "antonym"]
FIT = ["--n-prompts", "2", "--n-shots", "2", "--n-examples", "8"]


def constructed_alpha(n_layers: int, n_heads: int, n_saturated: int) -> torch.Tensor:
    """``[n_layers, n_heads]`` α: the first ``n_saturated`` heads (flat order) at 0.99, the others
    spread over [0.1, 0.9] (all distinct, so every top-k is well defined)."""
    n = n_layers * n_heads
    a = torch.linspace(0.1, 0.9, n)
    a[:n_saturated] = torch.linspace(0.999, 0.96, n_saturated)
    return a.reshape(n_layers, n_heads)


def constructed_adapter(alpha: torch.Tensor, d_head: int = 4) -> SiteAdapter:
    L, H = alpha.shape
    meta = {"model": "tiny-random", "task": "antonym", "stage1_seconds": 0.0, "stage2_seconds": 0.0,
            "best_step": 0, "final_valid_loss": 1.0,
            "hyperparameters": {"seed": 3, "n_examples": 8, "batch_size": 8, "sparsity": 0.0}}
    return SiteAdapter(alpha=alpha, embedding=torch.zeros(L, H, d_head), meta=meta)


@pytest.fixture(scope="module")
def tiny_cfg():
    from sitelens.models import load_model

    return load_model("tiny-random").cfg


@pytest.fixture
def tiny_adapter(tmp_path, tiny_cfg) -> Path:
    """An adapter of tiny-random's shape (2 x 4 heads) with 6 heads above 0.95, saved; no
    fingerprint in its metadata, so it passes the model check without a fit."""
    c = tiny_cfg
    ad = constructed_adapter(constructed_alpha(c.n_layers, c.n_heads, 6), c.d_head)
    return ad.save(tmp_path / "ad")


# ----------------------------------------------------------------------------------------------
# item 3: saturated α, in the library


def test_alpha_saturation_counts_heads_above_the_threshold():
    a = constructed_alpha(4, 8, 12)  # 12 of 32 above 0.95
    s = alpha_saturation(a, k=10)
    assert (s.n_saturated, s.n_heads, s.threshold) == (12, 32, SATURATION_THRESHOLD) and s.saturated
    assert not alpha_saturation(a, k=12).saturated  # the top-12 is exactly the saturated set
    assert not alpha_saturation(a, k=20).saturated
    edge = torch.full((2, 4), SATURATION_THRESHOLD)  # at the threshold: not above it
    assert alpha_saturation(edge, k=1).n_saturated == 0
    msg = s.message()
    assert "12 of 32 heads have α > 0.95" in msg and "top-10" in msg and "\n" not in msg
    for better in ("--sparsity 5", "alpha-grad", "atp", "effect"):
        assert better in msg, better


def test_top_heads_warns_when_saturated():
    ad = constructed_adapter(constructed_alpha(4, 8, 12))
    with pytest.warns(AlphaSaturationWarning, match="12 of 32 heads"):
        top = ad.top_heads(10)
    assert [a for *_, a in top] == sorted((a for *_, a in top), reverse=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ad.top_heads(12)  # not saturated for a top-12
        ad.top_heads(10, warn=False)
    assert ad.saturation(10).saturated and not ad.saturation(12).saturated


def test_mutation_top_heads_without_the_check_is_caught(monkeypatch):
    """Break: the adapter's saturation count always zero; the warning test must fail."""
    from sitelens.site.saturation import AlphaSaturation

    monkeypatch.setattr(adapter_module, "alpha_saturation",
                        lambda a, k=10: AlphaSaturation(0, int(a.numel()), k))
    with pytest.raises(pytest.fail.Exception):
        test_top_heads_warns_when_saturated()


# ----------------------------------------------------------------------------------------------
# item 3: the notice of fit, patch intra and heads


def _notes(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("note: α is saturated")]


@pytest.mark.parametrize("n_saturated, noted", [(12, True), (3, False)])
def test_fit_says_when_alpha_is_saturated(monkeypatch, tmp_path, capsys, n_saturated, noted):
    """``fit`` prints its top-8 heads; with 12 of 32 heads above 0.95 one notice line on stderr
    says so (no fit: the command's fit returns a constructed adapter)."""
    import sitelens.cli.fit_eval as fe

    ad = constructed_adapter(constructed_alpha(4, 8, n_saturated))
    monkeypatch.setattr(fe, "load_task_and_model", lambda args: (None, None))
    monkeypatch.setattr(fe, "fit_from_args", lambda model, task, args: ad)
    assert main(["fit", *TINY, "--out", str(tmp_path / "ad")]) == 0
    out, err = capsys.readouterr()
    assert "top heads: L0H0=1.00" in out
    assert len(_notes(err)) == int(noted), err
    if noted:
        assert f"{n_saturated} of 32 heads have α > 0.95" in err and "top-8" in err


def test_patch_intra_says_when_alpha_is_saturated(tiny_adapter, capsys):
    assert main(["patch", "intra", *TINY, "--adapter", str(tiny_adapter), "--ks", "1,2",
                 "--limit", "2", "--n-boot", "10", "--n-random-seeds", "1", "--json"]) == 0
    out, err = capsys.readouterr()
    json.loads(out)  # stdout stays one JSON object
    (note,) = _notes(err)
    assert "6 of 8 heads" in note and "every k below 6" in note and "--sparsity 5" in note


# ----------------------------------------------------------------------------------------------
# item 5: heads --adapter reads the adapter's α, no fit


class FitCounter:
    """Counts the calls of ``fit_alpha`` (stage 2) that ``fit_site`` makes."""

    def __init__(self, monkeypatch):
        self.calls, real = 0, adapter_module.fit_alpha

        def counted(*a, **kw):
            self.calls += 1
            return real(*a, **kw)

        monkeypatch.setattr(adapter_module, "fit_alpha", counted)


def test_heads_with_adapter_uses_its_alpha_and_fits_nothing(tiny_adapter, tmp_path, capsys,
                                                             monkeypatch):
    fits = FitCounter(monkeypatch)
    out = tmp_path / "h.csv"
    assert main(["heads", *TINY, "--lenses", "alpha,atp", "--adapter", str(tiny_adapter),
                 "--n-prompts", "2", "--n-shots", "2", "--n-boot", "10", "--out", str(out)]) == 0
    assert fits.calls == 0
    err = capsys.readouterr().err
    assert f"the α of --adapter {tiny_adapter}" in err
    (note,) = _notes(err)  # 6 of 8 above 0.95, and the table shows a top-5
    assert "the alpha lens's top-5" in note
    alpha = HeadScores.read_csv(out).lens("alpha")
    assert torch.allclose(alpha.map(), SiteAdapter.load(tiny_adapter).alpha)  # CSV: float text
    meta = json.loads(alpha.df["meta"].iloc[0])
    assert meta["source"] == "adapter" and meta["seeds"] == [3]
    assert alpha.df["ci_low"].isna().all()  # one value per head: no interval


def test_the_fit_counter_sees_a_fit(tmp_path, monkeypatch):
    """Without --adapter the alpha lens fits once per seed: the counter of the no-refit test
    counts it (so a refit under --adapter would be seen)."""
    fits = FitCounter(monkeypatch)
    assert main(["heads", *TINY, "--lenses", "alpha", "--seeds", "1", "--n-mean-prompts", "2",
                 "--n-shots", "2", "--n-examples", "8", "--out", str(tmp_path / "h.csv")]) == 0
    assert fits.calls == 1


def test_head_scores_with_adapter_reads_its_alpha(tiny_adapter, monkeypatch):
    from sitelens.models import load_model
    from sitelens.tasks import load_task

    fits = FitCounter(monkeypatch)
    ad = SiteAdapter.load(tiny_adapter)
    run = head_scores(load_model("tiny-random"), load_task("antonym"), ["alpha"], adapter=ad)
    assert fits.calls == 0 and torch.equal(run.scores.map("alpha"), ad.alpha)
    assert run.alpha.adapters == [ad] and len(run.alpha.stability) == 0


# ----------------------------------------------------------------------------------------------
# item 5: refusals before any model loads; --force


def _no_load(monkeypatch):
    import sitelens.models

    def fail(*a, **kw):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(sitelens.models, "load_model", fail)


REFUSED = [
    (["patch", "intra", *TINY, "--adapter", "{ad}", "--sparsity", "5"],
     ["--sparsity applies only when patch intra fits the adapter itself", "drop --sparsity"]),
    (["patch", "intra", *TINY, "--adapter", "{ad}", "--spars", "0"], ["--sparsity applies"]),
    (["heads", *TINY, "--adapter", "{ad}", "--lenses", "alpha", "--seeds", "3", "--out", "h.csv"],
     ["--seeds applies only when heads fits α itself"]),
    (["fit", *TINY, "--out", "{ad}"], ["already holds an adapter", "--force"]),
]


@pytest.mark.parametrize("argv, needles", REFUSED, ids=["sparsity", "abbreviated", "seeds", "fit-out"])
def test_refused_before_any_model_loads(tiny_adapter, monkeypatch, capsys, argv, needles):
    _no_load(monkeypatch)
    assert main([a.format(ad=tiny_adapter) for a in argv]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and err.startswith("sitelens: error: "), err
    for n in needles:
        assert n in err, (n, err)


def test_mutation_ignoring_what_was_typed_is_caught(tiny_adapter, monkeypatch, capsys):
    """Break: no option counts as given; the refusal test must fail (the model would load)."""
    import sitelens.cli.options as options

    monkeypatch.setattr(options, "given", lambda args: ())
    with pytest.raises(AssertionError):
        test_refused_before_any_model_loads(tiny_adapter, monkeypatch, capsys, *REFUSED[0])


def test_mutation_no_replace_check_is_caught(tiny_adapter, monkeypatch, capsys):
    """Break: the --force check a no-op; the fit-over-an-adapter refusal must fail."""
    import importlib

    validate_module = importlib.import_module("sitelens.cli.validate")  # not cli's validate()
    monkeypatch.setattr(validate_module, "check_no_replace", lambda args, cmd: None)
    with pytest.raises(AssertionError):
        test_refused_before_any_model_loads(tiny_adapter, monkeypatch, capsys, *REFUSED[-1])


def test_given_options_without_main(tiny_adapter):
    """``validate(args)`` called without :func:`sitelens.cli.main` (no record of what was typed)
    still refuses a fit option that differs from its default."""
    from sitelens.errors import UsageError

    args = build_parser().parse_args(["patch", "intra", *TINY, "--adapter", str(tiny_adapter),
                                      "--lr", "0.5"])
    with pytest.raises(UsageError, match="--lr applies only"):
        validate(args)


def test_force_replaces_an_adapter(tmp_path, capsys):
    out = tmp_path / "ad"
    assert main(["fit", *TINY, *FIT, "--out", str(out)]) == 0
    first = (out / "adapter.json").read_text()
    assert main(["fit", *TINY, *FIT, "--seed", "1", "--out", str(out)]) == 2
    assert "--force" in capsys.readouterr().err and (out / "adapter.json").read_text() == first
    assert main(["fit", *TINY, *FIT, "--seed", "1", "--out", str(out), "--force"]) == 0
    assert json.loads((out / "adapter.json").read_text())["hyperparameters"]["seed"] == 1


@pytest.mark.parametrize("argv, option", [
    (["heads", *TINY, "--lenses", "atp", "--out", "r.csv"], "--out"),
    (["patch", "intra", *TINY, "--out", "r.csv"], "--out"),
    (["patch", "effects", *TINY, "--out", "r.csv"], "--out"),
    (["patch", "inter", "--tasks", "antonym,first_letter", "--out", "r.csv"], "--out"),
    (["eval", *TINY, "--methods", "zero-shot", "--items", "r.csv"], "--items"),
], ids=["heads", "intra", "effects", "inter", "eval-items"])
def test_result_files_need_force(tmp_path, monkeypatch, argv, option):
    """An earlier result file is refused without --force, and passes the checks with it."""
    from sitelens.errors import UsageError

    monkeypatch.chdir(tmp_path)
    Path("r.csv").write_text("a,b\n1,2\n")
    args = build_parser().parse_args(argv)
    validate(args)
    with pytest.raises(UsageError, match=f"{option} r.csv already exists.*--force"):
        check_outputs(args)
    args = build_parser().parse_args([*argv, "--force"])
    validate(args)
    check_outputs(args)


# ----------------------------------------------------------------------------------------------
# item 5: patch intra keeps the adapter it fits when asked


def test_patch_intra_save_adapter(tmp_path, capsys):
    keep = tmp_path / "kept"
    base = ["patch", "intra", *TINY, "--ks", "1", "--limit", "2", "--n-boot", "10",
            "--n-random-seeds", "1", "--json"]
    assert main([*base, *FIT]) == 0
    assert "--save-adapter DIR to keep it" in capsys.readouterr().err
    assert main([*base, *FIT, "--save-adapter", str(keep)]) == 0
    err = capsys.readouterr().err
    assert f"saved the fitted adapter to {keep} (reuse it with --adapter {keep})" in err
    kept = SiteAdapter.load(keep)
    assert kept.meta["hyperparameters"]["n_examples"] == 8
    assert main([*base, "--adapter", str(keep)]) == 0
    assert "fitting SITE" not in capsys.readouterr().err
