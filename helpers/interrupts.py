"""The kernel's Interrupt button on a Ray cell: one line saying what stopped and what to run next (03, 04, 05, 07).

A learner who presses Interrupt while Ray works expects the cell to stop, and to be told what to do. Out of
the box they get something else:

* Ray Train's ``fit()`` installs its own Ctrl-C handler, which aborts the run and then raises
  ``SystemExit`` in the kernel (IPython adds "To exit: use 'exit', 'quit', or Ctrl-D"), and leaves that
  handler installed after ``fit()`` returns, where it would abort a run that has ended instead of stopping
  the next cell;
* Ray Tune's ``Tuner.fit()`` stops the sweep at the first Ctrl-C and returns as if it had finished;
* Ray Data stops its pipeline and its actors, and the cell ends in a ``KeyboardInterrupt`` traceback.

:func:`stop_cleanly` wraps one such call. An interrupt inside it ends the cell with one
:class:`Interrupted` line, after Ray has stopped what the call started, and the kernel's own Ctrl-C
handler is back when the block ends, interrupted or not.
"""

from __future__ import annotations

import contextlib
import json
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

from helpers.errors import TutorialError


class Interrupted(TutorialError, RuntimeError):
    """The learner interrupted a Ray cell: what stopped, and what to run next, in one line."""


def _raise_keyboard_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _abort_training(controllers: list[Any]) -> None:
    """Stop the Ray Train runs a ``fit()`` started: the controller aborts its workers, then it is killed."""
    import ray

    for controller in controllers:
        with contextlib.suppress(Exception, KeyboardInterrupt):  # already gone, or a second Ctrl-C: kill it anyway
            ray.get(controller.abort.remote(), timeout=30)
        with contextlib.suppress(Exception):
            ray.kill(controller, no_restart=True)


@contextlib.contextmanager
def _own_interrupts(trainer: Any, controllers: list[Any]) -> Iterator[None]:
    """Keep Ray Train from installing its Ctrl-C handler on ``trainer``: an interrupt stays a KeyboardInterrupt.

    ``fit()`` hands the run's controller to ``_register_sigint_handler``; it is kept here so the run can be
    aborted. Where a Ray version has no such method, its handler stays and its ``SystemExit`` is caught instead.
    """
    if trainer is None or not hasattr(trainer, "_register_sigint_handler"):
        yield
        return
    trainer._register_sigint_handler = controllers.append
    try:
        yield
    finally:
        with contextlib.suppress(AttributeError):
            del trainer._register_sigint_handler


@contextlib.contextmanager
def stop_cleanly(what: str, then: str | Callable[[], str] = "Run the cell again.", trainer: Any = None,
                 tuner: Any = None) -> Iterator[None]:
    """Turn an interrupt of the block into one :class:`Interrupted` line: ``"<what> stopped: ... <then>"``.

    Args:
        what: what the block runs, for the line ("Training", "The sweep", "The pipeline").
        then: what to run next, or a function that works it out once the block stopped.
        trainer: the Ray Train trainer the block fits: its run is aborted (workers and controller stopped).
        tuner: the Ray Tune tuner the block fits: a sweep it stopped at the first Ctrl-C is an interrupt too.

    Raises:
        Interrupted: the block was interrupted (its ``KeyboardInterrupt``, or Ray Train's ``SystemExit``).
    """
    main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGINT) if main else None
    if main:  # what the kernel's handler does; Ray Tune stores it and puts it back after the first Ctrl-C
        signal.signal(signal.SIGINT, _raise_keyboard_interrupt)
    controllers: list[Any] = []
    interrupted = False
    try:
        with _own_interrupts(trainer, controllers):
            yield
        # Ray Tune's handler stops the sweep and puts the previous handler back: this one, now.
        interrupted = tuner is not None and main and signal.getsignal(signal.SIGINT) is _raise_keyboard_interrupt
    except (KeyboardInterrupt, SystemExit) as stop:
        if isinstance(stop, SystemExit) and trainer is None:
            raise
        interrupted = True
        _abort_training(controllers)
    finally:
        if main and previous is not None:  # None: a handler not set from Python, which cannot be put back
            signal.signal(signal.SIGINT, previous)
    if interrupted:
        next_step = then() if callable(then) else then
        raise Interrupted(f"{what} stopped: you interrupted it. {next_step}")


def resumes(trainer: Any) -> Callable[[], str]:
    """What to run after ``trainer``'s run was interrupted: the cell again, and which checkpoint it resumes from.

    Ray Train keeps the run's checkpoints and a snapshot naming the latest under ``<storage_path>/<name>/``; a
    ``fit()`` under the same run name finds them there and ``ray.train.get_checkpoint()`` returns the latest.
    """

    def line() -> str:
        epoch = latest_checkpoint_epoch(trainer)
        if epoch is None:
            return "Run this cell again: training starts over, as no checkpoint was saved yet."
        return f"Run this cell again: training resumes from the checkpoint of epoch {epoch}."

    return line


def latest_checkpoint_epoch(trainer: Any) -> int | None:
    """The epoch of the latest checkpoint Ray Train recorded for ``trainer``'s run (None: none, or unreadable)."""
    run_config = trainer.run_config
    try:
        with run_config.storage_filesystem.open_input_stream(
                f"{run_config.storage_path.rstrip('/')}/{run_config.name}/checkpoint_manager_snapshot.json") as f:
            snapshot = json.loads(f.read())
        metrics = (snapshot.get("latest_checkpoint_result") or {}).get("metrics") or {}
        if isinstance(metrics, str):
            metrics = json.loads(metrics)
        return int(metrics["epoch"])
    except Exception:  # noqa: BLE001 - no snapshot yet, or one this version does not read: no epoch to name
        return None
