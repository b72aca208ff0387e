"""Every check before the work (issue 43): a backend the lenses cannot run on, a number out of its
range, a task too small for the shots and the splits it needs, each refused before any model
loads, on one line with exit status 2, in the command line's own words and numbers, and with
nothing written. "Before any load": :func:`sitelens.models.load_model` is replaced by a failure, so
a refusal that came after a load would fail here instead."""

from __future__ import annotations

import contextlib
import io
import json
from dataclasses import fields
from pathlib import Path

import pytest

import sitelens.models
from sitelens.cli import build_parser, main
from sitelens.cli.configs import COMMANDS
from sitelens.errors import FitError, SitelensError, TaskError
from sitelens.site.config import FitConfig
from sitelens.tasks.core import embedding_prompts, few_shot_prompts, items_needed, load_task


@pytest.fixture
def no_load(monkeypatch):
    """``load_model`` (every command's one way to a model) fails the test when called."""
    def load_model(*a, **k):
        raise AssertionError("a model was loaded before the refusal")

    monkeypatch.setattr(sitelens.models, "load_model", load_model)


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def _refused(argv: list[str], root: Path, monkeypatch) -> str:
    """Run ``sitelens argv`` in ``root``: exit 2, one line ``sitelens: error: ...`` on stderr,
    nothing written under ``root``; returns the line."""
    monkeypatch.chdir(root)
    before = _files(root)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(argv)
    lines = err.getvalue().strip().splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("sitelens: error: "), err.getvalue()
    assert _files(root) == before, f"written on a refusal: {_files(root) - before}"
    return lines[0]


def _pairs(root: Path, n: int, name: str = "task.json") -> str:
    (root / name).write_text(json.dumps([{"input": f"w{i}", "output": f"v{i}"} for i in range(n)]))
    return name


TINY = ["--model", "tiny-random"]


# ----------------------------------------------------------------------------------------------
# backend x lens


@pytest.mark.parametrize("lenses", ["dla", "alpha-grad,dla", "alpha,dla"])
def test_dla_on_the_bridge_backend_is_refused_before_the_load(lenses, tmp_path, monkeypatch, no_load):
    line = _refused(["heads", *TINY, "--task", "antonym", "--lenses", lenses, "--backend", "bridge",
                     "--out", "h.csv"], tmp_path, monkeypatch)
    assert "--lenses dla" in line and "--backend bridge" in line, line
    assert "--backend hooked" in line and "backend='" not in line, line  # the CLI's syntax


def test_a_lens_limited_to_one_backend_is_refused_from_its_registry_entry(tmp_path, monkeypatch,
                                                                         no_load):
    """The limit is the lens's registry entry (``Lens.backends``), not a rule about dla: an entry
    limited to the bridge is refused with --backend hooked, and one of the hooked backend with
    --backend bridge, each naming the backend it runs on."""
    from dataclasses import replace

    from sitelens.lenses import registry

    monkeypatch.setitem(registry.REGISTRY, "atp", replace(registry.REGISTRY["atp"],
                                                          backends=("bridge",)))
    from sitelens.models import has_hooked_transformer

    argv = ["heads", *TINY, "--task", "antonym", "--out", "h.csv", "--lenses"]
    if has_hooked_transformer():  # on TransformerLens 4 --backend hooked is refused before any lens
        line = _refused([*argv, "alpha,atp", "--backend", "hooked"], tmp_path, monkeypatch)
        assert "--lenses atp runs only on --backend bridge" in line and "use --backend bridge" in line
    line = _refused([*argv, "atp,dla", "--backend", "bridge"], tmp_path, monkeypatch)
    assert "--lenses dla runs only on --backend hooked" in line, line


# ----------------------------------------------------------------------------------------------
# the sign and range of every number


def test_every_number_an_option_takes_has_a_range():
    """Each option whose value is a number (its default or its annotation an int or a float) is
    parsed by a type with ``bounds``: a count, a seed, ``at_least`` / ``above`` of ``option``."""
    unbounded = []
    for config in COMMANDS:
        for f in fields(config):
            numeric = (isinstance(f.default, (int, float)) and not isinstance(f.default, bool)) or any(
                t in str(f.type).split(" | ") for t in ("int", "float"))
            if numeric and getattr(f.metadata.get("type"), "bounds", None) is None:
                unbounded.append(f"{config.COMMAND} --{f.name.replace('_', '-')}")
    assert not unbounded, f"numbers without a range: {unbounded}"


BAD_NUMBERS = [
    (["fit", *TINY, "--task", "antonym", "--out", "ad"], "--sparsity", "-1", ">= 0"),
    (["fit", *TINY, "--task", "antonym", "--out", "ad"], "--sparsity", "-1e-9", ">= 0"),
    (["run", *TINY, "--task", "antonym"], "--sparsity", "-0.5", ">= 0"),
    (["heads", *TINY, "--task", "antonym", "--lenses", "alpha", "--out", "h.csv"], "--sparsity", "-2",
     ">= 0"),
    (["frontier", *TINY, "--task", "antonym", "--out", "fr"], "--sparsity", "-1", ">= 0"),
    (["patch", "intra", *TINY, "--task", "antonym"], "--sparsity", "-3", ">= 0"),
    (["figures", "--models", "tiny-random"], "--sparsity", "0,-5", ">= 0"),
]


@pytest.mark.parametrize("argv, option, value, words", BAD_NUMBERS,
                         ids=[f"{a[0]}{o}={v}" for a, o, v, _ in BAD_NUMBERS])
def test_a_number_out_of_range_is_refused_before_the_load(argv, option, value, words, tmp_path,
                                                          monkeypatch, no_load):
    line = _refused([*argv, f"{option}={value}"], tmp_path, monkeypatch)
    assert f"argument {option}" in line and words in line and repr(value.split(",")[-1]) in line, line


@pytest.mark.parametrize("kw, words", [
    ({"sparsity": -1.0}, "sparsity must be >= 0"),
    ({"sparsity": -1e-9}, "sparsity must be >= 0"),
    ({"n_valid": 0}, ".n_valid must be at least 1"),
    ({"seed": -1}, "seed must be in [0, 4294967295]"),
    ({"seed": 2**32}, "seed must be in [0, 4294967295]"),
])
def test_fitconfig_refuses_the_same_values(kw, words):
    """The Python API: the same bad values raise FitError (a SitelensError), for both protocols."""
    for make in (FitConfig, FitConfig.official):
        with pytest.raises(FitError) as e:
            make(**kw)
        assert isinstance(e.value, SitelensError) and words in str(e.value), str(e.value)


@pytest.mark.parametrize("kw, words", [
    ({"n_bootstrap": -1}, "n_bootstrap must be a whole number >= 0"),
    ({"n_valid": 0}, "n_valid must be a whole number >= 1"),
    ({"greedy_pool": 0}, "greedy_pool must be a whole number >= 1"),
    ({"test_limit": 2.5}, "test_limit must be a whole number >= 1"),
    ({"sparsity_grid": (1.0, -5.0)}, "sparsity_grid must hold finite λ >= 0"),
])
def test_frontierconfig_refuses_the_values_the_frontier_options_refuse(kw, words):
    from sitelens.errors import LensError
    from sitelens.lenses.selectors import FrontierConfig

    with pytest.raises(LensError, match=words):
        FrontierConfig(**kw)
    FrontierConfig(n_bootstrap=0, greedy_pool=None, test_limit=1, sparsity_grid=(0.0,))


def test_the_ranges_keep_every_value_in_range():
    """The bounds refuse only what is out of range: 0 and a tiny λ, the smallest positive lr."""
    p = build_parser()
    base = ["fit", *TINY, "--task", "antonym", "--out", "ad"]
    a = p.parse_args([*base, "--sparsity", "0", "--lr", "1e-30"])
    assert a.sparsity == 0.0 and a.lr == 1e-30
    assert p.parse_args([*base, "--sparsity", "1e-300"]).sparsity == 1e-300
    FitConfig(sparsity=0.0, seed=2**32 - 1, n_valid=1)


# ----------------------------------------------------------------------------------------------
# a task's size against the shots and splits it needs


def test_run_on_a_three_pair_task_with_one_shot(tmp_path, monkeypatch, no_load):
    """The issue's case: refused before the load with the numbers, and no adapter/ left."""
    task = _pairs(tmp_path, 3, "three.json")
    line = _refused(["run", *TINY, "--task", task, "--n-shots", "1", "--out", "r"], tmp_path,
                    monkeypatch)
    assert "needs at least 4 pairs for 1 shot and the splits" in line and "has 3" in line, line
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("argv, needle", [
    (["fit", *TINY, "--out", "ad", "--n-shots", "10"], "needs at least 16 pairs for 10 shots"),
    (["heads", *TINY, "--lenses", "atp", "--out", "h.csv", "--n-shots", "10"],
     "needs at least 16 pairs for 10 shots"),
    (["patch", "effects", *TINY, "--n-shots", "10"], "needs at least 16 pairs for 10 shots"),
    (["eval", *TINY, "--methods", "icl", "--split", "train", "--n-shots", "10"],
     "needs at least 16 pairs for 10 shots"),
    # icl on test: the queries are not training items, 11 demonstrations need 11 of them
    (["eval", *TINY, "--methods", "icl", "--n-shots", "11"], "needs at least 16 pairs for 11 shots"),
    (["frontier", *TINY, "--out", "fr", "--n-shots", "10"], "needs at least 16 pairs for 10 shots"),
], ids=["fit", "heads", "patch-effects", "eval-icl-train", "eval-icl-test", "frontier"])
def test_a_task_too_small_for_the_shots(argv, needle, tmp_path, monkeypatch, no_load):
    task = _pairs(tmp_path, 15)  # split 10 / 2 / 3: one training item short of 10 shots + a query
    line = _refused([*argv, "--task", task], tmp_path, monkeypatch)
    assert needle in line and "has 15" in line, line


def test_the_frontier_counts_its_valid_and_test_items(tmp_path, monkeypatch, no_load):
    """The frontier selects on valid and scores on test, 2 items each: 10 pairs (split 7 / 1 / 2)
    hold the shots but not the splits; 15 pairs (10 / 2 / 3) are the fewest that do."""
    task = _pairs(tmp_path, 10)
    line = _refused(["frontier", *TINY, "--task", task, "--out", "fr", "--n-shots", "1"], tmp_path,
                    monkeypatch)
    assert "needs at least 15 pairs for 1 shot and the splits" in line, line
    assert "valid and test 2 each" in line and "has 10" in line and "--n-shots 0" not in line, line


def test_an_fv_folder_too_small_for_the_shots(tmp_path, monkeypatch, no_load):
    """An FV-layout folder keeps its own splits: the message counts its training items."""
    d = tmp_path / "small"
    d.mkdir()
    for split, n in (("train", 3), ("valid", 2), ("test", 2)):
        (d / f"{split}.json").write_text(json.dumps(
            [{"input": f"{split}{i}", "output": f"o{i}"} for i in range(n)]))
    line = _refused(["fit", *TINY, "--task", "small", "--out", "ad", "--n-shots", "3"], tmp_path,
                    monkeypatch)
    assert "needs at least 4 training items for 3 shots" in line and "train.json has 3" in line
    assert "--n-shots 2 or fewer" in line, line


@pytest.mark.parametrize("n_shots", [1, 2, 3, 5, 10, 25])
def test_the_pairs_needed_are_exact(n_shots, tmp_path):
    """``items_needed`` is what the prompts take: with that many pairs stage 1's prompts (queries
    from train) are built; with one fewer they raise."""
    n = items_needed(n_shots + 1)
    enough = load_task(str(tmp_path / _pairs(tmp_path, n, "a.json")))
    embedding_prompts(enough, n_prompts=8, n_shots=n_shots)
    few_shot_prompts(enough, enough.test, n_shots)
    short = load_task(str(tmp_path / _pairs(tmp_path, n - 1, "b.json")))
    with pytest.raises(TaskError):
        embedding_prompts(short, n_prompts=8, n_shots=n_shots)


@pytest.mark.parametrize("n_shots", [1, 2, 10])
def test_the_frontier_pairs_needed_are_exact(n_shots, tmp_path):
    """With the frontier's splits (MIN_SPLIT valid and test items too): N pairs pass its split
    check and build stage 1's prompts; N - 1 fail one or the other."""
    from sitelens.lenses.selectors import MIN_SPLIT, check_task_splits

    n = items_needed(n_shots + 1, n_valid=MIN_SPLIT, n_test=MIN_SPLIT)
    enough = load_task(str(tmp_path / _pairs(tmp_path, n, "a.json")))
    check_task_splits(enough)
    embedding_prompts(enough, n_prompts=8, n_shots=n_shots)
    short = load_task(str(tmp_path / _pairs(tmp_path, n - 1, "b.json")))
    with pytest.raises(TaskError):
        check_task_splits(short)
        embedding_prompts(short, n_prompts=8, n_shots=n_shots)


@pytest.mark.parametrize("n_shots", [1, 4, 10])
def test_a_task_of_exactly_the_pairs_needed_passes(n_shots, tmp_path, monkeypatch):
    """The check refuses no task that the work can run on: exactly N pairs validate."""
    from sitelens.cli import validate

    monkeypatch.chdir(tmp_path)
    task = _pairs(tmp_path, items_needed(n_shots + 1))
    validate(build_parser().parse_args(["fit", *TINY, "--task", task, "--out", "ad",
                                        "--n-shots", str(n_shots)]))


def test_a_fit_that_fails_after_the_load_leaves_no_folder(tmp_path, monkeypatch):
    """The one refusal of ``run`` that needs the model (a fit that fails) writes nothing either:
    no empty ``OUT/adapter/``, no ``OUT``."""
    import sitelens.cli.run as run

    def fails(*a, **k):
        raise FitError("Non-finite loss at step 1 (a fit refused after the load).")

    monkeypatch.setattr(run, "fit_from_args", fails)
    monkeypatch.chdir(tmp_path)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(["run", *TINY, "--task", "antonym", "--n-shots", "2", "--out", "r"])
    last = err.getvalue().strip().splitlines()[-1]  # after the load's own line
    assert rc == 2 and last.startswith("sitelens: error: Non-finite loss"), err.getvalue()
    assert _files(tmp_path) == set(), _files(tmp_path)
