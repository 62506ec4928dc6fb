"""The fixtures every test folder shares: settings, clients and buckets on the session's own stack.

The session itself (its private stack, the lakeFS double, nbval's notebooks, the order of work and the
machine's share) is the plugin ``tests/suite/session.py``; ``tests/suite/suite_timings.py`` writes where the
run's time went (``--timings-json``).
"""

from __future__ import annotations

import pytest

pytest_plugins = ["tests.suite.session", "tests.suite.suite_timings"]


@pytest.fixture(scope="session")
def settings():
    """Settings pointing at the session's object store and MLflow."""
    from helpers.settings import load_settings
    from tests.suite.session import session_stack

    session_stack()
    return load_settings()


@pytest.fixture(scope="session")
def lakefs_kind() -> str:
    """Which lakeFS the session uses: "real" (LAKEFS_ENDPOINT was set) or "double" (the test double)."""
    from tests.suite.session import session_lakefs

    return session_lakefs()


@pytest.fixture(scope="session")
def client(settings):
    """A MinIO SDK client for the session's object store."""
    from helpers import storage

    return storage.get_client(settings)


@pytest.fixture
def bucket(client):
    """A fresh, unique bucket name; the bucket is deleted after the test, pass or fail."""
    import uuid

    from helpers import storage

    name = f"t-{uuid.uuid4().hex[:12]}"
    yield name
    storage.delete_bucket(client, name)
