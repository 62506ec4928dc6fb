"""Debian's Chromium driven by Playwright: where the browser tests find it, and how they start it.

Playwright's own browser download is never used: ``apt-get install chromium`` (``.ci/run`` does). Where
Chromium or Playwright is missing, a browser test is skipped with one line, and with
``TUTORIAL_REQUIRE_BROWSER=1`` (set by ``.ci/run``) that is a failure. Used by ``test_browser.py`` (the lab)
and ``test_site.py`` (the website).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

REQUIRE_ENV = "TUTORIAL_REQUIRE_BROWSER"
CHROMIUM = os.environ.get("CHROMIUM", shutil.which("chromium") or "/usr/bin/chromium")
# Chromium's flags on a headless machine: no sandbox as root, and no background calls to Google's hosts,
# which a machine without internet refuses many at a time.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


def browser_or_skip() -> None:
    """Skip (or fail, under ``TUTORIAL_REQUIRE_BROWSER``) when Chromium or Playwright is missing."""
    missing = []
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing.append("Playwright (`pip install -r requirements.txt`)")
    if not Path(CHROMIUM).is_file():
        missing.append("Chromium (`sudo apt-get install chromium`)")
    if missing:
        why = "The browser test needs " + " and ".join(missing)
        if os.environ.get(REQUIRE_ENV):
            pytest.fail(f"{why}; {REQUIRE_ENV} is set, so that is a failure.")
        pytest.skip(f"{why}; install it to run this test, or set {REQUIRE_ENV}=1 to make its absence a failure.")


@contextmanager
def chromium() -> Iterator:
    """Headless Chromium under Playwright, closed on exit (skips or fails first where it is missing)."""
    browser_or_skip()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()
