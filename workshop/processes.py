"""The stack's processes: who is ours, by record, and how a service stops with everything it started.

``up`` records each service it starts in the state folder (``<service>.pid``: pid, start time, executable,
session, uid and how it was started). A later ``up``, ``down`` or ``make lab`` finds it there; a record
is trusted only while the same process runs (:func:`our_process`), never by its pid alone.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path

import psutil

from helpers.private_files import write_private


def our_process(record: dict) -> psutil.Process | None:
    """The recorded process if it is alive and is the one ``up`` started: same pid, start time and user.

    A pid alone is not enough: after a reboot or a crash the number can belong to any program. Its start
    time tells: a later process with the same pid started later. The executable does not: macOS's Python
    (python.org's, Homebrew's) starts as ``bin/python3.11`` and executes ``Python.app`` under the same pid,
    after the record may have been written.
    """
    try:
        proc = psutil.Process(record["pid"])
        if proc.status() == psutil.STATUS_ZOMBIE or proc.uids().real != record.get("uid", os.getuid()):
            return None
        now = identity(proc)  # the wall-clock start moves when the clock is set, the start since boot does not
        if not any(abs(now[key] - record[key]) <= 0.5 for key in ("create_time", "since_boot") if key in record):
            return None
        return proc
    except (psutil.NoSuchProcess, psutil.AccessDenied, KeyError, TypeError):
        return None


def identity(proc: psutil.Process) -> dict:
    """What tells the process from a later one with its pid: its start on the wall clock and since boot.

    Its executable goes with it, for a reader of the record.
    """
    started = proc.create_time()
    return {"pid": proc.pid, "create_time": started, "since_boot": started - psutil.boot_time(), "exe": proc.exe()}


def remembered_process(state: Path, service: str) -> psutil.Process | None:
    """The process recorded under ``service`` if it still runs (the same process, not a later one with its pid)."""
    record = read_pid_record(state, service)
    return our_process(record) if record else None


def remember_process(state: Path, name: str, pid: int, started_as: str = "") -> None:
    """Record process ``pid`` under ``name`` in the state folder, where a later run finds it (``make lab``).

    With it goes its session: ``up`` starts each service as the leader of a session of its own, so every
    process the service starts belongs to it, also after the service itself died (:func:`orphans`), and
    ``started_as``, its :func:`fingerprint`.
    """
    record = {**identity(psutil.Process(pid)), "uid": os.getuid(), "fingerprint": started_as}
    with contextlib.suppress(OSError):
        record["session"] = os.getsid(pid)
    write_private(state / f"{name}.pid", json.dumps(record))


def orphans(state: Path, service: str) -> list[psutil.Process]:
    """What is left of ``service``'s session when its main process is gone: workers whose parent died.

    MLflow's server forks uvicorn workers, lakeFS and Ray start helpers: killed on its own, the main
    process leaves them running, holding its port. A process counts only if it is in the recorded session
    (which only the service's own processes join), is this user's, and started after the service did, so a
    later program that happens to reuse the session's number is never touched.
    """
    record = read_pid_record(state, service)
    if not record or "session" not in record or our_process(record) is not None:
        return []
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            if os.getsid(proc.pid) == record["session"] and proc.uids().real == record.get("uid", os.getuid()) \
                    and proc.create_time() >= record["create_time"] - 0.5 and not is_zombie(proc):
                found.append(proc)
    return found


def stop_orphans(state: Path, service: str, timeout: float = 10.0) -> int:
    """Stop what :func:`orphans` finds of ``service`` (SIGTERM, then SIGKILL); how many processes there were."""
    found = orphans(state, service)
    terminate(found, timeout)
    return len(found)


def terminate(procs: list[psutil.Process], timeout: float) -> None:
    """SIGTERM ``procs``, and SIGKILL those still running after ``timeout``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for proc in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.send_signal(sig)
        procs = wait_stopped(procs, timeout)
        if not procs:
            return


def read_pid_record(state: Path, service: str) -> dict | None:
    """The record ``up`` wrote for ``service``, or None where there is none or it is damaged."""
    try:
        record = json.loads((state / f"{service}.pid").read_text())
    except (FileNotFoundError, ValueError):
        return None
    if isinstance(record, int):  # a bare pid, written by an older version while its services still run
        return _legacy_record(record, state)
    return record if isinstance(record, dict) and isinstance(record.get("pid"), int) else None


def _legacy_record(pid: int, state: Path) -> dict | None:
    """A full record for a bare pid whose command line names a path inside the state folder, else None."""
    try:
        proc = psutil.Process(pid)
        if f"{state}/" not in " ".join(proc.cmdline()):  # ".stack/" is not inside ".stack-dev/"
            return None
        return identity(proc)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def process_group(proc: psutil.Process) -> list[psutil.Process]:
    """The service and every process of its process group (``up`` starts each service in a group of its own)."""
    try:
        group = os.getpgid(proc.pid)
    except ProcessLookupError:
        return []
    members = {proc.pid: proc}
    for other in psutil.process_iter():
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            if os.getpgid(other.pid) == group:
                members[other.pid] = other
    with contextlib.suppress(psutil.Error):
        members.update({child.pid: child for child in proc.children(recursive=True)})
    return list(members.values())


def stop_group(proc: psutil.Process, timeout: float, leader_first: bool = False) -> None:
    """SIGTERM the service's process group (``leader_first``: the service alone first), SIGKILL what is left."""
    members = process_group(proc)
    if leader_first:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.terminate()
        members = [member for member in wait_stopped(members, timeout, [proc]) if member.pid != proc.pid]
    terminate(members, timeout)


def wait_stopped(procs: list[psutil.Process], timeout: float, until: list | None = None) -> list[psutil.Process]:
    """Those of ``procs`` running once ``until`` (default: all) stopped or ``timeout`` s passed (zombies: stopped)."""
    deadline = time.monotonic() + timeout
    while True:
        alive = [p for p in psutil.wait_procs(procs, timeout=0)[1] if not is_zombie(p)]  # reaps our children
        if not [p for p in alive if until is None or p in until] or time.monotonic() >= deadline:
            return alive
        time.sleep(0.1)


def is_zombie(proc: psutil.Process) -> bool:
    """Whether ``proc`` has exited (its parent not having reaped it yet counts) or is gone."""
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
