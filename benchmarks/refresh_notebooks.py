"""Refresh the committed notebooks' outputs from one clean-tree run on a fresh stack (``make notebooks``).

Every committed output comes from the same run: all notebooks in order, at their default (smoke)
parameters, from a working tree with no uncommitted changes (``workshop.runner --in-place`` refuses
otherwise), on a private stack started here on free ports in a temporary folder, so the learner's own
``.stack`` (their buckets, runs and models) is neither used nor changed. Notebook 06 runs against lakeFS
where one is configured, else against the tests' API double (its outputs say which).

    python benchmarks/refresh_notebooks.py
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

from common import lakefs_or_double

from helpers.settings import load_settings
from workshop import runner, stack, stack_ports


def main() -> int:
    """Start a private stack, run every notebook in place, stop the stack; the runner's exit status."""
    state = Path(tempfile.mkdtemp(prefix="stack-notebooks-"))
    os.environ.update(runner.reproducible_numerics())  # as nbval's run in the tests: the stack's Ray inherits it
    try:
        stack.up(state, ports=stack_ports.free_ports(list(stack_ports.DEFAULT_PORTS)))
        os.environ["STACK_STATE_DIR"] = str(state)  # the notebooks find it as a learner's find .stack
        with lakefs_or_double(load_settings()) as lakefs:
            print(f"Notebook 06 runs against {lakefs}.")
            return runner.main(["--in-place", *sys.argv[1:]])
    finally:
        stack.down(state)
        shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
