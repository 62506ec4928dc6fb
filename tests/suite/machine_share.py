"""The machine's memory, shared between the test processes of one run.

``make test`` runs two test processes on one machine. Most tests need a few GB at most, and two of them fit
side by side. Three learners' rooms running notebook 04 at once (``test_shared_server``) need about 13 GB on
their own (3.7 GB of a room's own memory at its peak, measured). Beside the other process's busiest tests,
that crossed the 95% at which Ray's memory monitor kills a worker. So a test that needs the whole machine
waits for the other process's current test to end, and the other process starts no test until it is done.

Two ``flock`` files in the run's shared temporary folder: every test holds ``machine.lock`` shared; a test
that needs the machine holds it exclusively. It first takes ``gate.lock``, which every test passes through
before it takes its shared lock, so a test that waits for the machine is not overtaken by the next test of
the other process.
"""

from __future__ import annotations

import contextlib
import fcntl
import time
from collections.abc import Iterator
from pathlib import Path

_SHARED: list = []  # this process's open machine.lock while a test runs
WAITED = {"seconds": 0.0}  # how long this process waited for the machine (tests/suite/suite_timings.py reports it)


@contextlib.contextmanager
def _counted() -> Iterator[None]:
    started = time.monotonic()
    try:
        yield
    finally:
        WAITED["seconds"] += time.monotonic() - started


def run_folder(config) -> Path | None:
    """The folder the test processes of this run share (the run's basetemp), or None outside pytest-xdist."""
    if not hasattr(config, "workerinput"):
        return None
    return Path(config.option.basetemp).parent


def _locked(path: Path, mode: int):
    handle = path.open("a")
    fcntl.flock(handle, mode)
    return handle


@contextlib.contextmanager
def sharing(folder: Path | None) -> Iterator[None]:
    """Hold the machine shared with the other test processes (every test does, through tests/suite/session.py)."""
    if folder is None:
        yield
        return
    with _counted():
        with _locked(folder / "gate.lock", fcntl.LOCK_EX):  # waits while a test waits for the whole machine
            pass
        held = _locked(folder / "machine.lock", fcntl.LOCK_SH)
    with held as handle:
        _SHARED.append(handle)
        try:
            yield
        finally:
            _SHARED.remove(handle)


@contextlib.contextmanager
def whole_machine(folder: Path | None) -> Iterator[None]:
    """Hold the machine alone: no test of another process runs until this ends.

    The calling test's shared hold is let go first (so two tests that both asked could not wait on each
    other), then made exclusive, and made shared again at the end.
    """
    if folder is None:
        yield
        return
    handle = _SHARED[-1] if _SHARED else (folder / "machine.lock").open("a")
    fcntl.flock(handle, fcntl.LOCK_UN)
    with _counted(), _locked(folder / "gate.lock", fcntl.LOCK_EX):
        fcntl.flock(handle, fcntl.LOCK_EX)
    try:
        yield
    finally:
        fcntl.flock(handle, fcntl.LOCK_SH)
        if not _SHARED:
            handle.close()
