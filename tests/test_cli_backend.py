"""``--backend hooked|bridge`` on every command that loads a model: it reaches ``load_model`` in the
:class:`~sitelens.models.LoadSpec` (in place of ``$SITELENS_BACKEND``), and ``--device-map`` is
refused without the bridge."""

from __future__ import annotations

import contextlib
import io

import pytest

from sitelens.cli import main
from sitelens.cli.common import load_spec
from sitelens.cli.parser import build_parser
from sitelens.models.spec import BACKENDS, has_hooked_transformer

LOADING = {  # one line per command that loads a model
    "fit": ["fit", "--model", "tiny-random", "--task", "antonym", "--out", "a"],
    "eval": ["eval", "--model", "tiny-random", "--task", "antonym", "--methods", "zero-shot"],
    "run": ["run", "--model", "tiny-random", "--task", "antonym", "--methods", "zero-shot"],
    "demo": ["demo", "--model", "tiny-random"],
    "heads": ["heads", "--model", "tiny-random", "--task", "antonym", "--lenses", "atp", "--out", "h.csv"],
    "patch effects": ["patch", "effects", "--model", "tiny-random", "--task", "antonym"],
    "bench": ["bench", "--models", "tiny-random", "--tasks", "antonym", "--out", "b.csv"],
}


@pytest.mark.parametrize("cmd", list(LOADING))
@pytest.mark.parametrize("backend", BACKENDS)
def test_backend_option_reaches_the_load_spec(cmd, backend):
    args = build_parser().parse_args(LOADING[cmd] + ["--backend", backend])
    assert load_spec(args).backend == backend


def test_backend_defaults_to_the_environment(monkeypatch):
    """Without ``--backend`` the spec leaves it open and ``load_model`` resolves
    ``$SITELENS_BACKEND`` (default hooked); the option wins over the environment."""
    from sitelens.models import resolve_backend
    from sitelens.models.spec import default_backend

    spec = load_spec(build_parser().parse_args(LOADING["fit"]))
    monkeypatch.setenv("SITELENS_BACKEND", "bridge")
    assert spec.backend is None and resolve_backend(spec.backend) == "bridge"
    monkeypatch.delenv("SITELENS_BACKEND")
    assert resolve_backend(spec.backend) == default_backend()
    monkeypatch.setenv("SITELENS_BACKEND", "hooked")
    given = load_spec(build_parser().parse_args(LOADING["fit"] + ["--backend", "bridge"]))
    assert resolve_backend(given.backend) == "bridge"


def _main(argv, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(argv)
    return rc, err.getvalue()


def test_fit_loads_with_the_backend_given(tmp_path, monkeypatch):
    """The model ``fit`` loads is the backend's: the spec handed to ``load_model`` says so, and with
    a broken loader nothing is written."""
    import sitelens.models as models

    seen = []

    def fake_load(name, spec=None, **kw):
        seen.append(spec.backend)
        raise RuntimeError("stop after the load call")

    monkeypatch.setattr(models, "load_model", fake_load)
    with pytest.raises(RuntimeError, match="stop after the load call"):
        _main(LOADING["fit"] + ["--backend", "bridge"], tmp_path, monkeypatch)
    assert seen == ["bridge"] and not (tmp_path / "a").exists()


@pytest.mark.skipif(not has_hooked_transformer(),
                    reason="HookedTransformer only: the hooked backend is the one that refuses --device-map")
def test_device_map_needs_the_bridge(tmp_path, monkeypatch):
    monkeypatch.delenv("SITELENS_BACKEND", raising=False)
    rc, err = _main(LOADING["eval"] + ["--device-map", "auto", "--backend", "hooked"], tmp_path, monkeypatch)
    assert rc == 2 and "--backend bridge" in err and err.count("\n") == 1


@pytest.mark.skipif(has_hooked_transformer(),
                    reason="TransformerBridge job only: TransformerLens 3.x still has HookedTransformer")
def test_hooked_backend_refused_without_hooked_transformer(tmp_path, monkeypatch):
    rc, err = _main(LOADING["eval"] + ["--backend", "hooked"], tmp_path, monkeypatch)
    assert rc == 2 and err.count("\n") == 1, err
    assert err.startswith("sitelens: error: --backend hooked needs HookedTransformer"), err
    assert "--backend bridge" in err  # the fix, in the CLI's own words


@pytest.mark.skipif(not has_hooked_transformer(),
                    reason="HookedTransformer only: needs TransformerLens 3.x for the hooked backend")
def test_hooked_backend_runs_end_to_end(tmp_path, monkeypatch):
    rc, err = _main(LOADING["eval"] + ["--backend", "hooked", "--limit", "2"], tmp_path, monkeypatch)
    assert rc == 0, err
