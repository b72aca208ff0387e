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


def _asset(name: str) -> str:
    """``atlas.css`` / ``atlas.js``, shipped beside this module."""
    from importlib.resources import files

    return files("sitelens.atlas").joinpath(name).read_text(encoding="utf-8")


def _plotly_js() -> str:
    from plotly.offline import get_plotlyjs

    return get_plotlyjs()


def build_atlas_html(payload: dict, *, title: str = "sitelens head atlas") -> str:
    """The page for ``payload`` (:func:`sitelens.atlas.views.payload`) as one HTML string."""
    data = json.dumps(payload, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")
    return "\n".join([
        "<!doctype html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{title}</title>", f"<style>{_asset('atlas.css')}</style>",
        f"<script>{_plotly_js()}</script>", "</head><body>",
        f'<header><h1>{title}</h1>'
        '<label>model <select id="model"></select></label>'
        '<label>lens <select id="lens"></select></label>'
        '<label>task <select id="task"></select></label></header>',
        '<main><p class="note" id="summary"></p>',
        '<div class="panel" id="overview"></div>',
        '<div class="row"><div class="panel" id="taskmap"></div>'
        '<div class="panel card" id="card"></div></div>',
        '<div class="row"><div class="panel" id="sim"></div><div class="panel" id="pair"></div></div>',
        '<div class="panel" id="depth"></div>',
        '<p class="note">Built by <code>sitelens atlas</code>. Scores: higher = more important in '
        'every lens; α is SITE\'s learned head weight (mean over seeds). Transfer: first-token '
        "accuracy of task B's zero-shot prompts with B's embedding injected through A's α.</p>",
        "</main>",
        f'<script id="atlas-data" type="application/json">{data}</script>',
        f"<script>{_asset('atlas.js')}</script>", "</body></html>", ""])
