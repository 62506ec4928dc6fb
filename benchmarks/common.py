"""Shared by the benchmark scripts: timing, machine facts, JSON output and a printed table."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    """Median wall time of ``repeats`` calls of ``fn``."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def machine() -> dict:
    """What the numbers were measured on."""
    return {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()}


def write_results(name: str, payload: dict) -> Path:
    """Write ``benchmarks/results/<name>.json`` with the machine facts and a UTC timestamp."""
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    payload = {"benchmark": name, "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
               "machine": machine(), **payload}
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path


def print_table(title: str, rows: list[dict], columns: list[str]) -> None:
    """Print rows as a Markdown table (paste-ready for README)."""
    print(f"\n{title}\n")
    print("| " + " | ".join(columns) + " |")
    print("|" + "|".join("---" for _ in columns) + "|")
    for row in rows:
        print("| " + " | ".join(str(row.get(c, "")) for c in columns) + " |")


def lakefs_answers(settings) -> bool:
    """Whether a lakeFS answers at the settings' endpoint."""
    from helpers import versioning

    try:
        versioning.connect(settings, timeout=3.0)
        return True
    except Exception:  # noqa: BLE001 - any failure means: not there
        return False


@contextlib.contextmanager
def lakefs_or_double(settings):
    """Yield what notebook 06 runs against: the configured lakeFS, else the tests' API double, started here.

    The double (tests/fakes/lakefs_double.py, contract-tested against lakeFS's API) forgets its repositories
    when it stops while the bucket keeps their namespaces: give each run a new repository name.
    """
    if lakefs_answers(settings):
        yield f"lakeFS at {settings.lakefs_endpoint}"
        return
    from helpers.settings import project_root

    sys.path.insert(0, str(project_root()))
    from tests.fakes.lakefs_double import LakeFSServer

    with LakeFSServer(settings) as server:
        saved = {key: os.environ.get(key) for key in server.env()}
        os.environ.update(server.env())
        try:
            yield "the API double of the tests (tests/fakes/lakefs_double.py), not a lakeFS server"
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


def summary_facts(notebook: Path) -> dict:
    """The facts an executed notebook's summary cell displayed (its JSON), or {} when it has none."""
    for cell in json.loads(notebook.read_text())["cells"]:
        if "summary" in cell.get("metadata", {}).get("tags", []):
            for output in cell.get("outputs", []):
                if "application/json" in output.get("data", {}):
                    return output["data"]["application/json"]
    return {}
