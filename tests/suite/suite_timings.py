"""Where a test run's time went: each test module's seconds, in which test process, and each process's wait.

``make test`` passes ``--timings-json runs/test-timings.json``. Every test's set-up, call and tear-down
seconds are added up by module (nbval's notebooks, and its second run on the same stack, count as one unit,
as they are scheduled), with the test process that ran it. Each process also counts the seconds it waited
for the machine (``tests/suite/machine_share.py``): a test that needs the whole machine waits for the other
process's current test, and the other process then waits for it. The main process writes one file for the
run and prints the longest modules after the test summary, so a change that makes the suite slower shows
which module paid, and whether the two processes were kept busy; then one budget line: each process's busy
seconds against those docs/tests.md records for the last full run, the largest unit, and any unit over 15
minutes. Speed is shown, never asserted: machines differ up to 3x. A change that adds a check on purpose
updates the recorded numbers, and says why in its commit.
"""

from __future__ import annotations

import json
import re
import time
from collections import defaultdict
from pathlib import Path

import pytest

from helpers.settings import project_root
from tests.suite import machine_share

OPTION = "--timings-json"
NBVAL_UNIT = "notebooks (nbval, then the browser test on the same stack)"
# docs/tests.md records each test process's busy seconds of the last full run as `<!-- busy-seconds: gw0=N gw1=N -->`
RECORDED = re.compile(r"<!-- busy-seconds: ((?:\w+=\d+ ?)+) -->")
UNIT_LIMIT_S = 15 * 60  # a unit of work longer than this holds one process for a third of the suite's 40 minutes


def recorded_busy_seconds(page: Path) -> dict[str, int]:
    """Each test process's busy seconds as docs/tests.md records them (empty where it records none)."""
    found = RECORDED.search(page.read_text()) if page.exists() else None
    return {name: int(value) for name, value in (pair.split("=") for pair in found[1].split())} if found else {}


def budget_line(written: dict, recorded: dict[str, int]) -> str:
    """One line: each process's busy seconds against the recorded ones, the largest unit, any unit over 15 min."""
    parts = []
    for process, row in written["processes"].items():
        was = recorded.get(process)
        change = f" (recorded {was:,}: {row['busy_s'] / was - 1:+.0%})" if was else " (none recorded)"
        parts.append(f"{process} {row['busy_s']:,.0f} s busy{change}")
    largest = written["units"][0] if written["units"] else None
    over = [f"{u['unit']} {u['seconds']:,.0f} s" for u in written["units"] if u["seconds"] > UNIT_LIMIT_S]
    return (f"budget: {', '.join(parts)}; largest unit "
            + (f"{largest['unit']} {largest['seconds']:,.0f} s ({largest['process']})" if largest else "none")
            + (f"; OVER 15 MIN: {', '.join(over)}" if over else "; no unit over 15 min"))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(OPTION, default=None, metavar="PATH",
                     help="write each test module's seconds, by test process, to PATH (JSON)")


def unit_of(nodeid: str) -> str:
    """The unit of work a test belongs to: its module, or nbval's notebooks with the browser test that follows."""
    path = nodeid.split("::")[0]
    return NBVAL_UNIT if path.startswith("notebooks/") or path.endswith("platform/test_browser.py") else path


class Timings:
    """Seconds by unit of work and test process, gathered in the process that reports the run."""

    def __init__(self, path: Path) -> None:
        self.path, self.started = path, time.monotonic()
        self.seconds: dict[tuple[str, str], float] = defaultdict(float)
        self.tests: dict[tuple[str, str], int] = defaultdict(int)
        self.waited: dict[str, float] = {}
        self.written: dict | None = None

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        node = getattr(report, "node", None)  # pytest-xdist: the test process the report came from
        process = node.gateway.id if node is not None else "main"
        key = (unit_of(report.nodeid), process)
        self.seconds[key] += report.duration
        self.tests[key] += report.when == "call"

    @pytest.hookimpl
    def pytest_testnodedown(self, node, error) -> None:
        self.waited[node.gateway.id] = getattr(node, "workeroutput", {}).get("machine_wait_s", 0.0)

    def summary(self) -> dict:
        """The run as JSON: its wall-clock seconds, each process's busy and waiting seconds, and every unit."""
        units = sorted(({"unit": unit, "process": process, "seconds": round(seconds, 1),
                         "tests": self.tests[unit, process]} for (unit, process), seconds in self.seconds.items()),
                       key=lambda row: -row["seconds"])
        waited = self.waited or {"main": machine_share.WAITED["seconds"]}  # without pytest-xdist: this process
        processes = sorted({process for _, process in self.seconds} | set(waited))
        return {"wall_s": round(time.monotonic() - self.started, 1),
                "processes": {p: {"busy_s": round(sum(s for (_, q), s in self.seconds.items() if q == p), 1),
                                  "waited_for_machine_s": round(waited.get(p, 0.0), 1)} for p in processes},
                "units": units}

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        self.written = self.summary()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.written, indent=1) + "\n")

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter) -> None:
        if self.written is None:
            return
        write = terminalreporter.write_line
        terminalreporter.section(f"where the time went ({self.path})")
        for process, row in self.written["processes"].items():
            write(f"{process}: {row['busy_s']:.1f} s in tests, {row['waited_for_machine_s']:.1f} s waiting for "
                  f"the machine, of {self.written['wall_s']:.1f} s")
        for row in self.written["units"][:12]:
            tests = f"{row['tests']} test" + "s" * (row["tests"] != 1)
            write(f"{row['seconds']:8.1f} s  {row['process']:5} {row['unit']} ({tests})")
        write(budget_line(self.written, recorded_busy_seconds(project_root() / "docs" / "tests.md")))


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption(OPTION)
    if path is None:
        return
    if hasattr(config, "workerinput"):  # a test process of pytest-xdist: the main process adds up its reports
        config.pluginmanager.register(WaitReporter(), "suite-timings-wait")
    else:
        config.pluginmanager.register(Timings(Path(path)), "suite-timings")


class WaitReporter:
    """In a test process of pytest-xdist: hands the seconds it waited for the machine to the main process."""

    @pytest.hookimpl
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        session.config.workeroutput["machine_wait_s"] = machine_share.WAITED["seconds"]
