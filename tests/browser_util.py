"""The browser tier: pages opened in a real headless Chromium, driven by Playwright.

Playwright's Python package drives the *system* Chromium (``SITELENS_CHROMIUM``, else
``/usr/bin/chromium``, else ``chromium`` / ``chromium-browser`` / ``google-chrome`` on ``PATH``);
nothing is downloaded (``playwright install`` is never needed). Tests marked ``browser`` use the
fixtures below and are skipped, with the reason, only when playwright is not importable or no
Chromium executable exists; a Chromium that is there but fails to start fails the test.

Every page runs offline: its context routes all requests and aborts any that is not ``file:`` /
``data:`` / ``blob:``, so a page that needs a CDN fails its test. :class:`PageLog` records what went
wrong on the page: console errors, uncaught exceptions, failed and blocked requests.

``tests/conftest.py`` imports the fixtures, so any test module can ask for ``offline_page``.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pytest

CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "chromium", "chromium-browser", "google-chrome")
LOCAL_SCHEMES = ("file:", "data:", "blob:", "about:")


def chromium_executable() -> str | None:
    """The Chromium to drive: ``$SITELENS_CHROMIUM``, else the first of
    :data:`CHROMIUM_CANDIDATES` that exists; ``None`` if there is none."""
    env = os.environ.get("SITELENS_CHROMIUM")
    for cand in ((env,) if env else CHROMIUM_CANDIDATES):
        path = cand if os.path.isabs(cand) else shutil.which(cand)
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def browser_skip_reason() -> str | None:
    """Why the browser tier cannot run here, or ``None`` if it can."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError as e:
        return f"playwright is not importable ({e}); install the dev extras: pip install -e '.[dev]'"
    if chromium_executable() is None:
        where = os.environ.get("SITELENS_CHROMIUM") or ", ".join(CHROMIUM_CANDIDATES)
        return (f"no Chromium executable found (looked for {where}); "
                "apt-get install -y chromium, or set SITELENS_CHROMIUM")
    return None


@dataclass
class PageLog:
    """What went wrong on one page."""

    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    failed_requests: list[str] = field(default_factory=list)
    blocked_requests: list[str] = field(default_factory=list)

    def problems(self) -> list[str]:
        return ([f"console error: {m}" for m in self.console_errors]
                + [f"uncaught exception: {m}" for m in self.page_errors]
                + [f"request failed: {m}" for m in self.failed_requests]
                + [f"network request blocked: {m}" for m in self.blocked_requests])


@dataclass
class OfflinePage:
    """A Playwright page whose network is cut off, and its :class:`PageLog`."""

    page: object
    log: PageLog


@pytest.fixture(scope="session")
def chromium():
    """One headless system Chromium for the whole session (skips if there is none)."""
    reason = browser_skip_reason()
    if reason:
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium_executable(), headless=True,
                                     args=["--no-sandbox", "--disable-gpu"])
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def offline_page(chromium):
    """A fresh context + page in :func:`chromium`, every non-local request aborted, and what went
    wrong recorded in ``.log``."""
    context = chromium.new_context(viewport={"width": 1200, "height": 800})
    log = PageLog()

    def route(r):
        url = r.request.url
        if url.startswith(LOCAL_SCHEMES):
            r.continue_()
        else:
            log.blocked_requests.append(url)
            r.abort()

    context.route("**/*", route)
    page = context.new_page()
    page.on("console", lambda m: log.console_errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: log.page_errors.append(str(e)))
    page.on("requestfailed", lambda r: log.failed_requests.append(f"{r.url} ({r.failure})"))
    try:
        yield OfflinePage(page, log)
    finally:
        context.close()


def file_url(path: str | Path) -> str:
    return Path(path).resolve().as_uri()


def panel_colours(page, png: bytes, selector: str = ".panel", inset: int = 8) -> dict[str, int]:
    """How many distinct colours the full-page screenshot ``png`` holds inside each element of
    ``selector`` (keyed by its id), ``inset`` pixels in from its edges (past the rounded, anti-aliased
    border), counted in the page itself (a canvas decodes the PNG: no image library needed). A panel
    left blank is its background alone, one colour; a drawn plot shows hundreds."""
    import base64

    return page.evaluate(
        """async ([src, selector, inset]) => {
          const img = new Image(); img.src = src; await img.decode();
          const c = document.createElement('canvas'); c.width = img.width; c.height = img.height;
          const ctx = c.getContext('2d'); ctx.drawImage(img, 0, 0);
          const out = {};
          for (const el of document.querySelectorAll(selector)) {
            const r = el.getBoundingClientRect();
            const x = Math.round(r.left + window.scrollX) + inset;
            const y = Math.round(r.top + window.scrollY) + inset;
            const d = ctx.getImageData(x, y, Math.max(1, Math.round(r.width) - 2 * inset),
                                       Math.max(1, Math.round(r.height) - 2 * inset)).data;
            const seen = new Set();
            for (let i = 0; i < d.length; i += 4) seen.add((d[i] << 16) | (d[i + 1] << 8) | d[i + 2]);
            out[el.id] = seen.size;
          }
          return out; }""",
        ["data:image/png;base64," + base64.b64encode(png).decode(), selector, inset])
