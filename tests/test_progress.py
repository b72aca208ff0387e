"""Progress on every step a user waits for (:func:`sitelens.format.progress_bar`).

- :class:`~sitelens.format.PlainProgress`: plain lines at each tenth of the work and at least every
  ``every_s`` seconds, never a ``\\r`` redraw, nothing when switched off;
- a terminal gets a tqdm bar, any other stream (a log file, pytest's captured stderr) plain lines;
- stage 1 of a fit, stage 2, ``evaluate(progress=True)`` and each gradient lens of
  ``head_scores(progress=True)`` show progress named after what runs (the lens by its name);
- ``sitelens fit`` with stderr redirected to a file writes a bounded number of plain lines.

Each check of a log is also run on a planted break (a tqdm bar forced onto a file, a lens bar
left unnamed) and must fail there.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import sitelens.format as fmt
from sitelens import evaluate, fit_site, head_scores, load_task, tiny_model
from sitelens.format import PlainProgress, progress_bar
from sitelens.lenses import AblationConfig, AttributionConfig
from sitelens.site import FitConfig

ROOT = Path(__file__).resolve().parents[1]


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def plain_log_problems(text: str, *, max_lines: int) -> list[str]:
    """What is wrong with ``text`` as a log of plain progress lines: carriage-return redraws,
    ANSI escapes, more than ``max_lines`` lines."""
    problems = []
    if "\r" in text:
        problems.append(f"{text.count(chr(13))} carriage-return redraws")
    if "\x1b[" in text:
        problems.append("ANSI escape codes")
    if len(text.splitlines()) > max_lines:
        problems.append(f"{len(text.splitlines())} lines > {max_lines}")
    return problems


# ----------------------------------------------------------------------------------------------
# the helper


def test_plain_progress_writes_a_line_per_tenth_and_ends_with_done():
    out = io.StringIO()
    with PlainProgress(total=1000, desc="fit α [t]", stream=out) as bar:
        for _ in range(1000):
            bar.update(1)
        bar.set_postfix({"train_loss": "1.234"})
    lines = out.getvalue().splitlines()
    assert len(lines) == 10  # one per tenth, not one per step
    assert lines[0].startswith("fit α [t]: 100/1000 (10%) ")
    assert re.fullmatch(r"fit α \[t\]: 1000/1000 done in \d+\.\ds", lines[-1])
    assert "\r" not in out.getvalue()


def test_plain_progress_writes_every_every_s_between_tenths():
    out, clock = io.StringIO(), FakeClock()
    bar = PlainProgress(total=100, desc="slow", stream=out, every_s=30.0, clock=clock)
    for _ in range(5):  # 5% of the work, 30 s per step: no tenth reached, one line per 30 s
        clock.t += 30.0
        bar.update(1)
    assert out.getvalue().splitlines() == [f"slow: {i}/100 ({i}%) {30.0 * i:.1f}s"
                                           for i in range(1, 6)]


def test_plain_progress_without_total_and_switched_off():
    out = io.StringIO()
    assert list(PlainProgress(iter(range(3)), desc="items", stream=out)) == [0, 1, 2]
    assert re.fullmatch(r"items: 3 done in \d+\.\ds\n", out.getvalue())
    quiet = io.StringIO()
    assert list(progress_bar(range(4), desc="off", enabled=False, stream=quiet)) == [0, 1, 2, 3]
    assert quiet.getvalue() == ""


def test_a_terminal_gets_tqdm_and_a_file_plain_lines():
    from tqdm.std import tqdm as std_tqdm

    bar = progress_bar(total=3, desc="x", stream=Tty())
    assert isinstance(bar, std_tqdm)
    bar.close()
    assert isinstance(progress_bar(total=3, desc="x", stream=io.StringIO()), PlainProgress)
    assert fmt.live_output(Tty()) and not fmt.live_output(io.StringIO())


# ----------------------------------------------------------------------------------------------
# the steps


@pytest.fixture(scope="module")
def model_and_task():
    return tiny_model(n_layers=2, n_heads=4, d_head=8, seed=0), load_task("antonym")


def _fit(model, task, progress=True):
    return fit_site(model, task, n_prompts=16, n_shots=2, progress=progress,
                    config=FitConfig(n_examples=80, batch_size=8))


def test_fit_shows_stage_1_and_stage_2(model_and_task, capsys):
    _fit(*model_and_task)
    err = capsys.readouterr().err
    assert re.search(r"^task embedding \[antonym\]: 16/16 done in ", err, re.M), err
    assert re.search(r"^fit α \[antonym\]: 10/10 done in ", err, re.M), err
    assert plain_log_problems(err, max_lines=20) == []
    _fit(*model_and_task, progress=False)
    assert capsys.readouterr().err == ""


def test_evaluate_shows_progress_per_method(model_and_task, capsys):
    model, task = model_and_task
    evaluate(model, task, methods=["zero-shot", "icl"], limit=6, n_shots=2, labels=None,
             progress=True)
    err = capsys.readouterr().err
    for method in ("zero-shot", "icl"):
        assert re.search(rf"^eval {method} \[antonym\]: 6/6 done in ", err, re.M), err
    evaluate(model, task, methods=["zero-shot"], limit=6, labels=None)
    assert capsys.readouterr().err == ""  # off by default


def bar_names(err: str) -> set[str]:
    """The names of the bars in a plain log (the text before ``: n/total``)."""
    return set(re.findall(r"^(.+?): \d+/\d+ ", err, re.M))


def test_each_lens_bar_is_named_after_its_lens(model_and_task, capsys):
    model, task = model_and_task
    att = AttributionConfig(n_prompts=4, n_shots=2, n_mean_prompts=8, n_alpha_items=8, n_boot=10)
    abl = AblationConfig(n_prompts=4, n_shots=2, n_boot=10)
    head_scores(model, task, ["alpha-grad", "atp", "ablation-mean", "effect"], attribution=att,
                ablation=abl, progress=True)
    names = bar_names(capsys.readouterr().err)
    assert names == {"task embedding [antonym]", "alpha-grad [antonym]", "atp [antonym]",
                     "ablation-mean [antonym]", "effect [antonym]"}, names


def test_the_lens_name_check_catches_an_unnamed_bar(model_and_task, capsys, monkeypatch):
    """The planted break: the gradient lenses' bar named as before ("mix gradients")."""
    import sitelens.lenses.attribution as A

    model, task = model_and_task
    real = A.mix_gradients
    monkeypatch.setattr(A, "mix_gradients", lambda *a, **k: real(*a, **{**k, "desc": "mix gradients"}))
    att = AttributionConfig(n_prompts=4, n_shots=2, n_mean_prompts=8, n_alpha_items=8, n_boot=10)
    head_scores(model, task, ["alpha-grad", "atp"], attribution=att, progress=True)
    names = bar_names(capsys.readouterr().err)
    assert names == {"task embedding [antonym]", "mix gradients"}, names


def test_the_log_check_catches_tqdm_redraws_in_a_file(model_and_task, capsys, monkeypatch):
    """The planted break: stderr treated as a terminal, so tqdm redraws into the log."""
    monkeypatch.setattr(fmt, "live_output", lambda stream: True)
    _fit(*model_and_task)
    assert any("redraws" in p for p in plain_log_problems(capsys.readouterr().err, max_lines=20))


# ----------------------------------------------------------------------------------------------
# the command line, stderr to a file


def test_sitelens_fit_logs_plain_progress_lines_to_a_file(tmp_path):
    log = tmp_path / "fit.log"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    with log.open("w") as f:
        r = subprocess.run([sys.executable, "-m", "sitelens.cli", "fit", "--model", "tiny-random",
                            "--task", "antonym", "--out", str(tmp_path / "ad")], cwd=tmp_path,
                           env=env, stderr=f, stdout=subprocess.PIPE, text=True, timeout=600)
    text = log.read_text(encoding="utf-8")
    assert r.returncode == 0, text
    # the load line, stage 1 (at most 10 lines) and stage 2 (at most 10): 30 leaves room for a
    # line per minute on a slow machine; tqdm writes one redraw per step (~100 per fit)
    assert plain_log_problems(text, max_lines=30) == [], text
    assert re.search(r"^task embedding \[antonym\]: 50/50 done in ", text, re.M), text
    assert re.search(r"^fit α \[antonym\]: 50/50 done in ", text, re.M), text
