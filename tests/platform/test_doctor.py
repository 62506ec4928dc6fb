"""``make doctor``: ready here, and one line naming the fix on each fault a learner's laptop can have (a TMPDIR too
long for sockets, a Python of another version, a full disk), each simulated here for real."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.settings import project_root
from tests.suite.session import session_stack

PYTHON_3_10 = Path("/root/.pyenv/versions/3.10.13/bin/python3.10")


def doctor(python: str = sys.executable, **env: str) -> tuple[int, list[str]]:
    done = subprocess.run([python, "-m", "workshop.doctor"], cwd=project_root(), capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=300)
    return done.returncode, (done.stdout + done.stderr).strip().splitlines()


def failed(lines: list[str]) -> list[str]:
    return [line for line in lines if line.startswith("  NO ")]


def test_ready_here_with_the_stack_answering_and_a_ray_task_on_a_worker():
    state = session_stack()
    code, lines = doctor(STACK_STATE_DIR=str(state))
    assert code == 0 and lines[-1].startswith("ready (checked in "), "\n".join(lines)
    checks = [line.split()[1] for line in lines if line.startswith("  ok ")]
    assert checks == ["Python", "platform", "disk", "memory", "sockets", "ports", "stack", "Ray"], lines
    assert any("a worker reached the object store in" in line for line in lines)
    from workshop import stack

    assert {row.name for row in stack.status(state) if row.healthy} >= {"seaweedfs", "mlflow", "ray"}, \
        "a stack the doctor found running is left running"


def test_a_tmpdir_too_long_for_sockets_is_one_line(tmp_path):
    long = tmp_path / ("t" * (100 - len(str(tmp_path)) - 1))
    long.mkdir()
    code, lines = doctor(TMPDIR=str(long), STACK_STATE_DIR=str(tmp_path / "state"))
    [line] = failed(lines)
    assert code == 1 and "sockets" in line and f"TMPDIR={long} (100 bytes)" in line and "export TMPDIR=/tmp" in line
    assert lines[-1].startswith("not ready: fix what the sockets line says")
    assert not (tmp_path / "state").exists(), "no stack started on a machine that is not ready"


def test_a_python_of_another_version_is_one_line(tmp_path):
    if not PYTHON_3_10.exists():
        pytest.skip("no Python 3.10 on this machine to stand for a learner's")
    code, lines = doctor(str(PYTHON_3_10), STACK_STATE_DIR=str(tmp_path / "state"))
    [line] = failed(lines)
    assert code == 1 and "3.10" in line and "needs 3.11 or 3.12" in line
    assert lines[-1].startswith("not ready: fix what the Python line says")


def test_a_full_disk_is_one_line(tmp_path):
    full = tmp_path / "full"
    full.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(full)], capture_output=True).returncode:
        pytest.skip("mounting a small disk needs root")
    try:
        code, lines = doctor(STACK_STATE_DIR=str(full / ".stack"))
    finally:
        subprocess.run(["umount", str(full)], check=True)
    [line] = failed(lines)
    assert code == 1 and "disk" in line and "GB free at" in line and "STACK_STATE_DIR" in line
    assert lines[-1].startswith("not ready: fix what the disk line says")
