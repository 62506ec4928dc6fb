"""The two test processes of a run share the machine, and a test that needs it whole gets it alone."""

from __future__ import annotations

import subprocess
import sys
import time

HOLD = '''
import sys, time
from pathlib import Path
from tests.suite import machine_share
folder = Path(sys.argv[1])
print("asking", time.time(), flush=True)
with machine_share.sharing(folder):  # as tests/suite/session.py holds it for every test
    with getattr(machine_share, sys.argv[2])(folder):
        print("in", time.time(), flush=True)
        time.sleep(float(sys.argv[3]))
        print("out", time.time(), flush=True)
print("waited", machine_share.WAITED["seconds"], flush=True)
'''


def hold(folder, how: str, seconds: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", HOLD, str(folder), how, str(seconds)], stdout=subprocess.PIPE,
                            text=True)


def times(process: subprocess.Popen) -> dict[str, float]:
    out, _ = process.communicate(timeout=30)
    return {word: float(at) for word, at in (line.split() for line in out.splitlines())}


def test_a_test_that_needs_the_whole_machine_waits_for_the_other_s_test_and_goes_before_its_next(tmp_path):
    running = hold(tmp_path, "sharing", 2.0)
    assert running.stdout.readline().startswith("asking") and running.stdout.readline().startswith("in")
    whole = hold(tmp_path, "whole_machine", 1.0)
    asked = float(whole.stdout.readline().split()[1])  # Python is up: the gate is a few file operations away
    time.sleep(0.3)  # the whole-machine test now waits at the gate ...
    next_test = hold(tmp_path, "sharing", 0.0)  # ... and the other process's next test must not overtake it
    first = {"out": float(running.stdout.readline().split()[1])}
    running.communicate(timeout=30)
    alone, after = {**times(whole), "asking": asked}, times(next_test)
    assert alone["in"] >= first["out"]
    assert after["in"] >= alone["out"]
    # each wait is counted, for the run's report of where its time went (tests/suite/suite_timings.py)
    for held in (alone, after):
        assert held["in"] - held["asking"] > 0.3 and abs(held["waited"] - (held["in"] - held["asking"])) < 0.25


def test_tests_share_the_machine_side_by_side(tmp_path):
    one, two = hold(tmp_path, "sharing", 1.5), hold(tmp_path, "sharing", 1.5)
    a, b = times(one), times(two)
    assert a["in"] < b["out"] and b["in"] < a["out"]
    assert a["waited"] < 0.5 and b["waited"] < 0.5
