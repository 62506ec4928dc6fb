"""Shared by the benchmark scripts: timing, machine facts, JSON output and a printed table."""

from __future__ import annotations

import json
import os
import platform
import statistics
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
