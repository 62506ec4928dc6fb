"""nbval a second time, on the stack the first run left behind, as a learner's stack is reused.

The first run (``make test``'s nbval, in this test process, just before) leaves models in the registry, a
champion, lakeFS tags, predictions and training results in the bucket. The cells nbval checks print what
the lesson controls, and ``tests/suite/nbval_sanitize.cfg`` masks what depends on where the notebook runs; so the
second run must match the committed outputs too.

It runs the notebooks whose checked cells read what the stack already holds: 01 (the upload that finds every
object there), 06 (a repository, branches, a tag and a champion that exist), 07 (a registry with versions and
predictions in the bucket) and 08 (a champion and day's models to roll to). 02-05's checked cells print the same
on any stack: 02 lists only ``train/`` and ``test/`` keys, 03's packing is not checked, 05 names each sweep anew,
and 04 could differ in one way only, a finished run of the same parameters taken for an interrupted one, which
``tests/lessons/test_train.py`` checks directly (``interrupted_run``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from helpers.settings import project_root
from tests.suite.session import REUSE_STACK_ENV, session_lakefs, session_stack

pytestmark = pytest.mark.notebook


AGAIN = ("01", "06", "07", "08")  # the notebooks whose checked outputs depend on what the stack holds


def nbval_options() -> list[str]:
    """nbval's options as ``make test`` gives them (its NBVAL line)."""
    makefile = (project_root() / "Makefile").read_text()
    return re.search(r"^NBVAL := (.+)$", makefile, flags=re.MULTILINE).group(1).split()


@pytest.mark.timeout(2400)
def test_nbval_passes_again_on_the_same_stack():
    session_lakefs()  # and the stack: this process's, which the first run used
    env = {**os.environ, REUSE_STACK_ENV: str(session_stack())}
    notebooks = [f"notebooks/{path.name}" for n in AGAIN for path in (project_root() / "notebooks").glob(f"{n}_*")]
    assert len(notebooks) == len(AGAIN)
    again = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tests.suite.session", "-p", "no:cacheprovider",
                            *nbval_options(), *notebooks],
                           cwd=project_root(), env=env, capture_output=True, text=True, timeout=2300)
    assert again.returncode == 0, again.stdout[-6000:] + again.stderr[-2000:]
    assert re.search(r"\d+ passed", again.stdout), again.stdout[-2000:]
