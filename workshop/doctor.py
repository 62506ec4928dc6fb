"""``make doctor``: is this laptop ready for the workshop? The check a learner runs the week before.

One line per check, in under a minute: the Python, the platform, free disk and memory, the Unix socket paths
against the platform's limit, the stack's ports, the embedded stack up and answering, and a Ray task that
reaches the object store from a worker. It ends with ``ready``, or with ``not ready:`` and what to fix first.

The machine's checks come first, before any service starts; the Python's needs nothing installed, so even an
interpreter with nothing in it is told what it lacks. A stack the doctor started, it stops again; one it found
running, it leaves running. Here it takes about 40 seconds, most of them the stack's start.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

SUPPORTED_PYTHONS = ((3, 11), (3, 12))  # = workshop.lock.PYTHONS
DISK_NEEDED = 3_000_000_000  # the stack's data at smoke size and the object store's own reserve (1% + 1 GiB)
MEMORY_NEEDED = 7_500_000_000  # an "8 GB" laptop: notebook 04 peaks at 3.7 GB beside the stack, JupyterLab, a browser
# A socket a program makes in $TMPDIR itself: Python's multiprocessing on macOS puts its listeners at
# <TMPDIR>/pymp-<8>/listener-<8> (32 bytes more); the stack's own sockets move to /tmp where they would not fit.
TMPDIR_SOCKET = "/pymp-01234567/listener-01234567"


@dataclass(frozen=True)
class Check:
    """One line of the report: what was checked, whether it is fine, and what was found (or what to do)."""

    name: str
    ok: bool
    detail: str


def python_check(version: tuple[int, ...] = tuple(sys.version_info)) -> Check:
    """The Python this runs on is one the lock is for."""
    found = ".".join(str(part) for part in version[:3])
    if tuple(version[:2]) in SUPPORTED_PYTHONS:
        return Check("Python", True, f"{found} ({sys.executable})")
    return Check("Python", False, f"{found} at {sys.executable}: the workshop needs 3.11 or 3.12; `make doctor` "
                                  "makes .venv with one, or says what to install where there is none")


def platform_check() -> Check:
    """This machine is one the lock has wheels for, and its system is new enough for them."""
    from workshop.install import InstallError, platform_name, system_too_old

    try:
        name = platform_name()
    except InstallError as err:
        return Check("platform", False, str(err))
    too_old = system_too_old()
    return Check("platform", not too_old, too_old or f"{name}: the lock has wheels for it")


def nearest_existing(folder: Path) -> Path:
    """``folder``, or its nearest parent that exists (where it will be made)."""
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return folder


def disk_check(state: Path, needed: int = DISK_NEEDED) -> Check:
    """Enough free disk where the stack keeps its data."""
    free = shutil.disk_usage(nearest_existing(state)).free
    if free >= needed:
        return Check("disk", True, f"{free / 1e9:.1f} GB free where the stack keeps its data ({state}); "
                                   f"{needed / 1e9:.1f} GB needed")
    return Check("disk", False, f"only {free / 1e9:.2f} GB free at {nearest_existing(state)}, where the stack keeps "
                                f"its data: free up {(needed - free) / 1e9:.1f} GB more, or set STACK_STATE_DIR to a "
                                "folder on a disk with room")


def memory_check(needed: int = MEMORY_NEEDED) -> Check:
    """Enough memory for a notebook's training beside the stack."""
    try:
        import psutil

        memory = psutil.virtual_memory()
        total, available = memory.total, memory.available
    except ImportError:
        total = available = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    said = f"{total / 1e9:.1f} GB, {available / 1e9:.1f} GB available"
    if total < needed:
        return Check("memory", False, f"{said}: the notebooks need a machine of about 8 GB; on WSL2, give it more "
                                      "(memory= in .wslconfig)")
    return Check("memory", True, f"{said}; about 8 GB needed")


def socket_check() -> Check:
    """Every Unix socket the stack, Ray and the lab make fits the platform's limit, and so do those made in TMPDIR.

    The limit is 107 bytes on Linux and 103 on macOS, whose TMPDIR alone is 48.
    """
    import tempfile

    from helpers.private_files import SocketPathError, short_temp_root, unix_socket_limit
    from helpers.worker_env import RAY_SOCKETS, ray_tmpdir
    from workshop.lab import KERNEL_SOCKETS

    limit, tmpdir = unix_socket_limit(), tempfile.gettempdir()
    in_tmpdir = len(tmpdir.encode()) + len(TMPDIR_SOCKET)
    if in_tmpdir > limit:
        return Check("sockets", False, f"TMPDIR={tmpdir} ({len(tmpdir.encode())} bytes) leaves no room for the "
                                       f"sockets programs make in it ({in_tmpdir} of at most {limit} bytes): set a "
                                       "shorter one, e.g. export TMPDIR=/tmp")
    try:
        ray = Path(ray_tmpdir())  # RAY_TMPDIR, or the folder the stack's Ray gets
        kernels = short_temp_root(len(KERNEL_SOCKETS))
    except SocketPathError as err:
        return Check("sockets", False, str(err))
    longest = {f"Ray's in {ray}": len(str(ray).encode()) + len(RAY_SOCKETS),
               f"the lab's kernels' in {kernels}": len(str(kernels).encode()) + len(KERNEL_SOCKETS),
               f"those made in TMPDIR ({tmpdir})": in_tmpdir}
    name, length = max(longest.items(), key=lambda item: item[1])
    if length > limit:  # unreachable unless the limits above are wrong: said all the same
        return Check("sockets", False, f"{name} would have {length} bytes, over this system's {limit}")
    return Check("sockets", True, f"the longest, {name}, {length} of {limit} bytes")


def ports_check(state: Path) -> Check:
    """The stack's ports: free, or its own; where another program holds one, the stack takes another."""
    from workshop import stack_ports

    ports = stack_ports.saved_ports(state)
    taken = [f"{name} {port}" for name, port in ports.items() if stack_ports.port_taken(name, port)]
    if not taken:
        return Check("ports", True, f"{len(ports)} free or the stack's own ({ports['s3']} S3, {ports['mlflow']} "
                                    "MLflow)")
    return Check("ports", True, f"{', '.join(taken)} held by another program: the stack takes free ones instead")


def stack_check(state: Path) -> tuple[Check, bool]:
    """The embedded stack started (where it was not running) and answering; whether the doctor started it."""
    from helpers import storage
    from helpers.settings import load_settings
    from helpers.stack_ray import read_service
    from workshop import stack

    was_running = any(row.healthy for row in stack.status(state))
    try:
        rows = stack.up(state)
        settings = load_settings()
        storage.get_client(settings).list_buckets()
    except Exception as err:  # noqa: BLE001 - whatever it is, the line says it and what the doctor started stops
        said = str(err).splitlines()[0] if str(err) else type(err).__name__
        return Check("stack", False, f"{said} (logs: {state / 'logs'})"), not was_running
    healthy = {row.name for row in rows if row.healthy}
    missing = [name for name in ("seaweedfs", "mlflow", "ray") if name not in healthy]
    if missing or read_service(state) is None:
        return Check("stack", False, f"{', '.join(missing) or 'ray'} not answering (logs: {state / 'logs'})"), \
            not was_running
    lakefs = "lakeFS answering" if "lakefs" in healthy else "no lakeFS: notebook 06 will be skipped, the others run"
    return Check("stack", True, f"object store, MLflow and Ray answering; {lakefs}"), not was_running


def ray_task_check(timeout: float = 10.0) -> Check:
    """A task on one of the stack's Ray workers lists the object store's buckets, within ``timeout`` seconds."""
    import ray

    from helpers.cluster import init_ray, shutdown_ray
    from helpers.settings import load_settings

    @ray.remote
    def buckets_seen_by_a_worker() -> list[str]:
        from helpers import storage

        return [bucket.name for bucket in storage.get_client(load_settings()).list_buckets()]

    started = time.monotonic()
    try:
        init_ray(load_settings())
        seen = ray.get(buckets_seen_by_a_worker.remote(), timeout=timeout)
    except Exception as err:  # noqa: BLE001 - whatever stops the task is what the learner must read
        return Check("Ray task", False, f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}")
    finally:
        shutdown_ray()
    return Check("Ray task", True, f"a worker reached the object store in {time.monotonic() - started:.1f} s "
                                   f"({len(seen)} bucket{'s' if len(seen) != 1 else ''})")


def report(check: Check) -> None:
    """Print one line of the report."""
    print(f"  {'ok ' if check.ok else 'NO '} {check.name:<9} {check.detail}", flush=True)


def run_checks() -> list[Check]:
    """Every check, in order; those that need the stack only once the machine's checks passed."""
    checks = [python_check()]
    report(checks[-1])
    if not checks[-1].ok:
        return checks
    from helpers.settings import state_dir

    state = state_dir()
    for check in (platform_check, lambda: disk_check(state), memory_check, socket_check, lambda: ports_check(state)):
        checks.append(check())
        report(checks[-1])
    if not all(c.ok for c in checks):
        return checks
    from workshop import stack

    check, started_here = stack_check(state)
    checks.append(check)
    report(check)
    try:
        if check.ok:
            checks.append(ray_task_check())
            report(checks[-1])
    finally:
        if started_here:
            stack.down(state)
    return checks


def main(argv: list[str] | None = None) -> int:
    """``python -m workshop.doctor`` (``make doctor``): the report, then ``ready`` (exit 0) or what to fix (1)."""
    started = time.monotonic()
    print("Is this machine ready for the workshop?", flush=True)
    checks = run_checks()
    failed = next((c for c in checks if not c.ok), None)
    took = f"(checked in {time.monotonic() - started:.0f} s)"
    if failed is None:
        print(f"ready {took}")
        return 0
    print(f"not ready: fix what the {failed.name} line says, then run `make doctor` again {took}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
