"""``.ci/run`` opens folders for the non-root users' tests, and gives every one its mode back."""

import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def closed_checkout():
    """A copy of ``.ci/`` in a checkout inside folders others cannot traverse, outside pytest's own folders."""
    top = Path(tempfile.mkdtemp(prefix="ci-modes-", dir="/tmp"))
    checkout = top / "closed" / "checkout"
    shutil.copytree(ROOT / ".ci", checkout / ".ci")
    (top / "closed").chmod(0o750)
    checkout.chmod(0o700)
    top.chmod(0o700)
    yield top, checkout
    shutil.rmtree(top)


def fake_tools(folder: Path, watched: list[Path]) -> Path:
    """``make`` writing the watched folders' modes to ``during``, exiting with $MAKE_EXIT; ``chromium``, ``curl``."""
    folder.mkdir()
    modes = " ".join(f'$(stat -c %a "{path}")' for path in watched)
    (folder / "make").write_text(f'#!/bin/sh\necho "{modes}" > "{folder}/during"\nexit "$MAKE_EXIT"\n')
    for tool in ("chromium", "curl"):
        (folder / tool).write_text("#!/bin/sh\nexit 0\n")
    for tool in ("make", "chromium", "curl"):
        (folder / tool).chmod(0o755)
    return folder


@pytest.mark.parametrize("make_exit", [0, 3])
def test_ci_run_opens_the_checkout_for_the_run_and_closes_it_after(closed_checkout, make_exit):
    top, checkout = closed_checkout
    watched = [top, top / "closed", checkout]
    before = [stat.S_IMODE(path.stat().st_mode) for path in watched]
    tools = fake_tools(Path(tempfile.mkdtemp(prefix="ci-tools-", dir="/tmp")) / "bin", watched)
    try:
        result = subprocess.run(["bash", str(checkout / ".ci" / "run")], capture_output=True, text=True, timeout=60,
                                env={"PATH": f"{tools}:/usr/bin:/bin", "MAKE_EXIT": str(make_exit)})
        assert result.returncode == make_exit, result.stderr
        during = [int(mode, 8) for mode in (tools / "during").read_text().split()]
    finally:
        shutil.rmtree(tools.parent)
    assert during == [mode | 0o001 for mode in before]  # traversable by others while the tests run ...
    assert [stat.S_IMODE(path.stat().st_mode) for path in watched] == before  # ... and as found afterwards
