"""``sitelens atlas``: the head atlas as one self-contained HTML file (plotly.js inlined, the
payload of :mod:`sitelens.atlas.views` embedded; no server, no network).

Views: a task × head overview and a per-task layer × head map of the chosen lens; a head card (the
head's score in every lens, its α interval, its α in every task, the tokens its injected vector
promotes); the α-similarity matrix, whose cells open a task pair (both α maps, their difference,
the measured transfer); α mass per relative-depth decile for every model. The page's JavaScript
(``atlas.js`` beside this module) mirrors the lookups of :mod:`sitelens.atlas.views`
(``headCard``, ``taskMap``, ``pairView``, ``overview``).
"""

from __future__ import annotations

import json

from sitelens.errors import UsageError


def _asset(name: str) -> str:
    """``atlas.css`` / ``atlas.js``, shipped beside this module."""
    from importlib.resources import files

    return files("sitelens.atlas").joinpath(name).read_text(encoding="utf-8")


CARTESIAN = "vendor/plotly-cartesian.min.js"  # fetched by scripts/setup.sh (gitignored)


def plotly_bundle(which: str = "auto") -> tuple[str, str]:
    """``(name, source)`` of the plotly.js the page inlines.

    ``"cartesian"``: plotly.js's cartesian partial bundle (heatmap and bar are all the page draws),
    1.5 MB, evaluating in about half the time of the full one; it must carry the same version as
    the ``plotly`` package's full bundle. ``"full"``: the ``plotly`` package's own bundle. ``"auto"``:
    cartesian when ``scripts/setup.sh`` has fetched it, else full.
    """
    import re
    from importlib.resources import files

    from plotly.offline import get_plotlyjs

    if which not in ("auto", "cartesian", "full"):
        raise UsageError(f"plotly bundle {which!r}: use 'auto', 'cartesian' or 'full'")
    full = get_plotlyjs()
    if which == "full":
        return "full", full
    path = files("sitelens.atlas").joinpath(CARTESIAN)
    if not path.is_file():
        if which == "cartesian":
            raise UsageError(f"no {CARTESIAN} beside sitelens.atlas: run scripts/setup.sh "
                             "(it fetches plotly.js's cartesian bundle), or use 'full'")
        return "full", full
    src = path.read_text(encoding="utf-8")
    version = re.compile(r"v(\d+\.\d+\.\d+)")
    have, want = version.search(src[:300]), version.search(full[:300])
    if have is None or want is None or have.group(1) != want.group(1):
        if which == "cartesian":
            raise UsageError(f"{CARTESIAN} is plotly.js {have and have.group(1)}, the plotly package's "
                             f"is {want and want.group(1)}: rerun scripts/setup.sh after removing it")
        return "full", full
    return "cartesian", src


def build_atlas_html(payload: dict, *, title: str = "sitelens head atlas", plotly: str = "auto") -> str:
    """The page for ``payload`` (:func:`sitelens.atlas.views.payload`) as one HTML string;
    ``plotly`` picks the inlined bundle (:func:`plotly_bundle`)."""
    bundle, plotly_js = plotly_bundle(plotly)
    data = json.dumps(payload, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")
    return "\n".join([
        "<!doctype html>", '<html lang="en"><head><meta charset="utf-8">',
        f'<meta name="plotly-bundle" content="{bundle}">', f"<title>{title}</title>",
        f"<style>{_asset('atlas.css')}</style>",
        f"<script>{plotly_js}</script>", "</head><body>",
        f'<header><h1>{title}</h1>'
        '<label>model <select id="model"></select></label>'
        '<label>lens <select id="lens"></select></label>'
        '<label>task <select id="task"></select></label></header>',
        '<main><p class="note" id="summary"></p>',
        '<div class="panel" id="overview"></div>',
        '<div class="row"><div class="panel" id="taskmap"></div>'
        '<div class="panel card" id="card"></div></div>',
        '<div class="panel" id="minimal"></div>',
        '<div class="row"><div class="panel" id="sim"></div><div class="panel" id="pair"></div></div>',
        '<div class="panel" id="depth"></div>',
        '<p class="note">Built by <code>sitelens atlas</code>. Scores: higher = more important in '
        'every lens; α is SITE\'s learned head weight (mean over seeds). Transfer: first-token '
        "accuracy of task B's zero-shot prompts with B's embedding injected through A's α.</p>",
        "</main>",
        f'<script id="atlas-data" type="application/json">{data}</script>',
        f"<script>{_asset('atlas.js')}</script>", "</body></html>", ""])
