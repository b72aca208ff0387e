"""The recipes of docs/architecture.md, "Where things plug in", followed literally (issue 41, item 7).

A new lens, head-set selector or baseline method is its module and one registry entry. For each, a
toy one is added to a copy of the package exactly so: its module written as a new file, its entry
inserted into the registry file by a textual edit and nothing else. The copy then runs it from
Python and from the command line (``python -m sitelens.cli``), each in a fresh interpreter whose
import path starts at the copy, on the tiny random test model (``tiny-random``: no download, no
bundled model). Each test asserts that the copy is what ran, that the toy's own output (its scores,
its head sets, its rows) is in the results written, and that the copy differs from the package in
the two files the recipe names and in no other.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest

PKG = Path(__file__).resolve().parents[1] / "sitelens"
LENS_REGISTRY = "sitelens/lenses/registry.py"
METHOD_REGISTRY = "sitelens/baselines/__init__.py"
TINY = ["--model", "tiny-random", "--task", "antonym"]
N_HEADS = 4  # tiny-random: 2 layers of 4 heads (sitelens.testing.tiny_model's defaults)


def package_files(root: Path) -> dict[str, bytes]:
    """``{path under root: bytes}`` of every file but compiled bytecode."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts}


def follow_recipe(tmp_path: Path, module: str, source: str, registry: str, opening: str,
                  entry: str) -> Path:
    """A copy of the package under ``tmp_path/src`` with the recipe followed: ``module`` written
    from ``source``, ``entry`` inserted into ``registry`` as the first item of the list that
    ``opening`` opens. Returns ``tmp_path/src`` (the import path of the copy)."""
    src = tmp_path / "src"
    shutil.copytree(PKG, src / "sitelens", ignore=shutil.ignore_patterns("__pycache__"))
    new = src / module
    assert not new.exists(), f"{module} exists already: pick another toy name"
    new.write_text(textwrap.dedent(source), encoding="utf-8")
    reg = src / registry
    text = reg.read_text(encoding="utf-8")
    assert text.count(opening) == 1, f"{registry} no longer opens its list with {opening!r}"
    reg.write_text(text.replace(opening, opening + entry), encoding="utf-8")
    (tmp_path / "work").mkdir()
    return src


def changed_files(src: Path) -> set[str]:
    """The files (under ``sitelens/``) in which the copy differs from the package."""
    before, after = package_files(PKG), package_files(src / "sitelens")
    return {f"sitelens/{p}" for p in before.keys() | after.keys() if before.get(p) != after.get(p)}


def run(src: Path, argv: list[str]) -> str:
    """``python ARGV`` in a fresh interpreter with the copy first on its path, in ``src/../work``
    (no ``sitelens`` folder there); its stdout. A non-zero exit fails with the end of stderr."""
    env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, *argv], cwd=src.parent / "work", env=env, text=True,
                       capture_output=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    return r.stdout


def run_python(src: Path, code: str) -> dict:
    """Run ``code`` (which leaves a JSON-able ``out``) from the copy; ``out`` with ``file``, the
    path of the ``sitelens`` that was imported."""
    prog = textwrap.dedent(code) + textwrap.dedent("""
        import json, sitelens
        out["file"] = sitelens.__file__
        print(json.dumps(out))
    """)
    out = json.loads(run(src, ["-c", prog]).strip().splitlines()[-1])
    assert Path(out["file"]).resolve() == (src / "sitelens" / "__init__.py").resolve()
    return out


def cli(src: Path, *argv: str) -> str:
    return run(src, ["-m", "sitelens.cli", *argv])


# ----------------------------------------------------------------------------------------------
# a lens: sitelens/lenses/<module>.py + one Lens(...) in sitelens/lenses/registry.py

TOY_LENS = '''\
"""A toy lens: each head scores its flat index (layer * n_heads + head) times the configs'
n_prompts (a setting it reads, so ``sitelens heads`` takes --n-prompts with it)."""

from __future__ import annotations

import torch

from sitelens.lenses.scores import HeadScores
from sitelens.models import model_name


def toy_lens(x) -> HeadScores:
    L, H = x.model.cfg.n_layers, x.model.cfg.n_heads
    score = torch.arange(L * H, dtype=torch.float32).reshape(L, H)  # [n_layers, n_heads]
    return HeadScores.from_map(score * x.attribution.n_prompts, model=model_name(x.model),
                               task=x.task.name, lens="toy")
'''


def test_a_new_lens_is_its_module_and_one_registry_entry(tmp_path):
    src = follow_recipe(tmp_path, "sitelens/lenses/toy.py", TOY_LENS, LENS_REGISTRY, "_LENSES = [\n",
                        '    Lens("toy", "each head\'s flat index", "sitelens.lenses.toy:toy_lens", '
                        'reads=("corrupted",)),\n')
    n_prompts = 3
    flat = {(layer, head): float(n_prompts * (layer * N_HEADS + head)) for layer in range(2)
            for head in range(N_HEADS)}

    out = run_python(src, f"""
        from sitelens import load_model, load_task
        from sitelens.lenses import AttributionConfig, available_lenses, head_scores
        model = load_model("tiny-random")
        run = head_scores(model, load_task("antonym"), ["toy"],
                          attribution=AttributionConfig(n_prompts={n_prompts}, n_mean_prompts=4, n_shots=2))
        out = {{"lenses": available_lenses(), "rows": run.scores.df[["lens", "layer", "head", "score"]]
               .values.tolist()}}
    """)
    assert "toy" in out["lenses"]
    assert {(layer, head): s for lens, layer, head, s in out["rows"] if lens == "toy"} == flat
    assert len(out["rows"]) == len(flat)

    assert "toy" in cli(src, "heads", "--help")  # the choices are read from the registry
    # --n-prompts is taken: the entry says the toy reads it
    printed = cli(src, "heads", *TINY, "--lenses", "toy", "--n-prompts", str(n_prompts),
                  "--n-mean-prompts", "4", "--n-shots", "2", "--out", "h.csv", "--json")
    table = pd.read_csv(tmp_path / "work" / "h.csv")
    assert set(table.lens) == {"toy"}
    assert {(r.layer, r.head): r.score for r in table.itertuples()} == flat
    assert json.loads(printed)["lenses"]["toy"]["top"][0] == [1, N_HEADS - 1, n_prompts * (2 * N_HEADS - 1)]

    assert changed_files(src) == {"sitelens/lenses/toy.py", LENS_REGISTRY}


# ----------------------------------------------------------------------------------------------
# a head-set selector: its module + one Selector(...) in sitelens/lenses/registry.py

TOY_SELECTOR = '''\
"""A toy selector: S_k = the k heads of largest flat index (the last layer's last head first)."""

from __future__ import annotations


def last_heads(ctx, budgets):
    n = ctx.model.cfg.n_layers * ctx.model.cfg.n_heads
    return {k: list(range(n - 1, n - 1 - k, -1)) for k in budgets}, {}
'''


def test_a_new_selector_is_its_module_and_one_registry_entry(tmp_path):
    src = follow_recipe(tmp_path, "sitelens/lenses/toy_selector.py", TOY_SELECTOR, LENS_REGISTRY,
                        "SELECTOR_REGISTRY: tuple[Selector, ...] = (\n",
                        '    Selector("toy", "the k heads of largest flat index", '
                        '"sitelens.lenses.toy_selector:last_heads"),\n')
    want = {(1, "alpha1"): "L1H3", (1, "refit"): "L1H3", (2, "alpha1"): "L1H3;L1H2",
            (2, "refit"): "L1H3;L1H2"}

    out = run_python(src, """
        from sitelens import load_model, load_task
        from sitelens.lenses.frontier import frontier
        from sitelens.lenses.registry import SELECTORS
        from sitelens.lenses.selectors import FrontierConfig
        from sitelens.site import FitConfig
        cfg = FrontierConfig(fit=FitConfig(n_examples=8), n_prompts=4, n_shots=2, n_valid=8,
                             test_limit=4, exact_match=False)
        res = frontier(load_model("tiny-random"), load_task("antonym"), budgets=[1, 2], selectors=["toy"],
                       config=cfg)
        out = {"selectors": SELECTORS, "rows": res.table[["selector", "k", "injection", "heads"]]
               .values.tolist()}
    """)
    assert "toy" in out["selectors"]
    assert {(k, inj): heads for sel, k, inj, heads in out["rows"]} == want
    assert {sel for sel, *_ in out["rows"]} == {"toy"}

    assert "toy" in cli(src, "frontier", "--help")  # the default and the help list the registry's
    cli(src, "frontier", *TINY, "--selectors", "toy", "--budgets", "1,2", "--n-examples", "8",
        "--n-mean-prompts", "4", "--n-shots", "2", "--test-limit", "4", "--no-exact-match",
        "--out", "fr")
    table = pd.read_csv(tmp_path / "work" / "fr" / "frontier.csv")
    assert set(table.selector) == {"toy"}
    assert {(r.k, r.injection): r.heads for r in table.itertuples()} == want
    summary = json.loads((tmp_path / "work" / "fr" / "summary.json").read_text())
    assert list(summary["selectors"]) == ["toy"]

    assert changed_files(src) == {"sitelens/lenses/toy_selector.py", LENS_REGISTRY}


# ----------------------------------------------------------------------------------------------
# a baseline method: sitelens/baselines/<module>.py + one entry in METHOD_CLASSES

TOY_METHOD = '''\
"""A toy baseline: the query alone (as zero-shot), reporting its declared parameter count."""

from __future__ import annotations

from dataclasses import dataclass

from sitelens.baselines.base import FitParts, Method
from sitelens.tasks import Task, Template


@dataclass(kw_only=True)
class Toy(Method):
    name: str = "toy"
    declared_params: int = 7  # reported as its parameter count

    def _fit(self, model, task: Task, seed: int, template: Template, progress: bool) -> FitParts:
        return FitParts(n_params=self.declared_params, meta={"stored_numbers": 0})
'''
SCORES = ["first_token_acc", "exact_match", "dntp"]


def check_bench_rows(rows: pd.DataFrame) -> None:
    """The toy's row: its parameter count and hyperparameters, and, with no intervention and the
    same prompts, exactly zero-shot's scores on the same items."""
    by = rows.set_index("method")
    assert list(by.index) == ["zero-shot", "toy"]
    toy, zero = by.loc["toy"], by.loc["zero-shot"]
    assert toy.trainable_params == 7 and zero.trainable_params == 0
    assert json.loads(toy.method_params) == {"__type__": "Toy", "name": "toy", "declared_params": 7}
    assert pd.isna(toy.error) or not toy.error
    assert toy.n == zero.n == 4
    assert [toy[c] for c in SCORES] == [zero[c] for c in SCORES]


def test_a_new_method_is_its_module_and_one_registry_entry(tmp_path):
    src = follow_recipe(tmp_path, "sitelens/baselines/toy.py", TOY_METHOD, METHOD_REGISTRY,
                        "METHOD_CLASSES: dict[str, str] = {\n",
                        '    "toy": "sitelens.baselines.toy:Toy",\n')

    out = run_python(src, """
        import json
        from sitelens.baselines import available_methods, get_method
        from sitelens.pipelines.bench import run_bench
        df = run_bench(["tiny-random"], ["antonym"], ["zero-shot", "toy"], "b.csv", limit=4)
        out = {"methods": available_methods(), "class": type(get_method("toy")).__module__,
               "rows": json.loads(df.to_json(orient="records"))}
    """)
    assert "toy" in out["methods"] and out["class"] == "sitelens.baselines.toy"
    check_bench_rows(pd.DataFrame(out["rows"]))

    printed = cli(src, "bench", "--models", "tiny-random", "--tasks", "antonym", "--methods",
                  "zero-shot,toy", "--limit", "4", "--out", "b.csv")
    check_bench_rows(pd.read_csv(tmp_path / "work" / "b.csv"))
    assert "| toy |" in printed

    assert changed_files(src) == {"sitelens/baselines/toy.py", METHOD_REGISTRY}


def test_the_tree_comparison_sees_a_third_file(tmp_path):
    """The check that the recipe touched two files only would see a third."""
    src = follow_recipe(tmp_path, "sitelens/baselines/toy.py", TOY_METHOD, METHOD_REGISTRY,
                        "METHOD_CLASSES: dict[str, str] = {\n", '    "toy": "sitelens.baselines.toy:Toy",\n')
    assert changed_files(src) == {"sitelens/baselines/toy.py", METHOD_REGISTRY}
    (src / "sitelens/cli/configs.py").write_text("# edited\n", encoding="utf-8")
    assert changed_files(src) == {"sitelens/baselines/toy.py", METHOD_REGISTRY, "sitelens/cli/configs.py"}


@pytest.mark.parametrize("ref", ["sitelens.lenses.toy", "no_such_module:f", ":f", "sitelens.lazy:"])
def test_a_registry_entry_that_names_nothing_fails(ref):
    """An entry's ``"module:function"`` that is malformed or names no module fails when it is
    first used, with the entry in the message where it is malformed."""
    from sitelens.lazy import resolve

    with pytest.raises((ValueError, ModuleNotFoundError), match="module:name|No module"):
        resolve(ref)
