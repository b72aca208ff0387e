"""How big the atlas page is and how fast it opens and answers a click, in headless Chromium.

    sitelens atlas --out /tmp/atlas.html          # from the committed figures/atlas tables
    python benchmarks/atlas_speed.py /tmp/atlas.html [--screenshots figures/atlas]

Measures (median of ``--repeats`` fresh pages): file size; ``open_s``, navigation start to the
page's ``window.atlasReady`` (every view drawn); ``click_s``, a click on a head in the task map
to the head card showing it (layer 1, head 1); ``pair_s``, a click on a similarity cell to the
pair drawn. Writes ``results/atlas_speed.{csv,md}`` and, with ``--screenshots DIR``, one PNG per
view into ``DIR``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import pandas as pd
from _common import md_table

HERE = Path(__file__).resolve().parent


def measure(path: Path, repeats: int, screenshots: Path | None) -> dict:
    from playwright.sync_api import sync_playwright

    opens, clicks, pairs = [], [], []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        for r in range(repeats):
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            t0 = time.perf_counter()
            page.goto(path.resolve().as_uri())
            page.wait_for_function("window.atlasReady === true", timeout=60_000)
            opens.append(time.perf_counter() - t0)
            xy = page.evaluate("""() => { const gd = document.getElementById('taskmap');
                const bb = gd.querySelector('.nsewdrag').getBoundingClientRect();
                return [bb.left + gd._fullLayout.xaxis.d2p(1), bb.top + gd._fullLayout.yaxis.d2p(1)]; }""")
            page.mouse.move(*xy)
            t0 = time.perf_counter()
            page.mouse.click(*xy)
            page.wait_for_function("document.getElementById('card').dataset.head === 'L1H1'")
            clicks.append(time.perf_counter() - t0)
            page.locator("#sim").scroll_into_view_if_needed()
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
                    page.locator(f"#{view}").screenshot(path=str(screenshots / f"atlas_{view}.png"))
            page.close()
        browser.close()
    return {"bytes": path.stat().st_size, "open_s": statistics.median(opens),
            "click_s": statistics.median(clicks), "pair_s": statistics.median(pairs),
            "repeats": repeats}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("page")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--screenshots", default=None)
    p.add_argument("--out", default=str(HERE / "results"))
    args = p.parse_args(argv)
    row = measure(Path(args.page), args.repeats, Path(args.screenshots) if args.screenshots else None)
    df = pd.DataFrame([{**row, "mb": round(row["bytes"] / 1e6, 2),
                        **{k: round(row[k], 3) for k in ("open_s", "click_s", "pair_s")}}])
    out = Path(args.out)
    df.to_csv(out / "atlas_speed.csv", index=False)
    (out / "atlas_speed.md").write_text("\n".join([
        "# Atlas page: size and speed", "",
        "`python benchmarks/atlas_speed.py ATLAS.html` (headless Chromium, median of "
        f"{args.repeats} fresh pages; see the script's docstring).", "", md_table(df), ""]))
    print(df.to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
