"""Make the committed HTML figures render offline, without re-running anything.

Plotly HTML written with ``include_plotlyjs="cdn"`` loads plotly.js from ``https://cdn.plot.ly/``
and is a blank page without network. This script rewrites that ``<script src=...>`` tag to the
relative ``<script charset="utf-8" src="plotly.min.js">`` (dropping its ``integrity`` /
``crossorigin``: a crossorigin script is a CORS request, which a browser refuses for a page opened
from disk) and puts one copy of plotly.js (from the installed plotly package, written atomically,
only if absent or different) into each folder that holds HTML figures — the same layout
:func:`sitelens.viz.export.write_figure_html` produces for new figures. Nothing else in the files (nor
the ``.csv`` / ``.png`` beside them) changes; a second run changes nothing.

    python scripts/offline_figures.py            # figures/ and benchmarks/results/
    python scripts/offline_figures.py --check    # exit 1 if any page still needs the network
    python scripts/offline_figures.py PATH ...   # other folders or files

``--check`` writes nothing: it reports every HTML file that references a network URL (a
``src``/``href`` of a script, stylesheet, image or frame starting with ``http:``, ``https:`` or
``//``), a local script that is missing or marked ``crossorigin``, and exits 1 if there is any.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

from sitelens.io import atomic_write_text  # noqa: E402
from sitelens.viz.export import PLOTLYJS_NAME, ensure_plotlyjs  # noqa: E402

DEFAULT_ROOTS = ("figures", "benchmarks/results")
# plotly's CDN script tag, e.g. <script charset="utf-8" src="https://cdn.plot.ly/plotly-4.1.1.min.js"
# integrity="sha256-..." crossorigin="anonymous">; the whole opening tag is replaced, since a
# `crossorigin` script is a CORS request, which Chromium refuses for file:// pages
_CDN_TAG = re.compile(r"""<script\b[^>]*?\bsrc\s*=\s*(["'])(?:https?:)?//cdn\.plot\.ly/[^"']*\1[^>]*>""",
                      re.IGNORECASE)
LOCAL_TAG = f'<script charset="utf-8" src="{PLOTLYJS_NAME}">'  # what plotly writes for a local path
_CROSSORIGIN = re.compile(r"\bcrossorigin\b", re.IGNORECASE)
_CDN_VERSION = re.compile(r"cdn\.plot\.ly/plotly-([0-9][0-9A-Za-z.\-]*?)(?:\.min)?\.js", re.IGNORECASE)
# any element that makes the browser fetch something
_FETCH = re.compile(
    r"""<(script|link|img|iframe|source|embed)\b[^>]*?\b(src|href)\s*=\s*(["']?)([^"'\s>]+)\3""",
    re.IGNORECASE)
_NETWORK = re.compile(r"^(?:[a-z][a-z0-9+.-]*:)?//", re.IGNORECASE)


def html_files(paths) -> list[Path]:
    """The ``.html`` files under ``paths`` (folders searched recursively, skipping hidden folders
    such as ``figures/.runs``), sorted."""
    out = set()
    for p in map(Path, paths):
        if p.is_file() and p.suffix.lower() == ".html":
            out.add(p)
        elif p.is_dir():
            for f in p.rglob("*.html"):
                if not any(part.startswith(".") for part in f.relative_to(p).parts[:-1]):
                    out.add(f)
    return sorted(out)


def problems(path: Path) -> list[str]:
    """What keeps ``path`` from rendering offline: network references, missing local scripts."""
    text = path.read_text(encoding="utf-8", errors="replace")
    found = []
    for m in _FETCH.finditer(text):
        tag, url = m.group(1).lower(), m.group(4)
        if _NETWORK.match(url):
            found.append(f"<{tag}> loads {url} from the network")
        elif tag == "script" and not url.startswith(("data:", "#")):
            local = path.parent / url.split("?", 1)[0].split("#", 1)[0]
            if not local.is_file():
                found.append(f"<script> loads {url}, which is missing")
            end = text.find(">", m.end())
            if _CROSSORIGIN.search(text, m.start(), end if end >= 0 else len(text)):
                found.append(f"<script> loads {url} with crossorigin, which file:// pages refuse")
    return found


def localize(path: Path) -> tuple[bool, str | None]:
    """Point ``path``'s plotly CDN script tag at ``plotly.min.js`` beside it (atomically; unchanged
    if there is none) and make sure that copy exists. Returns (rewritten?, the CDN's plotly.js
    version if it was there)."""
    text = path.read_text(encoding="utf-8")
    v = _CDN_VERSION.search(text)
    new, n = _CDN_TAG.subn(LOCAL_TAG, text)
    if n:
        atomic_write_text(path, new)
    if n or f'src="{PLOTLYJS_NAME}"' in new:
        ensure_plotlyjs(path.parent)
    return bool(n), (v.group(1) if v else None)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="*", help=f"folders / files (default: {' '.join(DEFAULT_ROOTS)})")
    ap.add_argument("--check", action="store_true",
                    help="write nothing; exit 1 if any HTML file still needs the network")
    args = ap.parse_args(argv)
    paths = args.paths or [ROOT / r for r in DEFAULT_ROOTS]
    files = html_files(paths)

    def rel(p: Path) -> str:
        try:
            return str(p.resolve().relative_to(ROOT))
        except ValueError:
            return str(p)

    if args.check:
        bad = {f: problems(f) for f in files}
        bad = {f: v for f, v in bad.items() if v}
        for f, msgs in bad.items():
            for msg in msgs:
                print(f"{rel(f)}: {msg}")
        print(f"{len(files)} HTML files, {len(bad)} not offline-ready")
        return 1 if bad else 0

    from plotly.offline import get_plotlyjs_version

    bundled = get_plotlyjs_version()
    changed = 0
    for f in files:
        rewritten, cdn_version = localize(f)
        changed += rewritten
        if rewritten:
            note = ""
            if cdn_version and cdn_version != bundled:
                note = f" (was plotly.js {cdn_version} from the CDN; now the bundled {bundled})"
            print(f"{rel(f)}: plotly.js from {PLOTLYJS_NAME}{note}")
    left = sum(bool(problems(f)) for f in files)
    print(f"{len(files)} HTML files, {changed} rewritten, {left} still not offline-ready")
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())
