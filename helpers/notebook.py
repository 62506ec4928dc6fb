"""What a notebook shows besides plots: a quiet set-up, timings and a closing summary (all notebooks)."""

from __future__ import annotations

import contextlib
import gc
import io
import logging
import os
import re
import time
import traceback
from collections.abc import Iterator, Mapping
from typing import Any

from tqdm.std import tqdm as tqdm_text

from helpers import timings
from helpers.errors import TutorialError
from helpers.interrupts import Interrupted
from helpers.storage import REPAIR_HINT, ObjectDecodeError, outage_during
from helpers.tracking import bounded_requests


class NotebookSkipped(TutorialError, RuntimeError):
    """A service the notebook needs is missing: it stops at its first cell and the runner reports "skipped"."""


HEADLESS_ENV = "TUTORIAL_HEADLESS"  # set by the runner and the tests: no one watches the outputs live


def progress_bar(total: int, desc: str, unit: str = "it", disable: bool = False):
    """A tqdm bar: a live widget in JupyterLab; in a headless run (papermill, tests) one final line of text.

    A widget saved into a notebook file is only state and a frozen "0%"; the final line says what happened.
    """
    if not os.environ.get(HEADLESS_ENV):
        from tqdm.auto import tqdm

        return tqdm(total=total, desc=desc, unit=unit, disable=disable)
    return _FinalLineBar(total=total, desc=desc, unit=unit, disable=disable)


class _FinalLineBar(tqdm_text):
    """Counts silently and prints its final state once, when closed."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, file=io.StringIO(), **kwargs)

    def close(self) -> None:
        if self.disable:  # tqdm marks a closed bar disabled: print once
            return
        line = str(self)
        super().close()
        print(line)


def skip_notebook(needs: str, reason: object) -> None:
    """Stop the notebook here with one line saying why and how to get what is missing."""
    raise NotebookSkipped(f"This notebook needs {needs} and stops here. {reason}")


def setup() -> None:
    """Prepare a notebook: keep library log noise out of the outputs and show user errors in one line."""
    timings.record("kernel start + imports", timings.process_started())
    for name in ("urllib3", "botocore", "mlflow", "alembic", "ray", "filelock"):
        logging.getLogger(name).setLevel(logging.WARNING)
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")  # the notebooks print their links
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    bounded_requests()  # MLflow gone mid-notebook: a call fails in seconds, not minutes
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is None:
        return

    def one_line(shell: Any, etype: type, value: BaseException, tb: Any, tb_offset: int | None = None) -> None:
        # Still an error (with its name) for papermill; only the display is shortened.
        error = user_error(value)
        if not isinstance(error, TutorialError):  # a ValueError of another kind: the whole traceback, as always
            shell.showtraceback((etype, value, tb), tb_offset=tb_offset)
            return
        # The error output with one line as its whole traceback (IPython's exception_only form would add
        # "An exception has occurred, use %tb to see the full traceback." above it).
        shell._showtraceback(type(error), error, [user_error_line(error)])

    # Every error passes here; those user_error() does not recognise keep their whole traceback.
    shell.set_custom_exc((Exception,), one_line)


_UNREADABLE_IMAGE = re.compile(r"couldn't load image file at path '([^']+)'")


def user_error(value: BaseException) -> BaseException:
    """The error a user should read: for an error raised in a Ray worker, the worker's own error.

    Ray re-raises a worker's ``ObjectDecodeError`` in the driver as a class that is both a
    ``RayTaskError`` and an ``ObjectDecodeError``, whose text is the worker's whole traceback;
    ``.cause`` is the original, whose first line names the object and the fix (Ray Data appends
    its retry advice below it).
    """
    outage = outage_during(value)
    if outage is not None:  # a Ray Train run whose workers lost the object store: one line, not 70
        return outage
    cause = getattr(value, "cause", None)
    unreadable = _UNREADABLE_IMAGE.search(str(cause)) if isinstance(cause, ValueError) else None
    if unreadable:  # ray.data.read_images: "PIL couldn't load image file at path '<bucket>/<key>'"
        bucket, _, key = unreadable.group(1).partition("/")
        return ObjectDecodeError(f"Object '{key}' in bucket '{bucket}' is not a readable image. {REPAIR_HINT}")
    if not isinstance(cause, TutorialError):
        return value
    try:
        return type(cause)(str(cause).split("\n", 1)[0])
    except TypeError:  # an error class that takes other arguments: shown as it is
        return cause


def user_error_line(value: BaseException) -> str:
    """The one line a notebook shows for a user error: ``<ErrorName>: <message>``."""
    error = user_error(value)
    return f"{type(error).__name__}: {error}"


@contextlib.contextmanager
def timed(label: str) -> Iterator[dict[str, float]]:
    """Time a block and print ``label: N.NN s``; the seconds are in the yielded dict's ``"seconds"``.

    The kernel's Interrupt button inside the block ends the cell in one :class:`~helpers.interrupts.Interrupted`
    line naming the step and saying to run the cell again (Ray Data has stopped its pipeline and actors by
    then), instead of a ``KeyboardInterrupt`` traceback.
    """
    result: dict[str, float] = {}
    started, wall = time.perf_counter(), time.time()
    try:
        yield result
    except KeyboardInterrupt as stop:
        # The interrupted frames (Ray Data's executor among them) hold the pipeline's actors: let go of them now,
        # not whenever the garbage collector next runs, so that the actors stop as the cell ends.
        traceback.clear_frames(stop.__traceback__)
        del stop
        gc.collect()
        raise Interrupted(f"{label} stopped: you interrupted it. Nothing it made is kept; run the cell again.") \
            from None
    finally:
        result["seconds"] = time.perf_counter() - started
        timings.record(label, wall)
        print(f"{label}: {result['seconds']:.2f} s")


def show_summary(title: str, facts: Mapping[str, Any]) -> None:
    """Show what the notebook produced as a small table (and as JSON, which the tests read)."""
    from IPython.display import display

    rows = "\n".join(f"| {key} | {value} |" for key, value in facts.items())
    markdown = f"**{title}**\n\n| | |\n|---|---|\n{rows}"
    display({"text/markdown": markdown, "application/json": dict(facts)}, raw=True)


def benchmark_results(name: str) -> dict[str, Any] | None:
    """The measured results ``benchmarks/results/<name>.json`` written by ``make bench`` (None if absent)."""
    import json

    from helpers.settings import project_root

    path = project_root() / "benchmarks" / "results" / f"{name}.json"
    return json.loads(path.read_text()) if path.is_file() else None
