"""Where the seconds go: labelled spans appended to a JSON-lines file that ``benchmarks/bench_smoke.py`` reads.

Nothing is written unless ``SMOKE_TIMINGS`` names a file. The variable is
inherited by the notebook's kernel and by a local Ray's workers, so a span
recorded inside a training worker lands in the same file as the driver's.
Each line is ``{"label", "start", "end", "pid"}`` with wall-clock times
(seconds since the epoch), so spans from different processes line up.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

TIMINGS_ENV = "SMOKE_TIMINGS"


def record(label: str, start: float, end: float | None = None) -> None:
    """Append one span (wall-clock ``start`` to ``end``, default now) when ``SMOKE_TIMINGS`` is set."""
    path = os.environ.get(TIMINGS_ENV)
    if not path:
        return
    line = json.dumps({"label": label, "start": start, "end": time.time() if end is None else end,
                       "pid": os.getpid()})
    with open(path, "a", encoding="utf-8") as out:  # one short append per span: lines do not interleave
        out.write(line + "\n")


@contextlib.contextmanager
def span(label: str) -> Iterator[None]:
    """Record the block as one span named ``label``."""
    start = time.time()
    try:
        yield
    finally:
        record(label, start)


def process_started() -> float:
    """When this process started (wall clock): the imports before the first recorded span count from here.

    Its age comes from the kernel's boot clock (``/proc``) and is subtracted from now:
    psutil's start time adds the age to the boot time, which on a machine up for hours
    can be seconds away from the wall clock the spans use.
    """
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])  # field 22: starttime
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):  # not Linux
        import psutil

        return psutil.Process().create_time()


def read(path: str | os.PathLike) -> list[dict]:
    """The spans recorded in ``path``, in the order they ended."""
    with open(path, encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]
