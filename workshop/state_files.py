"""The embedded stack's state folder: where each file is, its lock, and its JSON files read with a clear error.

Everything a stack keeps lives in one folder (``.stack/`` or ``STACK_STATE_DIR``), private to its user.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

from helpers.errors import TutorialError
from helpers.private_files import private_folder
from helpers.settings import STATE_FILE_NAME


class StackError(TutorialError, RuntimeError):
    """The embedded stack could not do what was asked; the message says why and what to do."""


RESET_HINT = "`python -m workshop.stack down` then delete {path} (or `make reset`, which deletes all the stack's data)"


def state_paths(state: Path) -> dict[str, Path]:
    """Where each of the stack's files is in the state folder ``state``."""
    return {
        "ports": state / "ports.json",
        "keys": state / "s3-identities.json",
        "env": state / STATE_FILE_NAME,
        "logs": state / "logs",
        "s3_data": state / "s3",
        "mlflow_db": state / "mlflow" / "mlflow.db",
        "lakefs_keys": state / "lakefs-keys.json",
        "mlflow_auth": state / "mlflow-auth.json",
        "mlflow_auth_config": state / "mlflow" / "basic_auth.ini",
        "lakefs_config": state / "lakefs" / "config.yaml",
        "lakefs_db": state / "lakefs" / "metadata",
    }


@contextlib.contextmanager
def state_lock(state: Path, timeout: float = 300.0) -> Iterator[None]:
    """Hold the state folder's lock: one ``up`` or ``down`` at a time (two notebooks starting together wait in turn).

    Raises:
        StackError: another ``up``/``down`` held the lock for longer than ``timeout`` seconds.
    """
    private_folder(state)
    fd = os.open(state / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise StackError(f"Another `python -m workshop.stack up` or `down` on {state} has been running "
                                     f"for over {timeout:.0f} s. Wait for it, or stop it and run the command "
                                     "again.") from None
                time.sleep(0.2)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def read_state_json(path: Path) -> dict:
    """A JSON object the stack wrote; a damaged one is a :class:`StackError` naming the file and the reset."""
    try:
        data = json.loads(path.read_text())
    except ValueError as err:
        raise StackError(f"{path} is damaged ({err}). Reset it: {RESET_HINT.format(path=path)}.") from None
    if not isinstance(data, dict):
        raise StackError(f"{path} is damaged (not a JSON object). Reset it: {RESET_HINT.format(path=path)}.")
    return data
