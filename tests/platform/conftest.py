"""Fixtures more than one module of the platform's tests uses."""

import pytest

from tests.platform.chromium import chromium


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium for one module: skipped where it is missing, or failed under TUTORIAL_REQUIRE_BROWSER."""
    with chromium() as started:
        yield started
