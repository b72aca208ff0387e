"""How big the atlas page is and how fast it opens and answers a click, in headless Chromium.

    sitelens atlas --out /tmp/atlas.html          # from the tables shipped in sitelens/data/atlas
    sitelens atlas --out /tmp/atlas_full.html --plotly full
    python benchmarks/atlas_speed.py /tmp/atlas.html /tmp/atlas_full.html [--screenshots figures/atlas]

Measures (median of ``--repeats`` fresh pages, times from the browser's navigation start by the
page's own ``performance.now()``): file size; the plotly.js bundle inlined; ``open_s``, until the
first view is drawn and clickable (``window.atlasReadyAt``); ``first_screen_s``, until every view
on the first screen (1400 × 1000) is drawn (views further down draw when scrolled to);
``plotly_only_s``, until a page holding only the same inlined plotly.js has evaluated it (the
floor any page built on it pays on this CPU); ``click_s``, a click on a head in the task map
to the head card showing it (layer 1, head 1); ``pair_s``, a click on a similarity cell to the
pair drawn. Writes ``results/atlas_speed.{csv,md}`` (the latest run) and, with ``--screenshots
DIR``, one PNG per view into ``DIR``.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import pandas as pd

from sitelens.pipelines.experiment import Experiment, Job, load_avg, main, md_table

TIMES = ("open_s", "first_screen_s", "click_s", "pair_s", "plotly_only_s")


def measure(path: Path, repeats: int, screenshots: Path | None) -> dict:
    from playwright.sync_api import sync_playwright

    opens, screens, clicks, pairs, floors = [], [], [], [], []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        for r in range(repeats):
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            t0 = time.perf_counter()
            page.goto(path.resolve().as_uri())
            page.wait_for_function("window.atlasReady === true", timeout=60_000)
            opens.append(page.evaluate("window.atlasReadyAt") / 1000)
            # every view on the first screen drawn (those further down wait to be scrolled to)
            page.wait_for_function("""() => [...document.querySelectorAll('.panel')]
                .filter(e => e.getBoundingClientRect().top < window.innerHeight)
                .every(e => e.dataset.drawn === '1')""")
            screens.append(page.evaluate("""() => Math.max(...[...document.querySelectorAll('.panel')]
                .filter(e => e.getBoundingClientRect().top < window.innerHeight)
                .map(e => Number(e.dataset.drawnAt || 0)))""") / 1000)
            page.locator("#taskmap").scroll_into_view_if_needed()
            page.wait_for_function("document.getElementById('taskmap').dataset.drawn === '1'")
            xy = page.evaluate("""() => { const gd = document.getElementById('taskmap');
                const bb = gd.querySelector('.nsewdrag').getBoundingClientRect();
                return [bb.left + gd._fullLayout.xaxis.d2p(1), bb.top + gd._fullLayout.yaxis.d2p(1)]; }""")
            page.mouse.move(*xy)
            t0 = time.perf_counter()
            page.mouse.click(*xy)
            page.wait_for_function("document.getElementById('card').dataset.head === 'L1H1'")
            clicks.append(time.perf_counter() - t0)
            page.locator("#sim").scroll_into_view_if_needed()
            page.wait_for_function("document.getElementById('sim').dataset.drawn === '1'")
            xy = page.evaluate("""() => { const gd = document.getElementById('sim');
                const o = gd.data[0].x, L = gd._fullLayout;
                const bb = gd.querySelector('.nsewdrag').getBoundingClientRect();
                return [bb.left + L.xaxis.d2p(o[1]), bb.top + L.yaxis.d2p(o[2])]; }""")
            page.mouse.move(*xy)
            t0 = time.perf_counter()
            page.mouse.click(*xy)
            page.wait_for_function("document.getElementById('pair').dataset.a === "
                                   "document.getElementById('sim').data[0].y[2]")
            pairs.append(time.perf_counter() - t0)
            if screenshots and r == 0:
                screenshots.mkdir(parents=True, exist_ok=True)
                for view in ("overview", "taskmap", "card", "sim", "pair", "depth"):
                    page.locator(f"#{view}").scroll_into_view_if_needed()
                    page.wait_for_function(f"document.getElementById('{view}').dataset.drawn === '1'")
                    page.locator(f"#{view}").screenshot(path=str(screenshots / f"atlas_{view}.png"))
            page.close()
        # the floor: a page holding nothing but the same inlined plotly.js
        import tempfile

        from sitelens.atlas.html import plotly_bundle
        bundle = "cartesian" if 'content="cartesian"' in path.read_text(encoding="utf-8")[:2000] else "full"
        with tempfile.TemporaryDirectory() as tmp:
            bare = Path(tmp) / "bare.html"
            js = plotly_bundle(bundle)[1]
            bare.write_text(f"<!doctype html><html><head><script>{js}</script></head><body>"
                            "<script>window.done = performance.now()</script></body></html>",
                            encoding="utf-8")
            for _ in range(repeats):
                page = browser.new_page()
                t0 = time.perf_counter()
                page.goto(bare.as_uri())
                page.wait_for_function("window.done > 0")
                floors.append(page.evaluate("window.done") / 1000)
                page.close()
        browser.close()
    return {"bytes": path.stat().st_size, "plotly_bundle": bundle, "open_s": statistics.median(opens),
            "first_screen_s": statistics.median(screens),
            "click_s": statistics.median(clicks), "pair_s": statistics.median(pairs),
            "plotly_only_s": statistics.median(floors),
            "repeats": repeats, "load_1m": load_avg(), "cpus": os.cpu_count()}


class AtlasSpeed(Experiment):
    name, title = "atlas_speed", "Atlas page: size and speed"
    columns = ["bytes", "plotly_bundle", *TIMES[:4], "plotly_only_s", "repeats", "load_1m", "cpus", "mb"]
    key, replace = None, True

    def add_arguments(self, p) -> None:
        p.add_argument("pages", nargs="*", help="atlas pages (e.g. one per plotly.js bundle)")
        p.add_argument("--repeats", type=int, default=5)
        p.add_argument("--screenshots", default=None)

    def cells(self, args):
        return [Job(page, page, {"i": i}) for i, page in enumerate(args.pages)]

    def run(self, job: Job) -> dict:
        a = self.args
        shots = Path(a.screenshots) if a.screenshots and job["i"] == 0 else None
        row = measure(Path(job.key), a.repeats, shots)
        return {**row, "mb": round(row["bytes"] / 1e6, 2), **{k: round(row[k], 3) for k in TIMES}}

    def report(self, df: pd.DataFrame) -> str:
        return f"Headless Chromium, median of {int(df.repeats.iloc[0])} fresh pages.\n\n{md_table(df)}\n"


if __name__ == "__main__":
    raise SystemExit(main(AtlasSpeed()))
