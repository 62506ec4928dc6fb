"""`make test` says where its time went: every test module's seconds, by test process, in runs/test-timings.json."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from helpers.settings import project_root
from tests.suite.suite_timings import NBVAL_UNIT, budget_line, recorded_busy_seconds, unit_of

PROBES = {
    "test_slow_probe.py": "import time\n\n\ndef test_slow():\n    time.sleep(1.5)\n",
    "test_quick_probe.py": "def test_one():\n    pass\n\n\ndef test_two():\n    pass\n",
}


def test_a_run_writes_each_module_s_seconds_by_test_process_and_prints_the_longest(tmp_path):
    for name, code in PROBES.items():
        (tmp_path / name).write_text(code)
    timings = tmp_path / "runs" / "test-timings.json"
    plugins = ["-p", "tests.suite.session", "-p", "tests.suite.suite_timings", "-p", "no:cacheprovider"]
    ran = subprocess.run([sys.executable, "-m", "pytest", *plugins, "-n", "2", "--dist", "loadfile",
                          "--timings-json", str(timings), "--rootdir", str(tmp_path), "-c", os.devnull,
                          *(str(tmp_path / name) for name in PROBES)],
                         cwd=project_root(), capture_output=True, text=True, timeout=180)
    assert ran.returncode == 0 and "3 passed" in ran.stdout, ran.stdout + ran.stderr
    written = json.loads(timings.read_text())
    units = {row["unit"].rsplit("/", 1)[-1]: row for row in written["units"]}
    assert set(units) == set(PROBES)
    assert units["test_slow_probe.py"]["tests"] == 1 and units["test_slow_probe.py"]["seconds"] >= 1.5
    assert units["test_quick_probe.py"]["tests"] == 2 and units["test_quick_probe.py"]["seconds"] < 1.5
    assert written["units"][0]["unit"].endswith("test_slow_probe.py"), "the longest first"
    processes = {row["process"] for row in written["units"]}
    assert processes <= set(written["processes"]) and processes <= {"gw0", "gw1"}
    for process, row in written["processes"].items():
        assert row["waited_for_machine_s"] >= 0
        assert row["busy_s"] == round(sum(u["seconds"] for u in written["units"] if u["process"] == process), 1)
    assert written["wall_s"] >= 1.5
    assert "where the time went" in ran.stdout and "test_slow_probe.py (1 test)" in ran.stdout
    budget = next(line for line in ran.stdout.splitlines() if line.startswith("budget: "))
    assert "s busy (recorded " in budget and "largest unit " in budget and "test_slow_probe.py" in budget


def test_nbval_s_notebooks_and_the_browser_test_after_them_are_one_unit_as_they_are_scheduled():
    assert unit_of("notebooks/04_distributed_training.ipynb::Cell 3") == NBVAL_UNIT
    browser = "tests/platform/test_browser.py::test_restart_and_run_all_in_jupyterlab[01_upload_mnist]"
    assert unit_of(browser) == NBVAL_UNIT
    assert unit_of("tests/lessons/test_train.py::test_fit[1]") == "tests/lessons/test_train.py"


def test_the_budget_line_compares_with_the_recorded_seconds_and_flags_a_unit_over_15_minutes():
    recorded = recorded_busy_seconds(project_root() / "docs" / "tests.md")
    assert set(recorded) == {"gw0", "gw1"} and all(s > 0 for s in recorded.values()), "docs/tests.md records them"
    written = {"processes": {"gw0": {"busy_s": 2200.0}, "gw1": {"busy_s": 1000.0}},
               "units": [{"unit": "tests/platform/test_kit.py", "seconds": 950.0, "process": "gw0"},
                         {"unit": "tests/lessons/test_train.py", "seconds": 300.0, "process": "gw1"}]}
    line = budget_line(written, {"gw0": 2000, "gw1": 1000})
    assert line.startswith("budget: gw0 2,200 s busy (recorded 2,000: +10%), gw1 1,000 s busy (recorded 1,000: +0%)")
    assert "largest unit tests/platform/test_kit.py 950 s (gw0); OVER 15 MIN: tests/platform/test_kit.py 950 s" in line
    written["units"] = written["units"][1:]
    assert budget_line(written, {}).endswith("(gw1); no unit over 15 min") and "(none recorded)" in budget_line(
        written, {})
