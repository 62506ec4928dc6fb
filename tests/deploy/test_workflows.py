"""The GitHub Actions workflows, checked offline: actionlint (syntax, expressions, runner labels) and zizmor
(security: unpinned actions, credentials left in the checkout, template injection, broad permissions).

They run where this machine cannot: the platforms a learner brings (.github/workflows/platforms.yml) and the
site's publishing (site.yml). Each checker is also shown a broken workflow, so a checker that passes everything
fails here.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers.settings import project_root

WORKFLOWS = project_root() / ".github" / "workflows"
BIN = Path(sys.executable).parent


def actionlint(*paths: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "actionlint"), "-no-color", *map(str, paths)], capture_output=True, text=True)


def zizmor(*paths: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "zizmor"), "--offline", "--no-progress", *map(str, paths)], capture_output=True,
                          text=True)


def test_every_workflow_passes_actionlint_and_zizmor():
    workflows = sorted(WORKFLOWS.glob("*.yml"))
    assert {w.name for w in workflows} >= {"platforms.yml", "site.yml"}
    linted = actionlint(*workflows)
    assert linted.returncode == 0, linted.stdout + linted.stderr
    audited = zizmor(*workflows)
    assert audited.returncode == 0, audited.stdout + audited.stderr


def test_the_platforms_workflow_runs_the_readme_s_commands_on_a_mac_and_ubuntu():
    workflow = yaml.safe_load((WORKFLOWS / "platforms.yml").read_text())
    job = workflow["jobs"]["learner"]
    assert job["strategy"]["matrix"]["os"] == ["ubuntu-24.04", "macos-14"]  # macos-14: Apple silicon
    commands = [step["run"] for step in job["steps"] if "run" in step]
    assert [c for c in commands if c.startswith("make ")] == ["make install", "make doctor", "make test-quick",
                                                             "make run"]
    assert "brew install python@3.11" in commands  # the Python docs/quickstart.md tells a Mac learner to install


@pytest.mark.parametrize("broken, checker, said", [
    ("on: push\njobs:\n  a:\n    runs-on: ubuntu-24.04\n    steps:\n      - run: echo ${{ github.evnt.name }}\n",
     actionlint, "evnt"),
    ("on: push\npermissions: {}\njobs:\n  a:\n    runs-on: ubuntu-24.04\n    steps:\n"
     "      - uses: actions/checkout@v7\n", zizmor, "unpinned"),
    ("on: pull_request_target\npermissions: {}\njobs:\n  a:\n    runs-on: ubuntu-24.04\n    steps:\n"
     "      - run: echo \"${{ github.event.pull_request.title }}\"\n", zizmor, "template-injection"),
])
def test_the_checkers_find_a_broken_workflow(tmp_path, broken, checker, said):
    (tmp_path / ".github" / "workflows").mkdir(parents=True)
    path = tmp_path / ".github" / "workflows" / "broken.yml"
    path.write_text(broken)
    found = checker(path)
    assert found.returncode != 0 and said in found.stdout + found.stderr, found.stdout + found.stderr
