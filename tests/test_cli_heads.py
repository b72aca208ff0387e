"""``sitelens heads`` end to end on the tiny test model: every requested lens scores every head
into one CSV (:class:`sitelens.lenses.HeadScores`), ``--json`` prints one strict JSON object
(no NaN), and the plain summary lists the top heads of each lens."""

from __future__ import annotations

import json

import pytest

from sitelens.cli import main
from sitelens.lenses import LENSES, HeadScores
from sitelens.models import resolve_backend

# dla reads W_O / W_U / the norms of a HookedTransformer: the CLI refuses it on the bridge backend
# (TransformerLens 4's job), so there these tests use the other lenses
HOOKED = resolve_backend(None) == "hooked"
WANT = [lens for lens in LENSES if HOOKED or lens != "dla"]
OTHER = "dla" if HOOKED else "effect"

# small settings: 2 α fits of 2 steps, 4 prompts of 2 shots, 8 alpha-grad items, 50 resamples
SMALL = ["--model", "tiny-random", "--task", "antonym", "--seeds", "2", "--n-prompts", "4",
         "--n-shots", "2", "--n-mean-prompts", "4", "--limit", "8", "--n-examples", "8",
         "--batch-size", "4", "--n-boot", "50", "--threads", "1"]
ALL = "alpha,alpha-grad,atp,atp-star,ablation,effect" + (",dla" if HOOKED else "")


def small(*drop: str) -> list[str]:
    """SMALL without the options ``drop`` (each with its value): the options that the lenses of a
    test do not read are refused (sitelens.cli.guards), so a test passes only those they read."""
    out = list(SMALL)
    for opt in drop:
        i = out.index(opt)
        del out[i:i + 2]
    return out


# what a fit reads (refused when no lens fits, or with --adapter)
FIT_ONLY = ("--seeds", "--n-examples", "--batch-size")


def _no_nan(name: str):
    raise AssertionError(f"--json printed {name}, which is not JSON")


@pytest.fixture(scope="module")
def tiny_shape() -> tuple[int, int]:
    from sitelens.models import load_model

    cfg = load_model("tiny-random").cfg
    return cfg.n_layers, cfg.n_heads


def test_heads_every_lens_json(tmp_path, capsys, tiny_shape):
    out = tmp_path / "scores.csv"
    assert main(["heads", *SMALL, "--lenses", ALL, "--out", str(out), "--json"]) == 0
    captured = capsys.readouterr()
    obj = json.loads(captured.out, parse_constant=_no_nan)  # one object, NaN as null

    L, H = tiny_shape
    table = HeadScores.read_csv(out)
    assert table.lenses == WANT  # ablation = ablation-mean + ablation-zero, in order
    assert len(table) == len(WANT) * L * H
    for lens in WANT:
        d = table.lens(lens).df
        assert len(d) == L * H and not d.duplicated(["layer", "head"]).any(), lens
        assert d["score"].notna().all(), lens
    assert set(table.df["model"]) == {"tiny-random"} and set(table.df["task"]) == {"antonym"}

    assert obj["model"] == "tiny-random" and obj["task"] == "antonym"
    assert list(obj["lenses"]) == WANT
    for lens, d in obj["lenses"].items():
        assert len(d["top"]) == min(10, L * H), lens
        assert all(0 <= layer < L and 0 <= head < H for layer, head, _ in d["top"]), lens
        assert [s for *_, s in d["top"]] == sorted((s for *_, s in d["top"]), reverse=True), lens
        row = table.lens(lens).df.iloc[0]  # the JSON reports the table's counted costs
        assert (d["forward_passes"], d["backward_passes"]) == (row.forward_passes, row.backward_passes), (
            f"{lens}: the --json costs are not the table's")
        assert d["seconds"] == round(float(row.seconds), 3) and row.seconds > 0, lens
        gradient = lens in ("alpha-grad", "atp", "atp-star")
        assert (d["backward_passes"] > 0) == gradient, lens
        assert (d["forward_passes"] > 0) == (lens != "alpha"), lens  # fits' passes are not counted
    # GradDrop repeats each batch's backward pass once per layer
    assert obj["lenses"]["atp-star"]["backward_passes"] == (L + 1) * obj["lenses"]["atp"]["backward_passes"]
    assert set(obj["alpha_stability"]) == {"spearman_mean", "top10_jaccard_mean"}
    assert "wrote" in captured.err


def test_heads_summary_table(tmp_path, capsys, tiny_shape):
    """Without --json: one row per lens with its top-5 heads; no α stability without α."""
    out = tmp_path / "sub" / "h.csv"
    drop = ("--seeds", "--limit") if HOOKED else (*FIT_ONLY, "--limit")  # dla fits once
    assert main(["heads", *small(*drop), "--lenses", f"atp,{OTHER}", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    assert "top-5 heads" in lines[1]
    assert [line.split()[0] for line in lines[2:]] == ["atp", OTHER]
    assert "α over seeds" not in text
    assert len(HeadScores.read_csv(out)) == 2 * tiny_shape[0] * tiny_shape[1]


def test_heads_with_adapter(tmp_path, capsys):
    """--adapter: its α feeds dla and its embedding the other lenses (no fit); an adapter of
    another model is refused after the load with one line, and nothing is written."""
    ad = tmp_path / "ad"
    assert main(["fit", "--model", "tiny-random", "--task", "antonym", "--n-prompts", "4",
                 "--n-shots", "2", "--n-examples", "8", "--batch-size", "4", "--out", str(ad)]) == 0
    out = tmp_path / "h.csv"
    capsys.readouterr()
    first = "dla" if HOOKED else "atp"
    with_adapter = small(*FIT_ONLY, "--n-mean-prompts", "--limit")
    assert main(["heads", *with_adapter, "--lenses", f"{first},effect", "--adapter", str(ad),
                 "--out", str(out), "--json"]) == 0
    obj = json.loads(capsys.readouterr().out, parse_constant=_no_nan)
    assert list(obj["lenses"]) == [first, "effect"] and "alpha_stability" not in obj

    other = tmp_path / "other.csv"
    argv = ["heads", *with_adapter, "--lenses", first, "--adapter", str(ad), "--out", str(other)]
    argv[argv.index("tiny-random")] = "tiny-random-gqa"
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("sitelens: error: "), err
    assert not other.exists()


def test_heads_json_aggregates_per_kv_group_on_gqa(tmp_path, capsys):
    """Grouped-query model: the JSON adds the top key/value groups, each the sum of its query
    heads' scores (query head h reads group h // (n_heads // n_key_value_heads))."""
    import pandas as pd

    out = tmp_path / "gqa.csv"
    rc = main(["heads", "--model", "tiny-random-gqa", "--task", "antonym", "--lenses", "atp",
               "--n-prompts", "4", "--n-shots", "2", "--n-mean-prompts", "4",
               "--out", str(out), "--json"])
    assert rc == 0
    obj = json.loads(capsys.readouterr().out)
    kv = obj["kv_groups"]
    assert kv["n_key_value_heads"] == 2
    df = pd.read_csv(out)
    df["group"] = df["head"] // 2
    sums = df.groupby(["layer", "group"])["score"].sum()
    for layer, group, score in kv["top"]["atp"]:
        assert score == pytest.approx(sums.loc[(layer, group)], rel=1e-3, abs=1e-9)
