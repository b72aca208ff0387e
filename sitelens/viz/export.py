"""Writing figures: PNG / HTML export of plotly figures and the CSV behind each, and the notebook
renderer.

:class:`FigureWriter` writes each figure atomically (:mod:`sitelens.io`) as ``.png`` (plotly +
kaleido + a Chrome/Chromium), ``.html`` and ``.csv``; without kaleido or Chromium it still writes
HTML + CSV and says why (:func:`png_export_error`). :func:`notebook_setup` sets plotly's
renderer for a notebook to plotly's JSON and a static PNG in each output (interactive in Jupyter,
an image on GitHub and nbviewer); :func:`notebook_renderer` sets one renderer (static PNGs where
export works, else interactive).

HTML figures work offline: every folder that holds them gets one shared copy of plotly.js
(:data:`PLOTLYJS_NAME`, from the installed plotly package; :func:`ensure_plotlyjs`) and each page
loads it by a relative ``<script src="plotly.min.js">`` (:func:`write_figure_html`), so a figure
opened from disk draws without network and a folder of figures carries plotly.js once.
"""

from __future__ import annotations

import os
import shutil
import warnings
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from sitelens.io import atomic_write, atomic_write_csv, atomic_write_text

PLOTLYJS_NAME = "plotly.min.js"
"""The shared copy of plotly.js beside HTML figures, referenced relatively by each of them."""


def plotlyjs_bytes() -> bytes:
    """The minified plotly.js bundled with the installed plotly package."""
    from plotly.offline import get_plotlyjs

    return get_plotlyjs().encode()


def ensure_plotlyjs(folder: str | Path) -> Path:
    """Write ``folder/plotly.min.js`` (the installed plotly's bundle), atomically, unless an
    identical copy is already there; return its path."""
    target = Path(folder) / PLOTLYJS_NAME
    want = plotlyjs_bytes()
    try:
        same = target.stat().st_size == len(want) and target.read_bytes() == want
    except OSError:
        same = False
    if not same:
        atomic_write(target, want)
    return target


def figure_html(fig) -> str:
    """``fig`` as a full HTML page that loads plotly.js from ``plotly.min.js`` beside it."""
    return fig.to_html(include_plotlyjs=PLOTLYJS_NAME, full_html=True)


def write_figure_html(fig, path: str | Path) -> Path:
    """Write ``fig`` as an HTML page at ``path`` (atomically) and the shared ``plotly.min.js``
    beside it (:func:`ensure_plotlyjs`), so the page renders offline."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    ensure_plotlyjs(path.parent)
    return atomic_write_text(path, figure_html(fig))


def png_export_error() -> str | None:
    """``None`` if plotly can export PNGs here (kaleido + a Chrome/Chromium), else why not. Points
    kaleido at the system Chromium (``BROWSER_PATH``) when that variable is unset."""
    if not os.environ.get("BROWSER_PATH"):
        for cand in ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome"):
            if Path(cand).exists():
                os.environ["BROWSER_PATH"] = cand
                break
    try:
        import kaleido  # noqa: F401
    except ImportError:
        return "kaleido is not installed (pip install 'sitelens[figures]')"
    if not (os.environ.get("BROWSER_PATH") or shutil.which("chromium")
            or shutil.which("google-chrome")):
        return "no Chrome/Chromium found (apt-get install chromium, or set BROWSER_PATH)"
    return None


def _start_kaleido_server() -> bool:
    """One browser for all exports (kaleido >= 1.0); older kaleido starts one per export."""
    try:
        import kaleido

        kaleido.start_sync_server(silence_warnings=True)
        return True
    except Exception:  # older kaleido, or a server already running
        return False


def notebook_renderer(preferred: str = "png") -> str:
    """Set plotly's default renderer for a notebook and return it: ``preferred`` (``"png"``:
    static images, which render on code hosts and keep notebooks small) when PNG export works
    here, else ``"notebook_connected"`` (interactive; plotly.js from a CDN)."""
    import plotly.io as pio

    renderer = preferred
    if "png" in preferred.split("+") and png_export_error() is not None:
        renderer = "notebook_connected"
    if "png" in renderer.split("+"):
        _start_kaleido_server()
    pio.renderers.default = renderer
    return renderer


class StaticFigureWarning(UserWarning):
    """Notebook figures get no static image here (no kaleido or no Chrome/Chromium), so they will
    not show on GitHub or nbviewer."""


def notebook_setup(interactive: str = "plotly_mimetype") -> str:
    """Call once at the top of a notebook: plotly's default renderer becomes ``interactive`` plus
    ``png``, so every figure is saved as plotly's JSON (drawn, interactive, by JupyterLab and
    Notebook) and, in the same output, a static PNG made here by kaleido and the local
    Chrome/Chromium, without network (what GitHub and nbviewer show, as they do not run plotly).
    Where PNG export does not work (:func:`png_export_error`), ``interactive`` alone, and a
    :class:`StaticFigureWarning` says why and what to install. Returns the renderer set."""
    import plotly.io as pio

    err = png_export_error()
    if err is None:
        renderer = f"{interactive}+png"
        _start_kaleido_server()
    else:
        renderer = interactive
        warnings.warn(f"Notebook figures get no static PNG, so they will be blank on GitHub and "
                      f"nbviewer: {err}.", StaticFigureWarning, stacklevel=2)
    pio.renderers.default = renderer
    return renderer


class FigureWriter:
    """Writes figures as PNG (plotly + kaleido + Chromium) / HTML and their CSVs, atomically.
    If PNG export is unavailable, HTML + CSV are still written and :attr:`png_error` says why."""

    def __init__(self, formats: Sequence[str] = ("png", "html")):
        self.formats = tuple(formats)
        self.png_error: str | None = None
        self._server = False
        if "png" in self.formats:
            self.png_error = self._start_png()

    def _start_png(self) -> str | None:
        err = png_export_error()
        if err is None:
            self._server = _start_kaleido_server()
        return err

    def close(self) -> None:
        if self._server:
            import kaleido

            try:
                kaleido.stop_sync_server(silence_warnings=True)
            except Exception:
                pass
            self._server = False

    def write(self, fig, frame: pd.DataFrame | None, base: Path) -> list[str]:
        base.parent.mkdir(parents=True, exist_ok=True)
        written = []
        if frame is not None:
            atomic_write_csv(base.with_suffix(".csv"), frame)
            written.append(base.with_suffix(".csv").name)
        if fig is None:
            return written
        if "html" in self.formats:
            target = base.with_suffix(".html")
            write_figure_html(fig, target)  # + the shared plotly.min.js beside it
            written.append(target.name)
        if "png" in self.formats and self.png_error is None:
            target = base.with_suffix(".png")
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # "kopts ignored if using a server"
                    png = fig.to_image(format="png", scale=1)
            except Exception as e:  # kaleido/Chromium failures vary
                self.png_error = f"PNG export failed: {type(e).__name__}: {e}"
            else:
                atomic_write(target, png)
                written.append(target.name)
        return written


__all__ = [
    "FigureWriter", "StaticFigureWarning", "png_export_error", "notebook_renderer", "notebook_setup",
    "PLOTLYJS_NAME", "ensure_plotlyjs",
    "figure_html", "write_figure_html",
]
