"""The test session: one real object store + MLflow per test process, nbval over the notebooks, the order of work.

A pytest plugin (``tests/conftest.py`` loads it), so its hooks hold for the notebooks nbval collects as for the
tests.

Where ``S3_ENDPOINT`` is set, the tests use the services it points at.
Otherwise a private embedded stack is started on free ports in a temporary
folder (never the developer's ``.stack``) and ``STACK_STATE_DIR`` names it,
so notebooks executed by papermill or nbval find it as a learner's notebook
finds ``.stack``. It is started on first need, by a test fixture or by the
first notebook nbval runs.

nbval (``--nbval-lax``, in ``make test``) runs every notebook top to bottom at
its defaults and compares the cells tagged ``nbval-check-output`` with their
committed outputs (``tests/suite/nbval_sanitize.cfg`` says what may differ). The
notebooks run in one test process, first, in order 01-08, on that process's
fresh stack: the run ``make notebooks`` made the committed outputs from. The browser test follows in the same
process, on the same stack: the rerun a learner makes in JupyterLab, checked against the same outputs.

lakeFS: where ``LAKEFS_ENDPOINT`` is set, the lakeFS tests run against that
server. Otherwise the lakeFS API test double (``tests/fakes/lakefs_double.py``)
is started on a free port and its endpoint and keys are exported the same
way.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
from pathlib import Path

import pytest

from workshop import stack_ports
from workshop.runner import reproducible_numerics

# A kernel runs every cell with Python's own Ctrl-C handler: ipykernel ignores SIGINT between requests and
# installs `signal.default_int_handler` while it handles one, whatever its process inherited. A test process
# inherits whatever started it, and a background job of a non-interactive shell (`make test &`, nohup, a CI
# runner) inherits SIGINT ignored, under which a Ctrl-C, and `_thread.interrupt_main`, does nothing: the
# interrupt tests then fail ("DID NOT RAISE") however the code behaves. So each test process starts as a
# cell does.
signal.signal(signal.SIGINT, signal.default_int_handler)
_SESSION_SIGINT = signal.default_int_handler

_SESSION: dict[str, object] = {}
os.environ.setdefault("TUTORIAL_HEADLESS", "1")  # helpers.notebook.HEADLESS_ENV: kernels run unwatched
# The same floating-point results on any x86 machine with AVX2, for the seeded accuracies nbval compares; set
# before the stack's Ray starts, whose workers inherit them.
os.environ.update(reproducible_numerics())


def session_stack() -> Path | None:
    """Start (once) the private test stack and name it in ``STACK_STATE_DIR``; None when endpoints are configured."""
    if "state" in _SESSION:
        return _SESSION["state"]  # type: ignore[return-value]
    if os.environ.get("S3_ENDPOINT"):
        _SESSION["state"] = None
        return None
    import mlflow

    from helpers.settings import load_settings
    from workshop import stack

    state = _SESSION["state"] = Path(tempfile.mkdtemp(prefix="stack-test-"))  # stopped at the end, even if up fails
    # Saved as the stack's own choice, not given: where the other test process's stack, starting at the same
    # moment, takes one of them first, up moves this stack's ports instead of failing the whole session.
    (state / "ports.json").write_text(json.dumps(stack_ports.free_ports(list(stack_ports.DEFAULT_PORTS))))
    stack.up(state)
    _SESSION["state"] = state
    # Where load_settings, here and in every kernel, finds the stack and its keys (a lakeFS it started too),
    # as a learner's notebook finds .stack: the notebooks say "embedded stack", as in their committed outputs.
    os.environ["STACK_STATE_DIR"] = str(state)
    settings = load_settings()
    mlflow.set_tracking_uri(settings.mlflow_tracking_uri)  # this process's own MLflow calls, signed in
    # set_tracking_uri also exports MLFLOW_TRACKING_URI, which every kernel nbval starts would inherit and then
    # name as the source ("from environment") where the committed outputs say "embedded stack".
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    settings.use_mlflow_credentials()
    return state


def session_lakefs() -> str:
    """Start (once) the lakeFS test double unless a real lakeFS is configured; returns "real" or "double"."""
    if "lakefs" in _SESSION:
        return _SESSION["lakefs"]  # type: ignore[return-value]
    session_stack()
    from helpers.settings import load_settings
    from tests.fakes.lakefs_double import LakeFSServer

    if load_settings().lakefs_endpoint:  # LAKEFS_ENDPOINT, or a lakefs binary the stack found and started
        _SESSION["lakefs"] = "real"
        return "real"

    server = LakeFSServer(load_settings(), import_step_delay=0.05).__enter__()
    os.environ.update(server.env())
    _SESSION["lakefs"], _SESSION["lakefs_server"] = "double", server
    return "double"


# `make test` runs two test processes (pytest-xdist, `--dist loadfile`): most of the suite waits on
# processes starting (Ray Train's workers, notebook kernels, MLflow), so two of them share two cores well.
# Each process starts its own private stack. A module is one unit of work, so its module-scoped fixtures
# (a training run, an uploaded bucket) are made once; the modules that take longest go first, so the
# many short ones fill in at the end.
LONGEST_MODULES = ("test_kit", "test_shared_server", "test_serving", "test_notebook_06",
                   "test_live_mode", "test_notebooks", "test_train", "test_submit", "test_data", "test_stack",
                   "test_sweeps", "test_versioning", "test_lab", "test_doctor", "test_lock", "test_site")


BROWSER = "tests/platform/test_browser.py"  # every notebook again, in JupyterLab, on the stack nbval left: after it


def _is_notebook(item: pytest.Item) -> bool:
    return item.path.suffix == ".ipynb"


def _module_rank(item: pytest.Item) -> tuple[int, str]:
    if _is_notebook(item):  # nbval's cells: first, on a fresh stack, notebook after notebook
        return -1, item.path.name
    if item.nodeid.startswith(BROWSER):
        return -1, "~"  # after every notebook's name
    name = item.path.stem
    return (LONGEST_MODULES.index(name) if name in LONGEST_MODULES else len(LONGEST_MODULES)), ""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Nbval's notebooks first, in order, then the longest test modules (a stable sort: a module keeps its order)."""
    items.sort(key=_module_rank)


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """``--dist loadfile``, except that the notebooks nbval runs are one unit of work.

    One process runs them all, in order, as ``make notebooks`` did: a notebook can depend on the models the
    ones before it made. Then, in the same process, the browser test runs them again in JupyterLab on the same
    stack, as a learner reruns the notebooks on a reused ``.stack``.
    """
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class NotebooksTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            together = nodeid.startswith(("notebooks/", BROWSER))
            return "notebooks" if together else super()._split_scope(nodeid)

    return NotebooksTogether(config, log)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """Every test, nbval's cells too, holds the machine shared (``tests/suite/machine_share.py``)."""
    from tests.suite.machine_share import run_folder, sharing

    with sharing(run_folder(item.config)):
        return (yield)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before nbval starts a notebook's kernel (which copies this process's environment): the stack, and lakeFS."""
    if _is_notebook(item):
        session_lakefs()  # and the stack


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Stop the private test stack and delete its state."""
    server = _SESSION.get("lakefs_server")
    if server is not None:
        server.__exit__(None, None, None)
    state = _SESSION.get("state")
    if isinstance(state, Path):
        from workshop import stack

        stack.down(state)
        shutil.rmtree(state, ignore_errors=True)


def assert_ctrl_c_interrupts() -> None:
    """Ctrl-C (a kernel's interrupt button) raises KeyboardInterrupt in this process, whatever ran before."""
    import _thread
    import time

    with pytest.raises(KeyboardInterrupt):
        _thread.interrupt_main()  # calls this process's SIGINT handler, as a real Ctrl-C does
        for _ in range(30):
            time.sleep(0.1)


def _sigint_put_back(found, who: str) -> None:
    """Put back the SIGINT handler ``found`` if it was changed, naming ``who`` changed it in a warning."""
    import warnings

    now = signal.getsignal(signal.SIGINT)
    if now is not found:
        signal.signal(signal.SIGINT, found)
        warnings.warn(f"{who} left the SIGINT handler {now!r} (put back: {found!r})", stacklevel=2)


@pytest.fixture(autouse=True, scope="module")
def _sigint_handler_of_the_session():
    """Each module starts with the SIGINT handler the test process started with, whatever the one before left.

    A kernel's Interrupt button is a SIGINT, and tests check that it still interrupts after a fit or a
    sweep; a module whose fixtures left a handler behind (Ray's libraries install their own) would fail
    those in the modules that run after it in the same process.
    """
    _sigint_put_back(_SESSION_SIGINT, "a module before this one")
    yield
    _sigint_put_back(_SESSION_SIGINT, "this module's fixtures")


@pytest.fixture(autouse=True)
def _sigint_handler_kept():
    """Each test starts with the SIGINT handler the one before it found; a test that changed it is named."""
    before = signal.getsignal(signal.SIGINT)
    yield
    _sigint_put_back(before, "this test")
